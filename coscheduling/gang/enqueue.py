"""Volcano's queues over the core's state: what each queue's groups hold, the admission
gate, and waking the groups a queue held back.

The rules are ``coscheduling.conventions.volcano_queues`` (a pure leaf); this module feeds
them what the core knows. A group holds in its queue what Lockstep reserved or bound for it
(Volcano's ``allocated``) or, while its pods are on their way, the ``minResources`` it was
enqueued with (``inqueue``). Only Volcano gangs are gated, and only while Volcano's Queue
CRD is served (``ClusterStore.queues`` is not None).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..conventions.volcano_queues import DEFAULT_QUEUE, QueueUse, demand
from ..corestate import CoreState
from ..podgroup import GangSpec, Source
from ..reasons import GangReason, QueueFull, QueueNotFound, QueueNotOpen
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
    use = QueueUse(st.store.queues)
    for g in st.gangs.values():
        queue = queue_of(st, g)
        if queue is not None and (held := holds(st, g)):
            use.take(g.key, queue, held)
    for key, pg in st.store.volcano.items():
        if key not in use.held and pg.phase == "Inqueue":
            use.take(key, pg.queue, pg.min_resources)  # enqueued, its pods on their way
    return use


def queue_gate(st: CoreState, g: Gang, spec: GangSpec, live: Sequence[PodRecord],
               adding: Resources | None = None) -> GangReason | None:
    """Why a Volcano gang may not be admitted for its queue, or None (other conventions,
    no Queue CRD, an open queue with room).

    The gang asks for its ``minResources`` (or members x minMember), and never less than
    all its live members together: admission plans every member that fits, extras beyond
    minMember too, so this keeps what a queue's gangs hold within its capability whatever
    the plan takes. With ``adding``, an admitted gang asks to grow by one extra member."""
    queue = queue_of(st, g)
    if queue is None or st.store.queues is None:
        return None
    q = st.store.queues.get(queue)
    if (q is None and queue == DEFAULT_QUEUE) or (q is not None and q.open and not q.capability):
        return None  # unlimited: no need to add up what the queue's groups hold
    use = queue_use(st)
    if use is None:
        return None
    if adding is not None:
        return use.check(g.key, queue, add(holds(st, g), adding))
    want = demand(spec.min_resources, spec.min_member, [p.requests for p in live])
    everyone: Resources = {}
    for p in live:
        everyone = add(everyone, p.requests)
    return use.check(g.key, queue, {r: max(want.get(r, 0), everyone.get(r, 0))
                                    for r in want.keys() | everyone.keys()})


def wake_queued(st: CoreState, queue: str | None = None) -> None:
    """A queue changed or one of its groups gave room back: try the groups it held back
    again (members kube-scheduler parked are nudged, held gangs planned again)."""
    for g in st.gangs.values():
        r = g.reason
        if isinstance(r, QueueFull | QueueNotFound | QueueNotOpen) \
                and (queue is None or r.queue == queue):
            st.outbox.requeue.update(g.wake())
            st.creation.gated.touched.add(g.key)


def queue_freed(st: CoreState, g: Gang) -> None:
    """``g`` gave back room (a member left or finished): wake its queue's waiting groups."""
    queue = queue_of(st, g)
    if queue is not None and st.store.queues is not None:
        wake_queued(st, queue)
