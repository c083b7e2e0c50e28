"""Expected members: slots a gang admitted at its first member's creation held for the
members not created yet.

**No longer created** (issue 32): a gang is now placed at creation only once its quorum
exists (``coscheduling.creation.placer``), so no placeholder is ever built and nothing is reserved
for a member that does not exist. What remains here keeps a state written by an older
Lockstep readable (``adopt`` and ``forget`` are no-ops while ``CoreState.expected`` is empty).

Placing a gang when its first member is created (``coscheduling.creation.placer``) needs a whole
plan before the other members exist. When the members are alike (the PodGroup's
``minResources`` is ``minMember`` times the member's requests, or it names none), the gang
is planned for the member at hand plus ``minMember - 1`` copies of it: *expected* members,
held in the store as pod records under names no real pod can have (``~`` is not allowed in
a Kubernetes name), so quorum, plans and the ledger work on them unchanged. Each real member
that arrives later takes the slot of an expected one of its shape (:func:`adopt`).

Expected members exist only while their gang is ADMITTED: leaving that phase (deadline,
fall-back, release) forgets them (:func:`forget`), which gives their slots back. They are
never bound, never evicted, never nudged and get no Event.
"""

from __future__ import annotations

from .corestate import CoreState
from .gang import Gang, GangPhase
from .records import NodeName, PodKey, PodRecord

__all__ = ["EXPECTED_MARK", "adopt", "forget", "is_expected", "shape"]

EXPECTED_MARK = "~"
"""Starts the name of an expected member: no real pod name can contain it."""


def is_expected(key: PodKey) -> bool:
    return EXPECTED_MARK in key


def shape(pod: PodRecord) -> tuple[object, ...]:
    """What a member's slot depends on: a member of the same shape fits every slot planned
    for another (same requests, same node constraints)."""
    return (tuple(sorted(pod.requests.items())), tuple(sorted(pod.node_selector.items())),
            repr(pod.required_affinity), pod.tolerations)


def forget(st: CoreState, g: Gang, keys: list[PodKey] | None = None) -> None:
    """Drop ``g``'s expected members (all by default) and the slots they hold."""
    for key in keys if keys is not None else [k for k in g.members if k in st.expected]:
        st.expected.pop(key, None)
        g.drop_slot(key)
        g.members.discard(key)
        st.membership.pop(key, None)
        st.store.drop_pod(key)


def adopt(st: CoreState, g: Gang, pod: PodRecord) -> NodeName | None:
    """Give ``pod`` (a real member without a slot) the slot of an expected member of its
    shape; the node, or None when there is none to take."""
    if g.phase is not GangPhase.ADMITTED or not st.expected:
        return None
    want = shape(pod)
    for key in sorted(g.plan):
        other = st.store.pods.get(key)
        if key in st.expected and other is not None and shape(other) == want:
            node = g.plan[key]
            forget(st, g, [key])
            g.add_slot(pod.key, node, pod.requests)
            return node
    return None
