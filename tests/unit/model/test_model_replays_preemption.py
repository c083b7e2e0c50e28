"""Replays of the preemption defects the model checker (``tests/unit/model/test_model.py``) found:
each fixed step sequence failed before its fix, and plays the model's own rules and
invariants, so it keeps guarding whatever the seeded budget of a run reaches."""

from __future__ import annotations

from typing import Any

from coscheduling import GangKey, PodKey
from coscheduling.reasons import Preempting, PreemptionStalled
from tests.internals import state_of
from tests.unit.model.test_model import UP, GangModel, PreemptionModel, _replay, _Script


def _replay_more(m: GangModel, *steps: tuple[Any, ...]) -> None:
    """Go on playing ``steps`` on ``m`` as :func:`_replay` does (every invariant after each)."""
    for name, *args in steps:
        getattr(m, name)(*args)
        m.promises_hold()
        m.rebuilt_core_agrees()


def test_replay_a_group_priority_edited_away_leaves_the_gang_at_its_members_priority() -> None:
    """The sequence seed 1234567 found: UP's PodGroup says priority 0, its pods 100; the
    PodGroup is then updated without a priority, so the gang is at its pods' 100 and gang b
    (50, 3 GPUs on the one node of 4) must not evict it. Before: the update did not
    re-resolve UP's members (only a changed policy did), the gang kept priority 0, b
    evicted it, and a core rebuilt from the same objects disagreed on its priority."""
    m = _replay(PreemptionModel,
                ("change_upstream_podgroup", 2, False, False, "0"),
                ("create_upstream_member", 0, True), ("create_upstream_member", 1, True),
                ("schedule_gang", UP, 0, _Script()),
                ("change_upstream_podgroup", 2, False, False, ""),
                ("create_whole_gang", "b", False),
                ("schedule_gang", "b", 0, _Script()))
    ups = [p for k, p in m.pods.items() if k.startswith("default/up")]
    assert len(ups) == 2 and all(p["spec"].get("nodeName") for p in ups), "UP not bound: stale"
    assert not m.evicting and not state_of(m.core).preemption.inflight.by_preemptor


def test_replay_a_gang_that_gave_its_room_back_is_not_left_preempting() -> None:
    """Gang d (100) evicts gang a and is admitted into the room; d-0 is deleted and created
    again, so d gives its room back (too few members) while a's pods still go, and d-0's
    next filter tells d it waits on its preemption (its own record: right). Then the
    victims go and the record completes. Before: d stayed "Preempting" with nothing in
    flight, for good; now the reason goes with the record and d's members are woken."""
    m = _replay(PreemptionModel, ("create_whole_gang", "a", False),
                ("schedule_gang", "a", 0, _Script()),
                ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, _Script()),
                ("delete_pod", _Script("default/d-0"), True),
                ("schedule_gang", "d", 0, _Script()))
    d = m.core.queries.gangs[GangKey("default/d")]
    assert isinstance(d.reason, Preempting) and len(m.evicting) == 2, "stale replay"
    _replay_more(m, ("victim_terminates", _Script(0), "delete"),
                 ("victim_terminates", _Script(0), "delete"))
    assert not state_of(m.core).preemption.inflight.by_preemptor \
        and not isinstance(d.reason, Preempting)
    m.schedule_gang("d", 0, _Script())
    assert all(m.pods[PodKey(f"default/d-{k}")]["spec"].get("nodeName") for k in range(4))


def test_replay_a_victim_group_made_basic_while_it_goes_keeps_its_measure() -> None:
    """The "default/up-0 (priority 100) evicted for gang default/c (priority 100)" the seeded
    run reached: UP's PodGroup names priority 0, its pods carry 100, so gang c (100) rightly
    evicts UP (0 < 100). The model's rule then made the PodGroup basic while UP's pods were
    going, so they became plain pods of 100 and the in-flight check saw an equal-priority
    victim: the user's edit, not the core's decision (the model already kept the priority
    fixed under an eviction, not whether the group is a gang). Now the edit keeps it a gang."""
    m = _replay(PreemptionModel, ("change_upstream_podgroup", 2, False, False, "0"),
                ("low_then_high", UP, "c", "0",
                 _Script(True, *("n0", True, False) * 3)))
    assert len(m.evicting) == 2, "UP not evicted for c: stale replay"
    _replay_more(m, ("change_upstream_podgroup", 1, True, False, ""))
    assert m.upstream is not None and "gang" in m.upstream["spec"]["schedulingPolicy"]


def test_replay_plain_victims_whose_group_becomes_a_gang_keep_their_measure() -> None:
    """The same from the other side: UP's PodGroup is basic (its pods, at 0, are plain pods)
    and names priority 1000; gang c (100) evicts two of them; the rule then made the group a
    gang, of 1000, while they went (the model guarded only gangs evicted as gangs)."""
    m = _replay(PreemptionModel, ("change_upstream_podgroup", 1, True, False, "1000"),
                ("low_then_high", UP, "c", "1000",
                 _Script(False, *("n0", True, False) * 3)))
    assert len(m.evicting) == 2, "UP's pods not evicted for c: stale replay"
    _replay_more(m, ("change_upstream_podgroup", 1, False, False, "1000"))
    assert m.upstream is not None and "basic" in m.upstream["spec"]["schedulingPolicy"]


def test_replay_a_gang_that_gave_its_room_back_is_told_when_its_victims_outlive_it() -> None:
    """As above, but a's pods never go: the preemption expires. Before: d stayed
    "Preempting" with nothing in flight; now it is told the preemption stalled."""
    m = _replay(PreemptionModel, ("create_whole_gang", "a", False),
                ("schedule_gang", "a", 0, _Script()),
                ("create_whole_gang", "d", False), ("schedule_gang", "d", 0, _Script()),
                ("delete_pod", _Script("default/d-0"), True),
                ("schedule_gang", "d", 0, _Script()))
    d = m.core.queries.gangs[GangKey("default/d")]
    assert isinstance(d.reason, Preempting), "stale replay"
    _replay_more(m, *[("advance_time", 8.0)] * 4)
    assert not state_of(m.core).preemption.inflight.by_preemptor, \
        "the preemption did not expire: stale"
    assert isinstance(d.reason, PreemptionStalled), d.reason


def test_replay_a_preemptor_does_not_bind_onto_room_its_victims_still_hold() -> None:
    """UP's bindings to n0 are in flight (2 of its 4 GPUs, not yet in the API, so
    kube-scheduler's own filters do not count them); gang a holds the other 2. Gang c
    (2 x 2 GPUs) evicts a and is planned on n0 and n1; kube-scheduler found room on n0 and
    c-0 was handed n0 while a still ran there. a never went, c's preemption expired, and
    a + c + UP overcommitted n0. A preemptor's member waits for the victims on its planned
    node to go, whatever kube-scheduler's filters say."""
    m = _replay(PreemptionModel, ("relist_pods",),
                ("low_then_high", UP, "c", "", _Script(False, "n0", False, False, "n0",
                                                      False, True)),
                ("add_or_relabel_node", 1, 2, "r0"), ("advance_time", 0.5),
                ("low_then_high", "a", "c", "",
                 _Script("n0", False, False, "n0", False, False,
                         "n0", False, False, "n1", False, False)))
    assert state_of(m.core).preemption.inflight.by_preemptor, "c preempted nothing: stale replay"
    assert not m.pods[PodKey("default/c-0")]["spec"].get("nodeName"), \
        "c-0 bound on n0 while its victims still hold it"
    _replay_more(m, ("advance_time", 25.0), ("advance_time", 8.0))


def test_replay_victims_gone_from_the_api_keep_their_measure_while_the_watch_is_behind() -> None:
    """UP's PodGroup is basic: gang c (100) evicts its pods (plain, at 0) with the watch
    behind; their node is deleted, so the API has them no more, but the core's book still
    waits for them. The model then made UP a gang of 1000 (its guard against editing a
    measure under an eviction looked only at the API's pods), and the core's victims
    measured above their preemptor: the user's edit, not the core's choice."""
    m = _replay(GangModel, ("low_then_high", UP, "c", "",
                            _Script(False, *("n0", False, False) * 2, *("n1", False, False) * 2)),
                ("delete_node", _Script("n1")), ("change_upstream_podgroup", 1, True, False, ""),
                ("watch_falls_behind",),
                ("low_then_high", "b", "c", "", _Script("n2", False, False, "n0", False, False)),
                ("delete_node", _Script("n0")))
    going = state_of(m.core).preemption.inflight.terminating()
    assert going and not going & set(m.pods), "victims not gone from the API: stale replay"
    _replay_more(m, ("change_upstream_podgroup", 1, False, False, "1000"))
    assert m.upstream is not None and "basic" in m.upstream["spec"]["schedulingPolicy"]
