"""Gang-aware preemption: which bound pods to evict so a waiting gang (or plain pod) fits.

A pure decision. The caller hands in a :class:`~coscheduling.planner.CapacityView` (free
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
  is :class:`~coscheduling.freed.FreedView`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from .freed import FreedView, Region
from .keys import GangKey
from .planner import CapacityView, Member, NoFit, Plan, plan_gang
from .records import NodeName, PodKey
from .resources import PODS, Resources, add, sub
from .topology import GPU, Level

__all__ = [
    "DOMAINS_TRIED",
    "AlreadyFits",
    "Candidate",
    "Cost",
    "NoLowerPriority",
    "NoPreemption",
    "PolicyNever",
    "PreemptionPolicy",
    "Preemptor",
    "VictimUnit",
    "Victims",
    "WouldNotFit",
    "choose_victims",
    "describe",
    "pdb_violating",
    "pdb_violations",
    "victim_units",
]

_FreeFn = Callable[[NodeName], Resources]

DOMAINS_TRIED = 16
"""Candidate domains planned for real per topology level, best estimates first."""


class PreemptionPolicy(enum.Enum):
    """``spec.preemptionPolicy`` of a pod (``PreemptLowerPriority`` when unset)."""

    PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
    NEVER = "Never"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A bound pod that might be evicted."""

    key: PodKey
    node: NodeName
    requests: Mapping[str, int]
    priority: int
    gang: GangKey | None
    """The gang it belongs to: the whole gang is evicted, or none of it. None: a plain pod."""
    started: float
    """When it started (seconds, any epoch the caller uses consistently)."""
    budgets: tuple[tuple[str, int], ...] = ()
    """The PodDisruptionBudgets selecting it, each with its ``disruptionsAllowed`` now.
    Evictions in one victim set share a budget's allowance (:func:`pdb_violations`)."""
    grace_seconds: float = 30.0
    """``terminationGracePeriodSeconds``: how long it may take to go."""
    quota: str | None = None
    """The quota it was admitted under (Kueue's LocalQueue, ``namespace/queue-name``), None
    when no quota system manages it. Lockstep never evicts across quota lines."""


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The gang (or plain pod) that cannot be admitted."""

    name: str
    """Its gang key, or its pod key when it is a plain pod: used in reasons only."""
    members: tuple[Member, ...]
    """Members to place. Build them without kube-scheduler's candidate nodes: its filters
    ran against the capacity the victims still hold."""
    priority: int
    policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER_PRIORITY
    required: Level | None = None
    """``topology-required``: the gang never spreads wider than one domain of this level."""
    gang: GangKey | None = None
    """Its own gang, whose bound members are never its victims."""
    quota: str | None = None
    """As :attr:`Candidate.quota`: only pods of the same quota (or both of none) are
    victims. Which workload runs *within* a quota is the quota system's decision (Kueue
    preempts for quota); Lockstep only frees node capacity inside the same line."""


@dataclass(frozen=True, slots=True)
class VictimUnit:
    """What is evicted together: a whole gang's bound members, or one plain pod."""

    key: str
    """The gang key, or the pod key of a plain pod."""
    gang: GangKey | None
    pods: tuple[Candidate, ...]

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)

    @property
    def pdb_pods(self) -> int:
        """Its pods whose eviction would violate a budget, counted as if it went alone."""
        return pdb_violations(self.pods)

    @property
    def gpus(self) -> int:
        return sum(p.requests.get(GPU, 0) for p in self.pods)

    @property
    def started(self) -> float:
        """When the unit began running: its earliest pod's start."""
        return min(p.started for p in self.pods)

    def reprieve_order(self, violating: set[PodKey] | None = None
                       ) -> tuple[int, int, int, int, float, str]:
        """Most worth keeping first: with more pods whose eviction violates a budget (among
        ``violating``, the set's own count; alone when not given), higher priority,
        smaller, older. kube-scheduler reprieves violating pods first too."""
        pdb = (self.pdb_pods if violating is None
               else sum(1 for p in self.pods if p.key in violating))
        return (-pdb, -self.priority, self.gpus, len(self.pods), self.started, self.key)


@dataclass(frozen=True, slots=True, order=True)
class Cost:
    """How bad a victim set is; smaller is better, compared field by field in this order."""

    pdb_violations: int
    highest_priority: int
    units: int
    gpus: int
    neg_earliest_start: float
    """Minus the earliest start among the victims: the set whose oldest victim is youngest
    loses the least work."""

    @staticmethod
    def of(units: Iterable[VictimUnit]) -> Cost:
        us = list(units)
        if not us:
            return Cost(0, 0, 0, 0, 0.0)
        return Cost(
            pdb_violations=pdb_violations(p for u in us for p in u.pods),
            highest_priority=max(u.priority for u in us),
            units=len(us),
            gpus=sum(u.gpus for u in us),
            neg_earliest_start=-min(u.started for u in us),
        )


def pdb_violating(pods: Iterable[Candidate]) -> set[PodKey]:
    """Which of ``pods``, evicted together, would violate a PodDisruptionBudget.

    As kube-scheduler's ``filterPodsWithPDBViolation`` counts: the pods are taken most
    important first (higher priority, then earlier start), each takes one from every budget
    selecting it, and a pod that takes some budget below zero violates. So a budget allowing
    one disruption lets the first of its pods go free and counts every further one."""
    left: dict[str, int] = {}
    out: set[PodKey] = set()
    for p in sorted(pods, key=lambda p: (-p.priority, p.started, p.key)):
        for key, allowed in p.budgets:
            left[key] = left.get(key, allowed) - 1
            if left[key] < 0:
                out.add(p.key)
    return out


def pdb_violations(pods: Iterable[Candidate]) -> int:
    """How many of ``pods``, evicted together, would violate a budget."""
    return len(pdb_violating(pods))


@dataclass(frozen=True, slots=True)
class Victims:
    """Evict exactly these, and the preemptor fits as ``plan`` says."""

    gangs: tuple[GangKey, ...]
    """Victim gangs, every bound member of each in ``evict``."""
    pods: tuple[PodKey, ...]
    """Victim plain pods."""
    evict: tuple[Candidate, ...]
    """Every pod to evict (gang members and plain pods), sorted by key."""
    plan: Plan
    """Where the preemptor's members go once the victims are gone."""
    freed: dict[NodeName, Resources]
    """What the victims give back, per node."""
    cost: Cost
    level: str | None = None
    """The topology level the victims were chosen at: one domain of it holds the gang.
    None: the gang spreads over the cluster (it has no required level)."""
    domain: tuple[str, ...] | None = None
    """That domain (None with a spread gang, or when the last resort chose over the whole
    cluster at the gang's required level)."""
    units: tuple[VictimUnit, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class PolicyNever:
    """The preemptor has ``preemptionPolicy: Never``: it waits for capacity instead."""

    preemptor: str


@dataclass(frozen=True, slots=True)
class NoLowerPriority:
    """No bound pod has a priority below the preemptor's under the same quota (equal
    priority is never evicted, nor a pod of another quota)."""

    preemptor: str
    priority: int
    bound: int
    """Bound pods looked at."""
    lowest: int | None
    """The lowest priority among them (None when there are none)."""


@dataclass(frozen=True, slots=True)
class WouldNotFit:
    """Even with every lower-priority unit evicted, the gang would not fit: nothing is
    evicted."""

    preemptor: str
    priority: int
    units: int
    """Eligible victim units (gangs and plain pods) that were all counted as gone."""
    pods: int
    nofit: NoFit


@dataclass(frozen=True, slots=True)
class AlreadyFits:
    """The preemptor fits without evicting anything: admit it instead."""

    preemptor: str
    plan: Plan


NoPreemption = PolicyNever | NoLowerPriority | WouldNotFit | AlreadyFits


def describe(reason: NoPreemption) -> str:
    """One sentence a person can act on."""
    match reason:
        case PolicyNever(p):
            return (f"{p} does not preempt: its preemptionPolicy is Never "
                    f"(it waits for free capacity)")
        case NoLowerPriority(p, prio, bound, lowest):
            low = f"the lowest is {lowest}" if lowest is not None else "none is bound"
            return (f"{p} (priority {prio}) cannot preempt: no bound pod of its quota has a "
                    f"lower priority ({bound} looked at, {low})")
        case WouldNotFit(p, prio, units, pods, nofit):
            where = f" in one {nofit.required_level}" if nofit.required_level else ""
            fit = (f"at most {nofit.widest_domain_fit} of {nofit.members} members would fit "
                   f"in any one {nofit.required_level}" if nofit.required_level
                   else f"{nofit.free_units} of {nofit.members} members would fit")
            return (f"{p} (priority {prio}) would not fit{where} even after evicting all "
                    f"{units} lower-priority gangs and pods ({pods} pods): nothing evicted; "
                    f"{fit}")
        case AlreadyFits(p, _):
            return f"{p} fits without preemption"


# ---------------------------------------------------------------------------- units


def victim_units(preemptor: Preemptor, candidates: Iterable[Candidate]
                 ) -> tuple[list[VictimUnit], int | None, int]:
    """Eligible units, the lowest priority seen, and how many candidates there were.

    A gang is eligible only when *every* bound member is strictly lower than the preemptor
    (and under its quota): one member of equal or higher priority protects the whole gang,
    as evicting the rest would leave it partial."""
    gangs: dict[GangKey, list[Candidate]] = {}
    plain: list[Candidate] = []
    lowest: int | None = None
    count = 0
    for c in candidates:
        count += 1
        lowest = c.priority if lowest is None else min(lowest, c.priority)
        if c.gang is None:
            plain.append(c)
        elif c.gang != preemptor.gang:
            gangs.setdefault(c.gang, []).append(c)
    def ok(c: Candidate) -> bool:
        return c.priority < preemptor.priority and c.quota == preemptor.quota

    units = [VictimUnit(str(c.key), None, (c,)) for c in plain if ok(c)]
    units += [VictimUnit(str(g), g, tuple(sorted(ps, key=lambda p: p.key)))
              for g, ps in gangs.items() if all(ok(p) for p in ps)]
    units.sort(key=lambda u: u.key)
    return units, lowest, count


def _pods(units: Iterable[VictimUnit]) -> list[Candidate]:
    return [p for u in units for p in u.pods]


def _total(members: Sequence[Member]) -> Resources:
    total: Resources = {}
    for m in members:
        total = add(total, m.pod.requests)
    return total


# ---------------------------------------------------------------------------- search


def _plan(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
          required: Level | None) -> Plan | None:
    got = plan_gang(members, view, levels, required=required)
    return got if isinstance(got, Plan) else None


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
              region: Region | None, free: _FreeFn) -> tuple[list[VictimUnit], Plan] | None:
    """Evict all of ``units``, then keep back as many as the plan allows (see module doc)."""
    bound = _Bound(members, region.nodes if region is not None else base.nodes, free)

    def attempt(vs: Sequence[VictimUnit]) -> Plan | None:
        if not bound.holds(bound.state(vs)):
            return None
        return _plan(members, FreedView(base, levels, _pods(vs), region), levels, required)

    def without(vs: list[VictimUnit], u: VictimUnit) -> tuple[list[VictimUnit], Plan | None]:
        trial = [v for v in vs if v is not u]
        if not bound.holds_without(cur, u):
            return trial, None
        return trial, _plan(members, FreedView(base, levels, _pods(trial), region), levels,
                            required)

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
        plan = attempt(victims)
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
            p2 = attempt(rest)
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
        trial, p2 = without(victims, u)
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
            trial, p2 = without(victims, u)
            if p2 is not None:
                victims, plan, changed = trial, p2, True
                cur = bound.state(victims)
                changes += 1
                break
            tried_at[u.key] = changes
    return victims, plan


def _estimate(units: Sequence[tuple[VictimUnit, Resources]], deficit: Mapping[str, int],
              rank: Mapping[str, tuple[Cost, str]]) -> Cost | None:
    """Cheapest units first until their in-domain requests cover ``deficit`` (by sums)."""
    left = {k: v for k, v in deficit.items() if v > 0}
    taken: list[VictimUnit] = []
    for u, here in sorted(units, key=lambda t: rank[t[0].key]):
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
    """The victim set that lets ``preemptor`` fit, or why there is none (see module doc).

    ``candidates`` are the bound pods (every bound member of each gang: a gang missing some
    here would be evicted only in part); pods already terminating should be left out, as
    their capacity is already on its way back."""
    if preemptor.policy is PreemptionPolicy.NEVER:
        return PolicyNever(preemptor.name)
    members = preemptor.members
    required = preemptor.required
    now = _plan(members, view, levels, required)
    if now is not None:
        return AlreadyFits(preemptor.name, now)
    nodes = view.nodes
    units, lowest, count = victim_units(preemptor, candidates)
    units = [u for u in units if any(p.node in nodes for p in u.pods)]
    if not units:
        return NoLowerPriority(preemptor.name, preemptor.priority, count, lowest)
    everything = plan_gang(members, FreedView(view, levels, _pods(units)), levels,
                           required=required)
    if isinstance(everything, NoFit):
        return WouldNotFit(preemptor.name, preemptor.priority, len(units),
                           len(_pods(units)), everything)

    need = {k: v for k, v in _total(members).items() if v > 0 and k != PODS}
    stop = levels.index(required) if required is not None else 0
    free_cache: dict[NodeName, Resources] = {}

    def free(n: NodeName) -> Resources:
        f = free_cache.get(n)
        if f is None:
            f = free_cache[n] = view.free_for_gang(n)
        return f

    order = {u.key: (Cost.of([u]), u.key) for u in units}
    for index in range(len(levels) - 1, stop - 1, -1):
        found = _best_at_level(members, view, levels, index, units, need, free,
                               domains_tried, order)
        if found is not None:
            return found
    # No single domain could be made to hold it among those tried (or the gang may spread):
    # the whole cluster, at the gang's own required level. Evicting every unit fits there,
    # so this always finds a set.
    got = _reprieve(members, view, levels, required, units, None, free)
    assert got is not None, "evicting every eligible unit fitted a moment ago"
    return _victims(*got, required)


def _best_at_level(
    members: Sequence[Member], view: CapacityView, levels: Sequence[Level], index: int,
    units: Sequence[VictimUnit], need: Mapping[str, int],
    free: _FreeFn, domains_tried: int, order: Mapping[str, tuple[Cost, str]],
) -> Victims | None:
    domains = view.domains(index)
    nodes = view.nodes
    where = {n: d for d, ns in domains.items() for n in ns}
    # What each unit frees in each domain it touches at this level.
    here: dict[tuple[str, ...], dict[str, tuple[VictimUnit, Resources]]] = {}
    for u in units:
        for p in u.pods:
            d = where.get(p.node)
            if d is None:
                continue
            per = here.setdefault(d, {})
            was = per.get(u.key)
            per[u.key] = (u, add(was[1], p.requests) if was else dict(p.requests))
    screened: list[tuple[Cost, int, tuple[str, ...]]] = []
    for d, per in here.items():
        have: Resources = {}
        for n in domains[d]:
            for k in need:
                have[k] = have.get(k, 0) + max(0, free(n).get(k, 0))
        deficit = {k: v - have.get(k, 0) for k, v in need.items()}
        est = _estimate(list(per.values()), deficit, order)
        if est is None:
            continue
        slack = have.get(GPU, 0) + sum(r.get(GPU, 0) for _, r in per.values()) - need.get(GPU, 0)
        screened.append((est, slack, d))
    screened.sort()
    best: tuple[Cost, int, tuple[str, ...], Victims] | None = None
    for _, slack, d in screened[:domains_tried]:
        region = Region({n: nodes[n] for n in domains[d]})
        got = _reprieve(members, view, levels, levels[index],
                        [u for u, _ in here[d].values()], region, free)
        if got is None:
            continue
        v = _victims(*got, levels[index], d)
        rank = (v.cost, slack, d)
        if best is None or rank < best[:3]:
            best = (v.cost, slack, d, v)
    return best[3] if best is not None else None
