"""One gang's lifecycle as an explicit state machine.

The phase is one enum; each transition is a method and the only place its bookkeeping
happens: admitting reserves, expiring / falling back / losing a slot unreserves. Before this
module, the state was implied by ``released``, ``admitted_at`` and ``backoff_until`` together,
and a reservation could outlive or undercut its plan.

::

    WAITING ----admit----> ADMITTED ----release----> RELEASED
       ^  ^                  |  |                       |
       |  |                  |  +--expire--> BACKING_OFF |
       |  +---backoff_over---+---------------------+     |
       +---------------------- fall_back ---------------+

    WAITING / BACKING_OFF --satisfied (minMember already bound)--> RELEASED

``fall_back`` is taken by an ADMITTED or RELEASED gang whose live members drop below
``minMember`` (a member deleted, failed or recreated): it gives back every slot except those
of bindings already in flight, which are about to become real usage (``expire`` keeps those
too).

Invariants (checked after every step of ``tests/unit/model/test_model.py``):

* ``plan`` and the ledger's reservations for this gang are the same set of (pod, node);
* only ADMITTED and RELEASED gangs hold slots, except in-flight bindings of a gang that fell
  back;
* an ADMITTED gang's slots plus its bound members cover ``minMember``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..podgroup import GangKey, GangSpec
from ..reasons import GangReason, PartiallyBound, TimedOut
from ..records import NodeName, PodKey
from ..resources import Resources
from .ledger import Ledger, Reservation

__all__ = ["Gang", "GangPhase", "IllegalTransition"]


class GangPhase(Enum):
    WAITING = "Waiting"
    """Fewer than minMember members exist, or no plan fits yet; holds no capacity."""
    ADMITTED = "Admitted"
    """A whole plan fits; its capacity is reserved and the deadline runs."""
    RELEASED = "Released"
    """minMember members are bound or binding: every further member binds at once."""
    BACKING_OFF = "BackingOff"
    """Timed out; holds nothing until the backoff ends, so other gangs can go first."""
    INVALID = "Invalid"
    """Views only: no member carries a usable declaration."""


class IllegalTransition(AssertionError):
    """A transition asked of a gang in a phase that does not allow it (a core bug)."""


@dataclass(slots=True)
class Gang:
    key: GangKey
    ledger: Ledger
    phase: GangPhase = GangPhase.WAITING
    members: set[PodKey] = field(default_factory=set)
    spec: GangSpec | None = None
    """The gang's declaration, from its first member (by name) that has a valid one."""
    plan: dict[PodKey, NodeName] = field(default_factory=dict)
    """Slots held for members not yet bound; always equal to this gang's reservations."""
    plan_level: str | None = None
    deadline: float | None = None
    backoff_until: float | None = None
    backoff_cause: TimedOut | None = None
    binding: set[PodKey] = field(default_factory=set)
    """Released members whose binding is in flight (not yet seen bound by the watch)."""
    reason: GangReason | None = None
    """Why members were last turned away, for Events and explain."""
    partial: PartiallyBound | None = None
    """Set when a sibling's binding failed for good after others bound."""
    turned_away: set[PodKey] = field(default_factory=set)
    """Members filter rejected since: they sit in kube-scheduler's unschedulable queue and
    only a nudge wakes them. Members never turned away are in its active queue already, so
    nudging them would be an API write for nothing."""

    told: dict[PodKey, GangReason] = field(default_factory=dict)
    """The last reason each member was given as an Event (one Event per change, per pod)."""

    def wake(self) -> set[PodKey]:
        """The members to nudge now, forgotten once returned."""
        out, self.turned_away = self.turned_away, set()
        return out

    def _expect(self, *phases: GangPhase) -> None:
        if self.phase not in phases:
            names = "/".join(p.value for p in phases)
            raise IllegalTransition(f"gang {self.key} is {self.phase.value}, not {names}")

    # ------------------------------------------------------------------ slots

    def _reserve(self, pod: PodKey, node: NodeName, requests: Resources) -> None:
        self.plan[pod] = node
        self.ledger.reserve(Reservation(pod, self.key, node, dict(requests)))

    def drop_slot(self, pod: PodKey) -> NodeName | None:
        """Give back one member's slot: it bound (usage now), left, or its node went away."""
        node = self.plan.pop(pod, None)
        if node is not None:
            self.ledger.unreserve(pod)
        if not self.plan:
            self.plan_level = None
        return node

    def add_slot(self, pod: PodKey, node: NodeName, requests: Resources) -> None:
        """One more member placed beside an existing plan (an extra, or a re-placed one)."""
        self._expect(GangPhase.ADMITTED, GangPhase.RELEASED)
        self.drop_slot(pod)
        self._reserve(pod, node, requests)

    def _drop_all(self, keep: set[PodKey] | None = None) -> None:
        for pod in list(self.plan):
            if keep is None or pod not in keep:
                self.drop_slot(pod)

    # ------------------------------------------------------------------ transitions

    def admit(self, assignments: Mapping[PodKey, NodeName],
              requests: Mapping[PodKey, Resources], level: str | None,
              now: float, timeout: float) -> None:
        self._expect(GangPhase.WAITING)
        self._drop_all(self.binding)
        for pod, node in assignments.items():
            self._reserve(pod, node, requests[pod])
        self.plan_level = level
        self.phase = GangPhase.ADMITTED
        self.deadline = now + timeout
        self.reason = None

    def release(self, binding: set[PodKey]) -> None:
        """Quorum: these members bind now; the deadline no longer applies."""
        self._expect(GangPhase.ADMITTED)
        self.phase = GangPhase.RELEASED
        self.deadline = None
        self.binding |= binding
        self.reason = None

    def satisfied(self) -> None:
        """minMember members are already bound (a restart, another scheduler's doing)."""
        self._expect(GangPhase.WAITING, GangPhase.BACKING_OFF)
        self.phase = GangPhase.RELEASED
        self.backoff_until = None
        self.backoff_cause = None

    def expire(self, now: float, backoff: float, cause: TimedOut) -> None:
        self._expect(GangPhase.ADMITTED)
        # A gang admitted again after falling back may still have bindings in flight: they
        # are about to become real usage, so their slots stay (as in ``fall_back``).
        self._drop_all(self.binding)
        self.phase = GangPhase.BACKING_OFF
        self.deadline = None
        self.backoff_until = now + backoff
        self.backoff_cause = cause
        self.reason = cause

    def backoff_over(self) -> None:
        self._expect(GangPhase.BACKING_OFF)
        self.phase = GangPhase.WAITING
        self.backoff_until = None

    def fall_back(self, reason: GangReason) -> None:
        self._expect(GangPhase.ADMITTED, GangPhase.RELEASED)
        self._drop_all(self.binding)
        self.phase = GangPhase.WAITING
        self.deadline = None
        self.reason = reason

    def bind_settled(self, pod: PodKey) -> None:
        """A binding this gang started ended (bound, failed, or the pod left)."""
        self.binding.discard(pod)
        if self.phase is not GangPhase.RELEASED and pod in self.plan:
            # A fallen-back gang kept the slot only while the binding was in flight.
            self.drop_slot(pod)
