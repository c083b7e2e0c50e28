"""Which gang a pod is in, and whether a gang has enough members: its quorum.

A pod's membership is resolved from every convention it may declare (``conventions.resolve``
for the annotation and CRD conventions, combined with ``conventions.upstream`` for Kubernetes'
own gang API); a gang's spec is
its members' (a Koordinator gang group sums each gang's own minimum). The quorum rules here
are the ones admission, binding and release all count by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..conventions import resolve
from ..conventions.upstream import combine, resolve_upstream
from ..corestate import CoreState
from ..podgroup import GangKey, GangSpec, MatchPolicy, Membership
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
    "resolve_pod",
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
                                       settings.defaults, settings.levels))


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
    if not specs or not specs[0].group:
        g.spec = specs[0] if specs else None
        return
    # A Koordinator gang group: every gang keeps its own minimum, and a gang none of
    # whose members exist yet needs at least one (so the group waits for it).
    mins: dict[GangKey, int] = {}
    for m in specs:
        if m.part is not None:
            mins.setdefault(m.part, m.min_member)
    parts = tuple((p, mins.get(p, 1)) for p in specs[0].group)
    g.spec = replace(specs[0], min_member=sum(n for _, n in parts), parts=parts,
                     part=None, timeout_seconds=min(m.timeout_seconds for m in specs))


def part_of(st: CoreState, key: PodKey) -> GangKey | None:
    m = st.membership.get(key)
    return m.part if isinstance(m, GangSpec) else None


def meets_quorum(st: CoreState, spec: GangSpec, keys: Iterable[PodKey]) -> bool:
    """Whether ``keys`` are enough members: minMember of them, or for a gang group each
    gang's own minimum."""
    if not spec.parts:
        return sum(1 for _ in keys) >= spec.min_member
    have = Counter(part_of(st, k) for k in keys)
    return all(have[p] >= n for p, n in spec.parts)


def pick(st: CoreState, spec: GangSpec, have: Sequence[PodKey], todo: Sequence[PodKey]
         ) -> list[PodKey] | None:
    """The fewest of ``todo`` (in order) that complete a quorum with ``have``."""
    if not spec.parts:
        need = max(0, spec.min_member - len(have))
        return list(todo[:need]) if len(todo) >= need else None
    count = Counter(part_of(st, k) for k in have)
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
