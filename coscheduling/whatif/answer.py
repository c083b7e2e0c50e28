"""What a what-if answers: the verdict, each member's place, the victims, why it waits.

Values only (the app renders the reasons in words and puts the answer on the wire as a
pydantic model): a dry plan never returns anything that points into the live state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..devices.inventory import PlannedDevices
from ..reasons import GangReason, NoFit
from ..records import GangKey, NodeName, PodKey

__all__ = ["Earliest", "Outcome", "Placed", "Proposal", "Verdict", "VictimSet", "WhatIfError"]


class Verdict(enum.Enum):
    """The four answers, best first (a proposal's verdict is its worst unit's)."""

    FITS = "fits-now"
    PREEMPTS = "fits-after-preemption"
    WAITS = "waits"
    NEVER = "never-fits"


class WhatIfError(ValueError):
    """The objects cannot be read as a proposal (bad input: HTTP 400, exit 2). ``field``
    names what is wrong, as every 4xx of Lockstep does."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


@dataclass(frozen=True, slots=True)
class Placed:
    """Where one member would go, and what the webhook would do at its creation."""

    pod: PodKey
    node: NodeName
    domains: tuple[tuple[str, str], ...]
    """``(level, value)`` for each topology level the node is labelled with (rack, clique,
    ...), coarse to fine, the hostname left out."""
    pinned: bool
    """The webhook pins it at creation (named, ungated, in the plan); else it is gated and
    its gate comes off when the gang is admitted, onto the same node."""


@dataclass(frozen=True, slots=True)
class VictimSet:
    """Whom a preemption would evict, and what it frees."""

    gangs: tuple[GangKey, ...]
    pods: tuple[PodKey, ...]
    evicted: int
    """Pods evicted in all (every bound member of each gang, and the plain pods)."""
    gpus: int
    """GPUs the victims give back."""


@dataclass(frozen=True, slots=True)
class Earliest:
    """The first known event after which the unit would fit (nothing else changing)."""

    seconds: float
    """From now."""
    event: str
    """What happens then, in words (a gang's deadline, a preemption's)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer for one unit of the proposal: a gang, or one plain pod."""

    unit: str
    """The gang key, or the pod key of a pod outside any gang."""
    gang: bool
    verdict: Verdict
    members: int
    placed: tuple[Placed, ...] = ()
    """Fits now: every member's place; after preemption: where it goes once they are gone."""
    gated: tuple[PodKey, ...] = ()
    """Members outside the plan (extras beyond the quorum): gated at creation."""
    level: str | None = None
    """The topology level one domain of which holds the plan (None: spread)."""
    victims: VictimSet | None = None
    reason: GangReason | None = None
    """Why it waits or never fits, as ``explain`` gives it."""
    why: str = ""
    """More words when no reason object says it (preemption's answer, a never-fit proof)."""
    hints: tuple[str, ...] = ()
    """What would make it fit (N GPUs in one rack, a queue's capability, a quota line)."""
    earliest: Earliest | None = None
    nofit: NoFit | None = None
    """The planner's negative answer (on the empty cluster, for a unit that never fits)."""
    devices: tuple[tuple[PodKey, PlannedDevices], ...] = ()
    """The DRA devices the plan gives each placed member (held for the later units of the
    proposal; not put on the wire: kube-scheduler's allocator picks the devices)."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """The answer for everything the objects would create."""

    verdict: Verdict
    outcomes: tuple[Outcome, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What was read and how (a Job expanded into its pods, a PodGroup assumed)."""
