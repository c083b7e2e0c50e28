"""What a gang asks for, whichever convention declared it: the values the core works with.

A pod names its gang by one of the conventions the ecosystem already uses (each in its own
module under ``coscheduling.conventions``, where the resolver also lives); whichever it was,
the result is one of the values here: a :class:`GangSpec`, an :class:`InvalidGang` naming the
field to fix, or a :class:`MissingPodGroup` the gang waits for. The core, the reasons and the
app read only these, so none of them needs to know which convention a gang came from beyond
``GangSpec.source``. (``GangKey`` and ``gang_key`` live in the ``keys`` leaf and are
exported here too, beside the values keyed by them.)

A bad value is never defaulted: the pod gets an :class:`InvalidGang` naming the field, which
the app turns into a rejection and an Event. (Koordinator itself falls back to its defaults
on a bad ``mode``, ``match-policy`` or ``total-number``; a silent fallback is how a gang
ends up scheduled under rules its author did not write.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from .keys import GangKey, gang_key
from .resources import Resources

__all__ = [
    "GangDefaults",
    "GangKey",
    "GangSpec",
    "InvalidGang",
    "MatchPolicy",
    "Membership",
    "MissingPodGroup",
    "Mode",
    "Source",
    "gang_key",
    "int_field",
    "seconds_field",
]

class Source(Enum):
    """Which convention a gang was declared by (what its status is written back as)."""

    LOCKSTEP = "lockstep"
    SCHEDULER_PLUGINS = "scheduler-plugins"
    VOLCANO = "volcano"
    KOORDINATOR = "koordinator"
    KUEUE = "kueue"
    UPSTREAM = "scheduling.k8s.io"
    """Kubernetes' own Workload / PodGroup API (``coscheduling.conventions.upstream``)."""


class MatchPolicy(Enum):
    """Which members count toward minMember (Koordinator's ``match-policy``)."""

    WAITING_AND_RUNNING = "waiting-and-running"
    """Parked and bound members both count; a gang that loses members below minMember
    gathers a quorum again. Lockstep's rule for every other convention."""
    ONCE_SATISFIED = "once-satisfied"
    """Koordinator's default: once minMember were bound, later members are plain pods."""
    ONLY_WAITING = "only-waiting"
    """Only members waiting to bind count: minMember of them must arrive together."""


class Mode(Enum):
    STRICT = "Strict"
    NON_STRICT = "NonStrict"
    """Koordinator keeps accumulating after a member fails. Lockstep never holds part of a
    gang's capacity (that is the deadlock), so the difference it honours is the retry: no
    backoff after a timeout."""


@dataclass(frozen=True, slots=True)
class GangDefaults:
    timeout_seconds: float = 60.0
    max_timeout_seconds: float = 240.0
    """Parked bind calls must be answered before kube-scheduler's httpTimeout."""


@dataclass(frozen=True, slots=True)
class GangSpec:
    key: GangKey
    min_member: int
    timeout_seconds: float
    source: Source
    min_resources: Resources = field(default_factory=dict)
    capped_from: float | None = None
    """The timeout asked for when it was above the maximum and capped."""
    total: int | None = None
    """Koordinator's ``total-number``: the children the job will create (views only)."""
    mode: Mode = Mode.STRICT
    match_policy: MatchPolicy = MatchPolicy.WAITING_AND_RUNNING
    part: GangKey | None = None
    """In a gang group, the gang this pod declared; ``key`` is then the group's."""
    group: tuple[GangKey, ...] = ()
    """A gang group's gangs, sorted; empty for an ordinary gang."""
    parts: tuple[tuple[GangKey, int], ...] = ()
    """Set by the core on a gang group's composed spec: each gang's own minMember."""
    topology: str | None = None
    """A required topology level by name (an upstream PodGroup's ``schedulingConstraints``);
    the ``lockstep.dev/topology-required`` annotation is read by the core itself."""
    priority: int | None = None
    """The group's own priority (an upstream PodGroup's ``spec.priority``, which the API
    server's Priority admission fills from its class); None: its highest member's."""
    priority_class: str | None = None
    """The group's PriorityClass by name (Volcano PodGroup or upstream PodGroup
    ``priorityClassName``), used when ``priority`` is None and the class exists."""
    preempt_never: bool = False
    """The group says ``preemptionPolicy: Never`` (upstream PodGroup): it never preempts."""

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]


@dataclass(frozen=True, slots=True)
class InvalidGang:
    """A gang declaration that cannot be honoured; ``field`` names what to fix."""

    key: GangKey | None
    field: str
    value: str
    problem: str


@dataclass(frozen=True, slots=True)
class MissingPodGroup:
    """The pod names a PodGroup (of ``api``) that does not exist (yet). The default is
    scheduler-plugins' API group, the convention whose PodGroup the others copied."""

    key: GangKey
    api: str = "scheduling.x-k8s.io"


Membership = GangSpec | InvalidGang | MissingPodGroup | None


def int_field(raw: object, fld: str, key: GangKey | None) -> int | InvalidGang:
    """A positive whole number, as a pod annotation or a PodGroup field gives it."""
    text = str(raw).strip()
    if isinstance(raw, bool) or not re.fullmatch(r"[+-]?\d+", text):
        return InvalidGang(key, fld, str(raw), "not a whole number")
    value = int(text)
    if value <= 0:
        return InvalidGang(key, fld, str(raw), "must be at least 1")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds_field(raw: object, fld: str, key: GangKey | None) -> float | InvalidGang:
    """Seconds as a number, or a Go duration ("90s", "10m") as Koordinator writes them."""
    text = str(raw).strip()
    value: float | None = None
    if re.fullmatch(r"\d+(\.\d+)?", text):
        value = float(text)
    elif text and _DURATION.sub("", text) == "":
        value = sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(text))
    if value is None:
        return InvalidGang(key, fld, text, "not a number of seconds or a duration like 90s")
    if value <= 0:
        return InvalidGang(key, fld, text, "must be greater than 0")
    return value
