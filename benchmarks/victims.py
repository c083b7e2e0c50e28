"""The preemption decision alone: how long ``choose_victims`` takes on a big cluster, and
how good a victim set it finds.

No test bed: the pure core on a synthetic 5,000-node cluster (8 GPUs per node, 20-node racks,
500-node blocks, two zones), full of bound pods. About 30% of nodes share a 2-member gang
with the next node of the rack; the rest of each node is filled with 1, 2 or 4-GPU plain
pods. Priorities (0-5 for gang members, 0-9 for plain pods) and start times are random from
a fixed seed, and 10% of plain pods sit under a PodDisruptionBudget of their own that allows
no disruption. Each preemptor is decided once, the cluster unchanged between them.

The decision runs on Lockstep's event loop. Each preemptor is decided twice: in one go
(``choose_victims``: its time is what filter calls would wait for if the search ran
unbounded), and as the core runs it, in slices of at most ``SEARCH_BUDGET`` units of work
(``VictimSearch``), one slice per sweep: the longest slice is the longest the event loop is
held, the number of slices how many sweeps the decision takes. Both must choose the same
set (the cluster does not change between slices here). The cost (budget violations,
highest victim priority, units, GPUs) is what the search optimises, in that order.
"""

from __future__ import annotations

import random
import time
from typing import Any

from coscheduling.placement.capacity import Capacity
from coscheduling.placement.planner import Member
from coscheduling.preemption.units import Candidate, Preemptor, Victims, describe
from coscheduling.preemption.victims import SEARCH_BUDGET, Unfinished, VictimSearch, choose_victims
from coscheduling.records import GangKey, NodeName, PodRecord, node_from_json
from coscheduling.state.cluster import ClusterStore
from coscheduling.state.ledger import Ledger
from coscheduling.topology.domains import DEFAULT_LEVELS, GPU, level_by_name

__all__ = ["CASES", "TABLE_COLUMNS", "run"]

CASES: tuple[tuple[int, int, int, str | None], ...] = (
    (1, 8, 6, None), (4, 8, 6, "rack"), (16, 8, 7, "rack"), (8, 8, 6, None),
    (40, 8, 10, None), (64, 8, 10, "block"))
"""(members, GPUs each, priority, required level) of each preemptor."""

TABLE_COLUMNS = (("preemptor", "preemptor"), ("seconds", "s in one go"),
                 ("cpu_seconds", "CPU s"), ("slices", "slices"),
                 ("longest_slice_ms", "longest slice ms"),
                 ("longest_slice_cpu_ms", "its CPU ms"), ("same_in_slices", "same set"),
                 ("units", "victim units"),
                 ("pods", "victim pods"), ("pdb_violations", "PDB violations"),
                 ("highest_priority", "highest victim priority"), ("gpus", "victim GPUs"),
                 ("level", "level"))


def _node(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"n{i:04d}", "labels": {
                "kubernetes.io/hostname": f"n{i:04d}",
                "topology.kubernetes.io/zone": f"z{i // 2500}",
                "lockstep.dev/block": f"b{i // 500}", "lockstep.dev/rack": f"r{i // 20}"}},
            "status": {"allocatable": {GPU: "8", "cpu": "64", "memory": "512Gi",
                                       "pods": "110"}}}


def _pod(name: str, gpus: int, node: str | None, prio: int) -> PodRecord:
    return PodRecord(namespace="default", name=name, uid=f"uid-{name}",
                     requests={GPU: gpus, "pods": 1}, labels={}, annotations={},
                     scheduler_name="lockstep", node_name=NodeName(node) if node else None,
                     phase="Running" if node else "Pending", priority=prio)


def cluster(nodes: int = 5000, seed: int = 1) -> tuple[Capacity, list[Candidate]]:
    rng = random.Random(seed)
    store = ClusterStore(levels=DEFAULT_LEVELS)
    for i in range(nodes):
        store.put_node(node_from_json(_node(i)))
    cands: list[Candidate] = []

    def bind(name: str, gpus: int, node: str, prio: int, gang: str | None,
             budgets: tuple[tuple[str, int], ...] = ()) -> None:
        rec = _pod(name, gpus, node, prio)
        store.put_pod(rec)
        cands.append(Candidate(rec.key, NodeName(node), rec.requests, prio,
                               GangKey(f"default/{gang}") if gang else None,
                               rng.random() * 1000, budgets))

    gangs = 0
    for i in range(nodes):
        here = f"n{i:04d}"
        if rng.random() < 0.3 and i % 20 < 19:
            gangs += 1
            for j, nn in enumerate((here, f"n{i + 1:04d}")):
                bind(f"g{gangs}-{j}", 4, nn, rng.randint(0, 5), f"g{gangs}")
        used = store.used.get(NodeName(here), {}).get(GPU, 0)
        k = 0
        while used < 8:
            g = min(8 - used, rng.choice([1, 2, 4]))
            budgets = ((f"default/pdb-{i}-{k}", 0),) if rng.random() < 0.1 else ()
            bind(f"p{i}-{k}", g, here, rng.randint(0, 9), None, budgets)
            k += 1
            used += g
    return Capacity(store, Ledger()), cands


def sliced(pre: Preemptor, cands: list[Candidate], view: Capacity, budget: int
           ) -> tuple[object, int, float, float]:
    """The search in slices of ``budget``: its answer, the slices, and the longest slice in
    seconds, by the wall clock and in this process's CPU time (on a shared machine the wall
    clock counts other processes' turns too; CPU time is what one core spends)."""
    search = VictimSearch(pre, cands, view, DEFAULT_LEVELS)
    wall = cpu = 0.0
    while True:
        t0, c0 = time.perf_counter(), time.process_time()
        got = search.advance(budget)
        wall = max(wall, time.perf_counter() - t0)
        cpu = max(cpu, time.process_time() - c0)
        if not isinstance(got, Unfinished):
            return got, search.slices, wall, cpu


def run(nodes: int = 5000, cases: tuple[tuple[int, int, int, str | None], ...] = CASES,
        budget: int = SEARCH_BUDGET) -> dict[str, Any]:
    view, cands = cluster(nodes)
    rows = []
    for members, gpus, prio, required in cases:
        pre = Preemptor(
            name="default/hi",
            members=tuple(Member(_pod(f"hi-{i}", gpus, None, prio)) for i in range(members)),
            priority=prio, required=level_by_name(DEFAULT_LEVELS, required) if required else None,
            gang=GangKey("default/hi"))
        t0, c0 = time.perf_counter(), time.process_time()
        got = choose_victims(pre, cands, view, DEFAULT_LEVELS)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        again, slices, longest, longest_cpu = sliced(pre, cands, view, budget)
        row: dict[str, Any] = {"preemptor": f"{members} x {gpus} GPUs, priority {prio}, "
                                            f"required {required or 'none'}",
                               "seconds": round(dt, 3), "cpu_seconds": round(cpu, 3),
                               "slices": slices,
                               "longest_slice_ms": round(longest * 1000, 1),
                               "longest_slice_cpu_ms": round(longest_cpu * 1000, 1),
                               "same_in_slices": again == got}
        if isinstance(got, Victims):
            row.update(units=len(got.units), pods=len(got.evict),
                       pdb_violations=got.cost.pdb_violations,
                       highest_priority=got.cost.highest_priority, gpus=got.cost.gpus,
                       level=got.level)
        else:
            row.update(level="no set (see why)", why=describe(got))
        rows.append(row)
    return {"nodes": nodes, "candidates": len(cands), "budget": budget, "rows": rows}
