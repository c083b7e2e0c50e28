"""The gate in front of a Volcano gang's admission: the core's side of Volcano's queues.

The rules are the convention's (``coscheduling.conventions.volcano_queues``: who may enter a
queue, what a gang asks of it, which reasons a queue gives); this module only gathers what
they read from the core's state, what each Volcano gang holds in its queue, and wakes the
gangs a queue held back when it changes or makes room. A gang holds what Lockstep reserved
or bound for it (Volcano's ``allocated``); a group enqueued with no pods placed yet holds its
``minResources`` (``inqueue``). Only Volcano gangs are gated, and only while Volcano's Queue
CRD is served (``ClusterStore.queues`` is not None).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..conventions import volcano_queues
from ..conventions.volcano import enqueued
from ..conventions.volcano_queues import DEFAULT_QUEUE, QueueUse, asks, held_back, unlimited
from ..corestate import CoreState
from ..podgroup import GangSpec, Source
from ..reasons import GangReason
from ..records import PodRecord
from ..resources import Resources, add
from ..state.gang import Gang

__all__ = ["holds", "queue_freed", "queue_gate", "queue_of", "queue_use", "wake_queued"]


def queue_of(st: CoreState, g: Gang) -> str | None:
    """The Volcano queue of a gang, or None for any other convention."""
    spec = g.spec
    if spec is None or spec.source is not Source.VOLCANO:
        return None
    pg = st.store.volcano.get(g.key)
    return pg.queue if pg is not None else DEFAULT_QUEUE


def holds(st: CoreState, g: Gang) -> Resources:
    """What the gang holds: its reservations and its bound live members' requests."""
    total: Resources = {}
    for key in g.plan:
        r = st.ledger.get(key)
        if r is not None:
            total = add(total, r.requests)
    for p in st.live(g):
        if p.node_name is not None:
            total = add(total, p.requests)
    return total


def queue_use(st: CoreState) -> QueueUse | None:
    """What every Volcano group holds in its queue; None when Queues are not served."""
    if st.store.queues is None:
        return None
    allocated = [(g.key, queue, holds(st, g)) for g in st.gangs.values()
            if (queue := queue_of(st, g)) is not None]
    return volcano_queues.queue_use(st.store.queues, allocated, enqueued(st.store.volcano))


def queue_gate(st: CoreState, g: Gang, spec: GangSpec, live: Sequence[PodRecord],
               adding: Resources | None = None) -> GangReason | None:
    """Why a Volcano gang may not be admitted for its queue, or None (other conventions,
    no Queue CRD, an open queue with room). The gang asks what ``volcano_queues.asks``
    says of its live members; with ``adding``, an admitted gang asks to grow by one extra
    member."""
    queue = queue_of(st, g)
    if queue is None or st.store.queues is None or unlimited(st.store.queues, queue):
        return None  # unlimited: no need to add up what the queue's groups hold
    use = queue_use(st)
    if use is None:
        return None
    if adding is not None:
        return use.check(g.key, queue, add(holds(st, g), adding))
    return use.check(g.key, queue, asks(spec.min_resources, spec.min_member,
                                        [p.requests for p in live]))


def wake_queued(st: CoreState, queue: str | None = None) -> None:
    """A queue changed or one of its groups gave room back: try the groups it held back
    again (members kube-scheduler parked are nudged, gated gangs planned again)."""
    for g in st.gangs.values():
        if held_back(g.reason, queue):
            st.outbox.requeue.update(g.wake())
            st.creation.gated.touched.add(g.key)


def queue_freed(st: CoreState, g: Gang) -> None:
    """``g`` gave back room (a member left or finished): wake its queue's waiting groups."""
    queue = queue_of(st, g)
    if queue is not None and st.store.queues is not None:
        wake_queued(st, queue)
