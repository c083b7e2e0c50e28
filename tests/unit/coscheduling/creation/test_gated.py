"""Gangs behind Lockstep's scheduling gate: admitted by Lockstep itself, lifted with a pin."""

from __future__ import annotations

from typing import Any

from coscheduling import (
    BindGroup,
    Coscheduler,
    GangPhase,
    NodeName,
    Park,
    Settings,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.actions import NoticeKind
from coscheduling.events import ingest
from coscheduling.gang.gating import GANG_GATE, lift_patch, pinned_node
from coscheduling.reasons import DoesNotFit, WaitingForMembers
from tests.builders import node, pod


def cluster(*gpus: int) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i, n in enumerate(gpus):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(n).rack("r0").build()))
    return core


def held(name: str, gang: str, size: int, gpus: int = 1) -> dict[str, Any]:
    return pod(name).gang(gang, size, timeout=30).gpu(gpus).gated().build()


def lifted(obj: dict[str, Any], node_name: str | None) -> dict[str, Any]:
    """What the API server makes of ``lift_patch`` (gate gone, pin on every term)."""
    patch = lift_patch(obj["metadata"]["uid"], pod_from_json(obj).required_affinity, node_name)
    spec = {**obj["spec"], "schedulingGates": [
        g for g in obj["spec"].get("schedulingGates", []) if g["name"] != GANG_GATE]}
    if "affinity" in patch["spec"]:
        spec["affinity"] = patch["spec"]["affinity"]
    return {**obj, "spec": spec}


def test_a_held_gang_is_admitted_without_any_filter_call_and_lifted_pinned() -> None:
    core = cluster(4, 4)
    objs = [held(f"w{i}", "g", 3) for i in range(3)]
    for o in objs[:2]:
        core.upsert_pod(pod_from_json(o))
    core.admit_gated(0.0)
    assert core.drain().lift == []  # two of three: nothing to lift
    g = core.queries.gangs[gang_key("default", "g")]
    assert isinstance(g.reason, WaitingForMembers)
    core.upsert_pod(pod_from_json(objs[2]))
    core.admit_gated(0.0)
    assert g.phase is GangPhase.ADMITTED
    lifts = core.drain().lift
    assert {lf.pod for lf in lifts} == {pod_key("default", f"w{i}") for i in range(3)}
    assert {lf.node for lf in lifts} == {g.plan[lf.pod] for lf in lifts}
    assert len({lf.node for lf in lifts}) == 1  # packed on one node
    # The gate comes off with the pin; kube-scheduler's cycle sees only the pinned node.
    for o, lf in zip(objs, sorted(lifts, key=lambda x: x.pod), strict=True):
        rec = pod_from_json(lifted(o, lf.node))
        assert not rec.gated and pinned_node(rec.required_affinity) == lf.node
        core.upsert_pod(rec)
    decisions = []
    for i in range(3):
        rec = core.queries.pod(pod_key("default", f"w{i}"))
        assert rec is not None
        pin = NodeName(pinned_node(rec.required_affinity) or "")
        assert core.filter(rec, [pin], 1.0).passed == [pin]
        decisions.append(core.bind(rec.key, pin, 1.0, rec.uid))
    assert [type(d) for d in decisions] == [Park, Park, BindGroup]


def test_a_held_gang_that_does_not_fit_waits_holding_nothing_then_goes_when_room_frees() -> None:
    core = cluster(4)
    for i in range(3):
        core.upsert_pod(pod_from_json(held(f"a{i}", "a", 3)))
    core.admit_gated(0.0)
    for i in range(3):  # b needs 3 more GPUs than are left
        core.upsert_pod(pod_from_json(held(f"b{i}", "b", 3)))
    core.admit_gated(0.0)
    b = core.queries.gangs[gang_key("default", "b")]
    assert b.phase is GangPhase.WAITING and isinstance(b.reason, DoesNotFit)
    assert not b.plan and core.drain().lift != []  # only a's members are lifted
    assert core.drain().lift == []
    for i in range(3):
        core.delete_pod(pod_key("default", f"a{i}"))
    core.admit_gated(0.1)  # capacity changed, but the retry waits HELD_RETRY_SECONDS
    assert b.phase is GangPhase.WAITING
    core.admit_gated(1.0)
    assert b.phase is GangPhase.ADMITTED
    assert {lf.pod for lf in core.drain().lift} == {pod_key("default", f"b{i}") for i in range(3)}


def test_a_held_pod_that_is_no_gang_member_is_lifted_unpinned() -> None:
    core = cluster(4)
    core.upsert_pod(pod_from_json(pod("solo").gpu(1).gated().build()))
    bad = pod("bad").gang("x", 2).annotate("lockstep.dev/min-member", "zero").gated().build()
    core.upsert_pod(pod_from_json(bad))
    core.admit_gated(0.0)
    assert {(lf.pod, lf.node) for lf in core.drain().lift} == {
        (pod_key("default", "solo"), None), (pod_key("default", "bad"), None)}


def test_a_pin_from_an_older_plan_moves_the_slot_onto_the_pin() -> None:
    core = cluster(4, 4)
    objs = [held(f"w{i}", "g", 2) for i in range(2)]
    for o in objs:
        core.upsert_pod(pod_from_json(o))
    core.admit_gated(0.0)
    g = core.queries.gangs[gang_key("default", "g")]
    planned = g.plan[pod_key("default", "w0")]
    other = NodeName("n1" if planned == "n0" else "n0")
    # A stale lift pinned w0 to the other node: its slot follows the pin.
    core.upsert_pod(pod_from_json(lifted(objs[0], other)))
    assert g.phase is GangPhase.ADMITTED
    assert g.plan[pod_key("default", "w0")] == other


def test_lift_patch_narrows_existing_terms_and_keeps_other_gates() -> None:
    terms = ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
             {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]})
    patch = lift_patch("u1", terms, "n7")
    got = patch["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["n7"]}
    assert got == [{**terms[0], "matchFields": [pin]},
                   {"matchFields": [*terms[1]["matchFields"], pin]}]
    assert patch["metadata"] == {"uid": "u1"}
    assert patch["spec"]["schedulingGates"] == [{"$patch": "delete", "name": GANG_GATE}]
    assert "affinity" not in lift_patch("u1", terms, None)["spec"]
    assert pinned_node(tuple(got)) == "n7"


def test_a_filter_call_newer_than_the_watch_takes_the_lifted_member_and_older_events_wait() -> None:
    """kube-scheduler's watch shows a member's gate gone before Lockstep's does: its filter
    call carries the lifted pod, which the core takes; the watch's older (gated) events that
    follow must not put the gate back while the member's bind is parked."""
    core = cluster(4)
    objs = [held(f"w{i}", "g", 2) for i in range(2)]
    for i, o in enumerate(objs):
        o["metadata"]["uid"] = f"uid-{i}"
        o["metadata"]["resourceVersion"] = str(10 + i)
        core.upsert_pod(pod_from_json(o))
    core.admit_gated(0.0)
    lifts = {lf.pod: lf.node for lf in core.drain().lift}
    w0 = pod_key("default", "w0")
    up = lifted(objs[0], lifts[w0])
    up["metadata"] = {**up["metadata"], "resourceVersion": "20"}
    decision = core.filter(pod_from_json(up), [NodeName("n0")], 1.0)
    assert decision.passed == [NodeName("n0")]
    rec = core.queries.pod(w0)
    assert rec is not None and not rec.gated
    stale = {**objs[0], "metadata": {**objs[0]["metadata"], "resourceVersion": "15"}}
    core.upsert_pod(pod_from_json(stale))  # an event from before the lift, delivered late
    rec = core.queries.pod(w0)
    assert rec is not None and not rec.gated and rec.resource_version == 20
    assert isinstance(core.bind(w0, NodeName("n0"), 1.0, "uid-0"), Park)
    core.upsert_pod(pod_from_json(up))  # the watch catches up: the same version again
    rec = core.queries.pod(w0)
    assert rec is not None and not rec.gated


def waiting_notices(core: Coscheduler) -> list[tuple[str, str]]:
    return [(str(n.pods[0]), f"{n.reason.have}/{n.reason.need}")
            for n in core.drain().notices
            if n.kind is NoticeKind.WAITING and isinstance(n.reason, WaitingForMembers)]


def test_a_held_gang_waiting_for_members_says_so_by_one_event_per_change() -> None:
    """A defect found: with the webhook on, members wait behind the gate and kube-scheduler never
    cycles them (no FailedScheduling Event), so the GangWaiting Event is the only place
    ``kubectl describe pod`` shows why. It was never emitted. One Event per change of the
    reason, on the first member: the same count seen again by a later sweep adds none."""
    core = cluster(4, 4)
    objs = [held(f"w{i}", "g", 4) for i in range(4)]
    for o in objs[:2]:
        core.upsert_pod(pod_from_json(o))
    core.admit_gated(0.0)
    assert waiting_notices(core) == [("default/w0", "2/4")]
    core.upsert_pod(pod_from_json(objs[1]))  # the same pod seen again: a sweep, no change
    core.admit_gated(0.5)
    assert waiting_notices(core) == []
    core.upsert_pod(pod_from_json(objs[2]))
    core.admit_gated(1.0)
    assert waiting_notices(core) == [("default/w0", "3/4")]
    core.upsert_pod(pod_from_json(objs[3]))
    core.admit_gated(1.5)
    assert waiting_notices(core) == []
    assert core.queries.gangs[gang_key("default", "g")].phase is GangPhase.ADMITTED
