"""Gated gangs: members behind Lockstep's scheduling gate, admitted without a filter call.

kube-scheduler never cycles a gated member, so no filter call will ask for it: admission
happens in :func:`admit_gated`, after each batch of cluster events, over every node Lockstep
knows, in kube-scheduler's own queue order. :func:`lift_target` then says which gated pods
lose the gate, and the node each is pinned to (``coscheduling.gang.gating``). What the sweep
remembers between runs is the creation wing's
(:class:`~coscheduling.creation.state.Gated`).
"""

from __future__ import annotations

from ..actions import Lift
from ..corestate import CoreState
from ..gang.admission import (
    admit_by_preemption,
    pinned_pending,
    try_admit,
    turn_away,
    yield_to_higher_priority,
)
from ..gang.membership import countable, meets_quorum
from ..podgroup import GangKey, InvalidGang, MissingPodGroup
from ..preemption.carry import preempt_for_plain
from ..preemption.inflight import PreemptorId
from ..reasons import WaitingForMembers
from ..records import PodKey
from ..state.gang import GangPhase

__all__ = ["GATED_RETRY_SECONDS", "admit_gated", "drain_lift", "lift_target",
           "queue_order"]

GATED_RETRY_SECONDS = 0.5
"""How often gated gangs that did not fit are planned again while capacity keeps changing."""


def admit_gated(st: CoreState, now: float) -> None:
    """Admit gangs whose members wait behind the gate.

    A gang that does not fit is planned again when capacity has changed, at most every
    ``GATED_RETRY_SECONDS`` (planning a big gang on a big cluster costs milliseconds; every
    binding changes capacity)."""
    # A gang holding room no member of it uses yet gives it back to pods of higher
    # priority that need it, before anything is evicted for them below.
    yield_to_higher_priority(st)
    todo, st.creation.gated.touched = st.creation.gated.touched, set()
    if st.creation.gated.blocked and st.store.epoch != st.creation.gated.epoch \
            and now - st.creation.gated.swept >= GATED_RETRY_SECONDS:
        todo |= st.creation.gated.blocked
        st.creation.gated.epoch, st.creation.gated.swept = st.store.epoch, now
    for key in sorted(todo, key=lambda k: queue_order(st, k)):
        g = st.gangs.get(key)
        st.creation.gated.blocked.discard(key)
        if g is None or g.spec is None:
            continue
        if g.phase is GangPhase.BACKING_OFF:
            if g.backoff_until is not None and now < g.backoff_until:
                continue  # expire() hands it back when the backoff ends
            g.backoff_over()
        if g.phase is not GangPhase.WAITING:
            continue
        live = st.live(g)
        gated = [p.key for p in live if p.gated or pinned_pending(p)]
        if not gated:
            # Members kube-scheduler cycles are admitted by their filter call, unless its
            # own filters found no node at all: then no filter call comes, and only a
            # preemption can make room.
            if any(p.unschedulable and p.node_name is None for p in live) \
                    and not admit_by_preemption(st, g, live, now):
                st.creation.gated.blocked.add(key)
                st.creation.gated.epoch, st.creation.gated.swept = st.store.epoch, now
            continue
        spec = g.spec
        if not meets_quorum(st, spec, countable(spec, live)):
            # No scheduling cycle runs for a gated member (so no FailedScheduling Event):
            # this Event is the only place ``kubectl describe pod`` says why it waits. One
            # per change of reason, on the first gated member (turn_away keeps the count).
            turn_away(st, gated[0], g, WaitingForMembers(g.key, len(live), spec.min_member))
            continue
        outcome = try_admit(st, g, spec, live, now)
        if not isinstance(outcome, dict):
            st.creation.gated.blocked.add(key)
            turn_away(st, gated[0], g, outcome)
            st.creation.gated.epoch, st.creation.gated.swept = st.store.epoch, now
    # Gangs first (kube-scheduler's queue would have served them in priority order too;
    # a gang admitted above took its room from the capacity these pods now see).
    preempt_for_plain(st, now)


def queue_order(st: CoreState, key: GangKey) -> tuple[int, str, str]:
    """kube-scheduler's queue order for a gang: priority (the gang's, as preemption
    measures it), then the oldest member."""
    g = st.gangs.get(key)
    pods = [p for k in (g.members if g is not None else ())
            if (p := st.store.pods.get(k)) is not None]
    return (-(st.gang_priority(g) if g is not None else 0),
            min((p.created for p in pods), default=""), key)


def lift_target(st: CoreState, key: PodKey) -> Lift | None:
    """Whether Lockstep's gate should come off ``key`` now, and the node to pin it to.

    A planned member is pinned to its slot. A gated pod that is no gang member, or whose
    declaration is invalid, is let go unpinned (filter then says what is wrong), as is an
    extra beyond an admitted gang's plan. Members of a gang not admitted yet, or waiting
    for its PodGroup, stay gated."""
    pod = st.store.pods.get(key)
    if pod is None or not pod.gated or pod.node_name is not None or pod.deleting \
            or pod.scheduler_name not in st.settings.scheduler_names:
        return None
    m = st.membership.get(key)
    if m is None or isinstance(m, InvalidGang):
        return Lift(key, pod.uid, None)
    if isinstance(m, MissingPodGroup):
        return None
    g = st.gangs.get(m.key)
    if g is None:
        return None
    node = g.plan.get(key)
    if node is not None:
        if st.preemption.inflight.get(PreemptorId.of_gang(g.key)) is not None:
            return None  # pinned once its victims are gone, not onto a node they still hold
        return Lift(key, pod.uid, node)
    if st.preemption.inflight.evicting(g.key) is not None:
        return None  # its gang is being evicted whole: no member may start now
    if g.phase in (GangPhase.ADMITTED, GangPhase.RELEASED):
        return Lift(key, pod.uid, None)
    return None


def drain_lift(st: CoreState) -> list[Lift]:
    """Gated pods whose gate comes off now (decided now, from the current plan)."""
    keys, st.outbox.lift = st.outbox.lift, set()
    return [lift for k in sorted(keys) if (lift := lift_target(st, k)) is not None]


