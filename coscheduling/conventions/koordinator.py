"""Koordinator: gang annotations on the pod (or the same keys on a scheduler-plugins
``PodGroup``, the CRD way), and the retired lightweight-coscheduling labels it still honours.

Its options (``total-number``, ``mode``, ``groups``, ``match-policy``) are read from the pod,
or from the scheduler-plugins PodGroup's annotations when the gang is declared the CRD way, as
Koordinator does; the pod's value wins. ``groups`` bundles gangs into a gang group: the pod's
gang key becomes the group's (:func:`group_key`) and ``GangSpec.part`` keeps the gang it came
from, so the core can require every gang's own minimum at once.

Koordinator itself falls back to its defaults on a bad ``mode``, ``match-policy`` or
``total-number``; Lockstep says which field is wrong instead, because a silent fallback is how
a gang ends up scheduled under rules its author did not write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from ..podgroup import (
    MAX_NAME_CHARS,
    GangKey,
    GangSpec,
    InvalidGang,
    MatchPolicy,
    Mode,
    Source,
    int_field,
    shown,
)
from ..records import PodRecord
from .base import Convention, Key, Objects

__all__ = [
    "CONVENTION",
    "GROUP",
    "GROUPS",
    "LIGHT_GROUP",
    "LIGHT_MIN",
    "MATCH",
    "MATCH_ALIAS",
    "MAX_GROUP_GANGS",
    "MIN",
    "MODE",
    "OPTIONS",
    "TOTAL",
    "WAIT",
    "group_key",
]

GROUP = "gang.scheduling.koordinator.sh/name"
MIN = "gang.scheduling.koordinator.sh/min-available"
WAIT = "gang.scheduling.koordinator.sh/waiting-time"
TOTAL = "gang.scheduling.koordinator.sh/total-number"
MODE = "gang.scheduling.koordinator.sh/mode"
GROUPS = "gang.scheduling.koordinator.sh/groups"
MATCH = "gang.scheduling.koordinator.sh/match-policy"
MATCH_ALIAS = "pod-group.scheduling.sigs.k8s.io/match-policy"
LIGHT_GROUP = "pod-group.scheduling.sigs.k8s.io/name"
"""The retired lightweight-coscheduling labels; Koordinator still honours them."""
LIGHT_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
MAX_GROUP_GANGS = 32
"""The most gangs a gang group may bundle (Lockstep's limit; Koordinator sets none)."""
MAX_GROUP_CHARS = MAX_GROUP_GANGS * (2 * MAX_NAME_CHARS + 4)
"""The longest ``groups`` value read: that many quoted ``namespace/name`` items."""
OPTIONS = (TOTAL, MODE, GROUPS, MATCH, MATCH_ALIAS)
"""Read from the pod, or from its scheduler-plugins PodGroup's annotations."""


def group_key(gangs: tuple[GangKey, ...]) -> GangKey:
    """One key for a Koordinator gang group, whichever member resolves it: its gangs may
    live in several namespaces, so it is filed under the first one's."""
    return GangKey(f"{gangs[0].split('/', 1)[0]}/gang-group[{','.join(gangs)}]")


def _refine(spec: GangSpec, pod: PodRecord, sources: frozenset[Source], objects: Objects
            ) -> GangSpec | InvalidGang:
    """The options, for a gang Koordinator declares or whose scheduler-plugins PodGroup
    carries them (the CRD way); the pod's own values win."""
    pg = objects.get(Source.SCHEDULER_PLUGINS, {}).get(spec.key)
    if Source.KOORDINATOR not in sources and (pg is None or not pg.annotations):
        return spec
    merged = {**(pg.annotations if pg is not None else {}),
              **{k: v for k in OPTIONS if (v := pod.annotations.get(k)) is not None}}
    return _options(spec, merged)


def _options(spec: GangSpec, values: Mapping[str, str]) -> GangSpec | InvalidGang:
    key = spec.key
    total: int | None = None
    if (raw := values.get(TOTAL)) is not None:
        t = int_field(raw, TOTAL, key)
        if isinstance(t, InvalidGang):
            return t
        if t < spec.min_member:
            return InvalidGang(key, TOTAL, shown(raw),
                               f"fewer than min-available {spec.min_member}")
        total = t
    mode = Mode.STRICT
    if (raw := values.get(MODE)) is not None:
        try:
            mode = Mode(raw.strip())
        except ValueError:
            return InvalidGang(key, MODE, shown(raw), "must be Strict or NonStrict")
    policy = MatchPolicy.ONCE_SATISFIED
    fld = MATCH if MATCH in values else MATCH_ALIAS
    if (raw := values.get(fld)) is not None:
        try:
            policy = MatchPolicy(raw.strip())
        except ValueError:
            known = ", ".join(p.value for p in MatchPolicy)
            return InvalidGang(key, fld, shown(raw), f"must be one of {known}")
    group: tuple[GangKey, ...] = ()
    if (raw := values.get(GROUPS)) is not None and raw.strip():
        parsed = _group_list(raw, key)
        if isinstance(parsed, InvalidGang):
            return parsed
        group = parsed
    if len(group) < 2:
        return replace(spec, total=total, mode=mode, match_policy=policy)
    return replace(spec, key=group_key(group), total=total, mode=mode, match_policy=policy,
                   part=key, group=group)


def _group_list(raw: str, own: GangKey) -> tuple[GangKey, ...] | InvalidGang:
    """The gangs of a gang group, at most :data:`MAX_GROUP_GANGS`, each named within an
    object name's length: the text is bounded before it is parsed, and a nesting too deep
    for the parser is a bad value like any other."""
    if len(raw) > MAX_GROUP_CHARS:
        return InvalidGang(own, GROUPS, shown(raw), f"is {len(raw)} characters long, above "
                           f"the limit of {MAX_GROUP_CHARS}")
    try:
        items = json.loads(raw)
    except (ValueError, RecursionError):
        items = None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return InvalidGang(own, GROUPS, shown(raw),
                           'not a JSON list of "namespace/name" strings')
    if len(items) > MAX_GROUP_GANGS:
        return InvalidGang(own, GROUPS, shown(raw), f"lists {len(items)} gangs, above the "
                           f"limit of {MAX_GROUP_GANGS}")
    for item in items:
        ns, _, name = item.partition("/")
        if not ns or not name or "/" in name or len(name) > MAX_NAME_CHARS \
                or len(ns) > MAX_NAME_CHARS:
            return InvalidGang(own, GROUPS, shown(raw),
                               f'"{shown(item)}" is not "namespace/name"')
    gangs = tuple(sorted({GangKey(i) for i in items}))
    if own not in gangs:
        return InvalidGang(own, GROUPS, shown(raw), f"does not list this gang ({own})")
    return gangs


CONVENTION = Convention(
    Source.KOORDINATOR,
    declares=(Key(GROUP, "annotation"), Key(LIGHT_GROUP, "label")),
    size=((Key(MIN, "either"), Key(WAIT, "either")), (Key(LIGHT_MIN, "either"), None)),
    refine=_refine,
)
