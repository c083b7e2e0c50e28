"""Gang admission, reservations and the waiting map, driven the way kube-scheduler drives them."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import (
    BindGroup,
    BindNow,
    Coscheduler,
    GangPhase,
    NodeName,
    Park,
    Reject,
    Settings,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
    podgroup_from_json,
)
from coscheduling.events import ingest
from coscheduling.reasons import (
    BackingOff,
    DoesNotFit,
    InvalidDeclaration,
    PodGroupNotFound,
    ReservedForGangs,
    TimedOut,
    WaitingForMembers,
)
from tests.builders import node, pod, podgroup


def cluster(*nodes: dict[str, Any], settings: Settings | None = None) -> Coscheduler:
    core = Coscheduler(settings or Settings(backoff_seconds=10))
    for n in nodes:
        core.upsert(ingest.NODES, node_from_json(n))
    return core


def add(core: Coscheduler, *pods: dict[str, Any]) -> None:
    for p in pods:
        core.upsert_pod(pod_from_json(p))


def filt(core: Coscheduler, name: str, now: float = 0.0, ns: str = "default"):  # type: ignore[no-untyped-def]
    p = core.queries.pods[pod_key(ns, name)]
    return core.filter(p, sorted(core.queries.nodes), now)


def observe_bound(core: Coscheduler, name: str, node_name: str, ns: str = "default") -> None:
    """What the watch delivers after a successful binding."""
    p = core.queries.pods[pod_key(ns, name)]
    p2 = pod_from_json(
        {
            "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid,
                         "annotations": p.annotations, "labels": p.labels},
            "spec": {"schedulerName": p.scheduler_name, "nodeName": node_name,
                     "containers": [{"name": "c", "resources": {"requests": {
                         k: str(v) for k, v in p.requests.items() if k not in ("pods", "cpu")}}}]},
            "status": {"phase": "Running"},
        }
    )
    core.upsert_pod(p2)


def six_gpus() -> Coscheduler:
    return cluster(*(node(f"n{i}").gpus(2).build() for i in range(3)))


def test_two_gangs_on_six_gpus_one_runs_the_other_holds_nothing() -> None:
    core = six_gpus()
    for i in range(4):  # created interleaved, as in the classic deadlock
        add(core, pod(f"a{i}").gang("a", min_member=4).gpu(1).build())
        add(core, pod(f"b{i}").gang("b", min_member=4).gpu(1).build())

    placed: dict[str, NodeName] = {}
    for i in range(4):
        for g in ("a", "b"):
            d = filt(core, f"{g}{i}")
            if g == "a":
                assert len(d.passed) == 1, d
                placed[f"a{i}"] = d.passed[0]
            else:
                assert d.passed == []
                assert isinstance(d.unresolvable, DoesNotFit)
                assert d.unresolvable.nofit.free_units == 2
                assert d.unresolvable.reserved_by == (gang_key("default", "a"),)

    assert sorted(placed.values()).count("n0") <= 2
    decisions = [core.bind(pod_key("default", f"a{i}"), placed[f"a{i}"], 1.0) for i in range(4)]
    assert all(isinstance(d, Park) for d in decisions[:3])
    assert isinstance(decisions[3], BindGroup)
    assert decisions[3].binds == {pod_key("default", f"a{i}"): placed[f"a{i}"] for i in range(4)}
    # No timeout was needed for any of this.
    assert core.expire(1000.0) == []

    for i in range(4):
        observe_bound(core, f"a{i}", placed[f"a{i}"])
    view = core.queries.gang_view(gang_key("default", "b"))
    assert view is not None and view.bound == 0 and view.phase is GangPhase.WAITING
    # The first gang finishes: the second now fits in full.
    for i in range(4):
        core.delete_pod(pod_key("default", f"a{i}"))
    assert len(filt(core, "b0", 3.0).passed) == 1


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({"lockstep.dev/min-member": "x"}, "not a whole number", id="non-numeric"),
        pytest.param({"lockstep.dev/min-member": "0"}, "at least 1", id="zero"),
        pytest.param({"lockstep.dev/min-member": "-2"}, "at least 1", id="negative"),
        pytest.param({"lockstep.dev/min-member": "2", "lockstep.dev/timeout-seconds": "soon"},
                     "not a number of seconds", id="bad-timeout"),
        pytest.param({"lockstep.dev/min-member": "2", "scheduling.k8s.io/group-name": "other"},
                     "conflicting gang declarations", id="conflicting-groups"),
        pytest.param({}, "missing", id="no-min-member"),
    ],
)
def test_invalid_declarations_are_rejected_with_the_field(
    annotations: dict[str, str], want: str
) -> None:
    core = six_gpus()
    b = pod("p0").gang("g").gpu(1)
    for k, v in annotations.items():
        b.annotate(k, v)
    add(core, b.build())
    d = filt(core, "p0")
    assert d.passed == []
    assert isinstance(d.unresolvable, InvalidDeclaration)
    assert want in d.unresolvable.error.problem
    notices = core.drain().notices
    assert [n.kind.value for n in notices] == ["GangInvalid"]


def test_incomplete_gang_waits_then_admits_when_the_last_member_arrives() -> None:
    core = six_gpus()
    add(core, *(pod(f"p{i}").gang("g", min_member=4).gpu(1).build() for i in range(3)))
    for i in range(3):
        d = filt(core, f"p{i}")
        assert d.unresolvable == WaitingForMembers(gang_key("default", "g"), 3, 4)
    add(core, pod("p3").gang("g", min_member=4).gpu(1).build())
    assert len(filt(core, "p3").passed) == 1
    # Admission wakes exactly the members kube-scheduler turned away before (one API write
    # each); the one being answered, and members never turned away, need no nudge.
    assert core.drain().requeue == [pod_key("default", f"p{i}") for i in range(3)]


def test_members_never_turned_away_are_not_nudged() -> None:
    core = six_gpus()
    add(core, *(pod(f"p{i}").gang("g", min_member=4).gpu(1).build() for i in range(4)))
    assert len(filt(core, "p0").passed) == 1
    assert core.drain().requeue == []


def test_filter_is_idempotent_for_an_admitted_member() -> None:
    core = six_gpus()
    add(core, *(pod(f"p{i}").gang("g", min_member=2).gpu(2).build() for i in range(2)))
    first = filt(core, "p1").passed
    assert filt(core, "p1").passed == first
    assert filt(core, "p0").passed != first


def test_plain_pods_never_take_reserved_capacity() -> None:
    core = six_gpus()
    add(core, *(pod(f"g{i}").gang("g", min_member=2).gpu(2).build() for i in range(2)))
    reserved = {filt(core, "g0").passed[0], filt(core, "g1").passed[0]}
    add(core, pod("plain").gpu(1).build())
    d = filt(core, "plain")
    assert set(d.passed) == {"n0", "n1", "n2"} - reserved
    assert set(d.failed) == reserved
    assert all(isinstance(r, ReservedForGangs) for r in d.failed.values())


def test_timeout_answers_every_parked_call_releases_and_backs_off() -> None:
    core = six_gpus()
    add(core, *(pod(f"a{i}").gang("a", min_member=3, timeout=30).gpu(1).build()
                for i in range(3)))
    add(core, *(pod(f"b{i}").gang("b", min_member=4).gpu(1).build() for i in range(4)))
    nodes = {i: filt(core, f"a{i}", 0.0).passed[0] for i in range(3)}
    assert isinstance(filt(core, "b0", 1.0).unresolvable, DoesNotFit)
    assert isinstance(core.bind(pod_key("default", "a0"), nodes[0], 1.0), Park)
    assert isinstance(core.bind(pod_key("default", "a1"), nodes[1], 1.0), Park)
    assert core.queries.next_deadline() == 30.0
    assert core.expire(29.9) == []

    expired = core.expire(30.0)
    assert [e.gang for e in expired] == [gang_key("default", "a")]
    assert set(expired[0].parked) == {pod_key("default", "a0"), pod_key("default", "a1")}
    assert isinstance(expired[0].reason, TimedOut)
    assert expired[0].reason.stragglers == ("default/a2 (not placed)",)
    assert core.queries.reserved_total() == {}
    # The waiting gang is woken and now takes the capacity; the timed-out one backs off.
    assert pod_key("default", "b0") in core.drain().requeue
    assert len(filt(core, "b0", 31.0).passed) == 1
    assert isinstance(filt(core, "a0", 31.0).unresolvable, BackingOff)
    assert core.queries.gang_view(gang_key("default", "a")).phase is GangPhase.BACKING_OFF  # type: ignore[union-attr]


def test_elastic_extras_bind_at_once_after_the_quorum() -> None:
    core = six_gpus()
    add(core, *(pod(f"p{i}").gang("g", min_member=2).gpu(1).build() for i in range(4)))
    nodes = {i: filt(core, f"p{i}").passed[0] for i in range(4)}
    assert isinstance(core.bind(pod_key("default", "p0"), nodes[0], 1.0), Park)
    group = core.bind(pod_key("default", "p1"), nodes[1], 1.0)
    assert isinstance(group, BindGroup) and len(group.binds) == 2
    assert core.bind(pod_key("default", "p2"), nodes[2], 1.0) == BindNow(
        pod_key("default", "p2"), nodes[2]
    )


def test_bind_to_another_node_than_planned_is_rejected() -> None:
    core = six_gpus()
    add(core, *(pod(f"p{i}").gang("g", min_member=2).gpu(2).build() for i in range(2)))
    planned = filt(core, "p0").passed[0]
    other = next(n for n in core.queries.nodes if n != planned)
    assert isinstance(core.bind(pod_key("default", "p0"), other, 1.0), Reject)


def test_scheduler_plugins_podgroup_gives_min_member_and_is_required() -> None:
    core = six_gpus()
    add(core, *(pod(f"p{i}").label("scheduling.x-k8s.io/pod-group", "pg").gpu(1).build()
                for i in range(2)))
    assert isinstance(filt(core, "p0").unresolvable, PodGroupNotFound)
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 3)))
    assert filt(core, "p0").unresolvable == WaitingForMembers(gang_key("default", "pg"), 2, 3)
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 2)))
    assert len(filt(core, "p0").passed) == 1


def test_cpu_launcher_and_gpu_workers_are_one_gang() -> None:
    core = cluster(node("cpu0").build(), *(node(f"n{i}").gpus(2).build() for i in range(2)))
    add(core, pod("launcher").gang("mpi", min_member=5).cpu("1").build())
    add(core, *(pod(f"w{i}").gang("mpi", min_member=5).gpu(1).build() for i in range(4)))
    d = filt(core, "launcher")
    assert d.passed == ["cpu0"]  # a CPU-only member keeps off GPU nodes when it can
    nodes = {f"w{i}": filt(core, f"w{i}").passed[0] for i in range(4)}
    assert sorted(nodes.values()) == ["n0", "n0", "n1", "n1"]
    where = {"launcher": NodeName("cpu0"), **nodes}
    for name in ("launcher", "w0", "w1", "w2"):
        assert isinstance(core.bind(pod_key("default", name), where[name], 1.0), Park)
    assert isinstance(core.bind(pod_key("default", "w3"), nodes["w3"], 1.0), BindGroup)


def test_a_gang_that_never_fits_does_not_block_others() -> None:
    core = six_gpus()
    add(core, *(pod(f"big{i}").gang("big", min_member=4).gpu(2).build() for i in range(4)))
    add(core, *(pod(f"s{i}").gang("small", min_member=2).gpu(1).build() for i in range(2)))
    d = filt(core, "big0")
    assert isinstance(d.unresolvable, DoesNotFit)
    assert d.unresolvable.nofit.members == 4 and d.unresolvable.nofit.free_units == 3
    assert len(filt(core, "s0").passed) == 1


def test_node_resource_topology_steers_pods_to_a_numa_zone_that_holds_them() -> None:
    from coscheduling.topology.domains import NumaZones

    core = cluster(node("split").gpus(4).build(), node("whole").gpus(4).build())
    add(core, pod("p").gpu(2).build())
    plain = core.queries.pods[pod_key("default", "p")]
    assert core.prioritize(plain, [NodeName("split"), NodeName("whole")]) == [8, 8]
    # NodeResourceTopology says "split" has one free GPU on each NUMA zone.
    core.upsert(ingest.NUMA, NumaZones(NodeName("split"), (1, 1)))
    core.upsert(ingest.NUMA, NumaZones(NodeName("whole"), (2, 0)))
    split, whole = core.prioritize(plain, [NodeName("split"), NodeName("whole")])
    assert whole > split
    assert "NUMA free [1, 1]" in core.queries.explain_score(NodeName("split"), 2, None).why


def test_after_a_restart_only_pods_kube_scheduler_marked_unschedulable_are_nudged() -> None:
    core = six_gpus()
    objs = [pod(f"p{i}").gang("g", min_member=3).gpu(1).build() for i in range(3)]
    objs[0]["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    core.replace(ingest.PODS, [pod_from_json(o) for o in objs])  # a fresh process's first list
    assert len(filt(core, "p2").passed) == 1
    assert core.drain().requeue == [pod_key("default", "p0")]
