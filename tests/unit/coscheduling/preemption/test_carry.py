"""Preemption carried out by the core: victims evicted whole for a gang admitted at once into
the room they free, that room held until they are gone or a deadline, PodDisruptionBudgets
respected when there is a choice, no preemption when it is turned off, and a group's own
priority fields (Volcano's class, upstream priority, preemptionPolicy, disruptionMode)."""

from __future__ import annotations

from typing import Any

from coscheduling import (
    Coscheduler,
    GangPhase,
    NodeName,
    Settings,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.actions import BindGroup, Reject
from coscheduling.conventions.scheduler_plugins import podgroup_from_json
from coscheduling.conventions.upstream import upstream_podgroup_from_json
from coscheduling.conventions.volcano import volcano_podgroup_from_json
from coscheduling.events import ingest
from coscheduling.events.ingest import (
    PDBS,
    PRIORITY_CLASSES,
    SP_PODGROUPS,
    UPSTREAM_PODGROUPS,
    VOLCANO_PODGROUPS,
)
from coscheduling.placement.planner import Member
from coscheduling.preemption.budgets import budget_from_json
from coscheduling.preemption.carry import _candidates, _recheck
from coscheduling.preemption.inflight import PreemptorId
from coscheduling.preemption.units import Preemptor, Victims
from coscheduling.preemption.victims import choose_victims
from coscheduling.reasons import (
    BeingPreempted,
    DoesNotFit,
    NotEnoughMinResources,
    Preempting,
    PreemptionStalled,
)
from coscheduling.records import priority_class_from_json
from tests.builders import node, pod, podgroup
from tests.internals import state_of

HIGH = PreemptorId.of_gang(gang_key("default", "high"))
URGENT = PreemptorId.of_pod(pod_key("default", "urgent"))


def cluster(*gpus: int, preemption: bool = True) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=5, preemption=preemption))
    for i, n in enumerate(gpus):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(n).rack("r0").build()))
    return core


def running(core: Coscheduler, gang: str, size: int, node_name: str, prio: int,
            **labels: str) -> list[dict[str, Any]]:
    out = []
    for i in range(size):
        b = pod(f"{gang}-{i}").gang(gang, size, timeout=30).gpu(1).priority(prio)
        for k, v in labels.items():
            b = b.label(k, v)
        obj = b.on(node_name).build()
        obj["metadata"]["uid"] = f"uid-{gang}-{i}"
        core.upsert_pod(pod_from_json(obj))
        out.append(obj)
    return out


def arrive(core: Coscheduler, gang: str, size: int, prio: int) -> None:
    for i in range(size):
        core.upsert_pod(pod_from_json(pod(f"{gang}-{i}").gang(gang, size, timeout=30).gpu(1)
                                      .priority(prio).build()))


def test_a_gang_evicts_a_whole_lower_gang_and_holds_the_room_until_it_is_gone() -> None:
    core = cluster(4)
    low = running(core, "low", 4, "n0", 10)
    arrive(core, "high", 4, 100)
    d = core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
    assert d.passed == [] and isinstance(d.unresolvable, Preempting)
    evictions = core.drain().evictions
    assert sorted(e.pod for e in evictions) == [pod_key("default", f"low-{i}") for i in range(4)]
    assert {e.gang for e in evictions} == {gang_key("default", "low")}
    high = core.queries.gangs[gang_key("default", "high")]
    assert high.phase is GangPhase.ADMITTED and len(high.plan) == 4
    # A recreated low member waits while the preemption is in flight.
    for obj in low[:3]:
        core.delete_pod(pod_key("default", obj["metadata"]["name"]), obj["metadata"]["uid"])
    assert state_of(core).preemption.inflight.get(HIGH) is not None
    core.drain()
    core.delete_pod(pod_key("default", "low-3"), "uid-low-3")
    assert state_of(core).preemption.inflight.get(HIGH) is None  # completed
    assert set(core.drain().requeue) >= {pod_key("default", "high-0")}
    d = core.filter(core.queries.pods[pod_key("default", "high-1")], [NodeName("n0")], 1.0)
    assert d.passed == [NodeName("n0")]


def test_a_recreated_victim_gang_waits_while_its_preemptor_is_not_running() -> None:
    core = cluster(4, 4)
    low = running(core, "low", 4, "n0", 10)
    running(core, "other", 4, "n1", 50)
    arrive(core, "high", 4, 100)
    core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
    for obj in low[:3]:  # three are gone, one still terminates
        core.delete_pod(pod_key("default", obj["metadata"]["name"]), obj["metadata"]["uid"])
    for i in range(4):  # the controller recreates them
        core.upsert_pod(pod_from_json(pod(f"low-new-{i}").gang("low", 4, timeout=30).gpu(1)
                                      .priority(10).build()))
    d = core.filter(core.queries.pods[pod_key("default", "low-new-0")], [NodeName("n0")], 0.5)
    assert isinstance(d.unresolvable, BeingPreempted)


def test_a_gated_extra_of_a_gang_being_evicted_is_neither_lifted_nor_let_bind() -> None:
    """Found by the model at 2000 x 80: h's extra member, still behind the gate, was lifted
    and bound while the rest of h was evicted for b, leaving h evicted in part."""
    core = cluster(4)
    running(core, "h", 3, "n0", 10)
    core.upsert_pod(pod_from_json(pod("h-3").gang("h", 3, timeout=30).gpu(1).priority(10)
                                  .gated().build()))
    assert core.queries.gangs[gang_key("default", "h")].phase is GangPhase.RELEASED
    arrive(core, "b", 4, 50)
    d = core.filter(core.queries.pods[pod_key("default", "b-0")], [], 0.0)
    assert isinstance(d.unresolvable, Preempting)
    out = core.drain()
    assert {e.pod for e in out.evictions} == {pod_key("default", f"h-{i}") for i in range(3)}
    assert pod_key("default", "h-3") not in {lf.pod for lf in out.lift}
    state_of(core).outbox.lift.add(pod_key("default", "h-3"))  # asked again, as a sweep would
    assert core.drain().lift == []
    extra = core.queries.pods[pod_key("default", "h-3")]
    assert isinstance(core.filter(extra, [NodeName("n0")], 0.5).unresolvable, BeingPreempted)


def test_victims_that_never_go_give_the_room_back_at_the_deadline() -> None:
    core = cluster(4)
    running(core, "low", 4, "n0", 10)
    arrive(core, "high", 4, 100)
    core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
    rec = state_of(core).preemption.inflight.get(HIGH)
    assert rec is not None
    core.expire(rec.deadline + 0.1)
    high = core.queries.gangs[gang_key("default", "high")]
    assert high.phase is not GangPhase.ADMITTED and not high.plan
    assert isinstance(high.reason, PreemptionStalled)


def test_a_budget_that_allows_no_disruption_steers_the_choice_to_the_other_gang() -> None:
    core = cluster(4, 4)
    running(core, "guarded", 4, "n0", 10, app="guarded")
    running(core, "free", 4, "n1", 10, app="free")
    core.upsert(PDBS, budget_from_json({
        "metadata": {"name": "guard", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "guarded"}}},
        "status": {"disruptionsAllowed": 0}}))
    arrive(core, "high", 4, 100)
    core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
    assert {e.gang for e in core.drain().evictions} == {gang_key("default", "free")}


def test_without_the_budget_the_same_tie_goes_the_other_way() -> None:
    """The control for the test above: it is the budget that decides, not the names."""
    core = cluster(4, 4)
    running(core, "guarded", 4, "n0", 10)
    running(core, "free", 4, "n1", 10)
    arrive(core, "high", 4, 100)
    core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
    assert {e.gang for e in core.drain().evictions} == {gang_key("default", "guarded")}


def test_preemption_off_evicts_nothing_and_says_the_gang_does_not_fit() -> None:
    core = cluster(4, preemption=False)
    running(core, "low", 4, "n0", 10)
    arrive(core, "high", 4, 100)
    d = core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
    assert isinstance(d.unresolvable, DoesNotFit) and d.unresolvable.preemption == ""
    assert core.drain().evictions == []


def test_an_unschedulable_gang_with_no_filter_call_preempts_from_the_sweep() -> None:
    """kube-scheduler's own filters found no node, so no filter call comes: the members'
    Unschedulable condition brings the gang to Lockstep's sweep."""
    core = cluster(4)
    running(core, "low", 4, "n0", 10)
    for i in range(4):
        obj = pod(f"high-{i}").gang("high", 4, timeout=30).gpu(1).priority(100).build()
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable"}]
        core.upsert_pod(pod_from_json(obj))
    core.admit_gated(0.0)
    assert len(core.drain().evictions) == 4
    assert core.queries.gangs[gang_key("default", "high")].phase is GangPhase.ADMITTED


# ------------------------------------------------------------------ the group's own priority


def upstream_group(core: Coscheduler, name: str, size: int, **spec: Any) -> None:
    obj = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"schedulingPolicy": {"gang": {"minCount": size}}, **spec}}
    core.upsert(UPSTREAM_PODGROUPS, upstream_podgroup_from_json(obj, "v1beta1"))


def upstream_pods(core: Coscheduler, group: str, size: int, prio: int = 0,
                  node_name: str | None = None) -> None:
    for i in range(size):
        b = pod(f"{group}-{i}").gpu(1).priority(prio)
        obj = (b.on(node_name) if node_name else b).build()
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
        obj["metadata"]["uid"] = f"uid-{group}-{i}"
        core.upsert_pod(pod_from_json(obj))


def test_a_volcano_podgroup_priority_class_outranks_its_pods_own_priority() -> None:
    """Volcano's scheduler orders and preempts jobs by the PodGroup's priorityClassName; the
    pods here carry none (priority 0), so without the class nothing would be evicted."""
    core = cluster(4)
    running(core, "low", 4, "n0", 10)
    core.upsert(VOLCANO_PODGROUPS, volcano_podgroup_from_json({
        "metadata": {"name": "urgent", "namespace": "default"},
        "spec": {"minMember": 4, "priorityClassName": "urgent"}}))
    for i in range(4):
        core.upsert_pod(pod_from_json(pod(f"urgent-{i}").gpu(1).annotate(
            "scheduling.k8s.io/group-name", "urgent").build()))
    urgent0 = core.queries.pods[pod_key("default", "urgent-0")]
    d = core.filter(urgent0, [], 0.0)
    assert core.drain().evictions == [] and not isinstance(d.unresolvable, Preempting)
    core.upsert(PRIORITY_CLASSES, priority_class_from_json(
        {"metadata": {"name": "urgent"}, "value": 1000}))
    d = core.filter(urgent0, [], 1.0)
    assert isinstance(d.unresolvable, Preempting)
    assert {e.gang for e in core.drain().evictions} == {gang_key("default", "low")}


def test_an_upstream_podgroup_priority_and_never_policy_are_its_own() -> None:
    core = cluster(4)
    running(core, "low", 4, "n0", 10)
    upstream_group(core, "never", 4, priority=1000, preemptionPolicy="Never")
    upstream_pods(core, "never", 4)
    d = core.filter(core.queries.pods[pod_key("default", "never-0")], [], 0.0)
    assert core.drain().evictions == [] and isinstance(d.unresolvable, DoesNotFit)
    assert "preemptionPolicy is Never" in d.unresolvable.preemption
    upstream_group(core, "urgent", 4, priority=1000)
    upstream_pods(core, "urgent", 4)
    d = core.filter(core.queries.pods[pod_key("default", "urgent-0")], [], 1.0)
    assert isinstance(d.unresolvable, Preempting)
    assert len(core.drain().evictions) == 4


def test_a_victim_group_is_evicted_whole_whatever_its_disruption_mode() -> None:
    """The 1.37 API server defaults ``disruptionMode`` to ``{single: {}}``, so it cannot say
    what the user wants; a gang evicted in part stops anyway. Two of the four would do, yet
    all four go, in both modes."""
    for mode in ({"single": {}}, {"all": {}}):
        core = cluster(2, 2)
        upstream_group(core, "low", 4, disruptionMode=mode)
        upstream_pods(core, "low", 2, 10, "n0")
        for i in (2, 3):
            obj = pod(f"low-{i}").gpu(1).priority(10).on("n1").build()
            obj["spec"]["schedulingGroup"] = {"podGroupName": "low"}
            core.upsert_pod(pod_from_json(obj))
        arrive(core, "high", 2, 100)
        core.filter(core.queries.pods[pod_key("default", "high-0")], [], 0.0)
        evicted = core.drain().evictions
        assert len(evicted) == 4 and {e.node for e in evicted} == {"n0", "n1"}, mode


def test_pods_of_a_job_kueue_admitted_are_under_its_cluster_queue() -> None:
    """Kueue labels the pods of jobs it admits with their ClusterQueue and LocalQueue, not
    with ``queue-name``: a gang outside that quota must not evict them; a gang of the same
    ClusterQueue may."""
    for label, want in (("team-a", 4), ("team-b", 0)):
        core = cluster(4)
        running(core, "job", 4, "n0", 10, **{"kueue.x-k8s.io/cluster-queue-name": "team-a",
                                             "kueue.x-k8s.io/local-queue-name": "a"})
        for i in range(4):
            core.upsert_pod(pod_from_json(
                pod(f"hi-{i}").gang("hi", 4, timeout=30).gpu(1).priority(100)
                .label("kueue.x-k8s.io/cluster-queue-name", label).build()))
        core.filter(core.queries.pods[pod_key("default", "hi-0")], [], 0.0)
        assert len(core.drain().evictions) == want, label
    core = cluster(4)
    running(core, "job", 4, "n0", 10, **{"kueue.x-k8s.io/cluster-queue-name": "team-a"})
    arrive(core, "outside", 4, 100)  # no quota at all
    core.filter(core.queries.pods[pod_key("default", "outside-0")], [], 0.0)
    assert core.drain().evictions == []


# ------------------------------------------------------------------ plain pods that preempt


def unschedulable(name: str, gpus: int, prio: int, never: bool = False) -> dict[str, Any]:
    """A plain pod kube-scheduler found no node for: no filter call comes for it."""
    obj = pod(name).gpu(gpus).priority(prio).build()
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                    "reason": "Unschedulable"}]
    if never:
        obj["spec"]["preemptionPolicy"] = "Never"
    return obj


def plain_on(core: Coscheduler, name: str, gpus: int, node_name: str, prio: int) -> None:
    obj = pod(name).gpu(gpus).priority(prio).on(node_name).build()
    obj["metadata"]["uid"] = f"uid-{name}"
    core.upsert_pod(pod_from_json(obj))


def test_an_unschedulable_plain_pod_evicts_what_it_needs_and_holds_the_room() -> None:
    core = cluster(4, 4)
    for i in range(4):
        plain_on(core, f"low-{i}", 2, f"n{i // 2}", 10)
    core.upsert_pod(pod_from_json(unschedulable("urgent", 4, 100)))
    core.admit_gated(0.0)  # the sweep after cluster events
    evicted = core.drain().evictions
    assert len(evicted) == 2 and len({e.node for e in evicted}) == 1  # one node, both pods
    node = evicted[0].node
    nominated = state_of(core).preemption.nominations.get(pod_key("default", "urgent"))
    assert nominated is not None and nominated.node == node
    for e in evicted:
        core.delete_pod(e.pod, e.uid)
    assert pod_key("default", "urgent") in core.drain().requeue  # woken to bind
    # The room is free and held: a lower-priority plain pod is turned away there, and no
    # gang is planned into it; the preemptor itself may use it.
    later = pod_from_json(pod("later").gpu(2).priority(10).build())
    core.upsert_pod(later)
    d = core.filter(later, [NodeName(node)], 0.5)
    assert d.passed == [] and pod_key("default", "urgent") in d.failed[NodeName(node)].nominated
    assert core.queries.free_unreserved(NodeName(node)).get("nvidia.com/gpu", 0) == 0
    urgent = core.queries.pods[pod_key("default", "urgent")]
    assert core.filter(urgent, [NodeName(node)], 1.0).passed == [NodeName(node)]
    core.upsert_pod(pod_from_json(pod("urgent").gpu(4).priority(100).on(node).build()))
    assert state_of(core).preemption.nominations.get(pod_key("default", "urgent")) is None


def test_a_plain_pod_that_may_not_preempt_or_would_not_fit_evicts_nothing() -> None:
    for obj in (unschedulable("polite", 4, 100, never=True), unschedulable("huge", 8, 100),
                unschedulable("peer", 4, 10)):
        core = cluster(4)
        for i in range(2):
            plain_on(core, f"low-{i}", 2, "n0", 10)
        core.upsert_pod(pod_from_json(obj))
        core.admit_gated(0.0)
        assert core.drain().evictions == [], obj["metadata"]["name"]
        assert len(state_of(core).preemption.nominations) == 0


def test_a_higher_priority_pod_may_take_the_room_and_the_nomination_is_given_back() -> None:
    core = cluster(4)
    for i in range(2):
        plain_on(core, f"low-{i}", 2, "n0", 10)
    core.upsert_pod(pod_from_json(unschedulable("mid", 4, 50)))
    core.admit_gated(0.0)
    for e in core.drain().evictions:
        core.delete_pod(e.pod, e.uid)
    core.drain()
    top = pod_from_json(pod("top").gpu(4).priority(1000).build())
    core.upsert_pod(top)
    assert core.filter(top, [NodeName("n0")], 1.0).passed == [NodeName("n0")]  # gives way
    plain_on(core, "top", 4, "n0", 1000)  # kube-scheduler bound it
    assert state_of(core).preemption.nominations.get(pod_key("default", "mid")) is None
    assert pod_key("default", "mid") in core.drain().requeue


def test_victims_that_never_go_give_a_plain_pods_room_back_at_the_deadline() -> None:
    core = cluster(4)
    for i in range(2):
        plain_on(core, f"low-{i}", 2, "n0", 10)
    core.upsert_pod(pod_from_json(unschedulable("urgent", 4, 100)))
    core.admit_gated(0.0)
    assert core.drain().evictions
    rec = state_of(core).preemption.inflight.get(URGENT)
    assert rec is not None
    core.expire(rec.deadline + 0.1)
    assert state_of(core).preemption.nominations.get(pod_key("default", "urgent")) is None
    assert state_of(core).preemption.inflight.get(URGENT) is None


def test_a_nominated_node_deleted_gives_the_pod_its_turn_again() -> None:
    """Found by make fuzz: the room stayed nominated on a node that was gone."""
    core = cluster(4)
    for i in range(2):
        plain_on(core, f"low-{i}", 2, "n0", 10)
    core.upsert_pod(pod_from_json(unschedulable("urgent", 4, 100)))
    core.admit_gated(0.0)
    assert core.drain().evictions
    assert state_of(core).preemption.nominations.get(pod_key("default", "urgent"))
    core.drain()
    core.delete(ingest.NODES, NodeName("n0"))
    assert state_of(core).preemption.nominations.get(pod_key("default", "urgent")) is None
    assert state_of(core).preemption.inflight.get(URGENT) is None
    assert pod_key("default", "urgent") in core.drain().requeue


# ------------------------------------------------------------------ one measure on both sides


def volcano_gang(core: Coscheduler, name: str, size: int, klass: str,
                 node_name: str | None = None, suffix: str = "") -> None:
    """A Volcano PodGroup naming ``klass`` and ``size`` pods of priority 0 (Volcano's own
    jobs leave the pods' priority unset and put the class on the group)."""
    core.upsert(VOLCANO_PODGROUPS, volcano_podgroup_from_json({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": size, "priorityClassName": klass}}))
    for i in range(size):
        b = pod(f"{name}{suffix}-{i}").gpu(1).annotate("scheduling.k8s.io/group-name", name)
        obj = (b.on(node_name) if node_name else b).build()
        obj["metadata"]["uid"] = f"uid-{name}{suffix}-{i}"
        core.upsert_pod(pod_from_json(obj))


def classes(core: Coscheduler, **values: int) -> None:
    for name, value in values.items():
        core.upsert(PRIORITY_CLASSES, priority_class_from_json(
            {"metadata": {"name": name}, "value": value}))


def test_a_priority_10_gang_never_evicts_a_volcano_gang_whose_class_is_1000() -> None:
    """A defect found: the victim's pods carry priority 0, its group 1000. It was evicted for a
    priority-10 gang (pod priority against group priority), and then evicted that one back,
    round after round. Both rounds are played here: the first may happen, the second never."""
    core = cluster(4)
    classes(core, high=1000)
    running(core, "ten", 4, "n0", 10)
    volcano_gang(core, "vc", 4, "high")
    d = core.filter(core.queries.pods[pod_key("default", "vc-0")], [], 0.0)
    assert isinstance(d.unresolvable, Preempting)  # 1000 > 10: round one
    for e in core.drain().evictions:
        core.delete_pod(e.pod, e.uid)
    for i in range(4):  # the Volcano gang binds; the priority-10 job recreates its pods
        obj = pod(f"vc-{i}").gpu(1).annotate("scheduling.k8s.io/group-name", "vc").on(
            "n0").build()
        obj["metadata"]["uid"] = f"uid-vc-{i}"
        core.upsert_pod(pod_from_json(obj))
        core.upsert_pod(pod_from_json(pod(f"ten-new-{i}").gang("ten", 4, timeout=30).gpu(1)
                                      .priority(10).build()))
    d = core.filter(core.queries.pods[pod_key("default", "ten-new-0")], [], 1.0)
    assert core.drain().evictions == []  # round two: never
    assert not isinstance(d.unresolvable, Preempting)
    # Nor does a plain pod of priority 10, from the sweep.
    core.upsert_pod(pod_from_json(unschedulable("plain-ten", 4, 10)))
    core.admit_gated(2.0)
    assert core.drain().evictions == []


def test_a_gang_whose_group_says_5_is_a_victim_of_10_whatever_its_pods_say() -> None:
    """The other direction: an upstream PodGroup of priority 5 whose pods carry 50 is a
    priority-5 gang, for a gang and for a plain pod of priority 10 alike. Measured by its
    pods it was spared, while as a preemptor it counts as 5."""
    for preemptor in ("gang", "plain"):
        core = cluster(4)
        upstream_group(core, "five", 4, priority=5)
        upstream_pods(core, "five", 4, 50, "n0")
        if preemptor == "gang":
            arrive(core, "ten", 4, 10)
            core.filter(core.queries.pods[pod_key("default", "ten-0")], [], 0.0)
        else:
            core.upsert_pod(pod_from_json(unschedulable("ten", 4, 10)))
            core.admit_gated(0.0)
        evicted = core.drain().evictions
        assert {e.gang for e in evicted} == {gang_key("default", "five")}, preemptor
        assert len(evicted) == 4, preemptor


# ------------------------------------------------------------------ a binding in flight


def test_a_gang_whose_group_binding_is_in_flight_is_a_victim_whole_or_not_at_all() -> None:
    """A defect found: BindGroup issued, the watch has shown 2 of 4 members bound. The gang was a
    victim with those two only, and the other two bound afterwards: a gang evicted in
    part. It is not a victim until its bindings have landed; then it is one whole."""
    core = cluster(4, 2)
    arrive(core, "mid", 4, 10)
    keys = [pod_key("default", f"mid-{i}") for i in range(4)]
    nodes = [core.filter(core.queries.pods[k], [NodeName("n0"), NodeName("n1")], 0.0).passed
             for k in keys]
    assert all(n == [NodeName("n0")] for n in nodes)
    decisions = [core.bind(k, NodeName("n0"), 0.1) for k in keys]
    assert isinstance(decisions[-1], BindGroup) and len(decisions[-1].binds) == 4
    for i in (0, 1):  # the watch shows two of them bound
        obj = pod(f"mid-{i}").gang("mid", 4, timeout=30).gpu(1).priority(10).on("n0").build()
        obj["metadata"]["uid"] = core.queries.pods[keys[i]].uid
        core.upsert_pod(pod_from_json(obj))
    arrive(core, "high", 4, 100)
    core.filter(core.queries.pods[pod_key("default", "high-0")], [], 1.0)
    assert core.drain().evictions == []  # 2 GPUs on n0 + 2 on n1 would fit: not whole
    for i in (2, 3):  # the other two land
        obj = pod(f"mid-{i}").gang("mid", 4, timeout=30).gpu(1).priority(10).on("n0").build()
        obj["metadata"]["uid"] = core.queries.pods[keys[i]].uid
        core.upsert_pod(pod_from_json(obj))
    core.filter(core.queries.pods[pod_key("default", "high-0")], [], 2.0)
    assert sorted(e.pod for e in core.drain().evictions) == keys  # now whole


def test_a_member_of_a_gang_being_evicted_may_not_bind_even_if_its_filter_passed() -> None:
    """An extra of a released gang passed filter before the gang became a victim; its bind
    call comes after. Binding it would leave a member of the evicted gang running."""
    core = cluster(4, 1)
    running(core, "h", 3, "n0", 10)
    extra = pod_from_json(pod("h-3").gang("h", 3, timeout=30).gpu(1).priority(10).build())
    core.upsert_pod(extra)
    assert core.filter(extra, [NodeName("n1")], 0.0).passed == [NodeName("n1")]
    arrive(core, "b", 4, 50)
    b0 = core.queries.pods[pod_key("default", "b-0")]
    assert isinstance(core.filter(b0, [], 0.5).unresolvable, Preempting)
    assert {e.gang for e in core.drain().evictions} == {gang_key("default", "h")}
    d = core.bind(extra.key, NodeName("n1"), 0.6, extra.uid)
    assert isinstance(d, Reject) and isinstance(d.reason, BeingPreempted)


def test_a_gang_and_a_plain_pod_of_the_same_name_preempt_each_for_itself() -> None:
    """A defect found: a gang ``default/job`` and a plain pod ``default/job`` shared one preemption
    record (keyed by the bare string). The gang was told "Preempting" from the pod's record,
    evicted nothing, and was never woken when the pod's victims went."""
    core = cluster(4, 4)
    for i in range(2):
        plain_on(core, f"low-{i}", 2, "n0", 10)
    running(core, "lowgang", 4, "n1", 20)
    core.upsert_pod(pod_from_json(unschedulable("job", 4, 100)))
    core.admit_gated(0.0)
    assert {e.pod for e in core.drain().evictions} == {pod_key("default", "low-0"),
                                                       pod_key("default", "low-1")}
    arrive(core, "job", 4, 100)
    d = core.filter(core.queries.pods[pod_key("default", "job-0")], [], 0.5)
    assert isinstance(d.unresolvable, Preempting)
    assert d.unresolvable.victim_gangs == (gang_key("default", "lowgang"),)
    assert {e.gang for e in core.drain().evictions} == {gang_key("default", "lowgang")}
    gang = PreemptorId.of_gang(gang_key("default", "job"))
    plain = PreemptorId.of_pod(pod_key("default", "job"))
    assert state_of(core).preemption.inflight.get(gang) is not None
    assert state_of(core).preemption.inflight.get(plain) is not None


# ------------------------------------------------------------------ a bounded search


def test_a_victim_search_runs_in_bounded_slices_across_sweeps_and_then_evicts() -> None:
    """Searches in slices: no call holds the event loop for the whole search. With a
    budget smaller than the search, the first sweep evicts nothing and says so; the timer
    asks for the next slice; a later sweep decides, and the gang is evicted whole."""
    core = cluster(4, 4, 4, 4)
    for i in range(4):
        running(core, f"low{i}", 4, f"n{i}", 10 + i)
    state_of(core).preemption.inflight.budget = 30
    for i in range(4):
        obj = pod(f"high-{i}").gang("high", 4, timeout=30).gpu(1).priority(100).build()
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable"}]
        core.upsert_pod(pod_from_json(obj))
    core.admit_gated(0.0)
    assert core.drain().evictions == []
    g = core.queries.gangs[gang_key("default", "high")]
    assert isinstance(g.reason, DoesNotFit) and "searching for victims" in g.reason.preemption
    now, sweeps = 0.0, 1
    while not (evicted := core.drain().evictions):
        due = core.queries.next_deadline()
        assert due is not None and due <= now + 0.05 + 1e-9  # the timer comes back for it
        now = due
        core.expire(now)
        core.admit_gated(now)
        sweeps += 1
        assert sweeps < 200
    assert sweeps > 2
    assert {e.gang for e in evicted} == {gang_key("default", "low0")} and len(evicted) == 4
    assert state_of(core).preemption.inflight.searches == {}


def test_a_set_decided_over_slices_is_checked_against_the_cluster_of_now() -> None:
    """Between two slices a chosen victim may go (or bind elsewhere, or another member of
    its gang bind): what was decided is checked before anything is evicted."""

    core = cluster(4, 4)
    running(core, "low", 4, "n0", 10)
    arrive(core, "high", 4, 100)
    st = state_of(core)
    members = tuple(Member(p) for p in st.live(st.gangs[gang_key("default", "high")]))
    pre = Preemptor("default/high", members, 100, gang=gang_key("default", "high"))
    plain_on(core, "filler", 4, "n1", 1000)
    found = choose_victims(pre, _candidates(st, 100), st.capacity, st.settings.levels)
    assert isinstance(found, Victims) and _recheck(st, found, pre) is not None
    core.upsert_pod(pod_from_json(pod("low-4").gang("low", 4, timeout=30).gpu(0).priority(10)
                                  .on("n1").build()))  # another member bound meanwhile
    assert _recheck(st, found, pre) is None
    core.delete_pod(pod_key("default", "low-4"), core.queries.pods[pod_key("default", "low-4")].uid)
    assert _recheck(st, found, pre) is not None
    core.delete_pod(pod_key("default", "low-0"), "uid-low-0")  # a victim went
    assert _recheck(st, found, pre) is None


def test_preemptors_of_one_sweep_share_its_budget() -> None:
    """The budget bounds the sweep, not each preemptor: once one spent it, the others wait
    for the next sweep without even listing their candidates."""
    core = cluster(4, 4)
    for i in range(4):
        plain_on(core, f"low-{i}", 2, f"n{i // 2}", 10)
    state_of(core).preemption.inflight.budget = 30
    for name in ("a", "b"):
        core.upsert_pod(pod_from_json(unschedulable(name, 4, 100)))
    core.admit_gated(0.0)
    searching = set(state_of(core).preemption.inflight.searches)
    assert searching == {PreemptorId.of_pod(pod_key("default", "a"))}
    now = 0.0
    for _ in range(200):
        now += 0.05
        core.expire(now)
        core.admit_gated(now)
        if len(state_of(core).preemption.nominations) == 2:
            break
    assert len(state_of(core).preemption.nominations) == 2  # both preempted, one node each
    assert len({e.node for e in core.drain().evictions}) == 2


# ------------------------------------------------------------------ gated gangs with minResources


def test_a_held_volcano_gang_whose_min_resources_need_evictions_preempts() -> None:
    """Found in the default install: the Volcano gang's members are held behind the gate, so
    only the sweep admits it. Its minResources (4 GPUs) exceed the free room (0) and it was
    told so and never tried to preempt, while the same gang through filter calls did."""
    core = cluster(4)
    classes(core, urgent=1000)
    running(core, "low", 4, "n0", 10)
    core.upsert(VOLCANO_PODGROUPS, volcano_podgroup_from_json({
        "metadata": {"name": "urgent", "namespace": "default"},
        "spec": {"minMember": 4, "priorityClassName": "urgent",
                 "minResources": {"nvidia.com/gpu": "4"}}}))
    for i in range(4):
        core.upsert_pod(pod_from_json(pod(f"urgent-{i}").gpu(1).gated().annotate(
            "scheduling.k8s.io/group-name", "urgent").build()))
    core.admit_gated(0.0)
    evictions = core.drain().evictions
    assert sorted(e.pod for e in evictions) == [pod_key("default", f"low-{i}") for i in range(4)]
    assert state_of(core).preemption.inflight.get(
        PreemptorId.of_gang(gang_key("default", "urgent")))


def test_a_held_gang_whose_min_resources_evictions_could_not_free_evicts_nothing() -> None:
    """The rule stays: no eviction for a gang that would not fit after it. minResources of
    8 GPUs on a 4-GPU cluster: even with every lower-priority pod gone it is short."""
    core = cluster(4)
    classes(core, urgent=1000)
    running(core, "low", 4, "n0", 10)
    core.upsert(VOLCANO_PODGROUPS, volcano_podgroup_from_json({
        "metadata": {"name": "urgent", "namespace": "default"},
        "spec": {"minMember": 4, "priorityClassName": "urgent",
                 "minResources": {"nvidia.com/gpu": "8"}}}))
    for i in range(4):
        core.upsert_pod(pod_from_json(pod(f"urgent-{i}").gpu(1).gated().annotate(
            "scheduling.k8s.io/group-name", "urgent").build()))
    core.admit_gated(0.0)
    assert core.drain().evictions == []
    g = core.queries.gangs[gang_key("default", "urgent")]
    assert isinstance(g.reason, NotEnoughMinResources)


def test_a_held_scheduler_plugins_gang_with_min_resources_preempts() -> None:
    """The PyTorchJob shape: Kubeflow's training-operator creates a scheduler-plugins
    PodGroup with minResources; its pods carry the job's priority and are held."""
    core = cluster(4)
    running(core, "low", 4, "n0", 10)
    core.upsert(SP_PODGROUPS, podgroup_from_json(
        podgroup("high", 4, min_resources={"nvidia.com/gpu": "4"})))
    for i in range(4):
        core.upsert_pod(pod_from_json(pod(f"high-{i}").gpu(1).priority(100).gated().label(
            "scheduling.x-k8s.io/pod-group", "high").build()))
    core.admit_gated(0.0)
    assert {e.gang for e in core.drain().evictions} == {gang_key("default", "low")}
    assert state_of(core).preemption.inflight.get(HIGH) is not None
