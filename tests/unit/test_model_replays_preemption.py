"""Replays of the preemption defects the model checker (``tests/unit/test_model.py``) found:
each fixed step sequence failed before its fix, and plays the model's own rules and
invariants, so it keeps guarding whatever the seeded budget of a run reaches."""

from __future__ import annotations

from tests.unit.test_model import UP, PreemptionModel, _replay, _Script


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
    assert not m.evicting and not m.core.state.preemptions.by_preemptor
