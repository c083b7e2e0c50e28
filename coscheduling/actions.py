"""What the coscheduler decides, as the actions the app carries out and renders.

Its values are what the app does, apart from :mod:`coscheduling.reasons`, which say why
Lockstep said no.

Each verb returns exactly one of these; ``app/`` maps them to HTTP answers, API calls and
Events in one place. Notices are the things a person should see as Events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .reasons import GangReason, NodeReason, TimedOut
from .records import GangKey, NodeName, PodKey

__all__ = [
    "Answer",
    "AwaitQuorum",
    "BindDecision",
    "BindFailed",
    "BindGroup",
    "BindNow",
    "BindOutcome",
    "Bound",
    "Eviction",
    "FilterDecision",
    "GangExpired",
    "GateAtCreation",
    "Notice",
    "NoticeKind",
    "Park",
    "PinAtCreation",
    "Placement",
    "Reject",
    "Unparked",
]


class NoticeKind(Enum):
    WAITING = "GangWaiting"
    ADMITTED = "GangAdmitted"
    RELEASED = "GangReleased"
    BOUND = "GangBound"
    TIMED_OUT = "GangTimedOut"
    INVALID = "GangInvalid"
    TIMEOUT_CAPPED = "GangTimeoutCapped"
    PARTIALLY_BOUND = "GangPartiallyBound"
    PREEMPTING = "GangPreempting"
    PREEMPTED = "Preempted"
    MOVING = "GangMovingPods"
    MOVED = "MovedForGang"


@dataclass(frozen=True, slots=True)
class Notice:
    """Something a person should see as an Event on the gang's pods."""

    kind: NoticeKind
    gang: GangKey | None
    pods: tuple[PodKey, ...]
    reason: GangReason | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class FilterDecision:
    passed: list[NodeName]
    failed: dict[NodeName, NodeReason] = field(default_factory=dict)
    """Nodes rejected for this pod only (preemption may help)."""
    unresolvable: GangReason | None = None
    """Set when every candidate is rejected for a gang-level reason."""


@dataclass(frozen=True, slots=True)
class BindNow:
    pod: PodKey
    node: NodeName


@dataclass(frozen=True, slots=True)
class Park:
    gang: GangKey
    deadline: float


@dataclass(frozen=True, slots=True)
class BindGroup:
    """Quorum reached: bind every one of these now and answer their parked calls."""

    gang: GangKey
    binds: dict[PodKey, NodeName]


@dataclass(frozen=True, slots=True)
class Reject:
    reason: GangReason | NodeReason


BindDecision = BindNow | Park | BindGroup | Reject


@dataclass(frozen=True, slots=True)
class GangExpired:
    """An admitted gang whose deadline passed before its quorum bound: its room is given
    back, and the app answers its parked calls with ``reason`` (not a preemption's expiry:
    :class:`~coscheduling.preemption.inflight.PreemptionExpired`)."""

    gang: GangKey
    parked: dict[PodKey, NodeName]
    reason: TimedOut


@dataclass(frozen=True, slots=True)
class Eviction:
    """A victim the app evicts for a preemption, as kube-scheduler does: the
    ``DisruptionTarget`` condition, then a delete with the pod's own grace period."""

    pod: PodKey
    uid: str
    node: NodeName
    preemptor: str
    """The preempting gang's key."""
    priority: int
    """The preemptor's priority."""
    gang: GangKey | None
    """The victim's gang (evicted whole), None for a plain pod."""
    move: bool = False
    """Moved to make room (``coscheduling.defrag``), not preempted: evicted through the
    Eviction API, so the API server refuses it when a PodDisruptionBudget would break."""


@dataclass(frozen=True, slots=True)
class Unparked:
    """Parked calls the core let go of outside a verb (a member or node left, a deadline):
    the app answers each with the rendered reason, and kube-scheduler retries them."""

    gang: GangKey
    pods: dict[PodKey, NodeName]
    reason: GangReason


@dataclass(frozen=True, slots=True)
class Bound:
    pod: PodKey
    node: NodeName
    uid: str = ""
    """The UID the binding was for (empty: not known). The outcomes of a BindGroup come back
    together once its last binding does; a member deleted and created again under its name
    meanwhile is another pod, and the outcome is not about it."""


@dataclass(frozen=True, slots=True)
class BindFailed:
    pod: PodKey
    node: NodeName
    message: str
    permanent: bool
    """True when retrying cannot help (pod or node gone, forbidden, conflict)."""
    uid: str = ""
    """The UID the binding was for (empty: not known), as :attr:`Bound.uid`."""


BindOutcome = Bound | BindFailed


@dataclass(frozen=True, slots=True)
class Lift:
    """Take Lockstep's gate off ``pod`` (only if it still has ``uid``), pinning it to
    ``node``; ``node`` is None for a pod that no plan holds (it then goes through filter
    like any other)."""

    pod: PodKey
    uid: str
    node: NodeName | None


# The webhook's answers to a member being created (coscheduling.creation.placer.placer.placer).


@dataclass(frozen=True, slots=True)
class PinAtCreation:
    """Create the pod pinned to ``node``, without Lockstep's gate."""

    node: NodeName
    gang: GangKey


@dataclass(frozen=True, slots=True)
class GateAtCreation:
    """Create the pod behind Lockstep's gate; ``why`` says why it could not be placed
    (``reason``: the gang's reason, when admission said no)."""

    why: str
    reason: GangReason | None = None


@dataclass(frozen=True, slots=True)
class AwaitQuorum:
    """Hold the review: its gang's quorum is not there yet, and other members' reviews may
    complete it. The answer comes from :func:`drain_answers` (a later review completed the
    quorum, or was refused) or :func:`expire_holds` at ``until`` at the latest."""

    gang: GangKey
    until: float


Answer = PinAtCreation | GateAtCreation
"""A review's final answer."""
Placement = Answer | AwaitQuorum
