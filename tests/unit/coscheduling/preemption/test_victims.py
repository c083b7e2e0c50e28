"""Gang-aware preemption: the pure victim choice and the in-flight book.

The capacity is the real one (a :class:`ClusterStore` with bound pods, a :class:`Ledger`,
:class:`Capacity` over both), so "fits" here is exactly what admission would say.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import victims as bench_victims
from coscheduling.placement.capacity import Capacity
from coscheduling.placement.planner import Member, NoFit, Plan, plan_gang
from coscheduling.podgroup import GangKey
from coscheduling.preemption.freed import freed_view
from coscheduling.preemption.inflight import (
    DEFAULT_MARGIN,
    AlreadyInFlight,
    BeingEvicted,
    Completed,
    InFlight,
    PreemptionBook,
    PreemptionExpired,
    PreemptorId,
)
from coscheduling.preemption.units import (
    AlreadyFits,
    Candidate,
    Cost,
    NoLowerPriority,
    NoPreemption,
    PolicyNever,
    PreemptionPolicy,
    Preemptor,
    Victims,
    WouldNotFit,
    describe,
)
from coscheduling.preemption.victims import Unfinished, VictimSearch, choose_victims
from coscheduling.records import NodeName, PodKey, PodRecord, node_from_json, pod_key
from coscheduling.state.cluster import ClusterStore
from coscheduling.state.ledger import Ledger, Reservation
from coscheduling.topology.domains import DEFAULT_LEVELS, GPU, domain_of, level_by_name
from tests.builders import node

LEVELS = DEFAULT_LEVELS
RACK = level_by_name(LEVELS, "rack")


# ---------------------------------------------------------------------------- builders


@dataclass(frozen=True)
class N:
    """A node: GPUs, and a rack when it has one."""

    name: str
    gpus: int = 4
    rack: str | None = None


@dataclass(frozen=True)
class B:
    """A bound pod: a candidate victim (or not, by its priority)."""

    name: str
    node: str
    gpus: int
    prio: int
    gang: str | None = None
    started: float = 0.0
    pdb: bool = False
    """A budget of its own that allows no disruption."""
    budget: tuple[str, int] | None = None
    """A shared budget (key, disruptions allowed now)."""
    grace: float = 30.0
    quota: str | None = None


def record(name: str, gpus: int, node_name: str | None = None, prio: int = 0) -> PodRecord:
    return PodRecord(
        namespace="default", name=name, uid=f"uid-{name}",
        requests={GPU: gpus, "pods": 1} if gpus else {"cpu": 100, "pods": 1},
        labels={}, annotations={}, scheduler_name="lockstep",
        node_name=NodeName(node_name) if node_name else None,
        phase="Running" if node_name else "Pending", priority=prio,
    )


def world(nodes: list[N], bound: list[B], reserved: dict[str, int] | None = None
          ) -> tuple[Capacity, list[Candidate]]:
    """Nodes, bound pods, and GPUs reserved in the ledger by another gang per node (which
    can exceed what is free: the room held for a preemptor while its victims terminate)."""
    store = ClusterStore(levels=LEVELS)
    ledger = Ledger()
    for n_name, gpus in (reserved or {}).items():
        ledger.reserve(Reservation(pod_key("other", f"r-{n_name}"), GangKey("other/held"),
                                   NodeName(n_name), {GPU: gpus}))
    for n in nodes:
        b = node(n.name).gpus(n.gpus)
        if n.rack is not None:
            b = b.rack(n.rack)
        store.put_node(node_from_json(b.build()))
    cands = []
    for p in bound:
        rec = record(p.name, p.gpus, p.node, p.prio)
        store.put_pod(rec)
        cands.append(Candidate(
            key=rec.key, node=NodeName(p.node), requests=rec.requests, priority=p.prio,
            gang=GangKey(f"default/{p.gang}") if p.gang else None, started=p.started,
            budgets=((f"default/own-{p.name}", 0),) * p.pdb + ((p.budget,) if p.budget else ()),
            grace_seconds=p.grace, quota=p.quota,
        ))
    return Capacity(store, ledger), cands


def gang(members: int, gpus: int, prio: int = 10, *, required: str | None = None,
         policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER_PRIORITY,
         name: str = "hi") -> Preemptor:
    lv = level_by_name(LEVELS, required) if required else None
    return Preemptor(
        name=f"default/{name}",
        members=tuple(Member(record(f"{name}-{i}", gpus, prio=prio)) for i in range(members)),
        priority=prio, policy=policy, required=lv, gang=GangKey(f"default/{name}"),
    )


def plain(gpus: int, prio: int = 10) -> Preemptor:
    return Preemptor(name="default/solo", members=(Member(record("solo", gpus, prio=prio)),),
                     priority=prio)


def keys(*names: str) -> tuple[PodKey, ...]:
    return tuple(sorted(pod_key("default", n) for n in names))


def evicted(result: Victims | NoPreemption) -> tuple[PodKey, ...]:
    if not isinstance(result, Victims):
        pytest.fail(describe(result))
    return tuple(p.key for p in result.evict)


FULL4 = [N("n1"), N("n2")]


# ---------------------------------------------------------------------------- which victims


@pytest.mark.parametrize(("nodes", "bound", "preemptor", "want_evict"), [
    pytest.param(
        FULL4, [B("lo-0", "n1", 4, 1, "lo"), B("lo-1", "n2", 4, 1, "lo")], gang(1, 4),
        keys("lo-0", "lo-1"),
        id="a victim gang is taken whole, every member on every node"),
    pytest.param(
        FULL4, [B("same", "n1", 4, 10), B("lower", "n2", 4, 9)], gang(1, 4),
        keys("lower"),
        id="strictly lower priority only: the equal-priority pod stays"),
    pytest.param(
        [N("n1"), N("n2"), N("n3")],
        [B("g-0", "n1", 4, 1, "g"), B("g-1", "n2", 4, 11, "g"), B("p", "n3", 4, 9)],
        gang(1, 4), keys("p"),
        id="one member of higher priority protects its whole gang"),
    pytest.param(
        FULL4, [B("pdb", "n1", 4, 1, pdb=True), B("free", "n2", 4, 3)], gang(1, 4),
        keys("free"),
        id="order 1: fewest PodDisruptionBudget violations, before priority"),
    pytest.param(
        [N("n1"), N("n2"), N("n3")],
        [B("a", "n1", 4, 1, budget=("default/x", 1)), B("b", "n2", 4, 1, budget=("default/x", 1)),
         B("c", "n3", 4, 5)], gang(2, 4),
        keys("a", "c"),
        id="order 1: a budget allowing one disruption is spent by the first of its victims"),
    pytest.param(
        [N("n1"), N("n2"), N("n3")],
        [B("a", "n1", 4, 5), B("b", "n2", 4, 1), B("c", "n3", 4, 1)], gang(2, 4),
        keys("b", "c"),
        id="order 2 across nodes the first plan did not pick: the dearer pod is spared"),
    pytest.param(
        FULL4, [B("three", "n1", 4, 3), B("two", "n2", 4, 2)], gang(1, 4),
        keys("two"),
        id="order 2: the lowest highest-victim priority"),
    pytest.param(
        FULL4, [B("a", "n1", 2, 1), B("b", "n1", 2, 1), B("big", "n2", 4, 1)], gang(1, 4),
        keys("big"),
        id="order 3: fewest victim units, before GPUs"),
    pytest.param(
        [N("n1"), N("n2"), N("n3")],
        [B("g-0", "n1", 4, 1, "g"), B("g-1", "n2", 4, 1, "g"), B("p", "n3", 4, 1)],
        gang(1, 4), keys("p"),
        id="order 4: fewest GPUs, a gang counting all its members"),
    pytest.param(
        FULL4, [B("old", "n1", 4, 1, started=100.0), B("new", "n2", 4, 1, started=200.0)],
        gang(1, 4), keys("new"),
        id="order 5: the most recently started"),
    pytest.param(
        FULL4, [B("keep", "n1", 2, 11), B("lo", "n1", 2, 1), B("n2", "n2", 4, 3)],
        gang(1, 2), keys("lo"),
        id="only what is needed: one 2-GPU victim next to a pod it may not touch"),
    pytest.param(
        [N("n1"), N("n2"), N("n3"), N("n4")],
        [B("p1", "n1", 4, 1), B("p2", "n2", 4, 2), B("p3", "n3", 4, 3), B("p4", "n4", 4, 4)],
        gang(2, 4), keys("p1", "p2"),
        id="a spread gang evicts the lowest priorities it needs, no more"),
    pytest.param(
        [N("n1"), N("n2"), N("n3")],
        [B(f"{n}-{i}", n, 2, 1, started=float(i)) for n in ("n1", "n2", "n3") for i in (1, 2)],
        plain(4), keys("n1-1", "n1-2"),
        id="a plain pod: victims on one node only"),
    pytest.param(
        FULL4, [B("kueue", "n1", 4, 1, quota="team-a/q"), B("mine", "n2", 4, 2)],
        gang(1, 4), keys("mine"),
        id="never across quota lines: a pod under another quota stays"),
    pytest.param(
        FULL4, [B("hi-9", "n1", 4, 1, "hi"), B("other", "n2", 4, 1)], gang(1, 4),
        keys("other"),
        id="the preemptor's own bound members are never its victims"),
])
def test_victims(nodes: list[N], bound: list[B], preemptor: Preemptor,
                 want_evict: tuple[PodKey, ...]) -> None:
    view, cands = world(nodes, bound)
    got = choose_victims(preemptor, cands, view, LEVELS)
    assert evicted(got) == want_evict
    assert isinstance(got, Victims)
    assert set(got.plan.assignments) == {m.key for m in preemptor.members}
    assert isinstance(plan_gang(list(preemptor.members), freed_view(view, LEVELS, got.evict),
                                LEVELS, required=preemptor.required), Plan)


def test_an_over_reserved_node_lends_nothing_to_the_others() -> None:
    """n1's room is held for somebody else beyond what is free (its pod terminating for
    another preemptor): evicting there frees nothing usable, and its deficit does not hide
    the room the other nodes have."""
    view, cands = world([N("n1"), N("n2"), N("n3")],
                        [B("x", "n1", 4, 1), B("a", "n2", 4, 1), B("b", "n3", 2, 1)],
                        reserved={"n1": 4})
    assert view.free_gpus(NodeName("n1")) == -4
    got = choose_victims(gang(2, 4), cands, view, LEVELS)
    assert evicted(got) == keys("a", "b")


def test_victims_reports_gangs_pods_and_freed() -> None:
    view, cands = world([N("n1"), N("n2"), N("n3")],
                        [B("g-0", "n1", 4, 1, "g"), B("g-1", "n2", 4, 1, "g"),
                         B("p", "n3", 2, 1), B("q", "n3", 2, 1)])
    got = choose_victims(gang(3, 4), cands, view, LEVELS)
    assert isinstance(got, Victims)
    assert got.gangs == (GangKey("default/g"),)
    assert got.pods == keys("p", "q")
    assert got.freed == {"n1": {GPU: 4, "pods": 1}, "n2": {GPU: 4, "pods": 1},
                         "n3": {GPU: 4, "pods": 2}}
    assert got.cost == Cost(pdb_violations=0, highest_priority=1, units=3, gpus=12,
                            neg_earliest_start=-0.0)
    assert sorted(got.plan.assignments.values()) == ["n1", "n2", "n3"]


# ---------------------------------------------------------------------------- topology


RACKS = [N("n1", rack="r1"), N("n2", rack="r1"), N("n3", rack="r2"), N("n4", rack="r2")]


@pytest.mark.parametrize(("nodes", "bound", "preemptor", "want"), [
    pytest.param(
        RACKS,
        [B("cheap1", "n1", 4, 1), B("keep", "n2", 4, 11), B("cheap3", "n3", 4, 1),
         B("dear", "n4", 4, 4)],
        gang(2, 4, required="rack"), keys("cheap3", "dear"),
        id="topology-required rack: one rack, though a spread pair would be cheaper"),
    pytest.param(
        RACKS,
        [B("cheap1", "n1", 4, 1), B("keep", "n2", 4, 11), B("cheap3", "n3", 4, 1),
         B("dear", "n4", 4, 4)],
        gang(2, 4), keys("cheap3", "dear"),
        id="tightest domain preferred: a gang without a required level still packs a rack"),
    pytest.param(
        RACKS,
        [B("cheap1", "n1", 4, 1), B("keep2", "n2", 4, 11), B("cheap3", "n3", 4, 1),
         B("keep4", "n4", 4, 11)],
        gang(2, 4), keys("cheap1", "cheap3"),
        id="no rack can be freed: a gang without a required level spreads"),
    pytest.param(
        [N("big", gpus=8, rack="r1"), N("n2", rack="r2"), N("n3", rack="r2")],
        [B("whole", "big", 8, 5), B("h2", "n2", 4, 1), B("h3", "n3", 4, 1)],
        gang(2, 4), keys("whole"),
        id="tightest domain preferred: one node over a rack of cheaper victims"),
])
def test_topology(nodes: list[N], bound: list[B], preemptor: Preemptor,
                  want: tuple[PodKey, ...]) -> None:
    view, cands = world(nodes, bound)
    got = choose_victims(preemptor, cands, view, LEVELS)
    assert evicted(got) == want
    assert isinstance(got, Victims)
    if preemptor.required is not None:
        idx = LEVELS.index(preemptor.required)
        doms = {domain_of(LEVELS, idx, view.nodes[n]) for n in got.plan.assignments.values()}
        assert len(doms) == 1


# ---------------------------------------------------------------------------- never


@pytest.mark.parametrize(("nodes", "bound", "preemptor", "want"), [
    pytest.param(
        FULL4, [B("a", "n1", 4, 1), B("b", "n2", 4, 1)],
        gang(1, 4, policy=PreemptionPolicy.NEVER),
        PolicyNever("default/hi"),
        id="preemptionPolicy Never"),
    pytest.param(
        FULL4, [B("a", "n1", 4, 10), B("b", "n2", 4, 12)], gang(1, 4),
        NoLowerPriority("default/hi", 10, bound=2, lowest=10),
        id="equal priority is never a victim"),
    pytest.param(
        FULL4, [], gang(2, 4),
        AlreadyFits,
        id="nothing to do when it fits"),
    pytest.param(
        [N("n1"), N("n2"), N("n3")],
        [B("g-0", "n1", 4, 1, "g"), B("g-1", "n2", 4, 20, "g"), B("x", "n3", 4, 20)],
        gang(1, 4), NoLowerPriority("default/hi", 10, bound=3, lowest=1),
        id="a gang with a higher-priority member is no victim at all"),
])
def test_no_preemption(nodes: list[N], bound: list[B], preemptor: Preemptor,
                       want: object) -> None:
    view, cands = world(nodes, bound)
    got = choose_victims(preemptor, cands, view, LEVELS)
    if isinstance(want, type):
        assert isinstance(got, want)
    else:
        assert got == want
    assert not isinstance(got, Victims)
    assert describe(got)


@pytest.mark.parametrize(("nodes", "bound", "preemptor", "want_units", "want_fit"), [
    pytest.param(
        FULL4, [B("a", "n1", 4, 1), B("b", "n2", 4, 1)], gang(3, 4), 2, 2,
        id="too big for the cluster: nothing evicted"),
    pytest.param(
        FULL4, [B("lo", "n1", 4, 1), B("hi", "n2", 4, 11)], gang(2, 4), 1, 1,
        id="would fit only by also evicting a higher priority: nothing evicted"),
    pytest.param(
        RACKS,
        [B("a", "n1", 4, 1), B("k2", "n2", 4, 11), B("c", "n3", 4, 1), B("k4", "n4", 4, 11)],
        gang(2, 4, required="rack"), 2, 2,
        id="fits only spread, and rack is required: nothing evicted"),
])
def test_would_not_fit(nodes: list[N], bound: list[B], preemptor: Preemptor,
                       want_units: int, want_fit: int) -> None:
    view, cands = world(nodes, bound)
    got = choose_victims(preemptor, cands, view, LEVELS)
    assert isinstance(got, WouldNotFit)
    assert got.units == want_units
    assert got.nofit.free_units == want_fit
    assert "nothing evicted" in describe(got)


def test_domains_tried_is_a_bound_not_a_correctness_switch() -> None:
    """With one domain tried per level the answer may be costlier, never wrong."""
    nodes = [N(f"n{i}") for i in range(12)]
    bound = [B(f"p{i}", f"n{i}", 4, i % 5 + 1) for i in range(12)]
    view, cands = world(nodes, bound)
    best = choose_victims(gang(1, 4), cands, view, LEVELS)
    narrow = choose_victims(gang(1, 4), cands, view, LEVELS, domains_tried=1)
    assert isinstance(best, Victims) and isinstance(narrow, Victims)
    assert best.cost.highest_priority == 1
    assert best.cost <= narrow.cost


def test_a_search_in_slices_chooses_what_one_go_chooses_and_keeps_to_its_budget() -> None:
    """The search runs in slices of bounded work (one per sweep).
    Sliced, it decides exactly as in one go; every slice stays within the budget unless it
    ran a single piece (a piece is never cut)."""
    view, cands = bench_victims.cluster(nodes=200)
    for members, prio, required in ((1, 6, None), (4, 6, "rack"), (16, 7, "rack"),
                                    (8, 6, None)):
        pre = Preemptor("default/hi", tuple(Member(bench_victims._pod(f"hi-{i}", 8, None, prio))
                                            for i in range(members)), prio,
                        required=level_by_name(LEVELS, required) if required else None,
                        gang=GangKey("default/hi"))
        whole = choose_victims(pre, cands, view, LEVELS)
        search = VictimSearch(pre, cands, view, LEVELS)
        got = search.advance(2000)
        while isinstance(got, Unfinished):
            assert got.slice_work <= 2000 or got.slice_steps == 1, got
            got = search.advance(2000)
        assert got == whole, (members, required)
        assert search.slices > 3, (members, required, search.slices)


# ---------------------------------------------------------------------------- property


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[N], list[B], Preemptor, dict[str, int]]:
    n_nodes = draw(st.integers(1, 6))
    nodes = [N(f"n{i}", gpus=draw(st.sampled_from([2, 4, 8])),
               rack=draw(st.sampled_from([None, "r0", "r1"]))) for i in range(n_nodes)]
    bound: list[B] = []
    for nd in nodes:
        left = nd.gpus
        while left > 0 and draw(st.integers(0, 5)) > 0:  # mostly full: preemption is needed
            g = draw(st.integers(1, left))
            left -= g
            bound.append(B(
                f"p{len(bound)}", nd.name, g, draw(st.integers(0, 6)),
                gang=draw(st.sampled_from([None, None, "g0", "g1", "g2"])),
                started=float(draw(st.integers(0, 5))), pdb=draw(st.booleans()),
                quota=draw(st.sampled_from([None, None, None, "ns/q"])),
            ))
    pre = gang(draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 7)),
               required=draw(st.sampled_from([None, None, "rack", "hostname"])))
    reserved = {nd.name: draw(st.integers(1, nd.gpus)) for nd in nodes
                if draw(st.integers(0, 4)) == 0}
    return nodes, bound, pre, reserved


def fits_without(preemptor: Preemptor, view: Capacity, evict: list[Candidate],
                 level: str | None = None, domain: tuple[str, ...] | None = None) -> bool:
    """The planner, on its own, places the gang once ``evict`` are gone; within one
    ``domain`` of ``level`` when given."""
    lv = level_by_name(LEVELS, level) if level is not None else preemptor.required
    within = None
    if lv is not None and domain is not None:
        idx = LEVELS.index(lv)
        within = [n for n, rec in view.nodes.items() if domain_of(LEVELS, idx, rec) == domain]
    got = plan_gang(list(preemptor.members), freed_view(view, LEVELS, evict, within), LEVELS,
                    required=lv)
    return isinstance(got, Plan)


def check_plan(preemptor: Preemptor, view: Capacity, v: Victims) -> None:
    """The plan fits the freed capacity node by node, by arithmetic of its own."""
    use: dict[NodeName, dict[str, int]] = {}
    reqs = {m.key: m.pod.requests for m in preemptor.members}
    for k, n in v.plan.assignments.items():
        for r, q in reqs[k].items():
            use.setdefault(n, {})[r] = use.setdefault(n, {}).get(r, 0) + q
    for n, want in use.items():
        free = view.free_for_gang(NodeName(n))
        back = v.freed.get(NodeName(n), {})
        for r, q in want.items():
            assert q <= free.get(r, 0) + back.get(r, 0), (n, r)
    if preemptor.required is not None:
        # Held by one domain of the required level or of a finer one (a single node holds
        # a gang "within one rack" whether or not the node carries a rack label).
        idx = LEVELS.index(preemptor.required)
        assert any(len({domain_of(LEVELS, i, view.nodes[NodeName(n)]) for n in use} - {None})
                   == 1 and all(domain_of(LEVELS, i, view.nodes[NodeName(n)]) is not None
                                for n in use)
                   for i in range(idx, len(LEVELS)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_property_any_decision_is_sound_and_minimal(
        case: tuple[list[N], list[B], Preemptor, dict[str, int]]) -> None:
    nodes, bound, pre, reserved = case
    view, cands = world(nodes, bound, reserved)
    got = choose_victims(pre, cands, view, LEVELS)
    search = VictimSearch(pre, cands, view, LEVELS)  # one piece of work per slice
    sliced = search.advance(1)
    while isinstance(sliced, Unfinished):
        sliced = search.advance(1)
    assert sliced == got
    prio = pre.priority
    by_gang: dict[GangKey, set[PodKey]] = {}
    for c in cands:
        if c.gang is not None:
            by_gang.setdefault(c.gang, set()).add(c.key)
    def ok(c: Candidate) -> bool:
        return c.priority < prio and c.quota == pre.quota

    eligible = [c for c in cands if c.gang != pre.gang and ok(c)
                and (c.gang is None or all(ok(o) for o in cands if o.gang == c.gang))]
    if isinstance(got, Victims):
        keys_ = {p.key for p in got.evict}
        # (a) strictly lower priority only, same quota, never the preemptor's own gang
        assert all(p.priority < prio for p in got.evict)
        assert all(p.quota == pre.quota for p in got.evict)
        assert all(p.gang != pre.gang for p in got.evict)
        # (b) every bound member of each victim gang
        for g in got.gangs:
            assert by_gang[g] <= keys_
        assert {p.gang for p in got.evict if p.gang is not None} == set(got.gangs)
        # (c) the preemptor fits, by the planner and by arithmetic
        assert fits_without(pre, view, list(got.evict))
        check_plan(pre, view, got)
        # (d) minimal, under the rule order: topology comes first, so without any one
        # victim unit the gang no longer fits in the domain the decision chose (it may
        # still fit spread wider, which the rules rank below the tighter placement)
        for u in got.units:
            rest = [p for p in got.evict if p not in u.pods]
            assert not fits_without(pre, view, rest, got.level, got.domain), u.key
        assert len(got.units) >= 1
    elif isinstance(got, WouldNotFit):
        assert not fits_without(pre, view, eligible)
    elif isinstance(got, NoLowerPriority):
        assert not eligible
    elif isinstance(got, AlreadyFits):
        assert fits_without(pre, view, [])
    else:
        pytest.fail(f"unexpected {got}")


# ---------------------------------------------------------------------------- in flight


def decided() -> tuple[Victims, dict[PodKey, dict[str, int]]]:
    view, cands = world(FULL4, [B("lo-0", "n1", 4, 1, "lo", grace=60.0),
                                B("lo-1", "n2", 4, 1, "lo", grace=10.0)])
    pre = gang(1, 4)
    got = choose_victims(pre, cands, view, LEVELS)
    assert isinstance(got, Victims)
    return got, {m.key: m.pod.requests for m in pre.members}


HI = PreemptorId.of_gang(GangKey("default/hi"))


def test_in_flight_lifecycle_completes_when_every_victim_is_gone() -> None:
    v, reqs = decided()
    book = PreemptionBook()
    rec = book.start(preemptor=HI, gang=GangKey("default/hi"), priority=10,
                     victims=v, requests=reqs, now=100.0)
    assert isinstance(rec, InFlight)
    assert rec.deadline == 100.0 + 60.0 + DEFAULT_MARGIN
    assert rec.slots[0].pod == pod_key("default", "hi-0")
    assert rec.slots[0].requests == {GPU: 4, "pods": 1}
    assert book.terminating() == set(keys("lo-0", "lo-1"))
    assert book.next_deadline() == rec.deadline
    assert book.gone([pod_key("default", "lo-0")]) == []
    assert book.terminating() == {pod_key("default", "lo-1")}
    done = book.gone([pod_key("default", "lo-1")])
    assert [type(d) for d in done] == [Completed]
    assert len(book) == 0 and book.terminating() == frozenset()
    assert book.evicting(GangKey("default/lo")) is None


def test_in_flight_expires_and_gives_back() -> None:
    v, reqs = decided()
    book = PreemptionBook()
    rec = book.start(preemptor=HI, gang=GangKey("default/hi"), priority=10,
                     victims=v, requests=reqs, now=0.0)
    assert isinstance(rec, InFlight)
    book.gone([pod_key("default", "lo-1")])
    assert book.expire(rec.deadline - 0.001) == []
    out = book.expire(rec.deadline)
    assert len(out) == 1 and isinstance(out[0], PreemptionExpired)
    assert out[0].still_there == {pod_key("default", "lo-0")}
    assert len(book) == 0 and book.next_deadline() is None


def test_one_in_flight_per_gang_and_victims_wait() -> None:
    v, reqs = decided()
    book = PreemptionBook()
    first = book.start(preemptor=HI, gang=GangKey("default/hi"), priority=10,
                       victims=v, requests=reqs, now=0.0)
    assert isinstance(first, InFlight)
    again = book.start(preemptor=HI, gang=GangKey("default/hi"), priority=10,
                       victims=v, requests=reqs, now=1.0)
    assert again == AlreadyInFlight(first)
    # The victim gang, recreated, waits; and cannot preempt in turn while it is evicted.
    assert book.evicting(GangKey("default/lo")) == first
    lo = GangKey("default/lo")
    assert book.may_start(PreemptorId.of_gang(lo), lo) == BeingEvicted(lo, first)
    assert book.cancel(HI) == first
    assert book.may_start(PreemptorId.of_gang(lo), lo) is None


def test_a_gang_and_a_plain_pod_of_one_name_have_a_record_each() -> None:
    """A defect found: records were keyed by ``str(key)``, so the gang ``default/hi`` and the plain
    pod ``default/hi`` shared one: the pod's start was refused as the gang's own in flight,
    and the gang was told "Preempting" from the pod's record."""
    v, reqs = decided()
    book = PreemptionBook()
    gang = book.start(preemptor=HI, gang=GangKey("default/hi"), priority=10, victims=v,
                      requests=reqs, now=0.0)
    assert isinstance(gang, InFlight)
    pod = PreemptorId.of_pod(pod_key("default", "hi"))
    assert book.get(pod) is None and book.may_start(pod, None) is None
    assert book.cancel(pod) is None and book.get(HI) == gang


def test_no_eviction_loop_between_two_gangs() -> None:
    """A evicts B only if A is strictly higher; B can then never choose A."""
    view, cands = world(FULL4, [B("a-0", "n1", 4, 5, "a"), B("b-0", "n2", 4, 5, "b")])
    for name in ("a", "b"):
        pre = gang(1, 4, prio=5, name=name)
        assert isinstance(choose_victims(pre, cands, view, LEVELS), NoLowerPriority)


def test_describe_names_what_to_change() -> None:
    nofit = NoFit(members=3, shape={GPU: 4}, free_units=5, eligible_nodes=2,
                  required_level="rack", widest_domain_fit=2)
    text = describe(WouldNotFit("default/hi", 10, 2, 2, nofit))
    assert "in one rack" in text and "2 lower-priority" in text
    # The cluster-wide count (5 of 3) would read as a contradiction: say the rack's.
    assert "at most 2 of 3 members would fit in any one rack" in text
    assert "Never" in describe(PolicyNever("default/hi"))
    assert "none is bound" in describe(NoLowerPriority("default/hi", 3, 0, None))



# ---------------------------------------------------------------------------- the what-if view


def test_freed_view_gives_back_exactly_the_leaving_pods() -> None:
    view, cands = world([N("n1", rack="r1"), N("n2", rack="r1"), N("n3", gpus=8, rack="r2")],
                        [B("a", "n1", 3, 1), B("b", "n1", 1, 1), B("c", "n3", 8, 1)])
    a, _, c = cands
    freed = freed_view(view, LEVELS, [a, c])
    assert freed.free_for_gang(NodeName("n1"))[GPU] == 3
    assert freed.free_gpus(NodeName("n1")) == 3
    assert list(freed.gpu_pods_on(NodeName("n1"))) == [1]
    assert freed.free_gpus(NodeName("n2")) == 4  # untouched
    rack = LEVELS.index(RACK) if RACK is not None else -1
    ranked = dict((d, g) for g, d in freed.domains_by_free_gpus(rack))
    assert ranked == {("", "b0", "r1"): 7, ("", "b0", "r2"): 8}
    assert list(freed.domains_by_free_gpus(rack)) == sorted(
        freed.domains_by_free_gpus(rack))
    # Limited to one rack: only its nodes, and its domains.
    within = freed_view(view, LEVELS, [a, c], within=[NodeName("n1"), NodeName("n2")])
    assert sorted(within.nodes) == ["n1", "n2"]
    assert list(within.domains(rack)) == [("", "b0", "r1")]
    assert list(within.domains_by_free_gpus(rack)) == [(7, ("", "b0", "r1"))]
    # The base view is untouched.
    assert view.free_gpus(NodeName("n1")) == 0
