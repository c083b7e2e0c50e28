"""A group of groups in the core (issue 44): subgroups each whole, a minimum of them admitted
together, elastic subgroups admitted whole and alone, stages, each subgroup in its own
domain; read here through the upstream CompositePodGroup convention (1.37).

Objects are written as ``k8s.io/api@v0.37.2/scheduling/v1alpha3/types.go`` documents them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from coscheduling import Coscheduler, GangPhase, Settings, gang_key, node_from_json, pod_key
from coscheduling.conventions.composite import composite_from_json, composite_key
from coscheduling.conventions.upstream import upstream_podgroup_from_json
from coscheduling.events import ingest
from coscheduling.podgroup import GangSpec, InvalidGang, MissingPodGroup, Source
from coscheduling.reasons import WaitingForMembers
from coscheduling.records import NodeName, PodKey, pod_from_json
from tests.builders import node, pod
from tests.internals import state_of
from tests.invariants import InvariantBroken, check_invariants

NS = "default"
SET = composite_key(NS, "job")
RACK = "lockstep.dev/rack"


def composite(name: str = "job", *, min_groups: int | None = 2,
              topology: str | None = None, **spec: Any) -> dict[str, Any]:
    policy = {"basic": {}} if min_groups is None else {"gang": {"minGroupCount": min_groups}}
    body: dict[str, Any] = {"workloadRef": {"workloadName": name, "templateName": "t"},
                            "schedulingPolicy": policy, **spec}
    if topology is not None:
        body["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {"apiVersion": "scheduling.k8s.io/v1alpha3", "kind": "CompositePodGroup",
            "metadata": {"name": name, "namespace": NS}, "spec": body}


def child(name: str, min_count: int, *, parent: str = "job",
          topology: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentCompositePodGroupName": parent,
                            "workloadRef": {"workloadName": parent, "templateName": name},
                            "schedulingPolicy": {"gang": {"minCount": min_count}}}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {"apiVersion": "scheduling.k8s.io/v1alpha3", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NS, "generation": 1}, "spec": spec}


def cluster(racks: int = 3, per_rack: int = 2, gpus: int = 1) -> Coscheduler:
    """``racks`` racks of ``per_rack`` nodes of ``gpus`` GPUs."""
    core = Coscheduler(Settings(backoff_seconds=10))
    for r in range(racks):
        for i in range(per_rack):
            core.upsert(ingest.NODES, node_from_json(
                node(f"r{r}n{i}").gpus(gpus).label(RACK, f"r{r}").build()))
    return core


def put_set(core: Coscheduler, children: dict[str, int], *, min_groups: int | None = 2,
            topology: str | None = None, child_topology: str | None = None) -> None:
    core.upsert(ingest.COMPOSITES, composite_from_json(
        composite(min_groups=min_groups, topology=topology), "v1alpha3"))
    for name, n in children.items():
        core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(
            child(name, n, topology=child_topology), "v1alpha3"))


def member(core: Coscheduler, group: str, i: int, gpus: int = 1) -> PodKey:
    obj = pod(f"{group}-{i}").gpu(gpus).build()
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    core.upsert_pod(pod_from_json(obj))
    return pod_key(NS, f"{group}-{i}")


def ask(core: Coscheduler, key: PodKey, now: float = 0.0) -> list[NodeName]:
    q = core.queries
    return core.filter(q.pods[key], sorted(q.nodes), now).passed


def bind_all(core: Coscheduler, now: float = 1.0) -> None:
    """Every member holding a slot binds, and the watch shows it bound."""
    g = core.queries.gangs[SET]
    for k, n in sorted(g.plan.items()):
        core.bind(k, n, now)
    for k, n in sorted(core.queries.gangs[SET].plan.items()):
        p = core.queries.pods[k]
        obj = pod(p.name).gpu(int(p.requests.get("nvidia.com/gpu", 0))).on(n).build()
        obj["metadata"]["uid"] = p.uid
        obj["spec"]["schedulingGroup"] = {"podGroupName": p.scheduling_group}
        core.upsert_pod(pod_from_json(obj))
    core.drain()


# ------------------------------------------------------------------------------ the convention


def test_composite_parsed_as_the_api_documents_it() -> None:
    c = composite_from_json(composite(min_groups=2, topology=RACK), "v1alpha3")
    assert (c.key, c.min_groups, c.topology_key, c.error) == (gang_key(NS, "job"), 2, RACK,
                                                             None)
    assert composite_from_json(composite(min_groups=None), "v1alpha3").min_groups is None
    nested = composite_from_json(composite(parentCompositePodGroupName="top"), "v1alpha3")
    assert nested.error is not None and "nested" in nested.error.problem
    both = composite()
    both["spec"]["schedulingPolicy"]["basic"] = {}
    assert composite_from_json(both, "v1alpha3").error is not None
    huge = composite(min_groups=10**12)
    err = composite_from_json(huge, "v1alpha3").error
    assert err is not None and "above the limit" in err.problem


def test_a_childs_pod_is_a_subgroup_of_the_composites_group() -> None:
    core = cluster()
    put_set(core, {"a": 2, "b": 2, "c": 2}, topology=RACK)
    m = core.queries.membership(member(core, "a", 0))
    assert isinstance(m, GangSpec)
    assert (m.key, m.part, m.min_member, m.min_parts, m.source) == (
        SET, gang_key(NS, "a"), 2, 2, Source.UPSTREAM)
    assert m.group == tuple(gang_key(NS, x) for x in "abc")
    assert m.topology == "rack"


def test_a_missing_composite_is_waited_for_and_a_basic_one_leaves_each_child_a_gang() -> None:
    core = cluster()
    core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(child("a", 2),
                                                                       "v1alpha3"))
    k = member(core, "a", 0)
    assert core.queries.membership(k) == MissingPodGroup(
        SET, "scheduling.k8s.io CompositePodGroup job")
    core.upsert(ingest.COMPOSITES, composite_from_json(composite(min_groups=None),
                                                       "v1alpha3"))
    m = core.queries.membership(k)
    assert isinstance(m, GangSpec) and m.key == gang_key(NS, "a") and m.part is None


def test_a_new_sibling_podgroup_re_resolves_the_others_pods() -> None:
    core = cluster()
    put_set(core, {"a": 1})
    k = member(core, "a", 0)
    core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(child("b", 1),
                                                                       "v1alpha3"))
    m = core.queries.membership(k)
    assert isinstance(m, GangSpec) and m.group == (gang_key(NS, "a"), gang_key(NS, "b"))


# ------------------------------------------------------------------------------ admission


def test_a_subgroup_short_of_its_minimum_counts_for_nothing() -> None:
    """2 of 3 children, each whole: a whole and c half-there is no quorum, though the
    members (3) are more than one child's minimum."""
    core = cluster()
    put_set(core, {"a": 2, "b": 2, "c": 2})
    a = [member(core, "a", i) for i in range(2)]
    c0 = member(core, "c", 0)
    d = core.filter(core.queries.pods[a[0]], sorted(core.queries.nodes), 0.0)
    assert isinstance(d.unresolvable, WaitingForMembers) and not d.passed
    assert core.queries.gangs[SET].phase is GangPhase.WAITING
    b = [member(core, "b", i) for i in range(2)]
    assert ask(core, a[0])
    g = core.queries.gangs[SET]
    assert g.phase is GangPhase.ADMITTED
    assert set(g.plan) == {*a, *b}  # c is not whole: none of it is planned
    check_invariants(core)
    d = core.filter(core.queries.pods[c0], sorted(core.queries.nodes), 0.0)
    assert d.unresolvable == WaitingForMembers(gang_key(NS, "c"), 1, 2)


def test_a_subgroup_beyond_the_minimum_is_admitted_later_whole_and_alone() -> None:
    core = cluster()
    put_set(core, {"a": 2, "b": 2, "c": 2})
    for x in "ab":
        for i in range(2):
            member(core, x, i)
    assert ask(core, pod_key(NS, "a-0"))
    bind_all(core)
    assert core.queries.gangs[SET].phase is GangPhase.RELEASED
    c0 = member(core, "c", 0)
    assert core.filter(core.queries.pods[c0], sorted(core.queries.nodes), 2.0).passed == []
    c1 = member(core, "c", 1)
    assert ask(core, c1, 3.0)
    g = core.queries.gangs[SET]
    assert {c0, c1} <= set(g.plan)  # the whole subgroup holds its slots at once
    check_invariants(core)


def test_a_partly_planned_subgroup_gives_its_slots_back() -> None:
    """A member of an elastic subgroup holding slots leaves: the rest of it hold nothing
    (they would bind a part of it)."""
    core = cluster()
    put_set(core, {"a": 2, "b": 2, "c": 2})
    for x in "ab":
        for i in range(2):
            member(core, x, i)
    assert ask(core, pod_key(NS, "a-0"))
    bind_all(core)
    c = [member(core, "c", i) for i in range(2)]
    assert ask(core, c[1], 3.0)
    core.delete_pod(c[0])
    g = core.queries.gangs[SET]
    assert c[1] not in g.plan
    check_invariants(core)


def test_each_subgroup_is_packed_in_its_own_rack_and_the_set_stays_whole() -> None:
    """Racks of 3, 1 and 2 one-GPU nodes; two children of 2 members, each required in one
    rack: the whole set fits no rack, and planned as one gang it took r0's three nodes and
    r1's one, splitting a child over two racks."""
    core = Coscheduler(Settings(backoff_seconds=10))
    for rack, count in (("r0", 3), ("r1", 1), ("r2", 2)):
        for i in range(count):
            core.upsert(ingest.NODES, node_from_json(
                node(f"{rack}n{i}").gpus(1).label(RACK, rack).build()))
    put_set(core, {"a": 2, "b": 2}, child_topology=RACK)
    keys = [member(core, x, i) for x in "ab" for i in range(2)]
    assert ask(core, keys[0])
    plan = core.queries.gangs[SET].plan
    racks = {x: {plan[k][:2] for k in keys if k.split("/")[1].startswith(x)} for x in "ab"}
    assert all(len(r) == 1 for r in racks.values()) and racks["a"] != racks["b"]


def test_an_exclusive_subgroup_takes_a_rack_nobody_else_is_in() -> None:
    core = cluster(gpus=2)  # r0 is the tightest rack once the squatter holds a GPU there
    squatter = pod("other").gpu(1).on("r0n0").build()
    core.upsert_pod(pod_from_json(squatter))
    put_set(core, {"a": 2}, min_groups=1, child_topology=RACK)
    st = state_of(core)
    spec = core.queries.membership(member(core, "a", 0))
    assert isinstance(spec, GangSpec)
    # The LWS/JobSet conventions set the flag; here it is set on the stored memberships.
    for k in [pod_key(NS, "a-0"), member(core, "a", 1)]:
        m = st.membership[k]
        assert isinstance(m, GangSpec)
        st.membership[k] = replace(m, part_exclusive=True)
    from coscheduling.gang.membership import refresh_spec
    refresh_spec(st, st.gangs[SET])
    assert ask(core, pod_key(NS, "a-0"))
    assert {n[:2] for n in core.queries.gangs[SET].plan.values()} != {"r0"}
    assert not any(n.startswith("r0") for n in core.queries.gangs[SET].plan.values())


# ------------------------------------------------------------------------------ stages


def test_stages_admit_the_initializer_alone_then_the_trainers_whole() -> None:
    """Trainer v2 with an initializer: stage 0 (1 pod) then stage 1 (4 pods). The nodes'
    subgroup has no pod yet when the initializer asks; its stage is the group's word."""
    core = cluster(racks=1, per_rack=4)
    put_set(core, {"init": 1, "node": 4}, min_groups=2)
    st = state_of(core)
    stages = ((gang_key(NS, "init"), 0), (gang_key(NS, "node"), 1))

    def staged(k: PodKey) -> None:
        m = st.membership[k]
        assert isinstance(m, GangSpec)
        st.membership[k] = replace(m, stage=dict(stages)[m.part] if m.part else 0,
                                   part_stages=stages, min_parts=None)
        from coscheduling.gang.membership import refresh_spec
        refresh_spec(st, st.gangs[SET])

    init = member(core, "init", 0)
    staged(init)
    assert ask(core, init)
    bind_all(core)
    done = pod("init-0").gpu(1).on("r0n0", phase="Succeeded").build()
    done["metadata"]["uid"] = core.queries.pods[init].uid
    done["spec"]["schedulingGroup"] = {"podGroupName": "init"}
    core.upsert_pod(pod_from_json(done))
    staged(init)
    nodes = []
    for i in range(4):
        nodes.append(k := member(core, "node", i))
        staged(k)
        if i < 3:  # the initializer's stage is done, and counts for nothing now
            assert core.filter(core.queries.pods[k], sorted(core.queries.nodes),
                               5.0).passed == []
    assert ask(core, nodes[0], 6.0)
    assert set(core.queries.gangs[SET].plan) == set(nodes)
    check_invariants(core)


# ------------------------------------------------------------------------------ the checker


def test_rule_19_catches_a_partly_planned_subgroup() -> None:
    core = cluster()
    put_set(core, {"a": 2, "b": 2, "c": 2})
    for x in "ab":
        for i in range(2):
            member(core, x, i)
    assert ask(core, pod_key(NS, "a-0"))
    g = state_of(core).gangs[SET]
    c0 = member(core, "c", 0)
    member(core, "c", 1)
    g.add_slot(c0, NodeName("r2n0"), {"nvidia.com/gpu": 1})  # what the core never does
    with pytest.raises(InvariantBroken, match="rule 19"):
        check_invariants(core)


def test_an_invalid_subgroup_level_is_named() -> None:
    core = cluster()
    put_set(core, {"a": 1}, min_groups=1)
    st = state_of(core)
    k = member(core, "a", 0)
    m = st.membership[k]
    assert isinstance(m, GangSpec)
    st.membership[k] = replace(m, part_topology="galaxy")
    from coscheduling.gang.membership import refresh_spec
    refresh_spec(st, st.gangs[SET])
    d = core.filter(core.queries.pods[k], sorted(core.queries.nodes), 0.0)
    assert d.unresolvable is not None and "galaxy" in repr(d.unresolvable)
    assert not isinstance(d.unresolvable, InvalidGang)


# ------------------------------------------------------------------------------ preemption


def test_a_group_of_groups_is_evicted_whole_for_a_higher_gang() -> None:
    """The higher gang needs two GPUs, one child's worth: every child of the set goes."""
    core = cluster(racks=2, per_rack=2)  # 4 GPUs, all the set's
    put_set(core, {"a": 2, "b": 2})
    for x in "ab":
        for i in range(2):
            obj = pod(f"{x}-{i}").gpu(1).priority(10).on(f"r{'ab'.index(x)}n{i}").build()
            obj["spec"]["schedulingGroup"] = {"podGroupName": x}
            core.upsert_pod(pod_from_json(obj))
    core.drain()
    for i in range(2):
        core.upsert_pod(pod_from_json(pod(f"high-{i}").gang("high", 2, timeout=30).gpu(1)
                                      .priority(100).build()))
    core.filter(core.queries.pods[pod_key(NS, "high-0")], [], 0.0)
    evicted = sorted(e.pod for e in core.drain().evictions)
    assert evicted == sorted(pod_key(NS, f"{x}-{i}") for x in "ab" for i in range(2))


def test_each_child_podgroup_gets_its_condition_once_the_set_is_bound() -> None:
    from coscheduling.conventions.upstream import status_patches

    core = cluster()
    put_set(core, {"a": 2, "b": 2, "c": 2})
    for x in "ab":
        for i in range(2):
            member(core, x, i)
    assert ask(core, pod_key(NS, "a-0"))
    bind_all(core)
    patches = {p.key: p for p in status_patches(core.queries.status_model(), repr, "t")}
    for x in "ab":
        cond = patches[gang_key(NS, x)].status["conditions"][0]
        assert (cond["type"], cond["status"], cond["reason"]) == (
            "PodGroupInitiallyScheduled", "True", "Scheduled")
    assert gang_key(NS, "c") not in patches  # nothing bound, waiting for members: nothing
