"""What a preemption decides over: who preempts (:class:`Preemptor`), who could be a victim
(:class:`Candidate`, grouped into whole :class:`VictimUnit` s: a gang with every bound member,
or one plain pod), what a victim set costs (:class:`Cost`, compared in the order kube-scheduler
compares nodes), and the answer: :class:`Victims`, or why there are none (:data:`NoPreemption`,
in words by :func:`describe`).

Values only; the search over them is :mod:`coscheduling.preemption.victims`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..placement.planner import Member, NoFit, Plan
from ..records import GangKey, NodeName, PodKey
from ..resources import Resources
from ..topology.domains import GPU, Level

__all__ = [
    "AlreadyFits",
    "Candidate",
    "Cost",
    "NoLowerPriority",
    "NoPreemption",
    "PolicyNever",
    "PreemptionPolicy",
    "Preemptor",
    "SearchAgain",
    "VictimUnit",
    "Victims",
    "WouldNotFit",
    "describe",
    "pdb_violating",
    "pdb_violations",
]


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
    """The priority it is measured by, the same measure as the preemptor's: its gang's
    (the group's when the group names one) for a gang member, its own for a plain pod
    (``CoreState.unit_priority``)."""
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


@dataclass(frozen=True, slots=True)
class SearchAgain:
    """The cluster changed while the search ran in slices, so its answers disagree: nothing
    is evicted, and the preemptor searches again once the cluster changes."""

    preemptor: str


NoPreemption = PolicyNever | NoLowerPriority | WouldNotFit | AlreadyFits | SearchAgain


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
        case SearchAgain(p):
            return (f"{p}: the cluster changed while its victims were searched; nothing "
                    f"evicted, it searches again")
