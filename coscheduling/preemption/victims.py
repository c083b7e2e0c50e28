"""Gang-aware preemption: which bound pods to evict so a waiting gang (or plain pod) fits.

A pure decision. The caller hands in a :class:`~coscheduling.placement.planner.CapacityView` (free
capacity outside every reservation, as the planner reads it), the preemptor and the bound
pods that could be victims; :func:`choose_victims` returns :class:`Victims` or a reason why
not. Nothing is evicted here, nothing is reserved, no clock is read.

The rules:

* Only a preemptor whose ``preemptionPolicy`` is ``PreemptLowerPriority`` preempts.
* A victim *unit* is a whole gang (every bound member, on every node) or one plain pod, and
  a unit is eligible only when every pod of it has a priority strictly below the
  preemptor's and sits under the same quota (Kueue LocalQueue, or none) as the preemptor.
  Equal priority is never a victim: that alone makes two gangs evicting each other
  impossible (each eviction goes strictly down in priority).
* The whole victim set is chosen first, and only if the whole gang fits once every victim's
  requests are returned; a gang that would not fit after evicting every eligible unit
  evicts nothing.
* The victims' capacity is checked with the planner itself (:func:`plan_gang` on a view
  with the victims' requests given back): there is one notion of "fits".

Which set, among the placements the gang may use:

1. Topology first, as the planner does: the tightest level (node, clique, rack, ...) at
   which some single domain can be made to hold the gang wins, never spreading wider than
   the gang's required level. Spread placement is the last resort of a gang without one.
2. Among the candidate sets at that level, the smallest :class:`Cost`, compared in order:
   pods whose PodDisruptionBudget would be violated, the highest victim priority, the number
   of victim units, their GPUs, then the set whose earliest start is latest (the least work
   lost). kube-scheduler's ``pickOneNodeForPreemption`` uses the same order for nodes, with
   the sum of priorities where this uses GPUs.

The search, and why it is bounded on a 5,000-node cluster. Choosing the cheapest set is a
knapsack problem; like kube-scheduler's ``SelectVictimsOnNode`` this does not search it:

* Per level, domains are screened by arithmetic only: a domain is a candidate when its free
  capacity plus what its eligible units would free covers the gang's total request. Each
  candidate gets an *estimate* (the cheapest units, cheapest first, until the sums cover the
  deficit), and only the :data:`DOMAINS_TRIED` best estimates are planned for real. That is
  O(candidate pods + nodes of touched domains) arithmetic per level, like kube-scheduler's
  ``minCandidateNodesAbsolute`` bound on dry runs.
* For a domain tried, every eligible unit touching it is evicted, the gang is planned (no
  plan: the domain is dropped), and then units are *reprieved* in order of value (PDB
  protected first, then higher priority, smaller, older) while the gang still plans: units
  with no pod on a planned node in one batch, then one at a time. That is kube-scheduler's
  "remove all lower-priority pods, then reprieve the most important first", with whole
  units in place of pods. A final pass tries to drop each remaining victim once more, until
  none can be: the planner is a heuristic and not monotone in free capacity, and this pass
  makes "no single victim unit can be spared" true by construction.
* Before any plan, a necessary condition is checked by arithmetic (:class:`_Bound`: slots
  of the smallest member's shape, per-node capacity summed): most reprieves of a unit on a
  node the plan needs are refuted in O(the unit's pods) without running the planner.
* Planner calls: one per domain screened in, plus at most one per unit touching it, plus
  the final pass (which re-tries only units refused before a later reprieve):
  O(DOMAINS_TRIED x units per domain) plans, each over one domain's nodes. Only a spread
  gang plans over the whole cluster, once per unit on the planned nodes. What-if capacity
  is :class:`~coscheduling.preemption.freed.FreedView`.

Bounded work per call: the search is a generator of pieces of work, each
announced with its cost (a plan: its nodes times the members; arithmetic:
:data:`BOOK_COST` per node or pod read). :class:`VictimSearch` runs it in slices of at most
:data:`SEARCH_BUDGET` units, returning :class:`Unfinished` in between, so the core can run
one slice per sweep and let the event loop answer verbs between two. Work is counted, not
timed: no clock is read, and the same inputs slice the same way. :func:`choose_victims` is
the same search with no budget. A piece is never cut (a slice runs at least one), so the
longest slice is the budget or the dearest piece: a plan over one domain, or the single
whole-cluster plan that tells a gang that fits nowhere why.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TypeVar

from ..placement.planner import CapacityView, Member, NoFit, Plan, plan_gang
from ..records import GangKey, NodeName
from ..resources import PODS, Resources, add, sub
from ..topology.domains import GPU, Level
from .freed import FreedView, Region
from .units import (
    AlreadyFits,
    Candidate,
    Cost,
    NoLowerPriority,
    NoPreemption,
    PolicyNever,
    PreemptionPolicy,
    Preemptor,
    SearchAgain,
    Victims,
    VictimUnit,
    WouldNotFit,
    pdb_violating,
)

__all__ = [
    "BOOK_COST",
    "DOMAINS_TRIED",
    "SEARCH_BUDGET",
    "Listing",
    "Steps",
    "Unfinished",
    "VictimSearch",
    "choose_victims",
    "victim_units",
]

_FreeFn = Callable[[NodeName], Resources]
T = TypeVar("T")

DOMAINS_TRIED = 16
"""Candidate domains planned for real per topology level, best estimates first."""

SEARCH_BUDGET = 20_000
"""Work one slice of a victim search may do (:class:`VictimSearch`), in units of one planner
look at one (node, member) pair: about 30 ms of CPU on the benchmark machine (measured
1.6 us per unit of planning, which is most of a search). A search that needs more goes on
at the next sweep. The filter call that runs a slice also plans its gang over the whole
cluster first, and a shared machine stretches both: at 40,000 the loop was held past
0.2 s under load."""

BOOK_COST = 4
"""Units charged per node or candidate pod read by the search's own arithmetic (screening
domains, the bound): a few planner-units' time each."""

SCREEN_GRAIN = 4_000
"""Units of screening work between two points where a slice may stop."""




# ---------------------------------------------------------------------------- units


def victim_units(preemptor: Preemptor, candidates: Iterable[Candidate]
                 ) -> tuple[list[VictimUnit], int | None, int]:
    """Eligible units, the lowest priority seen, and how many candidates there were.

    A gang is eligible only when *every* bound member is strictly lower than the preemptor
    (and under its quota): one member of equal or higher priority protects the whole gang,
    as evicting the rest would leave it partial."""
    steps = _unit_steps(preemptor, list(candidates), None)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        got: tuple[list[VictimUnit], int | None, int] = done.value
        return got


UNIT_GRAIN = 1_000
"""Candidates (or units) read by one piece of :func:`_unit_steps`: tens of thousands of
bound pods are grouped into units in pieces the slice's budget can stop between."""


def _unit_steps(preemptor: Preemptor, candidates: Sequence[Candidate],
                nodes: Mapping[NodeName, object] | None
                ) -> Steps[tuple[list[VictimUnit], int | None, int]]:
    """:func:`victim_units` in pieces of at most :data:`UNIT_GRAIN` candidates or units,
    keeping only units with a pod on one of ``nodes`` (None: every unit)."""
    gangs: dict[GangKey, list[Candidate]] = {}
    plain: list[Candidate] = []
    lowest: int | None = None
    for i in range(0, len(candidates), UNIT_GRAIN):
        some = candidates[i:i + UNIT_GRAIN]
        yield len(some) * BOOK_COST
        for c in some:
            lowest = c.priority if lowest is None else min(lowest, c.priority)
            if c.gang is None:
                plain.append(c)
            elif c.gang != preemptor.gang:
                gangs.setdefault(c.gang, []).append(c)

    def ok(c: Candidate) -> bool:
        return c.priority < preemptor.priority and c.quota == preemptor.quota

    def kept(u: VictimUnit) -> bool:
        return nodes is None or any(p.node in nodes for p in u.pods)

    units: list[VictimUnit] = []
    for i in range(0, len(plain), UNIT_GRAIN):
        some = plain[i:i + UNIT_GRAIN]
        yield len(some) * BOOK_COST
        units += [u for c in some if ok(c) and kept(u := VictimUnit(str(c.key), None, (c,)))]
    groups = list(gangs.items())
    for i in range(0, len(groups), UNIT_GRAIN):
        batch = groups[i:i + UNIT_GRAIN]
        yield sum(len(ps) for _, ps in batch) * BOOK_COST
        units += [u for g, ps in batch if all(ok(p) for p in ps)
                  and kept(u := VictimUnit(str(g), g, tuple(sorted(ps, key=lambda p: p.key))))]
    yield len(units)  # one sort, in C
    units.sort(key=lambda u: u.key)
    return units, lowest, len(candidates)


def _pods(units: Iterable[VictimUnit]) -> list[Candidate]:
    return [p for u in units for p in u.pods]


def _total(members: Sequence[Member]) -> Resources:
    total: Resources = {}
    for m in members:
        total = add(total, m.pod.requests)
    return total


# ---------------------------------------------------------------------------- search


Steps = Generator[int, None, T]
"""A search that yields, before each piece of work, what that piece will cost (in
:data:`SEARCH_BUDGET` units), and returns its answer: the caller decides between two
pieces whether to go on now or later (:class:`VictimSearch`)."""

Listing = Steps[Sequence[Candidate]]
"""The candidates of a search, listed in pieces of work announced as the search's are
(``coscheduling.preemption.carry`` lists the bound pods so)."""


def _plan_cost(members: Sequence[Member], view: CapacityView) -> int:
    """A planner call costs about one unit per (node, member) it looks at."""
    return max(1, len(view.nodes) * len(members))


def _plan(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
          required: Level | None) -> Steps[Plan | None]:
    yield _plan_cost(members, view)
    got = plan_gang(members, view, levels, required=required)
    return got if isinstance(got, Plan) else None


def _nofit(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
           required: Level | None) -> Steps[Plan | NoFit]:
    yield _plan_cost(members, view)
    return plan_gang(members, view, levels, required=required)


class _Bound:
    """Necessary conditions for the gang to fit, by arithmetic only.

    Every member needs at least the component-wise smallest member request on its node, so
    the nodes must offer ``len(members)`` such slots, and the sums must cover the total.
    Failing either, the planner need not run: the reprieve of a unit on a node the plan
    needs is usually refuted here, in O(the victims' pods), instead of by a plan."""

    def __init__(self, members: Sequence[Member], nodes: Iterable[NodeName],
                 free: _FreeFn) -> None:
        shape: Resources | None = None
        for m in members:
            r = {k: v for k, v in m.pod.requests.items() if v > 0}
            shape = r if shape is None else {k: min(v, r.get(k, 0)) for k, v in shape.items()}
        self.shape = {k: v for k, v in (shape or {}).items() if v > 0}
        self.count = len(members)
        self.need = {k: v for k, v in _total(members).items() if v > 0}
        self.free: dict[NodeName, Resources] = {}
        self.slots = 0
        self.sums: Resources = {}
        for n in nodes:
            f = self.free[n] = free(n)
            self.slots += self._slots(f)
            for k in self.need:
                # Per node, never below zero: a node over-reserved (a preemptor's room
                # while its victims terminate) takes nothing from the others.
                self.sums[k] = self.sums.get(k, 0) + max(0, f.get(k, 0))

    def _slots(self, free: Mapping[str, int]) -> int:
        if not self.shape:
            return self.count
        return max(0, min(free.get(k, 0) // v for k, v in self.shape.items()))

    def state(self, victims: Sequence[VictimUnit]) -> _BoundState:
        """What ``victims`` give back inside the nodes counted, and the slots and sums."""
        back: dict[NodeName, Resources] = {}
        for u in victims:
            for p in u.pods:
                if p.node in self.free:
                    back[p.node] = add(back.get(p.node, {}), p.requests)
        sums = dict(self.sums)
        slots = self.slots
        for n, b in back.items():
            f = self.free[n]
            g = add(f, b)
            slots += self._slots(g) - self._slots(f)
            for k in self.need:
                sums[k] = sums.get(k, 0) + max(0, g.get(k, 0)) - max(0, f.get(k, 0))
        return _BoundState(back, slots, sums)

    def holds(self, st: _BoundState) -> bool:
        return st.slots >= self.count and all(
            st.sums.get(k, 0) >= v for k, v in self.need.items())

    def holds_without(self, st: _BoundState, unit: VictimUnit) -> bool:
        """:meth:`holds` for ``st``'s victims less ``unit``, in O(the unit's pods)."""
        less: dict[NodeName, Resources] = {}
        for p in unit.pods:
            if p.node in self.free:
                less[p.node] = add(less.get(p.node, {}), p.requests)
        slots = st.slots
        sums = dict(st.sums)
        for n, r in less.items():
            f = add(self.free[n], st.back.get(n, {}))
            g = sub(f, r)
            slots += self._slots(g) - self._slots(f)
            for k in self.need:
                sums[k] = sums.get(k, 0) + max(0, g.get(k, 0)) - max(0, f.get(k, 0))
        return slots >= self.count and all(sums.get(k, 0) >= v for k, v in self.need.items())


@dataclass(frozen=True, slots=True)
class _BoundState:
    back: dict[NodeName, Resources]
    slots: int
    sums: Resources


def _reprieve(members: Sequence[Member], base: CapacityView, levels: Sequence[Level],
              required: Level | None, units: Sequence[VictimUnit],
              region: Region | None, free: _FreeFn
              ) -> Steps[tuple[list[VictimUnit], Plan] | None]:
    """Evict all of ``units``, then keep back as many as the plan allows (see module doc)."""
    nodes = region.nodes if region is not None else base.nodes
    yield len(nodes) * BOOK_COST  # the arithmetic bound reads every node once
    bound = _Bound(members, nodes, free)

    def attempt(vs: Sequence[VictimUnit]) -> Steps[Plan | None]:
        if not bound.holds(bound.state(vs)):
            return None
        return (yield from _plan(members, FreedView(base, levels, _pods(vs), region), levels,
                                 required))

    def without(vs: list[VictimUnit], u: VictimUnit
                ) -> Steps[tuple[list[VictimUnit], Plan | None]]:
        trial = [v for v in vs if v is not u]
        if not bound.holds_without(cur, u):
            return trial, None
        return trial, (yield from _plan(members, FreedView(base, levels, _pods(trial), region),
                                        levels, required))

    violating = pdb_violating(_pods(units))

    def value(u: VictimUnit) -> tuple[int, int]:
        return u.reprieve_order(violating)[:2]

    # Grow the set a value class at a time (budget violations, then priority), cheapest
    # first, until the gang fits: dearer classes are never touched when cheaper ones
    # suffice, and the arithmetic bound refutes most sizes without a plan.
    classes = [list(g) for _, g in groupby(sorted(units, key=value), key=value)]
    victims: list[VictimUnit] = []
    plan: Plan | None = None
    for cls in reversed(classes):
        victims += cls
        plan = yield from attempt(victims)
        if plan is not None:
            break
    if plan is None:
        return None
    # Units with no pod on a node the plan uses are reprieved in batches (a plan per value
    # class, not one per unit), dearest class first, each against the latest plan.
    for _, group in groupby(sorted(victims, key=value), key=value):
        used = set(plan.assignments.values())
        idle = {id(u) for u in group if not any(p.node in used for p in u.pods)}
        if idle:
            rest = [u for u in victims if id(u) not in idle]
            p2 = yield from attempt(rest)
            if p2 is not None:
                victims, plan = rest, p2
    victims.sort(key=lambda u: u.reprieve_order(violating))
    cur = bound.state(victims)
    # One pass in reprieve order. A unit refused was refused against the victims of that
    # moment; only if a later unit was reprieved after it can the answer have changed (the
    # planner is not monotone), so the final pass re-tries only those.
    tried_at: dict[str, int] = {}
    changes = 0
    for u in list(victims):
        trial, p2 = yield from without(victims, u)
        if p2 is not None:
            victims, plan = trial, p2
            cur = bound.state(victims)
            changes += 1
        else:
            tried_at[u.key] = changes
    changed = True
    while changed:  # until no single victim can be spared
        changed = False
        for u in victims:
            if tried_at.get(u.key) == changes:
                continue
            trial, p2 = yield from without(victims, u)
            if p2 is not None:
                victims, plan, changed = trial, p2, True
                cur = bound.state(victims)
                changes += 1
                break
            tried_at[u.key] = changes
    return victims, plan


def _unit_cost(u: VictimUnit) -> Cost:
    """``Cost.of([u])``, read straight off a plain pod (most units are one)."""
    if len(u.pods) != 1:
        return Cost.of([u])
    p = u.pods[0]
    # Alone, a pod violates a budget exactly when one of its budgets allows no disruption.
    pdb = 1 if any(allowed < 1 for _, allowed in p.budgets) else 0
    return Cost(pdb, p.priority, 1, p.requests.get(GPU, 0), -p.started)


class _Ranks:
    """Each unit's own cost, the order :func:`_estimate` takes units in: computed when a
    domain's estimate first needs it, not for every unit up front."""

    def __init__(self) -> None:
        self._got: dict[str, tuple[Cost, str]] = {}

    def __call__(self, u: VictimUnit) -> tuple[Cost, str]:
        got = self._got.get(u.key)
        if got is None:
            got = self._got[u.key] = (_unit_cost(u), u.key)
        return got


def _estimate(units: Sequence[tuple[VictimUnit, Resources]], deficit: Mapping[str, int],
              rank: Callable[[VictimUnit], tuple[Cost, str]]) -> Cost | None:
    """Cheapest units first until their in-domain requests cover ``deficit`` (by sums)."""
    left = {k: v for k, v in deficit.items() if v > 0}
    taken: list[VictimUnit] = []
    for u, here in sorted(units, key=lambda t: rank(t[0])):
        if not left:
            break
        if not any(here.get(k, 0) > 0 for k in left):
            continue
        taken.append(u)
        for k in list(left):
            left[k] -= here.get(k, 0)
            if left[k] <= 0:
                del left[k]
    return None if left else Cost.of(taken)


def _victims(units: Sequence[VictimUnit], plan: Plan, level: Level | None = None,
             domain: tuple[str, ...] | None = None) -> Victims:
    units = sorted(units, key=lambda u: u.key)
    evict = tuple(sorted(_pods(units), key=lambda p: p.key))
    freed: dict[NodeName, Resources] = {}
    for p in evict:
        freed[p.node] = add(freed.get(p.node, {}), p.requests)
    return Victims(
        gangs=tuple(u.gang for u in units if u.gang is not None),
        pods=tuple(u.pods[0].key for u in units if u.gang is None),
        evict=evict,
        plan=plan,
        freed=freed,
        cost=Cost.of(units),
        level=level.name if level is not None else None,
        domain=domain,
        units=tuple(units),
    )


def choose_victims(
    preemptor: Preemptor,
    candidates: Iterable[Candidate],
    view: CapacityView,
    levels: Sequence[Level],
    *,
    domains_tried: int = DOMAINS_TRIED,
) -> Victims | NoPreemption:
    """The victim set that lets ``preemptor`` fit, or why there is none (see module doc),
    decided in one go, however long it takes: :class:`VictimSearch` is the same search in
    bounded slices.

    ``candidates`` are the bound pods (every bound member of each gang: a gang missing some
    here would be evicted only in part); pods already terminating should be left out, as
    their capacity is already on its way back."""
    got = VictimSearch(preemptor, candidates, view, levels, domains_tried=domains_tried
                       ).advance(None)
    assert not isinstance(got, Unfinished), "no budget: the search always finishes"
    return got


@dataclass(frozen=True, slots=True)
class Unfinished:
    """The search spent this round's budget before it decided: it goes on from where it
    stopped at the next call (the next sweep), so no call holds the event loop longer than
    the budget allows."""

    preemptor: str
    work: int
    """Work done so far, in :data:`SEARCH_BUDGET` units."""
    slices: int
    """Calls that ran it so far."""
    slice_work: int = 0
    """Work this call did: at most the budget, unless it ran one piece only."""
    slice_steps: int = 0
    """Pieces of work this call ran."""


class VictimSearch:
    """One preemptor's victim search, run in slices of bounded work.

    The search (:func:`_search`) yields before every piece of work what it will cost: a
    planner call costs the nodes it plans over times the members; the screening of a
    level, :data:`BOOK_COST` per node and per candidate pod. :meth:`advance` runs pieces
    until the next one would take the slice past its budget, and returns
    :class:`Unfinished`; the next call goes on from there. A slice always runs at least
    one piece, so it always makes progress; the stall one slice causes is at most the
    budget or the dearest single piece (a planner call over the nodes of one domain, or of
    the whole cluster for a gang that may spread), whichever is larger.

    The search reads the capacity view as it is when each piece runs: between slices the
    cluster may change, so the caller checks a decided set against the cluster of the
    moment before it evicts (``coscheduling.preemption.carry``).

    ``candidates`` is the list of candidates, or a function that returns a
    :data:`Listing`: the candidates listed in pieces of bounded work, as the search's own
    first pieces (the core lists every bound pod of a 5,000-node cluster this way: in one
    go that alone held the event loop for a quarter of a second)."""

    def __init__(self, preemptor: Preemptor,
                 candidates: Iterable[Candidate] | Callable[[], Listing],
                 view: CapacityView, levels: Sequence[Level], *,
                 domains_tried: int = DOMAINS_TRIED) -> None:
        self.preemptor = preemptor
        listing = candidates if callable(candidates) else _listed(list(candidates))
        self._steps = _search(preemptor, listing, view, levels, domains_tried)
        self._next = 0
        self.work = 0
        self.slices = 0

    def advance(self, budget: int | None, *, must_move: bool = True
                ) -> Victims | NoPreemption | Unfinished:
        """Run the search for at most ``budget`` units of work (None: to the end).

        ``must_move``: run the next piece even if it alone is over the budget (the first
        preemptor of a sweep, so every search progresses); without it, a slice that cannot
        afford its next piece does nothing."""
        self.slices += 1
        spent = steps = 0
        cost = self._next
        try:
            while True:
                if budget is not None and (steps > 0 or not must_move) \
                        and spent + cost > budget:
                    self._next = cost
                    return Unfinished(self.preemptor.name, self.work, self.slices, spent,
                                      steps)
                spent += cost
                steps += 1
                self.work += cost
                cost = self._steps.send(None)
        except StopIteration as done:
            result: Victims | NoPreemption = done.value
            return result


def _listed(candidates: Sequence[Candidate]) -> Callable[[], Listing]:
    """Candidates listed already, as a listing of no work."""
    def listing() -> Listing:
        yield from ()
        return candidates
    return listing


def _search(preemptor: Preemptor, listing: Callable[[], Listing], view: CapacityView,
            levels: Sequence[Level], domains_tried: int) -> Steps[Victims | NoPreemption]:
    """:func:`choose_victims`, as steps (see :class:`VictimSearch`)."""
    if preemptor.policy is PreemptionPolicy.NEVER:
        return PolicyNever(preemptor.name)
    candidates = yield from listing()
    members = preemptor.members
    required = preemptor.required
    nodes = view.nodes
    free_cache: dict[NodeName, Resources] = {}

    def free(n: NodeName) -> Resources:
        f = free_cache.get(n)
        if f is None:
            f = free_cache[n] = view.free_for_gang(n)
        return f

    yield len(nodes) * BOOK_COST
    # Planning the whole cluster as it is only when the arithmetic allows a fit: on a
    # full cluster (the case preemption is for) that plan is skipped.
    whole = _Bound(members, nodes, free)
    if whole.holds(whole.state(())):
        now = yield from _plan(members, view, levels, required)
        if now is not None:
            return AlreadyFits(preemptor.name, now)
    units, lowest, count = yield from _unit_steps(preemptor, candidates, nodes)
    if not units:
        return NoLowerPriority(preemptor.name, preemptor.priority, count, lowest)
    need = {k: v for k, v in _total(members).items() if v > 0 and k != PODS}
    stop = levels.index(required) if required is not None else 0
    order = _Ranks()
    for index in range(len(levels) - 1, stop - 1, -1):
        found = yield from _best_at_level(members, view, levels, index, units, need, free,
                                          domains_tried, order)
        if found is not None:
            return found
    if required is None:
        # No single domain could be made to hold it: the gang may spread over the cluster.
        got = yield from _reprieve(members, view, levels, required, units, None, free)
        if got is not None:
            return _victims(*got, required)
    # Not among the best estimates (nor spread): the planner's own answer with every unit
    # gone says whether it fits at all, and if not, why.
    everything = yield from _nofit(members, FreedView(view, levels, _pods(units)), levels,
                                   required)
    if isinstance(everything, NoFit):
        return WouldNotFit(preemptor.name, preemptor.priority, len(units),
                           len(_pods(units)), everything)
    if required is not None:
        # Some domain of the required level holds it, past the best estimates: every one
        # that passed the screening is tried, one domain (one small plan) at a time.
        found = yield from _best_at_level(members, view, levels, stop, units, need, free,
                                          None, order)
        if found is not None:
            return found
    # The planner placed it, the search did not: the cluster changed between two slices
    # (or the planner, a heuristic, disagreed with itself). Start again.
    return SearchAgain(preemptor.name)


def _best_at_level(
    members: Sequence[Member], view: CapacityView, levels: Sequence[Level], index: int,
    units: Sequence[VictimUnit], need: Mapping[str, int],
    free: _FreeFn, domains_tried: int | None, order: Callable[[VictimUnit], tuple[Cost, str]],
) -> Steps[Victims | None]:
    """The best set within one domain of level ``index``, among the ``domains_tried`` best
    estimates; None: every domain that passed the screening, until one holds the gang
    (past the first ``DOMAINS_TRIED``, the first found is taken)."""
    domains = view.domains(index)
    nodes = view.nodes
    yield len(nodes) * BOOK_COST
    where = {n: d for d, ns in domains.items() for n in ns}
    # What each unit frees in each domain it touches at this level.
    here: dict[tuple[str, ...], dict[str, tuple[VictimUnit, Resources]]] = {}
    work = 0
    for u in units:
        if work >= SCREEN_GRAIN:
            yield work
            work = 0
        work += len(u.pods) * BOOK_COST
        for p in u.pods:
            d = where.get(p.node)
            if d is None:
                continue
            per = here.setdefault(d, {})
            was = per.get(u.key)
            per[u.key] = (u, add(was[1], p.requests) if was else dict(p.requests))
    screened: list[tuple[Cost, int, tuple[str, ...]]] = []
    for d, per in here.items():
        if work >= SCREEN_GRAIN:
            yield work
            work = 0
        work += (len(domains[d]) + len(per)) * BOOK_COST
        have: Resources = {}
        for n in domains[d]:
            for k in need:
                have[k] = have.get(k, 0) + max(0, free(n).get(k, 0))
        deficit = {k: v - have.get(k, 0) for k, v in need.items()}
        short = {k: v for k, v in deficit.items() if v > 0}
        if short:  # even every unit here would not cover it: no estimate to rank
            freeable = dict.fromkeys(short, 0)
            for _, r in per.values():
                for k in short:
                    freeable[k] += r.get(k, 0)
            if any(freeable[k] < v for k, v in short.items()):
                continue
        est = _estimate(list(per.values()), deficit, order)
        if est is None:
            continue
        slack = have.get(GPU, 0) + sum(r.get(GPU, 0) for _, r in per.values()) - need.get(GPU, 0)
        screened.append((est, slack, d))
    screened.sort()
    best: tuple[Cost, int, tuple[str, ...], Victims] | None = None
    for i, (_, slack, d) in enumerate(screened[:domains_tried]):
        if best is not None and i >= DOMAINS_TRIED:
            break
        region = Region({n: nodes[n] for n in domains[d]})
        got = yield from _reprieve(members, view, levels, levels[index],
                                   [u for u, _ in here[d].values()], region, free)
        if got is None:
            continue
        v = _victims(*got, levels[index], d)
        rank = (v.cost, slack, d)
        if best is None or rank < best[:3]:
            best = (v.cost, slack, d, v)
    return best[3] if best is not None else None
