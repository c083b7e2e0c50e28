"""A victim search lists its candidates inside its budget: no sweep reads more of the
cluster's pods than the budget allows, however many pods are bound. Work is counted (pods
measured by ``unit_priority``), never timed."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import Coscheduler, Settings, gang_key, node_from_json, pod_from_json, pod_key
from coscheduling.corestate import CoreState
from coscheduling.events import ingest
from coscheduling.placement.planner import Member
from coscheduling.preemption import carry
from coscheduling.preemption.carry import LIST_COST, _candidates, candidate_steps
from coscheduling.preemption.units import Preemptor, Victims
from coscheduling.preemption.victims import Unfinished, VictimSearch, choose_victims
from tests.builders import node, pod
from tests.internals import state_of

NODES = 60
PER_NODE = 4
GRAIN = 25
BUDGET = 2 * GRAIN * LIST_COST
"""Two pieces of the listing per sweep."""


def _bound(core: Coscheduler, name: str, node_name: str, prio: int,
           gang: str | None = None) -> None:
    b = pod(name).gpu(1).priority(prio)
    if gang is not None:
        b = b.gang(gang, 2, timeout=30)
    obj = b.on(node_name).build()
    obj["metadata"]["uid"] = f"uid-{name}"
    core.upsert_pod(pod_from_json(obj))


def _full_cluster() -> Coscheduler:
    """``NODES`` nodes of 4 GPUs, each full: plain pods, and a 2-member gang across every
    fifth node and the next; pending pods beside them (read, never candidates)."""
    core = Coscheduler(Settings(backoff_seconds=5))
    for i in range(NODES):
        core.upsert(ingest.NODES,
                    node_from_json(node(f"n{i:03d}").gpus(PER_NODE).rack(f"r{i // 20}")
                                   .build()))
    for i in range(NODES):
        used = 0
        if i % 5 == 0:
            for j in (0, 1):
                _bound(core, f"pair{i}-{j}", f"n{i + j:03d}", 1 + i % 3, f"pair{i}")
            used = 1
        elif i % 5 == 1:
            used = 1
        for k in range(used, PER_NODE):
            _bound(core, f"p{i}-{k}", f"n{i:03d}", k + i % 5)
    for i in range(100):
        core.upsert_pod(pod_from_json(pod(f"pending-{i}").gpu(1).build()))
    return core


def _ask(core: Coscheduler, size: int = 4) -> None:
    for i in range(size):
        obj = pod(f"high-{i}").gang("high", size, timeout=30).gpu(1).priority(100).build()
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable"}]
        core.upsert_pod(pod_from_json(obj))


class _Counter:
    """Counts ``CoreState.unit_priority`` calls: one per pod the listing measures."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = CoreState.unit_priority

        def counted(st: CoreState, p: Any, cache: Any = None) -> int:
            self.calls += 1
            return real(st, p, cache)

        monkeypatch.setattr(CoreState, "unit_priority", counted)


def test_no_sweep_of_a_victim_search_reads_more_pods_than_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the first slice listed every bound pod (and measured each twice) before the
    budget began: O(cluster) work in one call, a quarter of a second at 5,000 nodes."""
    monkeypatch.setattr(carry, "LIST_GRAIN", GRAIN)
    core = _full_cluster()
    st = state_of(core)
    pods = len(st.store.pods)
    assert pods > 5 * 2 * GRAIN  # the listing alone takes several sweeps
    st.preemption.inflight.budget = BUDGET
    _ask(core)
    counter = _Counter(monkeypatch)
    per_sweep = []
    now = 0.0
    core.admit_gated(now)
    per_sweep.append(counter.calls)
    while not (evicted := core.drain().evictions):
        counter.calls = 0
        due = core.queries.next_deadline()
        assert due is not None
        now = due
        core.expire(now)
        core.admit_gated(now)
        per_sweep.append(counter.calls)
        assert len(per_sweep) < 500
    # A slice runs pieces while they fit the budget (and always one): at most two pieces
    # of GRAIN pods, plus the few victims of the set checked before eviction.
    assert max(per_sweep) <= 2 * GRAIN + len(evicted)
    assert sum(per_sweep) >= pods  # every pod was read, over several sweeps
    assert len(per_sweep) > pods // (2 * GRAIN)
    assert {e.gang for e in evicted} <= {None} | {gang_key("default", f"pair{i}")
                                                   for i in range(0, NODES, 5)}


def test_the_listing_in_pieces_finds_what_one_go_finds(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    core = _full_cluster()
    st = state_of(core)
    whole = _candidates(st, 100)
    monkeypatch.setattr(carry, "LIST_GRAIN", 7)
    steps = candidate_steps(st, 100)
    pieces = []
    try:
        while True:
            pieces.append(next(steps))
    except StopIteration as done:
        sliced = done.value
    assert sliced == whole
    assert len(whole) == NODES * PER_NODE  # every bound pod, pairs whole; pending left out
    assert max(pieces) <= 7 * carry.RECORD_COST and len(pieces) > len(st.store.pods) // 7


def test_a_pod_gone_between_two_pieces_is_not_a_candidate(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(carry, "LIST_GRAIN", 10)
    core = _full_cluster()
    st = state_of(core)
    steps = candidate_steps(st, 100)
    next(steps)
    gone = pod_key("default", "p59-3")  # among the last pods listed
    core.delete_pod(gone, "uid-p59-3")
    try:
        while True:
            next(steps)
    except StopIteration as done:
        got = done.value
    assert gone not in {c.key for c in got}
    assert len(got) == NODES * PER_NODE - 1


def test_a_search_given_a_listing_decides_as_one_given_the_list() -> None:
    core = _full_cluster()
    st = state_of(core)
    _ask(core)
    members = tuple(Member(p) for p in st.live(st.gangs[gang_key("default", "high")]))
    pre = Preemptor("default/high", members, 100, gang=gang_key("default", "high"))
    listed = choose_victims(pre, _candidates(st, 100), st.capacity, st.settings.levels)
    search = VictimSearch(pre, lambda: candidate_steps(st, 100), st.capacity,
                          st.settings.levels)
    slices = 0
    while isinstance(got := search.advance(BUDGET), Unfinished):
        assert got.slice_work <= BUDGET or got.slice_steps == 1
        slices += 1
    assert isinstance(listed, Victims) and got == listed
    assert slices > 1


def test_no_piece_of_a_search_reads_more_candidates_than_its_grain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouping the candidates into units was one piece of O(candidates) work (68,000 units
    at 5,000 nodes, over three budgets of today's slice); now it is pieces of at most
    ``UNIT_GRAIN`` candidates. A budget of 1 runs one piece per slice, so each slice's work
    is one piece's."""
    from benchmarks.victims import _pod, cluster
    from coscheduling.preemption import victims as preemption
    from coscheduling.records import GangKey
    from coscheduling.topology.domains import DEFAULT_LEVELS

    monkeypatch.setattr(preemption, "UNIT_GRAIN", 50)
    view, cands = cluster(100)
    assert len(cands) > 6 * 50
    pre = Preemptor("default/hi", (Member(_pod("hi-0", 8, None, 6)),), 6,
                    gang=GangKey("default/hi"))
    search = VictimSearch(pre, cands, view, DEFAULT_LEVELS)
    pieces = []
    while isinstance(got := search.advance(1), Unfinished):
        assert got.slice_steps == 1
        pieces.append(got.slice_work)
    assert max(pieces) <= len(view.nodes) * preemption.BOOK_COST  # the dearest: a node pass
    assert got == choose_victims(pre, cands, view, DEFAULT_LEVELS)
