"""Placement at creation: a member is pinned by the webhook, with no gate to lift, only once
its gang's quorum exists (members that exist plus reviews held for a moment); its gang's
whole plan is reserved at once; anything that cannot be placed is gated as before, nothing is
reserved for a member that does not exist, and nothing reserved at creation outlives the pod
that never came."""

from __future__ import annotations

import time
from typing import Any

from coscheduling import (
    AwaitQuorum,
    BindGroup,
    Coscheduler,
    GangDefaults,
    GangPhase,
    GateAtCreation,
    NodeName,
    Park,
    PinAtCreation,
    Settings,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
    podgroup_from_json,
)
from coscheduling.actions import Answer
from coscheduling.creation.placer import HOLD_MAX_SECONDS, HOLD_SECONDS, PIN_LANDING_SECONDS
from coscheduling.events import ingest
from coscheduling.gang.gating import pinned_node, pinned_terms
from coscheduling.reasons import DoesNotFit, HigherPriorityPodsWaiting
from tests.builders import node, pod, podgroup
from tests.internals import state_of
from tests.invariants import check_invariants


def cluster(*gpus: int) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i, n in enumerate(gpus):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(n).rack("r0").build()))
    return core


def creating(name: str, gang: str, size: int, gpus: int = 1) -> dict[str, Any]:
    """The object as the webhook sees it: no uid, no resourceVersion yet."""
    obj = pod(name).gang(gang, size, timeout=30).gpu(gpus).build()
    obj["metadata"].pop("uid", None)
    return obj


def created(obj: dict[str, Any], placed: PinAtCreation, uid: str) -> dict[str, Any]:
    """What the API server stores for a pod the webhook pinned."""
    out = {**obj, "metadata": {**obj["metadata"], "uid": uid, "resourceVersion": "5"}}
    out["spec"] = {**obj["spec"], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": pinned_terms((), placed.node)}}}}
    return out


def burst(core: Coscheduler, objs: list[dict[str, Any]], now: float = 0.0
          ) -> dict[str, Answer]:
    """Members whose reviews reach the webhook together (a Job's creators in parallel): each
    one's answer by name, held ones answered when a later one completes the quorum."""
    out: dict[str, Answer] = {}
    for o in objs:
        p = core.place_at_creation(pod_from_json(o), now)
        if not isinstance(p, AwaitQuorum):
            out[o["metadata"]["name"]] = p
    for key, p in core.drain().answers.items():
        out[key.split("/", 1)[1]] = p
    return out


def land_all(core: Coscheduler, objs: list[dict[str, Any]], placed: dict[str, Answer]) -> None:
    """The API server stores each as answered (pinned, or gated)."""
    for i, o in enumerate(objs):
        p = placed[o["metadata"]["name"]]
        if isinstance(p, PinAtCreation):
            core.upsert_pod(pod_from_json(created(o, p, f"u{i}")))
        else:
            gated = {**o, "metadata": {**o["metadata"], "uid": f"u{i}", "resourceVersion": "5"}}
            gated["spec"] = {**o["spec"], "schedulingGates": [{"name": "lockstep.dev/gang"}]}
            core.upsert_pod(pod_from_json(gated))


def reserved(core: Coscheduler) -> int:
    return core.queries.reserved_gpus()


def test_a_gang_created_in_one_burst_is_pinned_whole_once_its_quorum_exists() -> None:
    core = cluster(4, 4)
    objs = [creating(f"w{i}", "g", 4) for i in range(4)]
    for o in objs[:3]:
        # Not a quorum yet: the review is held; nothing is reserved, no gang, no placeholder.
        held = core.place_at_creation(pod_from_json(o), 0.0)
        assert held == AwaitQuorum(gang_key("default", "g"), HOLD_SECONDS)
        assert reserved(core) == 0 and core.queries.gangs == {} and core.queries.pods == {}
        check_invariants(core)
    last = core.place_at_creation(pod_from_json(objs[3]), 0.01)
    assert isinstance(last, PinAtCreation) and last.gang == gang_key("default", "g")
    others = core.drain().answers
    assert set(others.values()) == {last}  # every held review pinned, on the same node
    g = core.queries.gangs[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED and reserved(core) == 4
    assert state_of(core).creation.holds == {}
    assert core.drain().lift == []  # nothing was gated, nothing to lift
    check_invariants(core)


def test_members_pinned_at_creation_bind_as_a_gang_once_the_watch_shows_them() -> None:
    core = cluster(4)
    objs = [creating(f"w{i}", "g", 3) for i in range(3)]
    placed = burst(core, objs)
    assert all(isinstance(p, PinAtCreation) for p in placed.values())
    land_all(core, objs, placed)
    assert state_of(core).creation.pinned == {}
    decisions = []
    for i in range(3):
        rec = core.queries.pods[pod_key("default", f"w{i}")]
        pin = NodeName(pinned_node(rec.required_affinity) or "")
        assert core.filter(rec, [pin], 1.0).passed == [pin]
        decisions.append(core.bind(rec.key, pin, 1.0, rec.uid))
    assert [type(d) for d in decisions] == [Park, Park, BindGroup]
    check_invariants(core)


def test_a_gang_that_does_not_fit_is_gated_and_leaves_nothing_behind() -> None:
    core = cluster(2)
    placed = burst(core, [creating(f"w{i}", "g", 4) for i in range(4)])
    assert len(placed) == 4
    for p in placed.values():
        assert isinstance(p, GateAtCreation) and isinstance(p.reason, DoesNotFit)
    assert reserved(core) == 0 and core.queries.pods == {}
    assert gang_key("default", "g") not in core.queries.gangs
    check_invariants(core)


def test_pods_it_cannot_place_are_gated() -> None:
    core = cluster(8)
    kueue = creating("k0", "k", 2)
    kueue["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert isinstance(core.place_at_creation(pod_from_json(kueue), 0.0), GateAtCreation)
    assert reserved(core) == 0 and core.queries.pods == {}
    bound = creating("b0", "b", 2)
    bound["spec"]["nodeName"] = "n0"
    assert isinstance(core.place_at_creation(pod_from_json(bound), 0.0), GateAtCreation)


def test_members_that_are_not_alike_are_planned_as_they_are() -> None:
    """No member is assumed to be like another: the plan is made for the reviews at hand."""
    core = cluster(8)
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup(
        "pg", 3, min_resources={"nvidia.com/gpu": "6"})))
    objs = []
    for name, gpus in (("l", 0), ("w0", 3), ("w1", 3)):
        o = pod(name).label("scheduling.x-k8s.io/pod-group", "pg").gpu(gpus).build()
        o["metadata"].pop("uid")
        objs.append(o)
    placed = burst(core, objs)
    assert all(isinstance(p, PinAtCreation) for p in placed.values()), placed
    assert reserved(core) == 6
    check_invariants(core)


def test_a_pin_whose_pod_never_appears_gives_the_gang_back_and_leaves_no_gang() -> None:
    core = cluster(4)
    placed = burst(core, [creating(f"w{i}", "g", 2) for i in range(2)])
    assert all(isinstance(p, PinAtCreation) for p in placed.values())
    assert reserved(core) == 2
    deadline = core.queries.next_deadline()
    assert deadline is not None and deadline <= PIN_LANDING_SECONDS
    core.expire(PIN_LANDING_SECONDS + 0.01)
    assert reserved(core) == 0 and core.queries.pods == {}
    assert core.queries.gangs == {}  # no empty gang left behind
    check_invariants(core)


def test_a_slow_gang_is_never_tied_to_nodes_chosen_before_its_quorum_existed() -> None:
    """A member created alone (its creator waits for each create) is held for a moment, then
    gated without a pin: a gang that later times out and backs off is planned afresh, not
    kept on nodes chosen for its first member. The member that completes the quorum is pinned
    with the others lifted onto the same plan, all chosen once the quorum existed."""
    core = cluster(1, 1, 4)
    first = creating("w0", "g", 2)
    held = core.place_at_creation(pod_from_json(first), 0.0)
    assert isinstance(held, AwaitQuorum) and reserved(core) == 0
    core.expire_holds(HOLD_MAX_SECONDS)
    (answer,) = core.drain().answers.values()
    assert isinstance(answer, GateAtCreation) and "quorum" in answer.why
    land_all(core, [first], {"w0": answer})
    assert pinned_node(core.queries.pods[pod_key("default", "w0")].required_affinity) is None
    # Created slowly: later members are not held, the one completing the quorum is pinned.
    second = creating("w1", "g", 2)
    p = core.place_at_creation(pod_from_json(second), 5.0)
    assert isinstance(p, PinAtCreation)
    g = core.queries.gangs[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED and set(g.plan.values()) == {p.node}
    assert [lift.node for lift in core.drain().lift] == [p.node]
    check_invariants(core)


def test_a_member_created_alone_holds_nothing_and_leaves_no_gang_when_cancelled() -> None:
    """A defect found: the only member of a gang admitted at its creation was deleted while
    pending (or its pin never landed) and the gang stayed, empty, forever. 100 cancelled
    jobs left 100 gangs. Now a member created alone reserves nothing, and its gang goes with
    it."""
    core = cluster(8)
    for j in range(100):
        obj = creating("w0", f"job{j}", 2)
        assert isinstance(core.place_at_creation(pod_from_json(obj), float(j)), AwaitQuorum)
        core.expire_holds(j + HOLD_MAX_SECONDS)
        answers = core.drain().answers
        if j % 2:
            land_all(core, [obj], {"w0": answers[pod_key("default", "w0")]})
            core.delete_pod(pod_key("default", "w0"))
        # else: its creation never landed
    core.expire(200.0 + PIN_LANDING_SECONDS)
    assert core.queries.gangs == {} and reserved(core) == 0 and core.queries.pods == {}
    check_invariants(core)


def test_a_member_disagreeing_on_min_member_reserves_nothing_beyond_the_gang() -> None:
    """A defect found: a gated member said 2, a new one said 10, and room was reserved
    for 8 placeholders of a gang of 2. The gang's own spec stands (its first members', as
    the filter verb answers too): the one that disagrees is gated and counts for nothing."""
    core = cluster(8, 8)
    core.upsert_pod(pod_from_json(pod("w0").gang("g", 2, timeout=30).gpu(1).gated().build()))
    placed = core.place_at_creation(pod_from_json(creating("w1", "g", 10)), 0.0)
    assert isinstance(placed, GateAtCreation) and "disagree" in placed.why
    assert reserved(core) == 0 and state_of(core).creation.holds == {}
    assert set(core.queries.pods) == {pod_key("default", "w0")}
    check_invariants(core)


def test_a_held_review_disagreeing_with_the_gang_that_came_since_is_gated_not_pinned() -> None:
    """Found by the model test: a review held before its gang existed said minMember 2;
    the gang then came from a member the watch showed that says 3. The held review was
    counted into that gang's quorum of 3 and pinned, and the gang took its minMember of 2,
    from a pod that may never land. Now it is gated and counts for nothing: the next member
    saying 3 makes 2 of 3, held, and nothing is reserved."""
    core = cluster(8, 8)
    w0 = creating("w0", "g", 2)
    assert isinstance(core.place_at_creation(pod_from_json(w0), 0.0), AwaitQuorum)
    w1 = creating("w1", "g", 3)
    placed = burst(core, [w1], 0.05)
    assert isinstance(placed["w1"], GateAtCreation) and "disagree" in placed["w1"].why
    land_all(core, [w1], placed)  # the gang now exists, with the minMember of 3 its pod says
    answers = burst(core, [creating("w2", "g", 3)], 0.1)
    assert set(answers) == {"w0"}, answers  # w2 is held for the third member
    assert isinstance(answers["w0"], GateAtCreation) and "disagree" in answers["w0"].why
    assert reserved(core) == 0 and set(core.queries.pods) == {pod_key("default", "w1")}
    spec = core.queries.gangs[gang_key("default", "g")].spec
    assert spec is not None and spec.min_member == 3
    assert [list(h.pods) for h in state_of(core).creation.holds.values()] == [
        [pod_key("default", "w2")]]
    placed = burst(core, [creating("w3", "g", 3)], 0.2)
    assert set(placed) == {"w2", "w3"} and all(
        isinstance(p, PinAtCreation) for p in placed.values())
    check_invariants(core)


def test_a_huge_min_member_is_gated_at_once_with_no_work_per_member() -> None:
    """A defect found: min-member 10,000,000 froze the loop, one placeholder built per
    expected member before any check that the gang could fit. ``--max-gang-size`` bounds
    the number at parse time; an operator who raises it must not bring the freeze back: the
    work stays bounded by what a review may wait for, not by the user's number."""
    core = Coscheduler(Settings(defaults=GangDefaults(max_gang_size=2**31 - 1)))
    core.upsert(ingest.NODES, node_from_json(node("n0").gpus(8).rack("r0").build()))
    for size in (300_000, 10_000_000, 2**31 - 1):
        start = time.perf_counter()
        placed = core.place_at_creation(pod_from_json(creating("w0", f"g{size}", size)), 0.0)
        assert time.perf_counter() - start < 0.1
        assert isinstance(placed, GateAtCreation)
        assert core.queries.pods == {} and state_of(core).creation.holds == {}


def test_a_relist_keeps_what_was_placed_at_creation() -> None:
    core = cluster(4)
    burst(core, [creating(f"w{i}", "g", 2) for i in range(2)])
    core.replace(ingest.PODS, [])
    assert reserved(core) == 2 and len(core.queries.pods) == 2
    check_invariants(core)


def test_a_filter_call_before_the_watch_takes_the_created_pod() -> None:
    core = cluster(4)
    obj = creating("w0", "g", 1)
    placed = core.place_at_creation(pod_from_json(obj), 0.0)
    assert isinstance(placed, PinAtCreation)
    rec = pod_from_json(created(obj, placed, "u0"))
    assert core.filter(rec, [placed.node], 0.1).passed == [placed.node]
    assert core.queries.pods[rec.key].uid == "u0" and state_of(core).creation.pinned == {}


def test_a_stale_call_for_a_deleted_pod_of_that_name_does_not_stand_in_for_the_pinned_one(
) -> None:
    """Found by the model: a deleted w0 that a lagging scheduler cache still calls with must
    not count as the new w0 pinned at creation, or the pin that never lands holds forever."""
    core = cluster(4)
    obj = pod("w0").gang("g", 1, timeout=30).gpu(1).build()
    obj["metadata"]["resourceVersion"] = "5"
    old = pod_from_json(obj)
    core.upsert_pod(old)
    other = pod("x").build()
    other["metadata"]["resourceVersion"] = "9"
    core.replace(ingest.PODS, [pod_from_json(other)])  # a relist: w0 was deleted meanwhile
    placed = core.place_at_creation(pod_from_json(creating("w0", "g", 1)), 1.0)
    assert isinstance(placed, PinAtCreation)
    core.filter(old, [placed.node], 1.1)
    assert core.queries.pods[old.key].uid == "" and old.key in state_of(core).creation.pinned
    core.expire(1.0 + PIN_LANDING_SECONDS + 0.01)
    assert reserved(core) == 0 and old.key not in core.queries.pods
    check_invariants(core)


def test_a_held_review_whose_pod_appears_in_the_watch_is_held_no_more() -> None:
    """The API server gave up on the webhook (its timeout) and created the pod as it was:
    the review is no longer counted toward the quorum of the reviews still held."""
    core = cluster(4)
    obj = creating("w0", "g", 2)
    assert isinstance(core.place_at_creation(pod_from_json(obj), 0.0), AwaitQuorum)
    core.upsert_pod(pod_from_json(pod("w0").gang("g", 2, timeout=30).gpu(1).build()))
    assert state_of(core).creation.holds == {}


def test_a_restarted_lockstep_admits_pinned_members_onto_their_pins() -> None:
    first = cluster(4, 4)
    objs = [creating(f"w{i}", "g", 2) for i in range(2)]
    placed = burst(first, objs)
    pods = []
    for i, o in enumerate(objs):
        p = placed[o["metadata"]["name"]]
        assert isinstance(p, PinAtCreation)
        pods.append(pod_from_json(created(o, p, f"u{i}")))
    pins = {p.key: pinned_node(p.required_affinity) for p in pods}
    second = cluster(4, 4)
    second.replace(ingest.PODS, pods)
    second.admit_gated(1.0)
    g = second.queries.gangs[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED and dict(g.plan) == pins
    check_invariants(second)


def plain(core: Coscheduler, name: str, priority: int, unschedulable: bool = False
          ) -> dict[str, Any]:
    obj = pod(name).gpu(1).priority(priority).build()
    if unschedulable:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable"}]
    core.upsert_pod(pod_from_json(obj))
    return obj


def test_a_gang_created_between_higher_priority_pods_is_not_pinned_onto_their_room() -> None:
    """scheduler-plugins' "different priority, not sequentially pg1 meet min and 3 regular
    pods": gang members and higher-priority plain pods created in turn, room for one side
    only. The gang is not admitted over the plain pods kube-scheduler is placing."""
    core = cluster(1, 1, 1)
    objs = [creating(f"w{i}", "g", 3) for i in range(3)]
    answers: dict[str, Answer] = {}
    for i, o in enumerate(objs):
        p = core.place_at_creation(pod_from_json(o), 0.0)
        if not isinstance(p, AwaitQuorum):
            answers[o["metadata"]["name"]] = p
        plain(core, f"inf-{i}", 100)
    answers.update({k.split("/")[1]: v for k, v in core.drain().answers.items()})
    assert len(answers) == 3 and all(isinstance(a, GateAtCreation) for a in answers.values())
    assert reserved(core) == 0
    assert core.drain().evictions == []


def test_an_admitted_gang_with_no_member_bound_gives_its_room_to_higher_priority_pods(
) -> None:
    """A defect found: a gang admitted before higher-priority plain pods were seen kept
    its room, bound, and was then evicted whole for them. A gang none of whose members is
    bound gives its reservation back instead, with no eviction, and waits."""
    core = cluster(1, 1, 1)
    objs = [creating(f"w{i}", "g", 3) for i in range(3)]
    placed = burst(core, objs)
    assert all(isinstance(p, PinAtCreation) for p in placed.values())
    land_all(core, objs, placed)
    assert reserved(core) == 3
    pods = [plain(core, f"inf-{i}", 100) for i in range(3)]
    for o in pods:  # kube-scheduler asks; the gang's reservation turns each away
        rec = core.queries.pods[pod_key("default", o["metadata"]["name"])]
        assert core.filter(rec, [NodeName(f"n{i}") for i in range(3)], 0.5).passed == []
    for o in pods:  # ... and marks each unschedulable
        plain(core, o["metadata"]["name"], 100, unschedulable=True)
    core.admit_gated(1.0)
    g = core.queries.gangs[gang_key("default", "g")]
    assert g.phase is GangPhase.WAITING and isinstance(g.reason, HigherPriorityPodsWaiting)
    out = core.drain()
    assert reserved(core) == 0 and out.evictions == []
    assert set(out.requeue) >= {pod_key("default", f"inf-{i}") for i in range(3)}
    for i in range(3):
        rec = core.queries.pods[pod_key("default", f"inf-{i}")]
        assert core.filter(rec, [NodeName(f"n{i}")], 1.5).passed == [NodeName(f"n{i}")]
    check_invariants(core)
    # Not re-admitted over them while they wait to be placed.
    core.admit_gated(2.0)
    assert reserved(core) == 0


def admitted_then_outranked(core: Coscheduler, gpus: int) -> list[dict[str, Any]]:
    """A 3 x 1-GPU gang pinned at creation and seen, then three plain pods of ``gpus`` GPUs
    and higher priority that Lockstep's filter turned away and kube-scheduler marked
    unschedulable."""
    objs = [creating(f"w{i}", "g", 3) for i in range(3)]
    placed = burst(core, objs)
    land_all(core, objs, placed)
    out = []
    for i in range(3):
        o = pod(f"inf-{i}").gpu(gpus).priority(100).build()
        core.upsert_pod(pod_from_json(o))
        core.filter(core.queries.pods[pod_key("default", f"inf-{i}")],
                    [NodeName(n) for n in sorted(core.queries.nodes)], 0.5)
        o["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                      "reason": "Unschedulable"}]
        core.upsert_pod(pod_from_json(o))
        out.append(o)
    return out


def test_a_gang_keeps_its_room_when_giving_it_back_would_place_no_one() -> None:
    """Pods of higher priority that fit nowhere, with or without the gang's room, do not
    take it from the gang."""
    core = cluster(1, 1, 1)
    admitted_then_outranked(core, gpus=2)
    core.admit_gated(1.0)
    assert core.queries.gangs[gang_key("default", "g")].phase is GangPhase.ADMITTED
    assert reserved(core) == 3


def test_a_gang_with_a_member_bound_keeps_its_room_for_preemption_to_decide() -> None:
    """Yielding is for gangs none of whose members is bound: a gang partly or wholly bound
    is a victim whole, or not at all (preemption's rules)."""
    core = cluster(1, 1, 1)
    objs = [creating(f"w{i}", "g", 3) for i in range(3)]
    placed = burst(core, objs)
    land_all(core, objs, placed)
    first = core.queries.pods[pod_key("default", "w0")]
    node = pinned_node(first.required_affinity)
    bound = {**created(objs[0], placed["w0"], "u0")}  # type: ignore[arg-type]
    bound["spec"] = {**bound["spec"], "nodeName": node}
    core.upsert_pod(pod_from_json(bound))
    for i in range(3):
        o = pod(f"inf-{i}").gpu(1).priority(100).build()
        core.upsert_pod(pod_from_json(o))
    core.admit_gated(1.0)
    assert core.queries.gangs[gang_key("default", "g")].phase is GangPhase.ADMITTED


def test_a_gang_admitted_with_the_members_that_exist_gates_the_extra_being_created() -> None:
    """Found by the model: gated members already make the quorum; the member being created is
    an extra the plan left out (no room for it). The gang is admitted with the others, and
    this one gated."""
    core = cluster(2)
    for name in ("w0", "w1"):
        core.upsert_pod(pod_from_json(pod(name).gang("g", 2, timeout=30).gpu(1).gated().build()))
    placed = core.place_at_creation(pod_from_json(creating("w2", "g", 2)), 0.0)
    g = core.queries.gangs[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED and reserved(core) == 2
    assert isinstance(placed, GateAtCreation)
    assert pod_key("default", "w2") not in core.queries.pods
    check_invariants(core)
