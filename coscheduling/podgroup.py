"""What a gang asks for, whichever convention declared it: the values the core works with.

A pod names its gang by one of the conventions the ecosystem already uses (each in its own
module under ``coscheduling.conventions``, where the resolver also lives); whichever it was,
the result is one of the values here: a :class:`GangSpec`, an :class:`InvalidGang` naming the
field to fix, or a :class:`MissingPodGroup` the gang waits for. The core, the reasons and the
app read only these, so none of them needs to know which convention a gang came from beyond
``GangSpec.source``. (``GangKey`` and ``gang_key`` live in the ``records`` leaf and are
exported here too, beside the values keyed by them.)

A bad value is never defaulted: the pod gets an :class:`InvalidGang` naming the field, which
the app turns into a rejection and an Event. (Koordinator itself falls back to its defaults
on a bad ``mode``, ``match-policy`` or ``total-number``; a silent fallback is how a gang
ends up scheduled under rules its author did not write.)

Every value is checked against a named limit before any work is done with it (the sizes
against ``--max-gang-size`` and int32, text by its length before it is converted), and a
reason repeats a bad value only in short (:func:`shown`): no pod or group object, however
written, raises out of the parsers or costs work that grows with what it says.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from .records import GangKey, gang_key
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
    "Subgroup",
    "gang_key",
    "gang_of",
    "int_field",
    "name_field",
    "seconds_field",
    "shown",
]

INT32_MAX = 2**31 - 1
"""Every convention's size fields are int32 in its own API (scheduler-plugins' and Volcano's
``minMember``, upstream ``minCount``, ``scheduleTimeoutSeconds``), as are pod priorities."""
DEFAULT_MAX_GANG_SIZE = 1000
"""``--max-gang-size``: the most members a gang may declare. Work at a gang's creation
(expected members, placeholders) grows with its size, so a size is bounded before any of it."""
MAX_TIMEOUT_INPUT_SECONDS = float(INT32_MAX)
"""The largest timeout accepted as written (``scheduleTimeoutSeconds`` is an int32); within
it a timeout is capped to ``--max-timeout`` and the cap reported, beyond it the gang is
invalid."""
MAX_NUMBER_CHARS = 32
"""A number written as text longer than this is refused before it is parsed: Python's
``int()`` raises past 4,300 digits, and converting even fewer costs time in the digits."""
MAX_NAME_CHARS = 253
"""A gang's name, as Kubernetes bounds an object's name (a DNS subdomain)."""
MAX_PARTS = 32
"""The most subgroups a group of groups is composed of (Koordinator's gang groups, a
CompositePodGroup's children, a Volcano subgroup policy's subgroups): each is planned on
its own, so the work of planning a group grows with their number."""
SHOWN_CHARS = 64
"""How much of a bad value a reason repeats (Events and conditions are read by people)."""

@dataclass(frozen=True, slots=True)
class Source:
    """Which convention a gang was declared by (what its status is written back as).

    Open, not an enum: a convention module names its own (``Source("name")``, once, as a
    module constant compared by identity), so adding a convention changes no module but its
    own and its line in the registry (``coscheduling.conventions.REGISTRY``). The ones below
    are the conventions Lockstep ships."""

    value: str

    LOCKSTEP: ClassVar[Source]
    SCHEDULER_PLUGINS: ClassVar[Source]
    VOLCANO: ClassVar[Source]
    KOORDINATOR: ClassVar[Source]
    KUEUE: ClassVar[Source]
    UPSTREAM: ClassVar[Source]
    """Kubernetes' own Workload / PodGroup API (``coscheduling.conventions.upstream``)."""


Source.LOCKSTEP = Source("lockstep")
Source.SCHEDULER_PLUGINS = Source("scheduler-plugins")
Source.VOLCANO = Source("volcano")
Source.KOORDINATOR = Source("koordinator")
Source.KUEUE = Source("kueue")
Source.UPSTREAM = Source("scheduling.k8s.io")


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
    max_gang_size: int = DEFAULT_MAX_GANG_SIZE
    """``--max-gang-size``: a larger minMember or total count makes the gang invalid."""


@dataclass(frozen=True, slots=True)
class Subgroup:
    """One subgroup of a group of groups, as the core composes it from its members' specs
    (``GangSpec.subgroups``): each counts toward the quorum only when whole."""

    key: GangKey
    min_member: int
    topology: str | None = None
    """Its own required level by name (``GangSpec.part_topology``)."""
    exclusive: bool = False
    stage: int = 0


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
    """A gang group's gangs, sorted; empty for an ordinary gang, and for an open group
    (``part`` set, ``group`` empty: Volcano's subgroups, known only from the pods)."""
    parts: tuple[tuple[GangKey, int], ...] = ()
    """Set by the core on a gang group's composed spec: each gang's own minMember."""
    min_parts: int | None = None
    """A group of groups: how many of ``group``'s subgroups are admitted together, each one
    whole (None: every one of them). Subgroups beyond it are admitted later, each whole, as
    room allows (elastic)."""
    part_topology: str | None = None
    """The subgroup's own required topology level by name (each LWS group in one rack, each
    JobSet child Job in one block); ``topology`` is then the whole set's."""
    part_exclusive: bool = False
    """The subgroup wants its ``part_topology`` domain to itself: no other subgroup's or
    gang's members there (LWS and JobSet ``exclusive-topology``)."""
    stage: int = 0
    """The subgroup's stage (a JobSet's ``dependsOn`` order, Trainer v2's initializers
    first): stage n is admitted whole once the stages before it have finished, and the
    quorum counts the current stage only."""
    part_stages: tuple[tuple[GangKey, int], ...] = ()
    """Each subgroup's stage as the group declares it (a JobSet's ``dependsOn`` read from
    the JobSet), for subgroups none of whose members exist yet: without it such a subgroup
    is taken to be in stage 0, and a Trainer v2 job's nodes would be waited for beside its
    initializer. A subgroup's own members' ``stage`` wins."""
    subgroups: tuple[Subgroup, ...] = ()
    """Set by the core on a group's composed spec (beside ``parts``, which its readers keep):
    every subgroup of ``group`` with its minimum, level, exclusivity and stage."""
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


def gang_of(m: Membership) -> GangKey | None:
    """The gang a pod's membership names (valid, invalid or waiting for its PodGroup); None
    for a pod outside any gang. (``gang_key`` builds a key from a namespace and a name.)"""
    if isinstance(m, GangSpec | MissingPodGroup | InvalidGang):
        return m.key
    return None


def shown(raw: object) -> str:
    """A bad value as a reason repeats it: short, and never by ``str()`` of something whose
    text could be huge (a 5,000-digit int raises; a deeply nested list recurses)."""
    if isinstance(raw, bool):
        return str(raw).lower()
    if isinstance(raw, int):
        if raw.bit_length() > 64:
            return f"a {raw.bit_length()}-bit number"
        return str(raw)
    if isinstance(raw, float):
        return repr(raw)
    if isinstance(raw, str):
        if len(raw) <= SHOWN_CHARS:
            return raw
        return f"{raw[:SHOWN_CHARS - 16]}... ({len(raw)} characters)"
    if isinstance(raw, Mapping):
        return "an object"
    if isinstance(raw, list | tuple):
        return "a list"
    return "null" if raw is None else type(raw).__name__


_WHOLE = re.compile(r"[+-]?[0-9]+")
"""ASCII digits only: ``\\d`` and ``int()`` also take other scripts' digits ('٣')."""


def int_field(raw: object, fld: str, key: GangKey | None, *, limit: int = INT32_MAX,
              limit_name: str = "int32") -> int | InvalidGang:
    """A positive whole number no larger than ``limit``, as a pod annotation (text) or a
    PodGroup field (a JSON number) gives it. Checked before it is converted: the work is
    bounded by :data:`MAX_NUMBER_CHARS` whatever the value."""
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        return InvalidGang(key, fld, shown(raw), "not a whole number")
    if isinstance(raw, int):
        value = raw
    else:
        text = raw.strip()
        if not _WHOLE.fullmatch(text):
            return InvalidGang(key, fld, shown(raw), "not a whole number")
        digits = text.lstrip("+-").lstrip("0")
        if text.startswith("-") and digits:
            return InvalidGang(key, fld, shown(raw), "must be at least 1")
        if len(digits) > len(str(limit)):
            return InvalidGang(key, fld, shown(raw),
                               f"is above the limit of {limit} ({limit_name})")
        if len(text) > MAX_NUMBER_CHARS:
            return InvalidGang(key, fld, shown(raw), f"is {len(text)} characters long, above "
                               f"the limit of {MAX_NUMBER_CHARS}")
        value = int(text)
    if value <= 0:
        return InvalidGang(key, fld, shown(raw), "must be at least 1")
    if value > limit:
        return InvalidGang(key, fld, shown(raw), f"is above the limit of {limit} ({limit_name})")
    return value


def name_field(raw: str, fld: str, key: GangKey | None) -> InvalidGang | None:
    """Why a gang name written on a pod cannot be used, or None: an annotation value may be
    256 KiB, and the name goes into every key, reason, Event and metric about the gang."""
    if len(raw) > MAX_NAME_CHARS:
        return InvalidGang(key, fld, shown(raw),
                           f"is {len(raw)} characters long, above the limit of "
                           f"{MAX_NAME_CHARS} (an object name's)")
    return None


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds_field(raw: object, fld: str, key: GangKey | None) -> float | InvalidGang:
    """Seconds as a number, or a Go duration ("90s", "10m") as Koordinator writes them, at
    most :data:`MAX_TIMEOUT_INPUT_SECONDS` (the caller caps it to ``--max-timeout``)."""
    value: float | None = None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw) if isinstance(raw, float) or raw.bit_length() <= 64 else math.inf
    elif isinstance(raw, str) and len(text := raw.strip()) <= MAX_NUMBER_CHARS:
        if _SECONDS.fullmatch(text):
            value = float(text)
        elif text and _DURATION.sub("", text) == "":
            value = sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(text))
    elif isinstance(raw, str) and _SECONDS.fullmatch(raw.strip()):
        value = math.inf  # all digits, longer than any timeout that fits the limit
    if value is None or math.isnan(value):
        return InvalidGang(key, fld, shown(raw), "not a number of seconds or a duration like 90s")
    if value <= 0:
        return InvalidGang(key, fld, shown(raw), "must be greater than 0")
    if value > MAX_TIMEOUT_INPUT_SECONDS:
        return InvalidGang(key, fld, shown(raw),
                           f"is above the limit of {MAX_TIMEOUT_INPUT_SECONDS:.0f} seconds "
                           "(int32, as scheduleTimeoutSeconds is)")
    return value
