"""Plain-words views for the debug endpoints and the CLI: gangs, nodes, one pod's story."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coscheduling import (
    GangSpec,
    GangView,
    InvalidGang,
    MissingPodGroup,
    NodeName,
    PlainVerdict,
    PodKey,
    Queries,
    format_rank,
    format_resources,
)
from coscheduling.reasons import InvalidDeclaration, PodGroupNotFound
from coscheduling.topology.domains import DEFAULT_LEVELS, GPU, gpu_layout

from ..render import render

if TYPE_CHECKING:
    from ..service import Lockstep

__all__ = ["explain_pod", "gang_json", "node_json"]


def gang_json(v: GangView, now: float) -> dict[str, Any]:
    return {
        "gang": v.key,
        "phase": v.phase.value,
        "minMember": v.spec.min_member if v.spec else None,
        "timeoutSeconds": v.spec.timeout_seconds if v.spec else None,
        "source": v.spec.source.value if v.spec else None,
        "matchPolicy": v.spec.match_policy.value if v.spec else None,
        "mode": v.spec.mode.value if v.spec else None,
        "totalNumber": v.spec.total if v.spec else None,
        "gangGroup": {k: n for k, n in v.spec.parts} if v.spec and v.spec.parts else None,
        "members": v.members,
        "bound": v.bound,
        "parked": v.parked,
        "reservation": dict(sorted(v.plan.items())),
        "placedWithin": v.plan_level,
        "deadlineInSeconds": round(v.deadline - now, 1) if v.deadline is not None else None,
        "backoffInSeconds": round(v.backoff_until - now, 1)
        if v.backoff_until is not None and v.backoff_until > now else None,
        "reason": render(v.reason) if v.reason is not None else None,
        "partiallyBound": render(v.partial) if v.partial is not None else None,
    }


def node_json(q: Queries, name: NodeName) -> dict[str, Any]:
    node = q.node(name)
    assert node is not None
    layout = gpu_layout(node)
    domains = {lv.name: lv.value(node.labels) for lv in DEFAULT_LEVELS[:-1]}
    return {
        "node": name,
        "allocatable": format_resources(node.allocatable),
        "free": format_resources(q.free(name)),
        "freeOutsideReservations": format_resources(q.free_unreserved(name)),
        "reservations": {g: format_resources(r) for g, r in sorted(q.reserved_on(name).items())},
        "topology": {k: v for k, v in domains.items() if v},
        "gpuIslands": list(layout.islands),
        "gpusPerNuma": list(layout.numa),
        "interconnectLabelled": layout.labelled,
        "unschedulable": node.unschedulable,
    }


def explain_pod(service: Lockstep, key: PodKey) -> dict[str, Any]:
    q = service.core.queries
    now = service.clock()
    pod = q.pod(key)
    assert pod is not None
    out: dict[str, Any] = {"pod": key, "phase": pod.phase, "node": pod.node_name,
                           "schedulerName": pod.scheduler_name, "rank": format_rank(pod.rank)}
    m = q.membership(key)
    gang = q.gang_of(key)
    view = q.gang_view(gang) if gang is not None else None
    if view is not None:
        out["gang"] = gang_json(view, now)
    if pod.node_name is not None:
        where = f" with gang {gang}" if gang else ""
        out["explanation"] = f"bound to {pod.node_name}{where}; phase {pod.phase}"
        return out
    if pod.scheduler_name not in q.settings.scheduler_names:
        names = ", ".join(sorted(q.settings.scheduler_names))
        out["explanation"] = (
            f"schedulerName is {pod.scheduler_name!r}: Lockstep only sees pods for {names}"
        )
        return out
    if isinstance(m, InvalidGang):
        out["explanation"] = render(InvalidDeclaration(m))
    elif isinstance(m, MissingPodGroup):
        out["explanation"] = render(PodGroupNotFound(m.key, m.api))
    elif isinstance(m, GangSpec) and view is not None:
        if q.is_parked(key):
            out["explanation"] = (
                f"assumed on {view.plan.get(key)} and parked: waiting for gang {gang} to reach "
                f"{m.min_member} ({view.parked} parked, {view.bound} bound)"
            )
        elif key in view.plan:
            out["explanation"] = (
                f"gang {gang} admitted; {view.plan[key]} is reserved for this pod and "
                "kube-scheduler will place it there on its next attempt"
            )
        elif view.reason is not None:
            out["explanation"] = render(view.reason)
        else:
            out["explanation"] = f"gang {gang} ({view.phase.value}): not yet filtered"
    else:
        out["explanation"] = (
            "not in a gang: kube-scheduler places it like any pod, on capacity not reserved "
            "for gangs"
        )
        verdict = q.plain_verdict(key)
        if verdict is not None:
            out["lastAnswers"] = plain_verdict_json(verdict, now)
            if verdict.bind_refused is not None:
                out["explanation"] += (f"; its last bind (to {verdict.bind_node}) was refused: "
                                       f"{render(verdict.bind_refused)}")
            elif verdict.refused:
                out["explanation"] += (f"; its last filter passed {verdict.passed} node(s) and "
                                       f"turned away {len(verdict.refused)} held for gangs")
            if verdict.preemption:
                out["explanation"] += f"; {verdict.preemption}"
    if view is not None and view.partial is not None:
        out["partiallyBound"] = render(view.partial)
        out["explanation"] = f"{render(view.partial)}; then: {out['explanation']}"
    out["bestNodes"] = best_nodes(q, pod.requests.get(GPU, 0), key if gang else None)
    return out


def plain_verdict_json(v: PlainVerdict, now: float) -> dict[str, Any]:
    """A plain pod's last filter and bind answers, as ``explain`` and ``/debug/pods`` show."""
    out: dict[str, Any] = {}
    if v.filtered_at is not None:
        out["filter"] = {"secondsAgo": round(now - v.filtered_at, 3), "passed": v.passed,
                         "refused": {n: render(r) for n, r in sorted(v.refused.items())[:10]}}
    if v.bind_at is not None:
        out["bind"] = {"secondsAgo": round(now - v.bind_at, 3), "node": v.bind_node,
                       "refused": render(v.bind_refused) if v.bind_refused else None}
    if v.preemption:
        out["preemption"] = v.preemption
    return out


def best_nodes(q: Queries, gpus: int, own: PodKey | None, top: int = 5
               ) -> list[dict[str, Any]]:
    """The nodes Lockstep's prioritize would rank highest for this pod, with why."""
    scored = [(q.explain_score(n, gpus, own), n) for n in sorted(q.nodes)]
    scored.sort(key=lambda t: (-t[0].total, t[1]))
    return [{"node": n, "score": s.total, "packing": s.packing, "locality": s.locality,
             "why": s.why} for s, n in scored[:top]]
