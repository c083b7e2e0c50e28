"""Placement at creation: a member whose gang fits is pinned by the webhook, with no gate to
lift; its gang's whole plan is reserved at once (expected members for the rest); anything
that cannot be placed is gated as before, and nothing reserved at creation outlives the pod
that never came."""

from __future__ import annotations

from typing import Any

from coscheduling import (
    BindGroup,
    Coscheduler,
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
from coscheduling.creation import PROVISIONAL_SECONDS
from coscheduling.gating import pinned_node, pinned_terms
from coscheduling.invariants import check_invariants
from coscheduling.reasons import DoesNotFit
from tests.builders import node, pod, podgroup


def cluster(*gpus: int) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i, n in enumerate(gpus):
        core.upsert_node(node_from_json(node(f"n{i}").gpus(n).rack("r0").build()))
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


def reserved(core: Coscheduler) -> int:
    return sum(r.requests.get("nvidia.com/gpu", 0) for r in core.state.ledger.by_pod.values())


def test_the_first_member_admits_its_gang_whole_and_is_pinned_without_a_gate() -> None:
    core = cluster(4, 4)
    placed = core.place_at_creation(pod_from_json(creating("w0", "g", 4)), 0.0)
    assert isinstance(placed, PinAtCreation) and placed.gang == gang_key("default", "g")
    g = core.gangs()[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED
    assert reserved(core) == 4 and len(set(g.plan.values())) == 1  # whole gang, one node
    assert len(core.state.expected) == 3
    check_invariants(core)
    # The rest are pinned into the slots held for them, on the same node.
    for i in range(1, 4):
        p = core.place_at_creation(pod_from_json(creating(f"w{i}", "g", 4)), 0.1)
        assert p == PinAtCreation(placed.node, g.key)
        check_invariants(core)
    assert core.state.expected == {} and reserved(core) == 4
    assert core.drain_lift() == []  # nothing was gated, nothing to lift


def test_members_pinned_at_creation_bind_as_a_gang_once_the_watch_shows_them() -> None:
    core = cluster(4)
    objs = [creating(f"w{i}", "g", 3) for i in range(3)]
    placed = [core.place_at_creation(pod_from_json(o), 0.0) for o in objs]
    assert all(isinstance(p, PinAtCreation) for p in placed)
    for i, (o, p) in enumerate(zip(objs, placed, strict=True)):
        assert isinstance(p, PinAtCreation)
        core.upsert_pod(pod_from_json(created(o, p, f"u{i}")))
    assert core.state.provisional == {}
    decisions = []
    for i in range(3):
        rec = core.pods[pod_key("default", f"w{i}")]
        pin = NodeName(pinned_node(rec.required_affinity) or "")
        assert core.filter(rec, [pin], 1.0).passed == [pin]
        decisions.append(core.bind(rec.key, pin, 1.0, rec.uid))
    assert [type(d) for d in decisions] == [Park, Park, BindGroup]
    check_invariants(core)


def test_a_gang_that_does_not_fit_is_gated_and_leaves_nothing_behind() -> None:
    core = cluster(2)
    placed = core.place_at_creation(pod_from_json(creating("w0", "g", 4)), 0.0)
    assert isinstance(placed, GateAtCreation) and isinstance(placed.reason, DoesNotFit)
    assert reserved(core) == 0 and core.state.expected == {}
    assert pod_key("default", "w0") not in core.pods
    assert gang_key("default", "g") not in core.gangs()
    check_invariants(core)


def test_pods_it_cannot_place_are_gated() -> None:
    core = cluster(8)
    kueue = creating("k0", "k", 2)
    kueue["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert isinstance(core.place_at_creation(pod_from_json(kueue), 0.0), GateAtCreation)
    assert reserved(core) == 0 and core.pods == {}
    bound = creating("b0", "b", 2)
    bound["spec"]["nodeName"] = "n0"
    assert isinstance(core.place_at_creation(pod_from_json(bound), 0.0), GateAtCreation)


def test_members_that_are_not_alike_wait_for_each_other() -> None:
    core = cluster(8)
    core.upsert_podgroup(podgroup_from_json(podgroup(
        "pg", 4, min_resources={"nvidia.com/gpu": "6"})))
    launcher = pod("l").label("scheduling.x-k8s.io/pod-group", "pg").gpu(0).build()
    launcher["metadata"].pop("uid")
    placed = core.place_at_creation(pod_from_json(launcher), 0.0)
    assert isinstance(placed, GateAtCreation) and "minResources" in placed.why
    assert reserved(core) == 0


def test_a_member_of_another_shape_is_gated_and_its_gang_planned_again() -> None:
    """The plan made at the first member assumed members like it; one that is not takes no
    slot, and the gang gives its placeholders back to be planned from its real members."""
    core = cluster(8)
    core.place_at_creation(pod_from_json(creating("w0", "g", 4)), 0.0)
    assert len(core.state.expected) == 3 and reserved(core) == 4
    big = core.place_at_creation(pod_from_json(creating("w1", "g", 4, gpus=2)), 0.1)
    assert isinstance(big, GateAtCreation)
    assert core.state.expected == {} and reserved(core) == 0
    assert core.gangs()[gang_key("default", "g")].phase is GangPhase.WAITING
    check_invariants(core)


def test_a_pin_whose_pod_never_appears_gives_the_gang_back_within_seconds() -> None:
    core = cluster(4)
    core.place_at_creation(pod_from_json(creating("w0", "g", 2)), 0.0)
    assert reserved(core) == 2
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= PROVISIONAL_SECONDS
    core.expire(PROVISIONAL_SECONDS + 0.01)
    g = core.gangs().get(gang_key("default", "g"))
    assert g is None or g.phase is not GangPhase.ADMITTED
    assert reserved(core) == 0 and core.state.expected == {} and core.pods == {}
    check_invariants(core)


def test_expected_members_that_never_come_are_given_back_at_the_gang_deadline() -> None:
    core = cluster(4)
    obj = creating("w0", "g", 3)
    placed = core.place_at_creation(pod_from_json(obj), 0.0)
    assert isinstance(placed, PinAtCreation)
    core.upsert_pod(pod_from_json(created(obj, placed, "u0")))
    core.expire(31.0)
    assert core.gangs()[gang_key("default", "g")].phase is GangPhase.BACKING_OFF
    assert reserved(core) == 0 and core.state.expected == {}
    assert set(core.pods) == {pod_key("default", "w0")}
    check_invariants(core)


def test_a_relist_keeps_what_was_placed_at_creation() -> None:
    core = cluster(4)
    core.place_at_creation(pod_from_json(creating("w0", "g", 2)), 0.0)
    core.replace_pods([])
    assert reserved(core) == 2 and len(core.pods) == 2  # w0 and one expected member
    check_invariants(core)


def test_a_filter_call_before_the_watch_takes_the_created_pod() -> None:
    core = cluster(4)
    obj = creating("w0", "g", 2)
    placed = core.place_at_creation(pod_from_json(obj), 0.0)
    assert isinstance(placed, PinAtCreation)
    rec = pod_from_json(created(obj, placed, "u0"))
    assert core.filter(rec, [placed.node], 0.1).passed == [placed.node]
    assert core.pods[rec.key].uid == "u0" and core.state.provisional == {}


def test_a_stale_call_for_a_deleted_pod_of_that_name_does_not_stand_in_for_the_pinned_one(
) -> None:
    """Found by the model: a deleted w0 that a lagging scheduler cache still calls with must
    not count as the new w0 pinned at creation, or the pin that never lands holds forever."""
    core = cluster(4)
    obj = pod("w0").gang("g", 2, timeout=30).gpu(1).build()
    obj["metadata"]["resourceVersion"] = "5"
    old = pod_from_json(obj)
    core.upsert_pod(old)
    other = pod("x").build()
    other["metadata"]["resourceVersion"] = "9"
    core.replace_pods([pod_from_json(other)])  # a relist: w0 was deleted meanwhile
    placed = core.place_at_creation(pod_from_json(creating("w0", "g", 2)), 1.0)
    assert isinstance(placed, PinAtCreation)
    core.filter(old, [placed.node], 1.1)
    assert core.pods[old.key].uid == "" and old.key in core.state.provisional
    core.expire(1.0 + PROVISIONAL_SECONDS + 0.01)
    assert reserved(core) == 0 and old.key not in core.pods
    check_invariants(core)


def test_an_ungated_member_takes_an_expected_slot_at_its_filter_call() -> None:
    core = cluster(4, 4)
    placed = core.place_at_creation(pod_from_json(creating("w0", "g", 2)), 0.0)
    assert isinstance(placed, PinAtCreation)
    other = pod_from_json(pod("w1").gang("g", 2, timeout=30).gpu(1).build())
    core.upsert_pod(other)
    d = core.filter(core.pods[other.key], [NodeName("n0"), NodeName("n1")], 0.1)
    assert d.passed == [placed.node] and core.state.expected == {}
    assert reserved(core) == 2
    check_invariants(core)


def test_a_restarted_lockstep_admits_pinned_members_onto_their_pins() -> None:
    first = cluster(4, 4)
    objs = [creating(f"w{i}", "g", 2) for i in range(2)]
    pods = []
    for i, o in enumerate(objs):
        p = first.place_at_creation(pod_from_json(o), 0.0)
        assert isinstance(p, PinAtCreation)
        pods.append(pod_from_json(created(o, p, f"u{i}")))
    pins = {p.key: pinned_node(p.required_affinity) for p in pods}
    second = cluster(4, 4)
    second.replace_pods(pods)
    second.admit_held(1.0)
    g = second.gangs()[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED and dict(g.plan) == pins
    check_invariants(second)


def test_an_expected_member_whose_node_goes_is_dropped_not_placed_again() -> None:
    """Found by the model: the node of an expected member is deleted. It held a slot and
    nothing else, so it goes with its slot, and the plan is completed from the members that
    exist (here a gated one of another shape), never left with a placeholder and no slot."""
    core = cluster(4, 2, 2)
    placed = core.place_at_creation(pod_from_json(creating("w0", "g", 3, gpus=2)), 0.0)
    assert isinstance(placed, PinAtCreation) and len(core.state.expected) == 2
    for name in ("w1", "w2"):  # members of another shape: gated, no slot of theirs
        core.upsert_pod(pod_from_json(pod(name).gang("g", 3, timeout=30).gpu(1).held().build()))
    ledger = core.state.ledger.by_pod
    alone = [r.node for k, r in ledger.items() if k in core.state.expected
             and sum(o.node == r.node for o in ledger.values()) == 1]
    assert alone, ledger  # an expected member alone on its node
    core.delete_node(alone[0])
    check_invariants(core)
    assert all(k in core.state.ledger.by_pod for k in core.state.expected)


def test_a_gang_admitted_with_the_members_that_exist_gates_the_extra_being_created() -> None:
    """Found by the model: held members already make the quorum; the member being created is
    an extra the plan left out (no room for it). The gang is admitted with the others, and
    this one gated."""
    core = cluster(2)
    for name in ("w0", "w1"):
        core.upsert_pod(pod_from_json(pod(name).gang("g", 2, timeout=30).gpu(1).held().build()))
    placed = core.place_at_creation(pod_from_json(creating("w2", "g", 2)), 0.0)
    g = core.gangs()[gang_key("default", "g")]
    assert g.phase is GangPhase.ADMITTED and reserved(core) == 2
    assert isinstance(placed, GateAtCreation)
    assert pod_key("default", "w2") not in core.pods
    check_invariants(core)
