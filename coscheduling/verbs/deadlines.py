"""Time: admitted gangs that did not bind by their deadline give their capacity back, and
gangs backing off get another try when their backoff ends. The app's timer calls
:func:`expire` at :func:`next_deadline`; nothing here reads a clock."""

from __future__ import annotations

from ..actions import GangExpired, NoticeKind
from ..corestate import CoreState
from ..creation.gated import GATED_RETRY_SECONDS
from ..creation.placer import expire_pins, next_pin_deadline
from ..defrag import carry as defrag
from ..gang.admission import fall_back
from ..gang.queue_gate import queue_freed
from ..podgroup import Mode
from ..preemption import carry
from ..reasons import DoesNotFit, PlannedNodeLost, PreemptionStalled, TimedOut
from ..state.gang import GangPhase

__all__ = ["expire", "next_deadline"]


def next_deadline(st: CoreState) -> float | None:
    times = [t for g in st.gangs.values()
             for t in (g.deadline, g.backoff_until) if t is not None]
    if st.creation.gated.blocked and st.store.epoch != st.creation.gated.epoch:
        times.append(st.creation.gated.swept + GATED_RETRY_SECONDS)
    if (preempting := st.preemption.inflight.next_deadline()) is not None:
        times.append(preempting)
    if (nominated := st.preemption.nominations.next_deadline()) is not None:
        times.append(nominated)
    if (created := next_pin_deadline(st)) is not None:
        times.append(created)
    if (moving := defrag.next_deadline(st)) is not None:
        times.append(moving)
    return min(times, default=None)


def expire(st: CoreState, now: float) -> list[GangExpired]:
    """Time out admitted gangs past their deadline and end finished backoffs."""
    out = []
    expire_pins(st, now)
    defrag.due(st, now)
    for stalled in carry.expired(st, now):
        # Victims outlived their grace period: the held room goes back, the gang plans anew.
        g = st.gangs.get(stalled.record.gang) if stalled.record.gang is not None else None
        if g is not None and g.phase is GangPhase.ADMITTED and not g.binding:
            fall_back(st, g, PreemptionStalled(g.key, len(stalled.still_there)))
            st.outbox.requeue.update(g.wake())
    for g in list(st.gangs.values()):
        if g.phase is GangPhase.BACKING_OFF and g.backoff_until is not None \
                and now >= g.backoff_until:
            g.backoff_over()
            st.outbox.requeue.update(g.wake())
            st.creation.gated.touched.add(g.key)
        if g.phase is not GangPhase.ADMITTED or g.deadline is None or now < g.deadline:
            continue
        spec = g.spec
        parked = st.waiting.pop_gang(g.key)
        pods = st.store.pods
        stragglers = tuple(
            f"{k} ({pods[k].node_name or 'not placed'})"
            for k in sorted(g.members)
            if k not in parked and k in pods and pods[k].node_name is None)
        reason = TimedOut(g.key, len(parked), spec.min_member if spec else 0,
                          spec.timeout_seconds if spec else 0.0, stragglers[:5])
        # Koordinator's NonStrict: try again at once rather than after a backoff.
        backoff = 0.0 if spec is not None and spec.mode is Mode.NON_STRICT \
            else st.settings.backoff_seconds
        g.expire(now, backoff, reason)
        st.notice(NoticeKind.TIMED_OUT, g.key, sorted(g.members), reason)
        out.append(GangExpired(g.key, parked, reason))
        queue_freed(st, g)  # a Volcano gang gave its queue's room back
        # Capacity came free: wake the gangs that were waiting for it.
        for other in st.gangs.values():
            if other is not g and isinstance(other.reason, DoesNotFit | PlannedNodeLost):
                st.outbox.requeue.update(other.wake())
    return out
