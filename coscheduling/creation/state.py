"""What the creation wing remembers between reviews and sweeps (:class:`CreationState`).

Two kinds of member wait here, and the names keep them apart: reviews **held** by the webhook
until their gang's quorum exists (:class:`Hold`), and gangs **gated** behind Lockstep's
scheduling gate, admitted by the sweep without a filter call (:class:`Gated`). Members the
webhook pinned at creation that the watch has not shown yet are ``pinned``, with the time
their slot is given back if it never does.

A leaf of the wing: the core's state (``corestate``) composes it, and the placer and the
gated sweep (``creation.placer``, ``creation.gated``) change it; it imports no rule.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..actions import Answer
from ..podgroup import GangKey, GangSpec
from ..records import PodKey, PodRecord

__all__ = ["CreationState", "Gated", "Hold"]


@dataclass(slots=True)
class Hold:
    """The reviews of one gang the webhook is holding, waiting for the ones that complete its
    quorum (:class:`~coscheduling.actions.AwaitQuorum`, ``coscheduling.creation.placer``)."""

    spec: GangSpec
    first: float
    until: float
    pods: dict[PodKey, PodRecord] = field(default_factory=dict)


@dataclass(slots=True)
class Gated:
    """The sweep's bookkeeping of gangs behind the gate (``coscheduling.creation.gated``)."""

    touched: set[GangKey] = field(default_factory=set)
    """Gated gangs whose admission may have become possible: the next sweep plans them."""
    blocked: set[GangKey] = field(default_factory=set)
    """Gated gangs that did not fit: planned again when capacity changed."""
    epoch: int = -1
    """The store epoch at which the blocked gangs were last planned."""
    swept: float = float("-inf")
    """When the blocked gangs were last planned (they are retried at most so often)."""


@dataclass(slots=True)
class CreationState:
    holds: dict[GangKey, Hold] = field(default_factory=dict)
    """Reviews the webhook holds until their gang's quorum exists: nothing is reserved for
    them."""
    slow_gangs: OrderedDict[GangKey, None] = field(default_factory=OrderedDict)
    """Gangs whose members were created one at a time: their reviews are gated, not held."""
    answers: dict[PodKey, Answer] = field(default_factory=dict)
    """Answers for held reviews decided since the webhook last asked."""
    pinned: dict[PodKey, float] = field(default_factory=dict)
    """Members pinned at creation that the watch has not shown yet, with the time their
    slot is given back if it never does."""
    gated: Gated = field(default_factory=Gated)
