"""Placement quality: the stock kube-scheduler alone vs with Lockstep, same seeded workload.

On the ``bench-64x8`` topology (64 nodes x 8 GPUs in 8 racks), a fixed seeded stream of
training gangs arrives; each gang runs for its (seeded) runtime once *all* its members are
bound, then finishes (its pods are deleted). The stock scheduler places pods one by one, so a
gang can sit partly bound, holding GPUs it cannot use; Lockstep admits whole gangs.

Reported per scheduler, measured in one run on the real test bed:
- gangs that fit one rack and were placed inside one rack (share; goal >= 95% with Lockstep),
- GPUs stranded on partly used nodes (free GPUs on nodes neither empty nor full, mean over time),
- gangs that waited (> 2 s from arrival to fully bound), gangs ever partly bound for > 2 s,
- gangs completed within the time budget, and the makespan.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from testbed.bins import REPO, ensure_bins
from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.kube import Kube
from testbed.runner import TestBed
from testbed.workloads import pod

SHAPES = ((1, 8), (2, 8), (4, 8), (8, 8), (2, 4), (4, 4), (4, 2), (8, 1), (1, 4), (3, 2),
          (2, 2), (1, 2), (6, 1))
"""(members, GPUs per member) training-job shapes drawn by the seeded workload."""
NODE_GPUS = 8

TABLE_COLUMNS = (
    ("scheduler", "scheduler"),
    ("gangs", "gangs"),
    ("completed", "completed"),
    ("one_rack_share", "in one rack (when one could hold it)"),
    ("stranded_gpus_mean", "stranded GPUs (mean)"),
    ("waited", "waited > 2 s"),
    ("partial", "partly bound > 2 s"),
    ("makespan_s", "makespan s"),
)


@dataclass
class Gang:
    name: str
    members: int
    gpus: int
    arrival: float
    runtime: float
    bound_at: float | None = None
    partial_since: float | None = None
    ever_partial: bool = False
    racks: set[str] = field(default_factory=set)
    one_rack_possible: bool = False
    """When it was placed, some rack's free GPUs (its own given back) could hold it whole."""
    done: bool = False

    @property
    def total(self) -> int:
        return self.members * self.gpus


def workload(seed: int, count: int) -> list[Gang]:
    rng = random.Random(seed)
    gangs = []
    t = 0.0
    for i in range(count):
        members, gpus = rng.choice(SHAPES)
        gangs.append(Gang(f"job{i:02d}", members, gpus, arrival=t,
                          runtime=rng.uniform(6.0, 16.0)))
        t += rng.uniform(0.05, 0.4)
    return gangs


def _pods(g: Gang, ns: str, lockstep: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(g.members):
        b = pod(f"{g.name}-{i}", ns).gpu(g.gpus)
        if lockstep:
            b.gang(g.name, g.members, timeout=60)
        else:
            b.scheduler("default-scheduler").annotate("bench/gang", g.name)
        out.append(b.build())
    return out


def _fits_one_rack(g: Gang, nodes: list[str], used: dict[str, int],
                   rack_of: dict[str, str]) -> bool:
    """Could one rack have held ``g`` whole (per-node free GPUs, its own usage given back)?"""
    free = {n: NODE_GPUS - u for n, u in used.items()}
    for n in nodes:
        free[n] += g.gpus
    for rack in set(rack_of.values()):
        slots = sorted((f for n, f in free.items() if rack_of[n] == rack), reverse=True)
        placed = 0
        for i, f in enumerate(slots):
            take = min(f // g.gpus, g.members - placed)
            placed += take
            slots[i] = f - take * g.gpus
        if placed >= g.members:
            return True
    return False


def _run_one(lockstep: bool, gangs: list[Gang], budget: float) -> dict[str, Any]:
    ns = "bench"
    with TestBed() as bed:
        kube = Kube(bed.api_url, bed.token)
        create_nodes(kube, nodes_from_topology(load_topology("bench-64x8")))
        if lockstep:
            # The extender alone, as this benchmark has always measured (start_lockstep's
            # default became the default install, webhook on).
            url = bed.start_lockstep(extra_args=("--backoff=5",), webhook=False)
            bed.start_scheduler(REPO / "scheduler-config" / "lockstep.yaml",
                                name="lockstep-scheduler", extender_url=url)
        else:
            bed.start_scheduler(None, name="kube-scheduler")
        kube.ensure_namespace(ns)
        rack_of = {n["metadata"]["name"]: n["metadata"]["labels"]["lockstep.dev/rack"]
                   for n in kube.list("/api/v1/nodes")}
        t0 = time.monotonic()
        pending = list(gangs)
        by_name = {g.name: g for g in gangs}
        stranded: list[int] = []
        last_done = 0.0
        while time.monotonic() - t0 < budget and not all(g.done for g in gangs):
            now = time.monotonic() - t0
            while pending and pending[0].arrival <= now:
                for p in _pods(pending.pop(0), ns, lockstep):
                    kube.create_pod(p)
            bound: dict[str, list[str]] = {}
            used: dict[str, int] = dict.fromkeys(rack_of, 0)
            for p in kube.pods(ns):
                node = p["spec"].get("nodeName")
                if not node or p["metadata"].get("deletionTimestamp"):
                    continue
                name = p["metadata"]["name"].rsplit("-", 1)[0]
                bound.setdefault(name, []).append(node)
                used[node] += by_name[name].gpus
            stranded.append(sum(NODE_GPUS - u for u in used.values() if 0 < u < NODE_GPUS))
            for g in gangs:
                if g.done or g.arrival > now:
                    continue
                nodes = bound.get(g.name, [])
                if g.bound_at is None:
                    if len(nodes) == g.members:
                        g.bound_at = now
                        g.racks = {rack_of[n] for n in nodes}
                        g.one_rack_possible = _fits_one_rack(g, nodes, used, rack_of)
                        g.partial_since = None
                    elif nodes:
                        g.partial_since = g.partial_since if g.partial_since is not None else now
                        if now - g.partial_since > 2.0:
                            g.ever_partial = True
                    else:
                        g.partial_since = None
                elif now - g.bound_at >= g.runtime:
                    for i in range(g.members):
                        kube.delete_pod(ns, f"{g.name}-{i}")
                    g.done = True
                    last_done = now
            time.sleep(0.25)
        kube.close()
    fits_rack = [g for g in gangs if g.one_rack_possible]
    one_rack = sum(1 for g in fits_rack if len(g.racks) == 1)
    return {
        "scheduler": "kube-scheduler + Lockstep" if lockstep else "kube-scheduler alone",
        "gangs": len(gangs),
        "completed": sum(1 for g in gangs if g.done),
        "one_rack_share": f"{100.0 * one_rack / len(fits_rack):.0f}% ({one_rack}/{len(fits_rack)})"
        if fits_rack else "n/a",
        "one_rack_ratio": one_rack / len(fits_rack) if fits_rack else None,
        "stranded_gpus_mean": round(sum(stranded) / max(1, len(stranded)), 1),
        "waited": sum(1 for g in gangs if g.bound_at is None or g.bound_at - g.arrival > 2.0),
        "partial": sum(1 for g in gangs if g.ever_partial),
        "never_placed": sum(1 for g in gangs if g.bound_at is None),
        "makespan_s": round(last_done, 1) if all(g.done for g in gangs) else f">{budget:.0f}",
    }


def run(quick: bool = False, seed: int = 7) -> dict[str, Any]:
    ensure_bins()
    count, budget = (20, 60.0) if quick else (60, 150.0)
    rows = []
    for lockstep in (False, True):
        rows.append(_run_one(lockstep, workload(seed, count), budget))
    return {"seed": seed, "topology": "bench-64x8", "budget_s": budget, "rows": rows}
