"""A group of groups placed: each subgroup packed into its own tightest domain, the whole set
inside one domain of the group's level when it names one.

The planner (``planner.plan_gang``) places one gang; here it is run once per subgroup, each
on the capacity the subgroups before it left (:class:`_Taken`), at the subgroup's own
required level (its ``topology``) or, without one, tightest first as for any gang. An
exclusive subgroup is planned only on domains of its level where no other pod is (no bound
pod, no slot of another gang: ``occupied``) and none of the set's other subgroups; once
placed, its domains are closed to the subgroups after it. With a level for the whole set,
the set's domains are tried tightest first (by free GPUs, as the planner ranks them) and the
first that holds every subgroup wins.

A flat gang never comes here (admission calls it only for a spec with ``subgroups``): its
planning costs what it did. The work for a group is the planner's per subgroup, per set
domain tried; an exclusive subgroup adds one pass over its level's domains.

Not done here: DRA claims (a group whose members have claims is planned as one gang by
admission), and keeping later gangs out of an exclusive subgroup's domain (exclusivity is
checked when the subgroup is placed; docs/design.md says so).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..devices.room import DeviceRoom
from ..podgroup import Subgroup
from ..records import NodeName, NodeRecord, PodKey
from ..resources import Resources, add, sub
from ..topology.domains import GPU, Level, domain_of
from .member import Member
from .planner import CapacityView, NoFit, Plan, plan_gang

__all__ = ["Part", "plan_subgroups"]


@dataclass(frozen=True, slots=True)
class Part:
    """One subgroup to place: its declaration, its level (resolved by the caller), and the
    members to plan (``fixed`` members of it hold their node already)."""

    subgroup: Subgroup
    level: Level | None
    members: Sequence[Member]


class _Taken:
    """``base`` with the requests of the subgroups placed so far taken."""

    def __init__(self, base: CapacityView, levels: Sequence[Level]) -> None:
        self._base = base
        self._levels = levels
        self.taken: dict[NodeName, Resources] = {}
        self._gpus: dict[NodeName, list[int]] = {}

    def take(self, node: NodeName, requests: Resources) -> None:
        self.taken[node] = add(self.taken.get(node, {}), requests)
        if g := requests.get(GPU, 0):
            self._gpus.setdefault(node, []).append(g)

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return self._base.nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        t = self.taken.get(node)
        base = self._base.free_for_gang(node)
        return sub(base, t) if t else base

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        more = self._gpus.get(node)
        base = self._base.gpu_pods_on(node)
        return [*base, *more] if more else base

    def free_gpus(self, node: NodeName) -> int:
        return self._base.free_gpus(node) - self.taken.get(node, {}).get(GPU, 0)

    def device_room(self) -> DeviceRoom | None:
        return self._base.device_room()

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self._base.domains(index)

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        base = self._base.domains_by_free_gpus(index)
        delta: dict[tuple[str, ...], int] = {}
        for n, t in self.taken.items():
            rec = self._base.nodes.get(n)
            if (g := t.get(GPU, 0)) and rec is not None \
                    and (d := domain_of(self._levels, index, rec)) is not None:
                delta[d] = delta.get(d, 0) - g
        return sorted((f + delta.get(d, 0), d) for f, d in base) if delta else base


def plan_subgroups(parts: Sequence[Part], view: CapacityView, levels: Sequence[Level], *,
                   required: Level | None = None,
                   fixed: Mapping[PodKey, NodeName] | None = None,
                   occupied: Callable[[NodeName], bool] = lambda _: False) -> Plan | NoFit:
    """Place every part, each whole in its own tightest domain (or say why not): the
    first subgroup that does not fit is the answer's NoFit. ``required``: the level one
    domain of which must hold the whole set; ``fixed``: members holding their node already
    (their parts are planned beside them); ``occupied``: whether a node holds a pod or a
    slot outside this group (exclusive subgroups avoid those domains)."""
    fixed = dict(fixed or {})
    # Exclusive subgroups first (they need clean domains), then the largest.
    order = sorted(parts, key=lambda p: (not p.subgroup.exclusive, -len(p.members),
                                         p.subgroup.key))
    if required is None:
        return _place(order, view, levels, None, fixed, occupied)
    index = levels.index(required)
    domains = view.domains(index)
    if fixed:
        at = {domain_of(levels, index, view.nodes[n]) for n in fixed.values()
              if n in view.nodes}
        domains = {d: ns for d, ns in domains.items() if d in at}
    need = sum(m.pod.requests.get(GPU, 0) for p in parts for m in p.members
               if m.key not in fixed)
    ranked = view.domains_by_free_gpus(index)
    first: NoFit | None = None
    for _, d in ranked[bisect_left(ranked, (need,)):]:
        ns = domains.get(d)
        if ns is None:
            continue
        got = _place(order, view, levels, frozenset(ns), fixed, occupied)
        if isinstance(got, Plan):
            return Plan(got.assignments, required.name, d)
        first = first or got
    if first is not None:
        return first
    # No domain of the level has the GPUs: the planner's own explanation, of the whole set.
    return plan_gang([m for p in parts for m in p.members], view, levels,
                     required=required, fixed=fixed)


def _place(order: Sequence[Part], view: CapacityView, levels: Sequence[Level],
           allowed: frozenset[NodeName] | None, fixed: Mapping[PodKey, NodeName],
           occupied: Callable[[NodeName], bool]) -> Plan | NoFit:
    """Every part in ``order``, each on what the ones before it left, within ``allowed``."""
    taken = _Taken(view, levels)
    used = set(fixed.values())
    closed: set[NodeName] = set()
    out: dict[PodKey, NodeName] = {}
    for part in order:
        s = part.subgroup
        own = {m.key: fixed[m.key] for m in part.members if m.key in fixed}
        cands = allowed
        if s.exclusive:
            cands = _clean(view, levels, part.level, cands, used, occupied, set(own.values()))
        if closed:
            cands = (cands if cands is not None else frozenset(view.nodes)) - closed
        members = [m if cands is None else
                   Member(m.pod, cands if m.candidates is None else m.candidates & cands)
                   for m in part.members]
        got = plan_gang(members, taken, levels, required=part.level, fixed=own)
        if isinstance(got, NoFit):
            return got
        requests = {m.key: m.pod.requests for m in part.members}
        for k, n in got.assignments.items():
            out[k] = n
            used.add(n)
            if k not in own:
                taken.take(n, requests[k])
        if s.exclusive:
            closed |= _domains_of(view, levels, part.level, set(got.assignments.values()))
    return Plan(out, None)


def _clean(view: CapacityView, levels: Sequence[Level], level: Level | None,
           allowed: frozenset[NodeName] | None, used: set[NodeName],
           occupied: Callable[[NodeName], bool], own: set[NodeName]) -> frozenset[NodeName]:
    """The nodes of ``allowed`` (every node when None) in domains of ``level`` (single nodes
    without one) where nothing else is: no node of the domain ``occupied`` or ``used`` by
    another subgroup of the set (the subgroup's own fixed nodes aside)."""
    pool = allowed if allowed is not None else frozenset(view.nodes)
    if level is None:
        return frozenset(n for n in pool if n in own or not (n in used or occupied(n)))
    out: set[NodeName] = set()
    for ns in view.domains(levels.index(level)).values():
        if any(n in pool for n in ns) and not any(
                n not in own and (n in used or occupied(n)) for n in ns):
            out.update(n for n in ns if n in pool)
    return frozenset(out)


def _domains_of(view: CapacityView, levels: Sequence[Level], level: Level | None,
                nodes: set[NodeName]) -> set[NodeName]:
    """Every node in the domains of ``level`` that hold ``nodes`` (the nodes themselves
    without a level)."""
    if level is None:
        return set(nodes)
    index = levels.index(level)
    doms = {domain_of(levels, index, view.nodes[n]) for n in nodes if n in view.nodes}
    return {n for d, ns in view.domains(index).items() if d in doms for n in ns}
