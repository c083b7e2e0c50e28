"""Which gang a pod belongs to, and what that gang asks for.

Pods join gangs through the conventions the ecosystem already uses, so a job written for
scheduler-plugins, Volcano or Koordinator works unchanged:

=====================  ===========================================  ===========================
convention             pod -> group                                 size / timeout
=====================  ===========================================  ===========================
Lockstep               ``lockstep.dev/pod-group`` (annotation/label)  ``lockstep.dev/min-member``,
                                                                    ``lockstep.dev/timeout-seconds``
scheduler-plugins      label ``scheduling.x-k8s.io/pod-group``       PodGroup ``spec.minMember``,
                                                                    ``scheduleTimeoutSeconds``
Volcano                ``scheduling.k8s.io/group-name`` or           ``scheduling.volcano.sh/
                       ``scheduling.volcano.sh/group-name``          group-min-member``
Koordinator            ``gang.scheduling.koordinator.sh/name``,      ``.../min-available``,
                       or the lightweight label                     ``.../waiting-time``,
                       ``pod-group.scheduling.sigs.k8s.io/name``    ``.../total-number``,
                                                                    ``.../mode``, ``.../groups``,
                                                                    ``.../match-policy``
Kueue plain pods       ``kueue.x-k8s.io/pod-group-name`` (label,     ``kueue.x-k8s.io/
                       or annotation)                               pod-group-total-count``
=====================  ===========================================  ===========================

Kueue's pod groups are all-or-nothing by construction: the total count is the gang size.
Kueue gates each pod (``kueue.x-k8s.io/admission``) until it admits the group's Workload;
a gated pod is not a member that can bind yet (``PodRecord.gated``).

Koordinator's options (``total-number``, ``mode``, ``groups``, ``match-policy``) are read from
the pod, or from the scheduler-plugins PodGroup's annotations when the gang is declared the
CRD way, as Koordinator does; the pod's value wins. ``groups`` bundles gangs into a gang
group: the pod's gang key becomes the group's (:func:`group_key`) and ``GangSpec.part``
keeps the gang it came from, so the core can require every gang's own minimum at once.

A bad value is never defaulted: the pod gets an :class:`InvalidGang` naming the field, which
the app turns into a rejection and an Event. (Koordinator itself falls back to its defaults
on a bad ``mode``, ``match-policy`` or ``total-number``; a silent fallback is how a gang
ends up scheduled under rules its author did not write.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NewType

from .conventions import REGISTRY, Source
from .conventions import koordinator as conv_koord
from .conventions import lockstep as conv_lockstep
from .conventions import scheduler_plugins as conv_sp
from .conventions import volcano as conv_volcano
from .records import PodRecord
from .resources import QuantityError, Resources, resource_list

__all__ = [
    "LOCKSTEP_GROUP",
    "LOCKSTEP_MIN_MEMBER",
    "LOCKSTEP_TIMEOUT",
    "SP_GROUP_LABEL",
    "GangDefaults",
    "GangKey",
    "GangSpec",
    "InvalidGang",
    "MatchPolicy",
    "Membership",
    "MissingPodGroup",
    "Mode",
    "PodGroupRecord",
    "Source",
    "gang_key",
    "group_key",
    "podgroup_from_json",
    "resolve",
    "volcano_podgroup_from_json",
]

GangKey = NewType("GangKey", str)
"""``namespace/name`` of a gang."""

# Each convention's keys live in its own module (``coscheduling.conventions``); these names
# are the resolver's shorthand for them.
LOCKSTEP_GROUP, LOCKSTEP_MIN_MEMBER, LOCKSTEP_TIMEOUT = (
    conv_lockstep.GROUP, conv_lockstep.MIN_MEMBER, conv_lockstep.TIMEOUT)
SP_GROUP_LABEL = conv_sp.GROUP_LABEL
VOLCANO_GROUP, VOLCANO_MIN = conv_volcano.GROUP, conv_volcano.MIN_MEMBER
KOORD_TOTAL, KOORD_MODE, KOORD_GROUPS = conv_koord.TOTAL, conv_koord.MODE, conv_koord.GROUPS
KOORD_MATCH, KOORD_MATCH_ALIAS = conv_koord.MATCH, conv_koord.MATCH_ALIAS
LIGHT_GROUP, LIGHT_MIN = conv_koord.LIGHT_GROUP, conv_koord.LIGHT_MIN


def gang_key(namespace: str, name: str) -> GangKey:
    return GangKey(f"{namespace}/{name}")


def group_key(gangs: tuple[GangKey, ...]) -> GangKey:
    """One key for a Koordinator gang group, whichever member resolves it: its gangs may
    live in several namespaces, so it is filed under the first one's."""
    return GangKey(f"{gangs[0].split('/', 1)[0]}/gang-group[{','.join(gangs)}]")


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


SP_API = conv_sp.API.group
VOLCANO_API = conv_volcano.API.group


@dataclass(frozen=True, slots=True)
class MissingPodGroup:
    """The pod names a PodGroup (of ``api``) that does not exist (yet)."""

    key: GangKey
    api: str = SP_API


Membership = GangSpec | InvalidGang | MissingPodGroup | None


@dataclass(frozen=True, slots=True)
class PodGroupRecord:
    """A scheduler-plugins ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``), parsed."""

    key: GangKey
    min_member: int | None
    timeout_seconds: float | None
    min_resources: Resources
    error: InvalidGang | None = None
    phase: str = ""
    """``status.phase`` as last written (Volcano's enqueue state lives there)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Koordinator reads its gang options from the PodGroup's annotations (CRD way)."""


def _int_field(raw: object, fld: str, key: GangKey | None) -> int | InvalidGang:
    text = str(raw).strip()
    if isinstance(raw, bool) or not re.fullmatch(r"[+-]?\d+", text):
        return InvalidGang(key, fld, str(raw), "not a whole number")
    value = int(text)
    if value <= 0:
        return InvalidGang(key, fld, str(raw), "must be at least 1")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds_field(raw: object, fld: str, key: GangKey | None) -> float | InvalidGang:
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


def volcano_podgroup_from_json(obj: Mapping[str, Any]) -> PodGroupRecord:
    """A Volcano ``PodGroup`` (``scheduling.volcano.sh/v1beta1``): ``spec.minMember`` and
    ``spec.minResources`` are what Lockstep uses; it has no timeout field."""
    return podgroup_from_json(obj, kind="PodGroup (scheduling.volcano.sh)")


def podgroup_from_json(obj: Mapping[str, Any], kind: str = "PodGroup") -> PodGroupRecord:
    meta = obj.get("metadata") or {}
    key = gang_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    spec = obj.get("spec") or {}
    min_member: int | None = None
    timeout: float | None = None
    error: InvalidGang | None = None
    mm = _int_field(spec.get("minMember", 1), f"{kind}.spec.minMember", key)
    if isinstance(mm, InvalidGang):
        error = mm
    else:
        min_member = mm
    if spec.get("scheduleTimeoutSeconds") is not None:
        t = _seconds_field(
            spec["scheduleTimeoutSeconds"], f"{kind}.spec.scheduleTimeoutSeconds", key
        )
        if isinstance(t, InvalidGang):
            error = error or t
        else:
            timeout = t
    try:
        min_resources = resource_list(spec.get("minResources"))
    except QuantityError as e:
        min_resources = {}
        error = error or InvalidGang(key, f"{kind}.spec.minResources", str(e.value), e.reason)
    status = obj.get("status")
    phase = str(status.get("phase") or "") if isinstance(status, Mapping) else ""
    raw_ann = meta.get("annotations")
    annotations = ({str(k): str(v) for k, v in raw_ann.items() if str(k) in _KOORD_OPTIONS}
                   if isinstance(raw_ann, Mapping) else {})
    return PodGroupRecord(key, min_member, timeout, min_resources, error, phase, annotations)


def _lookup(pod: PodRecord, name: str) -> str | None:
    return pod.annotations.get(name) or pod.labels.get(name)


def _declarations(pod: PodRecord) -> list[tuple[Source, str, str]]:
    """(convention, key, gang name) for every key by which the pod names a gang."""
    found: list[tuple[Source, str, str]] = []
    for conv in REGISTRY:
        for key in conv.declares:
            if key.on == "either":
                value = _lookup(pod, key.name)
            else:
                value = (pod.annotations if key.on == "annotation" else pod.labels).get(key.name)
            if value:
                found.append((conv.source, key.name, value))
    return found


def _cap(
    key: GangKey, seconds: float, defaults: GangDefaults
) -> tuple[float, float | None]:
    if seconds > defaults.max_timeout_seconds:
        return defaults.max_timeout_seconds, seconds
    return seconds, None


def resolve(
    pod: PodRecord,
    podgroups: Mapping[GangKey, PodGroupRecord],
    defaults: GangDefaults,
    volcano: Mapping[GangKey, PodGroupRecord] | None = None,
) -> Membership:
    """The pod's gang, or why its declaration is unusable; None when it is in no gang."""
    decls = _declarations(pod)
    if not decls:
        return None
    names = {v for _, _, v in decls}
    if len(names) > 1:
        listed = ", ".join(f"{f}={v}" for _, f, v in decls)
        return InvalidGang(None, "metadata", listed, "conflicting gang declarations")
    source, fld, name = decls[0]
    key = gang_key(pod.namespace, name)
    sources = {s for s, _, _ in decls}

    min_member: int | None = None
    timeout: float | None = None
    min_resources: Resources = {}
    pg = podgroups.get(key)
    if Source.SCHEDULER_PLUGINS in sources:
        if pg is None:
            return MissingPodGroup(key)
        if pg.error is not None:
            return pg.error
        min_member, timeout, min_resources = pg.min_member, pg.timeout_seconds, pg.min_resources
        source = Source.SCHEDULER_PLUGINS

    if Source.VOLCANO in sources and _lookup(pod, VOLCANO_MIN) is None:
        # What Volcano's job controller (and Kubeflow's in volcano mode) writes: only the
        # group name on the pod; the size lives on Volcano's own PodGroup object.
        vpg = (volcano or {}).get(key)
        if vpg is None:
            return MissingPodGroup(key, VOLCANO_API)
        if vpg.error is not None:
            return vpg.error
        if min_member is not None and vpg.min_member != min_member:
            return InvalidGang(key, "PodGroup (scheduling.volcano.sh).spec.minMember",
                               str(vpg.min_member),
                               f"conflicts with min-member {min_member} declared elsewhere")
        min_member = vpg.min_member
        min_resources = min_resources or vpg.min_resources

    for src, ann_min, ann_timeout in (
        (c.source, size.name, timeout.name if timeout is not None else None)
        for c in REGISTRY for size, timeout in c.size
    ):
        if src not in sources:
            continue
        raw_min = _lookup(pod, ann_min)
        if raw_min is not None:
            mm = _int_field(raw_min, ann_min, key)
            if isinstance(mm, InvalidGang):
                return mm
            if min_member is not None and mm != min_member:
                return InvalidGang(
                    key, ann_min, raw_min,
                    f"conflicts with min-member {min_member} declared elsewhere",
                )
            min_member = mm
        if ann_timeout is not None and (raw_t := _lookup(pod, ann_timeout)) is not None:
            t = _seconds_field(raw_t, ann_timeout, key)
            if isinstance(t, InvalidGang):
                return t
            timeout = t

    if min_member is None:
        want = next(c.size_key for c in REGISTRY if c.source is source)
        return InvalidGang(key, want, "", f"missing: {fld}={name} needs {want}")

    asked = timeout if timeout is not None else defaults.timeout_seconds
    seconds, capped = _cap(key, asked, defaults)
    spec = GangSpec(key, min_member, seconds, source, min_resources, capped)
    if Source.KOORDINATOR in sources or (pg is not None and pg.annotations):
        # Koordinator reads these from the pod, or from its PodGroup (the CRD way).
        merged = {**(pg.annotations if pg is not None else {}),
                  **{k: v for k in _KOORD_OPTIONS if (v := pod.annotations.get(k)) is not None}}
        return _koordinator(spec, merged)
    return spec


_KOORD_OPTIONS = conv_koord.OPTIONS


def _koordinator(spec: GangSpec, values: Mapping[str, str]) -> GangSpec | InvalidGang:
    """Koordinator's optional keys on top of a resolved gang (see the module docstring)."""
    key = spec.key
    total: int | None = None
    if (raw := values.get(KOORD_TOTAL)) is not None:
        t = _int_field(raw, KOORD_TOTAL, key)
        if isinstance(t, InvalidGang):
            return t
        if t < spec.min_member:
            return InvalidGang(key, KOORD_TOTAL, raw,
                               f"fewer than min-available {spec.min_member}")
        total = t
    mode = Mode.STRICT
    if (raw := values.get(KOORD_MODE)) is not None:
        try:
            mode = Mode(raw.strip())
        except ValueError:
            return InvalidGang(key, KOORD_MODE, raw, "must be Strict or NonStrict")
    policy = MatchPolicy.ONCE_SATISFIED
    fld = KOORD_MATCH if KOORD_MATCH in values else KOORD_MATCH_ALIAS
    if (raw := values.get(fld)) is not None:
        try:
            policy = MatchPolicy(raw.strip())
        except ValueError:
            known = ", ".join(p.value for p in MatchPolicy)
            return InvalidGang(key, fld, raw, f"must be one of {known}")
    group: tuple[GangKey, ...] = ()
    if (raw := values.get(KOORD_GROUPS)) is not None and raw.strip():
        parsed = _group_list(raw, key)
        if isinstance(parsed, InvalidGang):
            return parsed
        group = parsed
    if len(group) < 2:
        return replace(spec, total=total, mode=mode, match_policy=policy)
    return replace(spec, key=group_key(group), total=total, mode=mode, match_policy=policy,
                    part=key, group=group)


def _group_list(raw: str, own: GangKey) -> tuple[GangKey, ...] | InvalidGang:
    try:
        items = json.loads(raw)
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return InvalidGang(own, KOORD_GROUPS, raw,
                           'not a JSON list of "namespace/name" strings')
    for item in items:
        ns, _, name = item.partition("/")
        if not ns or not name or "/" in name:
            return InvalidGang(own, KOORD_GROUPS, raw, f'"{item}" is not "namespace/name"')
    gangs = tuple(sorted({GangKey(i) for i in items}))
    if own not in gangs:
        return InvalidGang(own, KOORD_GROUPS, raw, f"does not list this gang ({own})")
    return gangs

