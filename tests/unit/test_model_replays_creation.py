"""Replays of sequences the model checker (``tests/unit/test_model.py``) found in node loss
under a binding in flight and in placement at creation: each failed before its fix.

Each replay plays rules of :class:`~tests.unit.test_model.GangModel` step by step and checks
every invariant after each, as a run of the model does (``_replay``).
"""

from __future__ import annotations

from typing import Any

from coscheduling import pod_key
from tests.unit.test_model import GangModel, _replay, _Script, gpu


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
