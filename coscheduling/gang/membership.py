"""Which gang a pod is in, and whether a gang has enough members: its quorum.

A pod's membership is resolved from every convention it may declare (``conventions.resolve``
for the annotation and CRD conventions, combined with ``conventions.upstream`` for Kubernetes'
own gang API); a gang's spec is
its members' (a Koordinator gang group sums each gang's own minimum). The quorum rules here
are the ones admission, binding and release all count by.

A group of groups (``GangSpec.subgroups``, composed by :func:`refresh_spec`) counts whole
subgroups: one short of its own minimum counts for nothing, and the quorum is ``min_parts``
whole subgroups (all of them when None) of the current stage (:func:`required`). A flat
gang never reaches that code: every function tests ``spec.parts`` first, as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..conventions import resolve
from ..conventions.upstream import combine, resolve_upstream
from ..corestate import CoreState
from ..podgroup import MAX_PARTS, GangKey, GangSpec, MatchPolicy, Membership, Subgroup
from ..records import PodKey, PodRecord
from ..state.gang import Gang

__all__ = [
    "bound_count",
    "countable",
    "declares_alike",
    "departed",
    "meets_quorum",
    "part_of",
    "pick",
    "refresh_spec",
    "required",
    "resolve_pod",
    "subgroup_short",
    "whole_members",
]


def resolve_pod(st: CoreState, pod: PodRecord) -> Membership:
    """The gang ``pod`` declares (None: not a gang member, or not Lockstep's pod)."""
    if pod.scheduler_name not in st.settings.scheduler_names:
        return None
    store, settings = st.store, st.settings
    m = resolve(pod, store.groups, settings.defaults)
    if pod.scheduling_group is None and pod.workload_ref is None:
        return m
    return combine(m, resolve_upstream(pod, store.upstream, store.workloads,
                                       settings.defaults, settings.levels,
                                       store.composites, store.children))


def declares_alike(old: PodRecord, new: PodRecord) -> bool:
    """Whether :func:`resolve_pod` must answer the same for ``new`` as for ``old`` against
    the same objects: equal in every field of the pod it reads (the conventions read a
    pod's labels and annotations, its scheduler, and Kubernetes' own gang API its
    ``schedulingGroup`` and ``workloadRef``, all in its namespace). A convention that comes
    to read another field must be added here
    (``tests/unit/coscheduling/events/test_status_events.py`` checks the watch's way
    against resolving every event)."""
    return (old.scheduler_name == new.scheduler_name and old.namespace == new.namespace
            and old.scheduling_group == new.scheduling_group
            and old.workload_ref == new.workload_ref
            and old.labels == new.labels and old.annotations == new.annotations)


def refresh_spec(st: CoreState, g: Gang) -> None:
    """The gang's declaration: its first member's by name, among the members the API server
    holds before any pinned at creation whose pod has not landed (no UID yet). A pin's pod
    may never land, and a core rebuilt from the API server would take the declaration
    from the members that exist."""
    def created_first(k: PodKey) -> tuple[bool, PodKey]:
        pod = st.store.pods.get(k)
        return (pod is None or not pod.uid, k)

    specs = [m for k in sorted(g.members, key=created_first)
             if isinstance(m := st.membership.get(k), GangSpec)]
    if not specs or (not specs[0].group and specs[0].part is None):
        g.spec = specs[0] if specs else None
        return
    # A group of groups (a Koordinator gang group, a CompositePodGroup, ...): every
    # subgroup keeps its own minimum, and one none of whose members exist yet needs at
    # least one (so the group waits for it).
    own: dict[GangKey, GangSpec] = {}
    for m in specs:
        if m.part is not None:
            own.setdefault(m.part, m)
    declared = dict(specs[0].part_stages)
    # An open group (Volcano's subgroups) is the subgroups its members show, at most
    # MAX_PARTS of them (members of any further one are in no subgroup: never planned).
    group = specs[0].group or tuple(sorted(own))[:MAX_PARTS]
    subs = tuple(Subgroup(p, o.min_member, o.part_topology, o.part_exclusive, o.stage)
                 if (o := own.get(p)) is not None else Subgroup(p, 1, stage=declared.get(p, 0))
                 for p in group)
    first = min(s.stage for s in subs)
    mins = sorted(s.min_member for s in subs if s.stage == first)
    need = len(mins) if specs[0].min_parts is None else specs[0].min_parts
    # For reasons and views: the fewest members a quorum of the first stage may be (a
    # subgroup not known yet counts as one).
    g.spec = replace(specs[0], min_member=sum(mins[:need]) + max(0, need - len(mins)),
                     parts=tuple((s.key, s.min_member) for s in subs), subgroups=subs,
                     part=None, timeout_seconds=min(m.timeout_seconds for m in specs))


def _finished(st: CoreState, spec: GangSpec) -> set[GangKey]:
    """The subgroups of a staged group that are done: as many Succeeded members as their
    minimum, or none of their members left while a later stage has some (a Job's pods
    deleted once it completed; a later stage exists only once the earlier finished)."""
    g = st.gangs.get(spec.key)
    succeeded: Counter[GangKey | None] = Counter()
    present: set[GangKey | None] = set()
    for k in g.members if g is not None else ():
        p = st.store.pods.get(k)
        if p is None:
            continue
        part = part_of(st, k)
        present.add(part)
        if p.phase == "Succeeded":
            succeeded[part] += 1
    latest = max((s.stage for s in spec.subgroups if s.key in present), default=-1)
    return {s.key for s in spec.subgroups if succeeded[s.key] >= s.min_member
            or (s.key not in present and s.stage < latest)}


def required(st: CoreState, spec: GangSpec) -> tuple[tuple[Subgroup, ...], int]:
    """The subgroups the quorum counts now, and how many of them must be whole: the
    lowest stage with a subgroup not finished (every subgroup when there are no stages),
    ``min_parts`` of them (all when None). No subgroup left: nothing is required."""
    subs = spec.subgroups
    if any(s.stage for s in subs):
        done = _finished(st, spec)
        stage = min((s.stage for s in subs if s.key not in done), default=None)
        subs = tuple(s for s in subs if s.stage == stage)
        # A stage is whole in itself: min_parts never asks for more than it holds.
        return subs, len(subs) if spec.min_parts is None else min(spec.min_parts, len(subs))
    # Without stages, more than the subgroups known yet means waiting for the others (a
    # CompositePodGroup's children PodGroups come one by one).
    return subs, len(subs) if spec.min_parts is None else spec.min_parts


def whole_members(st: CoreState, spec: GangSpec, have: Sequence[PodKey],
                  todo: Sequence[PodKey]) -> list[PodKey]:
    """Those of ``todo`` (in order) in a subgroup that is whole with ``have`` and them, of
    the current stage or a later one: the members a plan may hold. A member of a subgroup
    short of its minimum is never planned (it would bind a part of its subgroup)."""
    subs, _ = required(st, spec)
    stage = min((s.stage for s in subs), default=0)
    mins = {s.key: s.min_member for s in spec.subgroups if s.stage >= stage}
    count = Counter(part_of(st, k) for k in (*have, *todo))
    return [k for k in todo if (p := part_of(st, k)) is not None and p in mins
            and count[p] >= mins[p]]


def subgroup_short(st: CoreState, spec: GangSpec, key: PodKey, keys: Iterable[PodKey]
                   ) -> tuple[GangKey, int, int] | None:
    """``key``'s subgroup, its members among ``keys`` and its minimum, when fewer; None
    when it is whole (or ``key`` is in no subgroup of ``spec``)."""
    part = part_of(st, key)
    sub = next((s for s in spec.subgroups if s.key == part), None)
    if part is None or sub is None:
        return None
    have = sum(1 for k in keys if part_of(st, k) == part)
    return (part, have, sub.min_member) if have < sub.min_member else None


def part_of(st: CoreState, key: PodKey) -> GangKey | None:
    m = st.membership.get(key)
    return m.part if isinstance(m, GangSpec) else None


def meets_quorum(st: CoreState, spec: GangSpec, keys: Iterable[PodKey]) -> bool:
    """Whether ``keys`` are enough members: minMember of them, or for a group of groups
    ``min_parts`` whole subgroups of the current stage (each at its own minimum)."""
    if not spec.parts:
        return sum(1 for _ in keys) >= spec.min_member
    have = Counter(part_of(st, k) for k in keys)
    if not spec.subgroups:
        return all(have[p] >= n for p, n in spec.parts)
    subs, need = required(st, spec)
    return sum(1 for s in subs if have[s.key] >= s.min_member) >= need


def pick(st: CoreState, spec: GangSpec, have: Sequence[PodKey], todo: Sequence[PodKey]
         ) -> list[PodKey] | None:
    """The fewest of ``todo`` (in order) that complete a quorum with ``have``: for a group
    of groups, whole subgroups only, those closest to whole first."""
    if not spec.parts:
        need = max(0, spec.min_member - len(have))
        return list(todo[:need]) if len(todo) >= need else None
    count = Counter(part_of(st, k) for k in have)
    if spec.subgroups:
        subs, need = required(st, spec)
        whole = sum(1 for s in subs if count[s.key] >= s.min_member)
        offered = Counter(part_of(st, k) for k in todo)
        fillable = sorted((s.min_member - count[s.key], s.key) for s in subs
                          if count[s.key] < s.min_member
                          and count[s.key] + offered[s.key] >= s.min_member)
        if whole + len(fillable) < need:
            return None
        short = dict((p, n) for n, p in fillable[:max(0, need - whole)])
    else:
        short = {p: max(0, n - count[p]) for p, n in spec.parts}
    out = []
    for k in todo:
        p = part_of(st, k)
        if p is not None and short.get(p, 0) > 0:
            out.append(k)
            short[p] -= 1
    return None if any(short.values()) else out


def countable(spec: GangSpec, live: Sequence[PodRecord]) -> list[PodKey]:
    """Members that count toward the quorum: Koordinator's ``only-waiting`` leaves out the
    bound ones."""
    if spec.match_policy is MatchPolicy.ONLY_WAITING:
        return [p.key for p in live if p.node_name is None]
    return [p.key for p in live]


def bound_count(st: CoreState, g: Gang) -> int:
    return sum(1 for p in st.live(g) if p.node_name is not None)


def departed(g: Gang, live: list[PodRecord]) -> tuple[str, ...]:
    """Up to five members that left, for the reason a person reads."""
    alive = {p.key for p in live}
    return tuple(sorted(k for k in g.members if k not in alive))[:5]
