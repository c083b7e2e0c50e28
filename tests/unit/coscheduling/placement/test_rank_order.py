"""Ranked members are placed in topology order: ranks 0-3 on one node, 4-7 on the next.
The planner's nodes and counts per node are kept (only interchangeable members swap slots);
members without a rank, bound ones, ones with DRA claims or narrower candidates stay put."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from coscheduling.placement import rankorder
from coscheduling.placement.capacity import Capacity
from coscheduling.placement.planner import Member, Plan, plan_gang
from coscheduling.placement.rankorder import interchangeable, order_by_rank, slot_key
from coscheduling.records import NodeName, PodKey, node_from_json, pod_from_json
from coscheduling.state.cluster import ClusterStore
from coscheduling.state.ledger import Ledger
from coscheduling.topology.domains import DEFAULT_LEVELS, GPU
from tests.builders import node, pod
from tests.invariants import InvariantBroken, check_rank_order


def _view(names: Sequence[str], gpus: int = 4, racks: Sequence[str] | None = None) -> Capacity:
    store = ClusterStore(levels=DEFAULT_LEVELS)
    for i, n in enumerate(names):
        store.put_node(node_from_json(node(n).gpus(gpus).rack(
            racks[i] if racks else "r0").build()))
    return Capacity(store, Ledger())


def _ranked(names: Sequence[str], gpus: int = 1) -> list[Member]:
    """Members whose names sort unlike their ranks (the planner orders ties by name)."""
    return [Member(pod_from_json(pod(n).gang("g", len(names)).gpu(gpus)
                                 .annotate("lockstep.dev/rank", str(r)).build()))
            for r, n in enumerate(names)]


def _by_rank(plan: Plan, members: Sequence[Member]) -> list[NodeName]:
    return [plan.assignments[m.key] for m in sorted(members, key=lambda m: m.pod.rank or ())]


SHUFFLED = ["w-h", "w-c", "w-f", "w-a", "w-g", "w-b", "w-e", "w-d"]


def test_eight_ranks_on_two_four_gpu_nodes_fill_one_node_then_the_next() -> None:
    # node-9 before node-10: names compare with their digits as numbers.
    members = _ranked(SHUFFLED)
    plan = plan_gang(members, _view(["node-10", "node-9"]), DEFAULT_LEVELS)
    assert isinstance(plan, Plan)
    assert _by_rank(plan, members) == ["node-9"] * 4 + ["node-10"] * 4


def test_the_planner_alone_mixes_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the pass, the same gang's ranks straddle both nodes (the test above is not
    passing by luck)."""
    from coscheduling.placement import planner
    monkeypatch.setattr(planner, "order_by_rank", lambda *_: None)
    members = _ranked(SHUFFLED)
    plan = plan_gang(members, _view(["node-10", "node-9"]), DEFAULT_LEVELS)
    assert isinstance(plan, Plan)
    assert _by_rank(plan, members) != ["node-9"] * 4 + ["node-10"] * 4


def test_racks_come_in_label_order_then_nodes_in_each() -> None:
    members = _ranked([f"p{i:02d}" for i in reversed(range(16))])
    view = _view(["a", "b", "c", "d"], racks=["r1", "r0", "r1", "r0"])
    plan = plan_gang(members, view, DEFAULT_LEVELS)
    assert isinstance(plan, Plan)
    assert _by_rank(plan, members) == ["b"] * 4 + ["d"] * 4 + ["a"] * 4 + ["c"] * 4


def test_mixed_shapes_each_in_rank_order_with_the_planners_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    names = [f"m{i}" for i in range(12)]
    rng.shuffle(names)
    members = [Member(pod_from_json(pod(n).gang("g", 12).gpu(1 + (r % 2))
                                    .annotate("lockstep.dev/rank", str(r)).build()))
               for r, n in enumerate(names)]
    members.append(Member(pod_from_json(pod("unranked").gang("g", 13).gpu(1).build())))
    view = _view([f"n{i}" for i in range(5)], gpus=8)
    plan = plan_gang(members, view, DEFAULT_LEVELS)
    from coscheduling.placement import planner
    monkeypatch.setattr(planner, "order_by_rank", lambda *_: None)
    unordered = plan_gang(members, view, DEFAULT_LEVELS)
    assert isinstance(plan, Plan) and isinstance(unordered, Plan)

    def per_shape(p: Plan) -> Counter[tuple[int, NodeName]]:
        return Counter((m.pod.requests[GPU], p.assignments[m.key]) for m in members)
    assert per_shape(plan) == per_shape(unordered)  # same nodes, same counts per shape
    assert plan.assignments["default/unranked"] == unordered.assignments["default/unranked"]
    for gpus in (1, 2):
        shape = [m for m in members if m.pod.requests[GPU] == gpus and m.pod.rank is not None]
        order = [slot_key(DEFAULT_LEVELS, view.nodes[n], n) for n in _by_rank(plan, shape)]
        assert order == sorted(order)


def test_bound_parked_claims_and_narrow_candidates_never_move() -> None:
    view = _view(["n1", "n2"])
    recs = [pod_from_json(pod(f"p{i}").gang("g", 4).gpu(1)
                          .annotate("lockstep.dev/rank", str(3 - i)).build()) for i in range(4)]
    plan: dict[PodKey, NodeName] = {recs[0].key: NodeName("n1"), recs[1].key: NodeName("n1"),
                                    recs[2].key: NodeName("n2"), recs[3].key: NodeName("n2")}
    # All four free to move: ranks 0, 1 (p3, p2) take n1.
    got = order_by_rank(plan, [Member(r) for r in recs], view.nodes, DEFAULT_LEVELS)
    assert got == {recs[3].key: "n1", recs[2].key: "n1", recs[1].key: "n2", recs[0].key: "n2"}
    # p3 bound (its node is the API server's), p2 narrowed to n2 by kube-scheduler: p0 and
    # p1 already stand in rank order between themselves, so nothing moves.
    bound = pod_from_json(pod("p3").gang("g", 4).gpu(1).annotate("lockstep.dev/rank", "0")
                          .on("n2").build())
    members = [Member(recs[0]), Member(recs[1]), Member(recs[2], frozenset({NodeName("n2")})),
               Member(bound)]
    assert order_by_rank(plan, members, view.nodes, DEFAULT_LEVELS) is None
    # Fixed (parked) members are not the planner's to place: their slots are kept whole.
    fixed = {recs[3].key: NodeName("n2")}
    got_plan = plan_gang([Member(r) for r in recs[:3]], view, DEFAULT_LEVELS, fixed=fixed)
    assert isinstance(got_plan, Plan) and got_plan.assignments[recs[3].key] == "n2"
    claimed = pod_from_json(pod("c").gang("g", 4).gpu(1).annotate("lockstep.dev/rank", "0")
                            .claim(template="gpu").build())
    assert claimed.claims and interchangeable(claimed) is None
    assert interchangeable(recs[0]) is not None


def test_work_is_a_sort_per_group_not_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 ranked members on 250 nodes: each node's place in the order is computed once."""
    calls = Counter[str]()
    real = rankorder.slot_key

    def counted(levels: object, rec: object, name: NodeName) -> tuple[object, ...]:
        calls[name] += 1
        return real(DEFAULT_LEVELS, view.nodes.get(name), name)
    monkeypatch.setattr(rankorder, "slot_key", counted)
    view = _view([f"n{i}" for i in range(250)])
    members = _ranked([f"m{(i * 7919) % 1000:04d}" for i in range(1000)])
    plan = plan_gang(members, view, DEFAULT_LEVELS)
    assert isinstance(plan, Plan)
    assert len(calls) == 250 and max(calls.values()) == 1
    ranks = [slot_key(DEFAULT_LEVELS, view.nodes[n], n) for n in _by_rank(plan, members)]
    assert ranks == sorted(ranks)


def test_the_checker_finds_a_plan_out_of_rank_order() -> None:
    """Rule 18 (tests/invariants.py), as the model test applies it to every plan: it passes
    the pass's answer and fails a reversed one, a changed count and an unranked member moved."""
    view = _view(["n1", "n2"])
    members = _ranked(SHUFFLED)
    placed = {m.key: NodeName("n1" if i % 2 else "n2") for i, m in enumerate(members)}
    ordered = order_by_rank(placed, members, view.nodes, DEFAULT_LEVELS)
    assert ordered is not None
    check_rank_order(placed, ordered, members, view.nodes, DEFAULT_LEVELS)
    backwards = {m.key: ordered[r.key] for m, r in zip(members, reversed(members), strict=True)}
    with pytest.raises(InvariantBroken, match=r"rule 18: .* in topology order"):
        check_rank_order(placed, backwards, members, view.nodes, DEFAULT_LEVELS)
    with pytest.raises(InvariantBroken, match="how many of a shape"):
        check_rank_order(placed, {**ordered, members[0].key: NodeName("n2")}, members,
                         view.nodes, DEFAULT_LEVELS)
    loners = [Member(pod_from_json(pod(f"loner-{i}").gang("g", 10).gpu(1).build()))
              for i in range(2)]
    with pytest.raises(InvariantBroken, match="may not"):  # two unranked members swapped
        check_rank_order({**placed, loners[0].key: NodeName("n1"), loners[1].key: NodeName("n2")},
                         {**ordered, loners[0].key: NodeName("n2"), loners[1].key: NodeName("n1")},
                         [*members, *loners], view.nodes, DEFAULT_LEVELS)
