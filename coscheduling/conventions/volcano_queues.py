"""Volcano's queues, as Volcano's enqueue step decides them: a pure leaf over plain data.

Both places a queue is asked use these rules: Volcano's enqueue step, which writes each
PodGroup's phase (``coscheduling.conventions.volcano``), and the gate in front of a Volcano
gang's admission, which the core feeds what its gangs hold (``coscheduling.gang.queue_gate``).

A Volcano ``PodGroup`` names a cluster-scoped ``Queue`` (``spec.queue``, ``default`` when
unset). Lockstep plays Volcano's enqueue step (``coscheduling.conventions.volcano``), so it
honours what that step honours, as Volcano's source has it:

* the queue must be ``Open`` (``pkg/scheduler/plugins/proportion/proportion.go``,
  ``AddJobEnqueueableFn``: any other state rejects; Volcano's PodGroup webhook refuses a
  group whose queue is missing or not Open, ``pkg/webhooks/admission/podgroups/validate``;
  its enqueue action skips a job whose queue it cannot find,
  ``pkg/scheduler/actions/enqueue/enqueue.go``). A state nobody has written yet counts as
  Open: Volcano's queue controller writes Open for an empty state
  (``pkg/controllers/queue/state/open.go``), and without Volcano's controllers nobody writes
  one at all.
* the group's ``minResources`` plus what the queue's other groups hold (Volcano's
  ``allocated`` + ``inqueue``) must stay within ``spec.capability``, dimension by dimension,
  only for the resources the group asks for (``LessEqualWithDimensionAndResourcesName``); a
  resource the capability does not name is unlimited (proportion takes the capability with
  ``MinDimensionResource(..., Infinity)``), and a queue without a capability is unlimited.
* ``default`` is created open and unlimited by Volcano's scheduler at start
  (``newDefaultAndRootQueue`` in ``pkg/scheduler/cache/cache.go``); Lockstep creates no
  objects, so a missing ``default`` queue is taken as that one.

``spec.weight``, ``spec.reclaimable``, ``guarantee`` and ``deserved`` (fair share, reclaim)
stay Volcano's, or Kueue's: Lockstep only keeps a queue within its capability and state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..podgroup import GangKey
from ..reasons import GangReason, QueueFull, QueueNotFound, QueueNotOpen
from ..resources import CPU, Resources, add, resource_list

__all__ = [
    "DEFAULT_QUEUE",
    "OPEN",
    "QueueRecord",
    "QueueUse",
    "asks",
    "demand",
    "held_back",
    "queue_from_json",
    "queue_use",
    "unlimited",
]

DEFAULT_QUEUE = "default"
OPEN = "Open"
MAX_STATE_CHARS = 64
"""A Queue's ``status.state`` as kept and shown (Volcano's states are one short word)."""


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A Volcano ``Queue`` (``scheduling.volcano.sh/v1beta1``, cluster-scoped)."""

    name: str
    capability: Resources
    """``spec.capability``; empty: unlimited."""
    state: str
    """``status.state`` (Open, Closed, Closing, Unknown); "" when none was written."""

    @property
    def open(self) -> bool:
        return self.state in ("", OPEN)


def queue_from_json(obj: Mapping[str, Any]) -> QueueRecord:
    """A served Queue; a bad quantity raises (the cache then skips the object, and its
    groups wait for a queue it cannot find, which says which queue to look at)."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    status = obj.get("status")
    cap = resource_list(spec.get("capability") if isinstance(spec, Mapping) else None)
    # Volcano's proportion plugin reads cpu or memory <= 0 as unlimited.
    cap = {k: v for k, v in cap.items() if v > 0 or k not in (CPU, "memory")}
    state = status.get("state") if isinstance(status, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return QueueRecord(name if isinstance(name, str) else "", cap,
                       state[:MAX_STATE_CHARS] if isinstance(state, str) else "")


def demand(min_resources: Resources, min_member: int, requests: Iterable[Resources]
           ) -> Resources:
    """What a group asks of its queue: its ``minResources``, or when it has none, its
    members' requests times ``minMember`` (the first ``minMember`` members; the last one's
    requests stand in for members not created yet). Volcano itself enqueues a group without
    ``minResources`` whatever its queue holds; Lockstep, which sees the members, counts them.

    The members not created yet are counted by multiplying, never one by one: the cost is
    the members that exist, whatever ``minMember`` says (2^31-1 costs what 2 does)."""
    if min_resources:
        return dict(min_resources)
    reqs = list(requests)
    total: Resources = {}
    for r in reqs[:min_member]:
        total = add(total, r)
    missing = min_member - len(reqs)
    if missing > 0 and reqs:
        total = add(total, {k: v * missing for k, v in reqs[-1].items()})
    return total


def asks(min_resources: Resources, min_member: int, requests: Sequence[Resources]
         ) -> Resources:
    """What a gang asks of its queue to be admitted: its :func:`demand`, and never less than
    all its live members (``requests``) together: admission plans every member that fits,
    extras beyond minMember too, so this keeps what a queue's gangs hold within its
    capability whatever the plan takes."""
    want = demand(min_resources, min_member, requests)
    everyone: Resources = {}
    for r in requests:
        everyone = add(everyone, r)
    return {r: max(want.get(r, 0), everyone.get(r, 0)) for r in want.keys() | everyone.keys()}


def unlimited(queues: Mapping[str, QueueRecord], queue: str) -> bool:
    """Whether ``queue`` lets any group in without adding up what its groups hold: open and
    without a capability, or the ``default`` queue nobody created."""
    q = queues.get(queue)
    return (q is None and queue == DEFAULT_QUEUE) or (q is not None and q.open
                                                      and not q.capability)


def held_back(reason: GangReason | None, queue: str | None = None) -> bool:
    """Whether a queue (``queue``, or any) held a gang back for ``reason``: such a gang is
    tried again when that queue changes or makes room."""
    return isinstance(reason, QueueFull | QueueNotFound | QueueNotOpen) \
        and (queue is None or reason.queue == queue)


@dataclass(slots=True)
class QueueUse:
    """What each queue's groups hold, and whether one more group may enter."""

    queues: Mapping[str, QueueRecord]
    allocated: dict[GangKey, tuple[str, Resources]] = field(default_factory=dict)
    """Each group's queue and what it holds there (reserved, bound, or enqueued)."""

    def take(self, gang: GangKey, queue: str, amount: Resources) -> None:
        """Count ``amount`` as ``gang``'s share of ``queue`` (replacing what it had)."""
        self.allocated[gang] = (queue, dict(amount))

    def used(self, queue: str, other_than: GangKey | None = None) -> Resources:
        total: Resources = {}
        for gang, (q, amount) in self.allocated.items():
            if q == queue and gang != other_than:
                total = add(total, amount)
        return total

    def check(self, gang: GangKey, queue: str, want: Resources
              ) -> QueueNotFound | QueueNotOpen | QueueFull | None:
        """Why ``gang`` may not enter ``queue`` asking ``want``, or None when it may."""
        q = self.queues.get(queue)
        if q is None:
            return None if queue == DEFAULT_QUEUE else QueueNotFound(gang, queue)
        if not q.open:
            return QueueNotOpen(gang, queue, q.state)
        if not q.capability:
            return None
        used = self.used(queue, other_than=gang)
        over = tuple(sorted(r for r, cap in q.capability.items()
                            if want.get(r, 0) > 0 and used.get(r, 0) + want[r] > cap))
        if not over:
            return None
        names = sorted(r for r in q.capability if want.get(r, 0) > 0)
        return QueueFull(gang, queue, {r: want[r] for r in names},
                         {r: used.get(r, 0) for r in names},
                         {r: q.capability[r] for r in names}, over)


def queue_use(queues: Mapping[str, QueueRecord],
              allocated: Iterable[tuple[GangKey, str, Resources]],
              enqueued: Iterable[tuple[GangKey, str, Resources]]) -> QueueUse:
    """What each queue's groups hold: ``allocated``, (group, queue, amount) for what Lockstep
    reserved or bound for a group (Volcano's ``allocated``); then ``enqueued``, the
    ``minResources`` of each group enqueued that holds nothing yet, its pods on their way
    (Volcano's ``inqueue``)."""
    use = QueueUse(queues)
    for gang, queue, amount in allocated:
        if amount:
            use.take(gang, queue, amount)
    for gang, queue, amount in enqueued:
        if gang not in use.allocated:
            use.take(gang, queue, amount)
    return use
