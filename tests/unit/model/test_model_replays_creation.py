"""Replays of sequences the model checker (``tests/unit/model/test_model.py``) found in node loss
under a binding in flight and in placement at creation: each failed before its fix.

Each replay plays rules of :class:`~tests.unit.model.test_model.GangModel` step by step and checks
every invariant after each, as a run of the model does (``_replay``).
"""

from __future__ import annotations

from typing import Any

from coscheduling import (
    BindNow,
    Bound,
    Coscheduler,
    NodeName,
    PodRecord,
    Settings,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.events import ingest
from tests.builders import PodBuilder, node, pod
from tests.internals import state_of
from tests.invariants import check_invariants
from tests.unit.model.test_model import GangModel, _replay, _Script, gpu


def _gpus_bound(m: GangModel, node: str) -> int:
    """GPUs the API server has bound on ``node`` (running or pending, not finished)."""
    return sum(gpu(p) for p in m.pods.values() if p["spec"].get("nodeName") == node
               and p["status"]["phase"] not in ("Failed", "Succeeded"))


def _allocatable(m: GangModel, node: str) -> int:
    obj: dict[str, Any] = m.nodes[node]
    return int(obj["status"]["allocatable"]["nvidia.com/gpu"])


def test_replay_a_node_recreated_under_a_binding_in_flight_is_not_double_booked() -> None:
    """Gang a's BindGroup is in flight (a-0 shown bound on n0, a-1's binding not back yet)
    when n0 is deleted (the pod GC deletes a-0) and created again under its name; gang d
    (4 x 1 GPU) is planned next, and then a-1's binding lands: a bind POST to a node of
    that name succeeds. a-1's room must have stayed counted on n0 (before: ``_node_lost``
    dropped the in-flight slot, d was planned whole onto n0 and a-1 bound beside it: 5 GPUs
    bound on a node of 4)."""
    s = _Script
    m = _replay(GangModel, ("create_whole_gang", "a", False),
                ("schedule_gang", "a", 1, s("n0", True, "n0", True)),
                ("group_binding_lands", s(0), 0),
                ("delete_node", s("n0")), ("add_or_relabel_node", 0, 4, "r0"),
                ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, s()),
                ("group_binding_lands", s(0), 0))
    assert m.pods[pod_key("default", "a-1")]["spec"].get("nodeName") == "n0", "stale replay"
    assert _gpus_bound(m, "n0") <= _allocatable(m, "n0"), \
        f"n0 double-booked: {_gpus_bound(m, 'n0')} GPUs bound on {_allocatable(m, 'n0')}"


def test_replay_the_node_rule_recreates_a_node_under_a_binding_in_flight() -> None:
    """The model's rule for it: the node under a BindGroup in flight goes and comes back
    under its name, then another gang is planned and the binding lands."""
    s = _Script
    m = _replay(GangModel, ("create_whole_gang", "a", False),
                ("schedule_gang", "a", 1, s("n0", True, "n0", True)),
                ("group_binding_lands", s(0), 0),
                ("node_recreated_under_binding", s(0), "r0"),
                ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, s()),
                ("group_binding_lands", s(0), 0))
    assert _gpus_bound(m, "n0") <= _allocatable(m, "n0")


def test_replay_pins_that_never_land_leave_the_gang_to_the_members_that_exist() -> None:
    """The sequence the fuzz runs found (rebuilt_core_agrees failed): w-0 and w-1 are
    reviewed saying minMember 3 and held; w-2's review (3) completes the quorum and all
    three are pinned, but the creations of w-0 and w-1 never land. w-1 is then created
    again saying minMember 2 (gated: a pin of that name is still in flight). The gang's
    minMember came from w-0, a pod the API server never held, so a core rebuilt from the
    API server (w-1 says 2, w-2 says 3) disagreed until w-0's pin expired. A gang's
    declaration now comes from the members that exist first."""
    _replay(GangModel, ("create_through_webhook", 0, "never", False, 3),
            ("create_through_webhook", 1, "never", False, 3),
            ("create_through_webhook", 2, "now", False, 3),
            ("create_through_webhook", 1, "now", False, 2),
            ("advance_time", 3.0), ("advance_time", 8.0))


def test_replay_a_gang_timing_out_keeps_the_room_of_its_binding_in_flight() -> None:
    """Found by the model once it checked that a binding in flight keeps its room (rule 14):
    gang a's BindGroup is in flight (a-0 shown bound, a-1 not yet) when a-0 is deleted; the
    gang falls back (a-1's slot kept), a-2 arrives, the gang is admitted again around a-1's
    slot and times out. Its timeout gave a-1's room back while the binding was in flight
    (before: gang d was then planned whole onto n0 and a-1 bound beside it)."""
    s = _Script
    m = _replay(GangModel, ("create_whole_gang", "a", False),
                ("schedule_gang", "a", 1, s("n0", True, "n0", True)),
                ("group_binding_lands", s(0), 0), ("delete_pod", s("default/a-0"), False),
                ("create_member", "a", 2), ("schedule_gang", "a", 0, s()),
                ("advance_time", 25.0),
                ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, s()),
                ("group_binding_lands", s(0), 0))
    assert m.pods[pod_key("default", "a-1")]["spec"].get("nodeName") == "n0", "stale replay"
    assert _gpus_bound(m, "n0") <= _allocatable(m, "n0"), \
        f"n0 double-booked: {_gpus_bound(m, 'n0')} GPUs bound on {_allocatable(m, 'n0')}"


def test_an_extra_of_a_released_gang_is_counted_on_its_node_while_its_binding_flies() -> None:
    """Not a replay (the model reports a BindNow's outcome in the same step; the app awaits
    the POST first): an extra of a released gang is told BindNow with no slot to hold its
    room, and while its POST is in flight another gang must not be planned onto that room
    (before: gang c was admitted onto the 2 GPUs left and the extra landed beside it, 5
    GPUs on a node of 4). Rule 14: a binding in flight is counted, by a slot or assumed."""
    core = Coscheduler(Settings(backoff_seconds=5))
    core.upsert(ingest.NODES, node_from_json(node("n0").gpus(4).build()))
    n0 = NodeName("n0")
    for k in range(3):
        core.upsert_pod(pod_from(pod(f"a-{k}").gang("a", min_member=2, timeout=20).gpu(1)))
        if k == 1:  # released and bound before a-2 exists: a-2 is an extra with no slot
            for j in range(2):
                member = core.queries.pods[pod_key("default", f"a-{j}")]
                assert core.filter(member, [n0], 0.0).passed == [n0]
                core.bind(member.key, n0, 0.0, member.uid)
            core.bind_outcomes([Bound(key, n0, core.queries.pods[key].uid)
                                for key in (pod_key("default", "a-0"), pod_key("default", "a-1"))])
    extra = core.queries.pods[pod_key("default", "a-2")]
    assert core.filter(extra, [n0], 0.0).passed == [n0]
    assert isinstance(core.bind(extra.key, n0, 0.0, extra.uid), BindNow)
    check_invariants(core, 0.0)
    for k in range(2):  # gang c (2 x 1 GPU) arrives while a-2's POST is in flight
        core.upsert_pod(pod_from(pod(f"c-{k}").gang("c", min_member=2, timeout=20).gpu(1)))
    core.filter(core.queries.pods[pod_key("default", "c-0")], [n0], 0.0)
    check_invariants(core, 0.0)
    core.bind_outcomes([Bound(extra.key, n0, extra.uid)])
    check_invariants(core, 0.0)


def pod_from(builder: PodBuilder) -> PodRecord:
    return pod_from_json(builder.build())


def test_replay_a_member_that_redeclares_a_held_gang_answers_its_parked_calls() -> None:
    """The sequence ``LOCKSTEP_FUZZ_SEED=2279538499`` (400 runs) found, shortened: h-2
    (ungated, minMember 2) is parked for gang h, admitted with the gated h-3; then h-1 is
    created saying minMember 5. The first member by name declares the gang, so h falls back
    and h-2's parked call is answered; the model then held a call the core had let go (its
    rule for gated members did not send what the core answered, as the app does after every
    batch of events)."""
    h2 = pod_key("default", "h-2")
    m = _replay(GangModel, ("create_held_member", 2, False, 2),
                ("create_held_member", 3, True, 2), ("schedule_gang", "h", 0, _Script()))
    assert h2 in m.parked, "h-2 not parked: stale replay"
    m.create_held_member(1, True, 5)
    m.promises_hold()
    m.rebuilt_core_agrees()
    assert not m.parked and not m.core.queries.is_parked(h2)


def test_replay_a_once_satisfied_gang_group_rebinding_one_by_one_is_its_disruption() -> None:
    """The sequence ``LOCKSTEP_FUZZ_SEED=2279538499`` (400 runs) found, shortened (a model
    bug): the gang group KG (Koordinator's once-satisfied, its default) binds whole; its
    node goes (the pod GC deletes k1-0 and k1-1; k2-0's binding was in flight and lands on
    the node created again), the job recreates k1-0 and k1-1, and k2-0 fails. The core holds
    KG satisfied, so k1-0 and k1-1 bind as plain pods, as Koordinator's would: the model
    had ended the disruption when none was bound, and called KG partial."""
    s = _Script
    m = _replay(GangModel, ("create_whole_koord_gangs", True),
                ("schedule_gang", "kg", 0, s("n0", False, False, "n0", False, False,
                                             "n0", False, True)),
                ("group_binding_lands", s(0), 0), ("group_binding_lands", s(0), 0),
                ("node_recreated_under_binding", s(0), "r0"),
                ("create_whole_koord_gangs", True), ("group_binding_lands", s(0), 0),
                ("member_fails", s("default/k2-0")),
                ("schedule_gang", "kg", 0, s("n0", False, False, "n2", False, False)))
    assert all(m.pods[pod_key("default", f"k1-{k}")]["spec"].get("nodeName")
               for k in range(2)), "k1 members unbound: stale replay"



def test_replay_a_transient_bind_failure_in_a_gang_admitted_again_completes_its_plan() -> None:
    """The seeded run's 42 steps, shortened: the gated gang h is released (BindGroup of h-0,
    h-1, h-2 in flight); h-0 is deleted and created again (held), so h falls back keeping
    the slots of h-1 and h-2 for their flights, and is admitted again around them. h-1
    binds; h-2's binding fails for now (not for good). Its slot was kept only for the
    flight and went, and nothing completed the plan: h stayed admitted with 1 slot + 1
    bound < minMember 3 (before: only a permanent failure or a lost node reconciled it)."""
    s = _Script
    m = _replay(GangModel, ("create_whole_held_gang", False),
                ("api_applies_every_lift", s("n0", False, False, "n0", False, False,
                                             "n0", False, True), True),
                ("delete_pod", s("default/h-0"), True),
                ("group_binding_lands", s(0), 0), ("group_binding_lands", s(0), 0),
                ("group_binding_lands", s(0), 8))
    assert m.pods[pod_key("default", "h-1")]["spec"].get("nodeName") == "n0", "stale replay"
    assert not m.pods[pod_key("default", "h-2")]["spec"].get("nodeName"), "stale replay"


def test_replay_a_member_leaving_its_gang_with_its_binding_in_flight_keeps_its_room() -> None:
    """Found by the model with ``LOCKSTEP_FUZZ_SEED=2279538499`` after 3fcc8e4, shortened:
    UP's BindGroup is in flight on n0 when its PodGroup is made basic (its pods become
    plain pods); gang d (4 x 1 GPU) is planned next and UP's bindings land. The members
    left their gang with their slots, so their room was counted nowhere (before: d was
    planned onto n0 and 6 GPUs were bound on a node of 4). They are assumed on their node
    now, as a plain pod Lockstep binds is."""
    s = _Script
    m = _replay(GangModel, ("create_whole_upstream_gang", False, "", False),
                ("schedule_gang", "up", 1, s("n0", True, "n0", True)),
                ("change_upstream_podgroup", 2, True, False, ""),
                ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, s()),
                ("group_binding_lands", s(0), 0), ("group_binding_lands", s(0), 0))
    assert m.pods[pod_key("default", "up-1")]["spec"].get("nodeName") == "n0", "stale replay"
    assert _gpus_bound(m, "n0") <= _allocatable(m, "n0"), \
        f"n0 double-booked: {_gpus_bound(m, 'n0')} GPUs bound on {_allocatable(m, 'n0')}"


def test_replay_a_member_rejoining_its_gang_with_its_binding_in_flight_stays_assumed() -> None:
    """The full model run found it once the members above were assumed: UP's BindGroup is
    in flight when its PodGroup is made basic (its members assumed on n0) and then a gang
    again. Re-resolving the stored record (its node the assumed one) was taken for the
    watch showing it bound: the assumption ended and the pod stayed on n0 as if the API
    server had bound it (a core rebuilt from the API server disagreed: up-0 pending)."""
    s = _Script
    m = _replay(GangModel, ("create_whole_upstream_gang", False, "", False),
                ("schedule_gang", "up", 1, s("n0", True, "n0", True)),
                ("change_upstream_podgroup", 2, True, False, ""),
                ("change_upstream_podgroup", 2, False, False, ""))
    assert state_of(m.core).assumed, "nothing assumed: stale replay"
    _replay_more(m, ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, s()),
                 ("group_binding_lands", s(0), 0), ("group_binding_lands", s(0), 0))
    assert _gpus_bound(m, "n0") <= _allocatable(m, "n0"), \
        f"n0 double-booked: {_gpus_bound(m, 'n0')} GPUs bound on {_allocatable(m, 'n0')}"


def _replay_more(m: GangModel, *steps: tuple[Any, ...]) -> None:
    """Go on playing ``steps`` on ``m`` as ``_replay`` does (every invariant after each)."""
    for name, *args in steps:
        getattr(m, name)(*args)
        m.promises_hold()
        m.rebuilt_core_agrees()


def test_replay_a_restart_landing_a_binding_to_a_deleted_node_is_the_clusters_doing() -> None:
    """The seeded GangModel run (a helper's nested ``factory() -> GangModel``) found it, in
    full: gang d's BindGroup is in flight (d-0, d-1 to n2; d-2, d-3 to n1: d's ranks run
    against its names, rank order puts ranks 1 and 2 on n1) when n2 is deleted, and Lockstep
    restarts. The bindings already sent land: d-2 and d-3 on n1, d-0 and d-1 fail (their
    node is gone). Gang d is partially bound by the cluster, not by
    Lockstep: the same sequence without the restart, landing by ``group_binding_lands``,
    records that failed binding as the disruption; the restart rule dropped the outcomes
    (before: "gang d rests partially bound: 2/4"). The restarted core then completes d."""
    s = _Script
    m = _replay(GangModel, ("relist_nodes",), ("relist_nodes",), ("delete_node", s("n0")),
                ("create_namesake_plain", "c", 2, False),
                ("create_plain", 0, 1, 50, False, False),
                ("create_through_webhook", 0, "now", True, 3, False),
                ("create_whole_webhook_gang", False, "now", True),
                ("low_then_high", "a", "d", "",
                 s("n2", False, False, "n2", False, False, "n1", False, False,
                   "n1", False, True)),
                ("delete_node", s("n2")))
    assert [n for _, binds, *_ in m.group_binds for n, _ in binds.values()] \
        == ["n2", "n2", "n1", "n1"], "d's BindGroup not in flight to n2 and n1: stale replay"
    _replay_more(m, ("lockstep_restarts", True))
    bound = {k: m.pods[pod_key("default", f"d-{k}")]["spec"].get("nodeName") for k in range(4)}
    assert bound == {0: None, 1: None, 2: "n1", 3: "n1"}, f"stale replay: {bound}"
    _replay_more(m, ("schedule_gang", "d", 0, s()))
    assert all(m.pods[pod_key("default", f"d-{k}")]["spec"].get("nodeName") == "n1"
               for k in range(4)), "the restarted core left gang d partial"


def test_replay_a_pod_of_another_shape_created_under_a_pin_that_never_landed_is_sized() -> None:
    """``LOCKSTEP_FUZZ_SEED=2718`` (600 runs) found it: w's members are pinned at creation
    (1 GPU each, w-0 to n2) but their creations never land; w-0 is then created again
    through the webhook with 2 GPUs (gated: a pod of that name was still counted). The core
    took it for the pod it had pinned and kept its 1-GPU slot; w-0's gate was lifted with
    a pin to n2 and it bound there beside its siblings and h-0's slot: 5 GPUs on a node of
    4. A slot now holds its pod's requests, or goes (the plan is completed or given back)."""
    s = _Script
    m = _replay(GangModel, ("low_then_high", "a", "c", "",
                            s("n0", False, False, "n0", False, True,
                              "n1", False, False, "n1", False, False)),
                ("watch_falls_behind",), ("create_whole_held_gang", False),
                ("member_fails", s("default/c-0")),
                ("create_whole_webhook_gang", False, "never", False),
                ("create_through_webhook", 0, "now", True, 3, False),
                ("relist_pods",), ("delete_node", s("n0")),
                ("api_applies_every_lift", s(), False),
                ("create_whole_webhook_gang", False, "now", False),
                ("api_applies_every_lift", s(*("n2", False, False) * 3), True))
    assert gpu(m.pods[pod_key("default", "w-0")]) == 2, "stale replay"
    assert _gpus_bound(m, "n2") <= _allocatable(m, "n2")
