"""What the webhook answers a member being created (``coscheduling.creation``), and the
reviews it holds: plain values, kept apart so the state can name them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .podgroup import GangKey, GangSpec
from .reasons import GangReason
from .records import NodeName, PodKey, PodRecord

__all__ = ["Answer", "AwaitQuorum", "GateAtCreation", "Held", "PinAtCreation", "Placement"]


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


@dataclass(slots=True)
class Held:
    """The reviews of one gang being held, waiting for the ones that complete its quorum."""

    spec: GangSpec
    first: float
    until: float
    pods: dict[PodKey, PodRecord] = field(default_factory=dict)


