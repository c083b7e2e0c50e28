"""The six broken promises first reproduced, one regression test each (all failed on the old core).

Each drives ``Coscheduler`` the way the app does (watch events, filter, bind, outcomes) and
asserts on the promise that broke, not on incidental output.
"""

from __future__ import annotations

from typing import Any

from coscheduling import (
    BindFailed,
    BindGroup,
    Bound,
    Coscheduler,
    GangPhase,
    NodeName,
    Park,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.events import ingest
from coscheduling.reasons import BindTargetGone, PartiallyBound, PodNotInCache, WaitingForMembers
from coscheduling.resources import sub
from tests.builders import node, pod
from tests.invariants import check_invariants
from tests.unit.coscheduling.test_core import add, cluster


def filt(core: Coscheduler, name: str, now: float = 0.0) -> list[NodeName]:
    p = core.queries.pod(pod_key("default", name))
    assert p is not None
    return core.filter(p, sorted(core.queries.nodes), now).passed


def bound(core: Coscheduler, name: str, where: str, phase: str = "Running") -> None:
    """What the watch delivers after a binding (same UID, nodeName set)."""
    p = core.queries.pod(pod_key("default", name))
    assert p is not None
    obj = {"metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid,
                        "annotations": p.annotations, "labels": p.labels},
           "spec": {"schedulerName": p.scheduler_name, "nodeName": where,
                    "containers": [{"name": "c", "resources": {"requests": {
                        "nvidia.com/gpu": str(p.requests.get("nvidia.com/gpu", 0))}}}]},
           "status": {"phase": phase}}
    core.upsert_pod(pod_from_json(obj))


def overcommitted(core: Coscheduler) -> dict[str, int]:
    """Nodes whose usage plus reservations exceed allocatable GPUs, with the excess."""
    out = {}
    for n in sorted(core.queries.nodes):
        left = sub(core.queries.free(n), {k: v for per in core.queries.reserved_on(n).values()
                                  for k, v in per.items()})
        if left.get("nvidia.com/gpu", 0) < 0:
            out[n] = -left["nvidia.com/gpu"]
    return out


def test_case1_member_deleted_after_admission_frees_only_its_own_slot() -> None:
    core = cluster(node("n0").gpus(4).build())
    add(core, *(pod(f"a{i}").gang("a", min_member=4).gpu(1).build() for i in range(4)))
    assert filt(core, "a0") == ["n0"]
    core.delete_pod(pod_key("default", "a3"))  # a worker deleted after its gang was admitted
    add(core, *(pod(f"b{i}").gang("b", min_member=4).gpu(1).build() for i in range(4)))
    filt(core, "b0")
    # Old core: a's whole reservation on n0 vanished while its plan kept 3 members there,
    # then b was admitted onto the same GPUs: 7 planned on a 4-GPU node.
    assert overcommitted(core) == {}
    check_invariants(core)
    a = core.queries.gang_view(gang_key("default", "a"))
    assert a is not None and a.plan == {} and a.phase is GangPhase.WAITING


def test_case2_extra_member_never_lands_on_a_siblings_slot() -> None:
    core = cluster(node("n0").gpus(2).build(), node("n1").gpus(2).build())
    add(core, *(pod(f"p{i}").gang("g", min_member=2).gpu(1).build() for i in range(2)))
    assert filt(core, "p0") == filt(core, "p1")  # packed on one node
    add(core, pod("extra").gang("g", min_member=2).gpu(1).build())
    placed = filt(core, "extra")
    assert overcommitted(core) == {}
    assert placed and placed != filt(core, "p0")
    check_invariants(core)


def test_case3_released_gang_whose_members_failed_admits_replacements_together() -> None:
    core = cluster(node("n0").gpus(2).build(), node("n1").gpus(2).build())
    add(core, *(pod(f"w{i}").gang("job", min_member=2).gpu(1).build() for i in range(2)))
    where = {i: filt(core, f"w{i}")[0] for i in range(2)}
    assert isinstance(core.bind(pod_key("default", "w0"), where[0], 1.0), Park)
    assert isinstance(core.bind(pod_key("default", "w1"), where[1], 1.0), BindGroup)
    for i in range(2):
        bound(core, f"w{i}", where[i])
    for i in range(2):  # the job fails; the controller recreates its pods before GC
        bound(core, f"w{i}", where[i], phase="Failed")
    add(core, *(pod(f"r{i}").gang("job", min_member=2).gpu(1).build() for i in range(2)))
    first = filt(core, "r0", 2.0)
    # Old core: the gang stayed "released", so r0 was bound on its own.
    assert isinstance(core.bind(pod_key("default", "r0"), first[0], 2.0), Park)
    assert isinstance(core.bind(pod_key("default", "r1"), filt(core, "r1", 2.0)[0], 2.0),
                      BindGroup)
    check_invariants(core)


def test_case4_node_relist_drops_the_topology_domain_index() -> None:
    racks = [node(f"n{i}").gpus(8).rack(f"r{i}").build() for i in range(4)]
    core = cluster(*racks)
    members = [pod(f"t{i}").gang("t", min_member=4).gpu(8)
               .annotate("lockstep.dev/topology-required", "rack").build() for i in range(4)]
    add(core, *members)
    assert filt(core, "t0") == []  # four racks of one node: no rack holds the gang
    # A relist (after 410 Gone) shows the nodes relabelled into one rack.
    core.replace(ingest.NODES, [node_from_json(node(f"n{i}").gpus(8).rack("big").build())
                        for i in range(4)])
    assert len(filt(core, "t0")) == 1
    check_invariants(core)


def test_case5_filter_after_the_delete_event_never_resurrects_the_pod() -> None:
    core = cluster(node("n0").gpus(4).build())
    objs = [pod(f"p{i}").gang("g", min_member=3).gpu(1).build() for i in range(3)]
    add(core, *objs)
    core.delete_pod(pod_key("default", "p2"))
    stale = core.filter(pod_from_json(objs[2]), [NodeName("n0")], 0.0)  # request raced delete
    assert stale.passed == [] and isinstance(stale.unresolvable, PodNotInCache)
    assert core.queries.pod(pod_key("default", "p2")) is None
    again = core.filter(pod_from_json(objs[0]), [NodeName("n0")], 0.0)
    assert again.unresolvable == WaitingForMembers(gang_key("default", "g"), 2, 3)
    assert core.queries.reserved_gpus() == 0
    check_invariants(core)


def test_case6_node_gone_before_quorum_is_never_bound_and_partial_is_reported() -> None:
    core = cluster(*(node(f"n{i}").gpus(1).build() for i in range(4)))
    add(core, *(pod(f"p{i}").gang("g", min_member=3).gpu(1).build() for i in range(3)))
    where = {i: filt(core, f"p{i}")[0] for i in range(3)}
    assert isinstance(core.bind(pod_key("default", "p0"), where[0], 1.0), Park)
    assert isinstance(core.bind(pod_key("default", "p1"), where[1], 1.0), Park)
    core.delete(ingest.NODES, where[1])  # p1's target node disappears while p1 is parked
    let_go = core.drain().unparked
    assert [(list(u.pods), type(u.reason)) for u in let_go] == [
        ([pod_key("default", "p1")], BindTargetGone)]
    # Old core: the group bound p1 to a node that no longer exists.
    decision = core.bind(pod_key("default", "p2"), where[2], 1.0)
    assert isinstance(decision, Park)
    check_invariants(core)
    p1 = filt(core, "p1", 2.0)  # kube-scheduler retries p1: re-placed on a live node
    assert p1 and p1[0] != where[1]
    group = core.bind(pod_key("default", "p1"), p1[0], 2.0)
    assert isinstance(group, BindGroup) and len(group.binds) == 3
    # The API then refuses one binding for good after its siblings bound: never hidden.
    report = core.bind_outcomes([
        Bound(pod_key("default", "p0"), where[0]),
        Bound(pod_key("default", "p1"), p1[0]),
        BindFailed(pod_key("default", "p2"), where[2], "403 forbidden", permanent=True),
    ])
    assert isinstance(report, PartiallyBound) and (report.bound, report.need) == (2, 3)
    assert core.queries.partial_gangs == 1
    view = core.queries.gang_view(gang_key("default", "g"))
    assert view is not None and view.partial == report
    assert "GangPartiallyBound" in {n.kind.value for n in core.drain().notices}
    check_invariants(core)


def test_a_gang_partly_bound_by_a_crash_completes_without_parking() -> None:
    """Lockstep died between a group's bindings: the restarted core finds 2/4 bound (from the
    API server) and binds the rest as they come instead of parking them again."""
    core = cluster(*(node(f"n{i}").gpus(2).build() for i in range(2)))
    add(core, *(pod(f"w{i}").gang("job", min_member=4).gpu(1).build() for i in range(4)))
    bound(core, "w0", "n0")
    bound(core, "w1", "n0")
    rest = {i: filt(core, f"w{i}") for i in (2, 3)}
    assert rest == {2: ["n1"], 3: ["n1"]}
    first = core.bind(pod_key("default", "w2"), NodeName("n1"), 1.0)
    assert type(first).__name__ == "BindNow"
    second = core.bind(pod_key("default", "w3"), NodeName("n1"), 1.0)
    assert type(second).__name__ == "BindNow"
    check_invariants(core)


def test_kueue_groups_of_three_on_four_gpus_never_split_two_and_two() -> None:
    """Reproduced: two Kueue plain-pod groups of 3 on 4 GPUs used to be
    scheduled as unrelated pods and end 2 + 2. One group runs; the other holds nothing."""
    core = cluster(node("n0").gpus(2).build(), node("n1").gpus(2).build())

    def kueue_pod(group: str, i: int) -> dict[str, Any]:
        return (pod(f"{group}-{i}").label("kueue.x-k8s.io/pod-group-name", group)
                .annotate("kueue.x-k8s.io/pod-group-total-count", "3").gpu(1).build())

    for i in range(3):
        add(core, kueue_pod("x", i), kueue_pod("y", i))
    placed = {f"{g}-{i}": filt(core, f"{g}-{i}") for i in range(3) for g in ("x", "y")}
    admitted = [g for g in ("x", "y") if all(placed[f"{g}-{i}"] for i in range(3))]
    assert len(admitted) == 1
    other = "y" if admitted == ["x"] else "x"
    assert all(placed[f"{other}-{i}"] == [] for i in range(3))
    check_invariants(core)


def test_gated_members_do_not_count_until_kueue_lifts_the_gate() -> None:
    core = cluster(node("n0").gpus(4).build())
    objs = [pod(f"k{i}").label("kueue.x-k8s.io/pod-group-name", "g")
            .annotate("kueue.x-k8s.io/pod-group-total-count", "3").gpu(1).build()
            for i in range(3)]
    objs[2]["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    add(core, *objs)
    d = core.filter(pod_from_json(objs[0]), [NodeName("n0")], 0.0)
    assert d.unresolvable == WaitingForMembers(gang_key("default", "g"), 2, 3)
    objs[2]["spec"]["schedulingGates"] = []  # Kueue admitted the group's Workload
    add(core, objs[2])
    assert core.filter(pod_from_json(objs[0]), [NodeName("n0")], 0.0).passed == ["n0"]
    check_invariants(core)


def test_volcano_pods_with_only_the_group_name_are_gated_on_their_podgroup() -> None:
    """Volcano's controllers put only scheduling.k8s.io/group-name on pods. They
    wait (PodGroup not found) until Volcano's PodGroup exists, then form a gang of its
    minMember; deleting the PodGroup sends them back to waiting."""
    from coscheduling.conventions.volcano import volcano_podgroup_from_json
    from coscheduling.reasons import PodGroupNotFound

    core = cluster(node("n0").gpus(4).build())
    add(core, *(pod(f"w{i}").annotate("scheduling.k8s.io/group-name", "pg").gpu(1).build()
                for i in range(3)))
    p = core.queries.pod(pod_key("default", "w0"))
    assert p is not None
    assert core.filter(p, [NodeName("n0")], 0.0).unresolvable == PodGroupNotFound(
        gang_key("default", "pg"), "scheduling.volcano.sh")
    pg = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
          "metadata": {"name": "pg", "namespace": "default"}, "spec": {"minMember": 3}}
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(pg))
    assert core.drain().requeue == [pod_key("default", "w0")]  # woken: no pod event would
    assert core.filter(p, [NodeName("n0")], 0.0).passed == ["n0"]
    check_invariants(core)
    core.delete(ingest.VOLCANO_PODGROUPS, gang_key("default", "pg"))
    assert core.queries.reserved_gpus() == 0
    check_invariants(core)
