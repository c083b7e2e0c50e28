"""The read-only web page at ``/ui``: gangs, capacity as a picture, one gang's plan.

One static page (``app/static/ui.html`` and ``ui.js``, no build step) polls the JSON
endpoints below every few seconds. Every view is sized for a 5,000-node, 50,000-pod cluster:

``/ui/api/gangs``        counts by state for all gangs, and at most ``limit`` rows (worst state
                         first), filtered by namespace and state; member details are computed
                         for the rows shown only.
``/ui/api/racks``        one aggregate per rack (nodes, GPUs used / reserved / free, the gangs
                         holding reservations there), never one entry per node.
``/ui/api/rack``         one rack's nodes, each GPU as a slot: used (by which gang or pod),
                         reserved (for which gang) or free, grouped by NVLink island and NUMA
                         side, with the node's NVSwitch/NVLink domain (the ``clique`` level).
``/ui/api/gang/{ns}/{name}``  a gang's plan (which node each member goes to and why that
                         domain), its members, and the Events Lockstep posted for it.

Read-only and no wider than ``get pods``: it shows what Lockstep holds about pods (names,
nodes, gangs, reasons) and GPU counts per node, never labels, annotations, specs or Secrets.
The JSON endpoints answer whom ``/debug/*`` answers (loopback, as through
``kubectl port-forward``, or ``--debug-token``); ``--ui=false`` turns all of it off.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from coscheduling import (
    GANG_STATES,
    GangKey,
    GangPhase,
    GangView,
    NodeName,
    Queries,
    format_rank,
)
from coscheduling.topology.domains import GPU, INTERCONNECT_LABEL, domain_of, level_by_name

from ..kube.errors import BadRequest
from ..render import render
from .rest import json_response

if TYPE_CHECKING:
    from ..service import Lockstep

__all__ = ["STATES", "gang_detail", "gangs_page", "rack_nodes", "racks",
           "ui_router"]

STATES = GANG_STATES
"""The page's gang states, worst first (the order rows are listed in)."""
_RANK = {s: i for i, s in enumerate(STATES)}
NO_RACK = "(no rack)"
MAX_ROWS = 1000
CACHE_SECONDS = 1.0


def _created(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return ns, name


def gang_row(q: Queries, v: GangView, now: float, wall: float) -> dict[str, Any]:
    """One gang as a table row: counts, convention, priority, age and the reason in words."""
    ns, name = _split(v.key)
    members = q.members_of(v.key)
    created = [c for m in members if (c := _created(m.created)) is not None]
    pending = max(0, v.members - v.bound - v.parked)
    return {
        "gang": v.key, "namespace": ns, "name": name, "state": q.gang_state(v.key) or "invalid",
        "phase": v.phase.value, "minMember": v.spec.min_member if v.spec else None,
        "members": v.members, "bound": v.bound, "parked": v.parked, "pending": pending,
        "convention": v.spec.source.value if v.spec else None,
        "priority": max((m.priority for m in members), default=0),
        "ageSeconds": round(wall - min(created)) if created else None,
        "reservedNodes": len(set(v.plan.values())),
        "deadlineInSeconds": round(v.deadline - now, 1) if v.deadline is not None else None,
        "reason": render(v.partial) if v.partial is not None
        else render(v.reason) if v.reason is not None else _progress(v, pending),
    }


def _progress(v: GangView, pending: int) -> str | None:
    """Where an admitted gang is when the core has no reason to give (it is not waiting)."""
    if v.phase is not GangPhase.ADMITTED:
        return None
    nodes = len(set(v.plan.values()))
    return (f"admitted, capacity reserved on {nodes} node(s): {v.parked} member(s) parked, "
            f"{pending} not yet asked to bind by kube-scheduler")


def gangs_page(q: Queries, now: float, wall: float, *, namespace: str = "",
               state: str = "", limit: int = 200) -> dict[str, Any]:
    """Counts for every state (within ``namespace``), and the first ``limit`` matching rows."""
    gangs = q.gangs
    namespaces = sorted({_split(k)[0] for k in gangs})
    keys = [k for k in gangs if _split(k)[0] == namespace] if namespace else list(gangs)
    states = [(q.gang_state(k) or "invalid", k) for k in keys]
    counts = dict.fromkeys(STATES, 0)
    for s, _ in states:
        counts[s] += 1
    chosen = sorted((_RANK[s], k) for s, k in states if not state or s == state)
    rows = []
    for _, k in chosen[:limit]:
        v = q.gang_view(k)
        if v is not None:
            rows.append(gang_row(q, v, now, wall))
    return {"counts": counts, "total": len(keys), "matching": len(chosen),
            "namespaces": namespaces, "gangs": rows, "preemptions": preemptions(q, now)}


def preemptions(q: Queries, now: float) -> list[dict[str, Any]]:
    """Who is preempting whom: each preemption whose victims are still terminating."""
    out = []
    for rec in q.preemptions_in_flight():
        out.append({"preemptor": rec.preemptor.name, "priority": rec.priority,
                    "victimGangs": sorted(rec.victim_gangs), "plainPods": rec.plain,
                    "victimPods": len(rec.victims), "waitingFor": len(rec.waiting_for),
                    "gpus": sum(r.get(GPU, 0) for r in rec.freed.values()),
                    "ageSeconds": round(max(0.0, now - rec.started), 1)})
    return out


def _rack_level(q: Queries) -> int | None:
    """The index of the level the page groups nodes by: ``rack``, else the one above the
    node, else None (one group for the whole cluster)."""
    levels = q.settings.levels
    lv = level_by_name(levels, "rack")
    if lv is not None:
        return levels.index(lv)
    return len(levels) - 2 if len(levels) >= 2 else None


def _rack_of(q: Queries) -> tuple[str, dict[str, list[NodeName]]]:
    """(level name, rack id -> its nodes); a rack's id is its domain path joined by '/'."""
    index = _rack_level(q)
    if index is None:
        return "cluster", {NO_RACK: sorted(q.nodes)}
    out = {"/".join(d): list(ns) for d, ns in q.domains(index).items()}
    placed = {n for ns in out.values() for n in ns}
    if len(placed) < len(q.nodes):
        out[NO_RACK] = sorted(n for n in q.nodes if n not in placed)
    return q.settings.levels[index].name, out


def _gpus(q: Queries, n: NodeName, reserved: Mapping[NodeName, Mapping[GangKey, Any]]
          ) -> tuple[int, int, int]:
    """(allocatable, used, reserved) GPUs of node ``n``."""
    node = q.nodes[n]
    alloc = node.allocatable.get(GPU, 0)
    used = q.used(n).get(GPU, 0)
    held = sum(r.get(GPU, 0) for r in reserved.get(n, {}).values())
    return alloc, used, held


def racks(q: Queries) -> dict[str, Any]:
    """One aggregate per rack: what the capacity picture draws at cluster scale."""
    level, by_rack = _rack_of(q)
    reserved = q.reserved_total()
    out = []
    totals = {"nodes": 0, "gpus": 0, "used": 0, "reserved": 0}
    for rack_id in sorted(by_rack, key=lambda r: (r == NO_RACK, r)):
        names = by_rack[rack_id]
        gpus = used = held = unschedulable = 0
        gangs: dict[str, int] = {}
        for n in names:
            a, u, r = _gpus(q, n, reserved)
            gpus, used, held = gpus + a, used + u, held + r
            unschedulable += q.nodes[n].unschedulable
            for g, res in reserved.get(n, {}).items():
                gangs[g] = gangs.get(g, 0) + res.get(GPU, 0)
        out.append({
            "rack": rack_id, "name": rack_id.rsplit("/", 1)[-1] or rack_id,
            "nodes": len(names), "gpus": gpus, "used": min(used, gpus),
            "reserved": min(held, max(0, gpus - used)),
            "free": max(0, gpus - used - held), "unschedulable": unschedulable,
            "reservedFor": dict(sorted(gangs.items(), key=lambda kv: (-kv[1], kv[0]))[:5]),
        })
        totals["nodes"] += len(names)
        totals["gpus"] += gpus
        totals["used"] += used
        totals["reserved"] += held
    return {"level": level, "racks": out, "totals": totals}


def _natural(name: str) -> tuple[Any, ...]:
    """n2 before n10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _owners(q: Queries, names: Iterable[NodeName]) -> dict[NodeName, list[str]]:
    """Per node, the gang (or plain pod) of each GPU in use, one entry per GPU."""
    wanted = set(names)
    out: dict[NodeName, list[str]] = {n: [] for n in wanted}
    for p in q.pods.values():
        if p.node_name in wanted and p.holds_capacity:
            gpus = p.requests.get(GPU, 0)
            if gpus:
                out[p.node_name].extend([q.gang_of(p.key) or p.key] * gpus)
    return out


def rack_nodes(q: Queries, rack_id: str) -> dict[str, Any]:
    """One rack's nodes, each GPU a slot: ``[state, owner]`` with state used / reserved /
    free, in NVLink-island order, plus the node's NUMA split and NVSwitch domain."""
    level, by_rack = _rack_of(q)
    names = by_rack.get(rack_id)
    if names is None:
        raise BadRequest(404, f"no {level} {rack_id!r}", ["rack"])
    reserved = q.reserved_total()
    owners = _owners(q, names)
    levels = q.settings.levels
    clique = level_by_name(levels, "clique")
    nodes = []
    for n in sorted(names, key=_natural):
        node = q.nodes[n]
        alloc, _, _ = _gpus(q, n, reserved)
        slots: list[list[str]] = [["used", o] for o in owners[n][:alloc]]
        for g, res in sorted(reserved.get(n, {}).items()):
            slots += [["reserved", g]] * res.get(GPU, 0)
        slots = slots[:alloc] + [["free", ""]] * max(0, alloc - len(slots))
        layout = q.layout(n)
        path = {lv.name: v for lv in levels[:-1] if (v := lv.value(node.labels))}
        nodes.append({
            "node": n, "gpus": alloc, "slots": slots, "islands": list(layout.islands),
            "numa": list(layout.numa),
            "interconnect": node.labels.get(INTERCONNECT_LABEL) or
            ("unlabelled" if not layout.labelled else ""),
            "nvswitchDomain": clique.value(node.labels) if clique else None,
            "domains": path, "unschedulable": node.unschedulable,
        })
    return {"level": level, "rack": rack_id, "nodes": nodes}


def gang_detail(q: Queries, key: GangKey, now: float, wall: float,
                events: Iterable[Mapping[str, str]]) -> dict[str, Any]:
    """A gang's row, its plan with the reason for each node, its members and its Events."""
    v = q.gang_view(key)
    if v is None:
        raise BadRequest(404, f"gang {key} is not known", ["gang"])
    levels = q.settings.levels
    plan_index = next((i for i, lv in enumerate(levels) if lv.name == v.plan_level), None)
    plan = []
    for pod_key, n in sorted(v.plan.items()):
        pod = q.pod(pod_key)
        node = q.node(n)
        gpus = pod.requests.get(GPU, 0) if pod else 0
        why = q.explain_score(n, gpus, pod_key).why if node is not None else "node gone"
        domain = (domain_of(levels, plan_index, node)
                  if node is not None and plan_index is not None else None)
        plan.append({"pod": pod_key, "node": n, "gpus": gpus,
                     "rank": format_rank(pod.rank) if pod else None,
                     "domain": "/".join(domain) if domain else None, "why": why})
    members = []
    for m in sorted(q.members_of(key), key=lambda p: p.key):
        state = ("bound" if m.node_name is not None else "parked" if q.is_parked(m.key)
                 else "gated" if m.gated else "pending")
        members.append({"pod": m.key, "state": state, "node": m.node_name,
                        "planned": v.plan.get(m.key), "rank": format_rank(m.rank),
                        "gpus": m.requests.get(GPU, 0),
                        "priority": m.priority, "phase": m.phase})
    required = v.spec.topology if v.spec else None
    return {
        **gang_row(q, v, now, wall),
        "placedWithin": v.plan_level, "topologyRequired": required,
        "planWhy": _plan_why(v.plan_level, required, len(set(v.plan.values()))),
        "plan": plan, "memberPods": members, "events": list(events),
        "timeoutSeconds": v.spec.timeout_seconds if v.spec else None,
    }


def _plan_why(level: str | None, required: str | None, nodes: int) -> str:
    if level is None:
        return "no plan: the gang holds no reservation"
    where = "one node" if level == "hostname" else f"one {level}"
    because = (f"the gang requires one {required}" if required
               else f"{where} is the tightest domain with room for every member")
    return f"all members placed within {where} ({nodes} node(s)): {because}"


NO_STORE = {"Cache-Control": "no-store"}
"""The page's JSON is of the moment: a browser must not show an old answer."""


def _static(name: str, media: str) -> Response:
    body = resources.files("app").joinpath("static", name).read_bytes()
    return Response(body, media_type=media, headers={"Cache-Control": "no-cache"})


def ui_router(service: Lockstep, guard: Callable[[Request], Response | None],
              wall: Callable[[], float] = time.time) -> APIRouter:
    """The page and its JSON; ``guard`` is the debug endpoints' access check."""
    router = APIRouter()
    q = service.core.queries
    answered: dict[tuple[str, str, int], tuple[float, Response]] = {}

    def cached(key: tuple[str, str, int], make: Callable[[], Any]) -> Response:
        """The gangs answer at most once a second per query, however many pages poll it:
        counting every gang costs ~15 ms of the event loop at 50,000 pods."""
        now = service.clock()
        hit = answered.get(key)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        if len(answered) > 256:
            answered.clear()
        answered[key] = (now, json_response(make(), headers=NO_STORE))
        return answered[key][1]

    @router.get("/ui")
    async def page() -> Response:
        return _static("ui.html", "text/html; charset=utf-8")

    @router.get("/ui/ui.js")
    async def script() -> Response:
        return _static("ui.js", "text/javascript; charset=utf-8")

    @router.get("/ui/api/gangs")
    async def gangs(request: Request, namespace: str = "", state: str = "",
                    limit: int = 200) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        if state and state not in STATES:
            raise BadRequest(400, f"state {state!r} is not one of {', '.join(STATES)}",
                             ["state"])
        if not 0 < limit <= MAX_ROWS:
            raise BadRequest(400, f"limit must be 1..{MAX_ROWS}", ["limit"])
        return cached((namespace, state, limit), lambda: gangs_page(
            q, service.clock(), wall(), namespace=namespace, state=state, limit=limit))

    @router.get("/ui/api/racks")
    async def all_racks(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        return json_response(racks(q), headers=NO_STORE)

    @router.get("/ui/api/rack")
    async def one_rack(request: Request, rack: str) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        return json_response(rack_nodes(q, rack), headers=NO_STORE)

    @router.get("/ui/api/gang/{namespace}/{name}")
    async def one_gang(request: Request, namespace: str, name: str) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        key = GangKey(f"{namespace}/{name}")
        history = service.poster.history.get(key, ())
        return json_response(gang_detail(q, key, service.clock(), wall(), list(history)),
                             headers=NO_STORE)

    return router
