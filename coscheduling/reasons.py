"""Why Lockstep said no, as values.

The core returns these; ``app/render.py`` turns them into the one sentence that appears in
``FailedAndUnresolvableNodes``, in Events and on the explain endpoint, so a reason is worded
in exactly one place and no caller parses a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .podgroup import GangKey, InvalidGang
from .records import NodeName, PodKey
from .resources import Resources

__all__ = [
    "BackingOff",
    "BeingPreempted",
    "BindTargetGone",
    "DevicesNotReady",
    "DoesNotFit",
    "ExtraMemberWaits",
    "GangReason",
    "HigherPriorityPodsWaiting",
    "InvalidDeclaration",
    "MembersLost",
    "NoFit",
    "NodeReason",
    "NotEnoughMinResources",
    "PartiallyBound",
    "PlannedNodeLost",
    "PodGroupNotFound",
    "PodNotInCache",
    "Preempting",
    "PreemptionStalled",
    "QueueFull",
    "QueueNotFound",
    "QueueNotOpen",
    "Reason",
    "ReservedForGangs",
    "TimedOut",
    "UnknownNode",
    "WaitingForMembers",
    "WrongNode",
]


@dataclass(frozen=True, slots=True)
class NoFit:
    """Why a whole gang has no placement: the planner's negative answer, the payload of
    :class:`DoesNotFit` and :class:`PlannedNodeLost` (here, so the reasons that render it need
    not import the planner)."""

    members: int
    shape: Resources
    """The largest member's request (all members when they are alike)."""
    free_units: int
    """How many members of that shape fit in the free capacity, ignoring topology."""
    eligible_nodes: int
    required_level: str | None = None
    widest_domain_fit: int = 0
    """With a required level: the most members any single domain could hold."""
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class WaitingForMembers:
    gang: GangKey
    have: int
    need: int


@dataclass(frozen=True, slots=True)
class InvalidDeclaration:
    error: InvalidGang


@dataclass(frozen=True, slots=True)
class PodGroupNotFound:
    gang: GangKey
    api: str = "scheduling.x-k8s.io"


@dataclass(frozen=True, slots=True)
class BackingOff:
    gang: GangKey
    seconds_left: float
    cause: TimedOut | None


@dataclass(frozen=True, slots=True)
class DoesNotFit:
    gang: GangKey
    nofit: NoFit
    reserved_by: tuple[GangKey, ...]
    """Admitted gangs holding reservations, which a waiting gang may be waiting for."""
    preemption: str = ""
    """Why preemption could not make room ("" when it was not tried)."""


@dataclass(frozen=True, slots=True)
class NotEnoughMinResources:
    gang: GangKey
    want: Resources
    free: Resources


@dataclass(frozen=True, slots=True)
class ExtraMemberWaits:
    gang: GangKey
    planned: int


@dataclass(frozen=True, slots=True)
class PlannedNodeLost:
    gang: GangKey
    node: NodeName
    nofit: NoFit


@dataclass(frozen=True, slots=True)
class TimedOut:
    gang: GangKey
    parked: int
    need: int
    timeout_seconds: float
    stragglers: tuple[str, ...]
    """Members that never reached bind, with what they last waited on."""


@dataclass(frozen=True, slots=True)
class WrongNode:
    gang: GangKey
    planned: NodeName | None
    asked: NodeName


@dataclass(frozen=True, slots=True)
class ReservedForGangs:
    node: NodeName
    gangs: tuple[GangKey, ...]
    short: Resources
    nominated: tuple[PodKey, ...] = ()
    """Plain pods (of this pod's priority or higher) that preempted for room on the node."""


@dataclass(frozen=True, slots=True)
class HigherPriorityPodsWaiting:
    """Pods of higher priority that kube-scheduler is placing now would not fit beside the
    gang: as kube-scheduler's queue serves them first, the gang waits for them."""

    gang: GangKey
    priority: int
    pods: tuple[str, ...]
    """Up to five of them, highest priority first."""
    count: int


@dataclass(frozen=True, slots=True)
class Preempting:
    """The gang evicted lower-priority work and holds the room it frees: it runs once the
    victims have terminated."""

    gang: GangKey
    victim_gangs: tuple[str, ...]
    plain_pods: int
    """Victim pods outside any gang."""
    gpus: int
    """GPUs the victims give back."""
    waiting: int
    """Victim pods not yet gone."""


@dataclass(frozen=True, slots=True)
class PreemptionStalled:
    """Victims outlived their grace period and the margin: the held room was given back
    and the gang is planned again."""

    gang: GangKey
    still_there: int


@dataclass(frozen=True, slots=True)
class BeingPreempted:
    """The gang was evicted for a higher-priority gang that is not running yet: its
    recreated members wait, so they do not race the preemptor for the room."""

    gang: GangKey
    by: str


@dataclass(frozen=True, slots=True)
class MembersLost:
    """An admitted or released gang fell below minMember: its reservation was given back."""

    gang: GangKey
    have: int
    need: int
    lost: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodNotInCache:
    """A verb named a pod the watch has not delivered (or has already deleted)."""

    pod: str
    uid: str
    cached_uid: str | None


@dataclass(frozen=True, slots=True)
class BindTargetGone:
    """Checked before the first binding of a quorum: a member or its node is gone."""

    gang: GangKey
    pod: str
    what: str


@dataclass(frozen=True, slots=True)
class PartiallyBound:
    """Some members bound, then a sibling's binding failed for good: never hidden."""

    gang: GangKey
    bound: int
    need: int
    failures: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueNotFound:
    """A Volcano group names a Queue that does not exist: Volcano's enqueue skips it."""

    gang: GangKey
    queue: str


@dataclass(frozen=True, slots=True)
class QueueNotOpen:
    """A Volcano group's Queue is Closed, Closing (or Unknown): nothing new enters it."""

    gang: GangKey
    queue: str
    state: str


@dataclass(frozen=True, slots=True)
class QueueFull:
    """A Volcano group would take its Queue past ``spec.capability``: it waits until the
    queue's other groups finish or the capability grows. Only the resources it asks for."""

    gang: GangKey
    queue: str
    want: Resources
    used: Resources
    """What the queue's other groups hold (reserved, bound, or enqueued)."""
    capability: Resources
    over: tuple[str, ...]
    """The resources that would go past the capability."""


@dataclass(frozen=True, slots=True)
class DevicesNotReady:
    """A member's DRA devices: kube-scheduler's first fit on its planned node would take
    devices another plan cannot spare (filter), or it allocated such devices (bind)."""

    gang: GangKey
    pod: PodKey
    why: str


@dataclass(frozen=True, slots=True)
class UnknownNode:
    node: NodeName


GangReason = (
    WaitingForMembers
    | InvalidDeclaration
    | PodGroupNotFound
    | BackingOff
    | DoesNotFit
    | NotEnoughMinResources
    | ExtraMemberWaits
    | PlannedNodeLost
    | TimedOut
    | WrongNode
    | MembersLost
    | PodNotInCache
    | BindTargetGone
    | PartiallyBound
    | HigherPriorityPodsWaiting
    | Preempting
    | PreemptionStalled
    | BeingPreempted
    | QueueNotFound
    | QueueNotOpen
    | QueueFull
    | DevicesNotReady
)
NodeReason = ReservedForGangs | UnknownNode
Reason = GangReason | NodeReason
