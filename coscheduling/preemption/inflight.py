"""Preemptions in flight: what was evicted for whom, and until when the freed room is held.

Deciding victims is :mod:`coscheduling.preemption.victims`; this is what the core remembers between
the eviction and the preemptor's admission. Pure: the core holds one :class:`PreemptionBook`,
passes ``now`` in and acts on what comes back (evict, reserve, give back, re-plan).

The lifecycle of one record::

    start ──> in flight ──(every victim gone)──> Completed: admit the preemptor into its
                  │                              reservation (re-plan if a slot is lost)
                  └──(deadline passed)─────────> PreemptionExpired: give the reservation
                                                 back and re-plan the gang from scratch

Rules the book enforces:

* One preemption in flight per preemptor: a gang whose victims are still terminating does
  not pick more (kube-scheduler's ``PodEligibleToPreemptOthers`` refuses likewise while a
  victim on the nominated node is terminating).
* A gang being evicted does not preempt, and its recreated members wait while the
  preemption that evicted it is in flight: they must not race the preemptor for the room
  its members leave (the ledger holds that room too; this keeps them out of admission
  altogether, so they are not admitted elsewhere half-way either).
* The freed room is held until every victim is gone or the deadline passes: the longest
  victim grace period plus :data:`DEFAULT_MARGIN`.

Two gangs cannot evict each other in a loop: every eviction edge goes from a higher to a
strictly lower priority (:mod:`coscheduling.preemption.victims`), so a chain of them never returns
to where it began.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ..records import GangKey, NodeName, PodKey
from ..resources import Resources
from .units import Victims
from .victims import SEARCH_BUDGET, VictimSearch

__all__ = [
    "DEFAULT_MARGIN",
    "SEARCH_IDLE",
    "SLICE_PAUSE",
    "AlreadyInFlight",
    "BeingEvicted",
    "Completed",
    "InFlight",
    "PreemptionBook",
    "PreemptionExpired",
    "PreemptorId",
    "Searching",
    "Slot",
    "deadline_for",
]

DEFAULT_MARGIN = 30.0
"""Seconds beyond the longest victim grace period before the held room is given back
(kubelet's kill after the grace period, and the watch delivering the deletion)."""


@dataclass(frozen=True, slots=True, order=True)
class PreemptorId:
    """Whose preemption a record is: a gang, or a plain pod.

    A gang and a plain pod may share ``namespace/name`` (a Job ``train`` whose gang is
    ``default/train`` beside a pod ``default/train``), so a record keyed by the bare string
    was one record for both: the gang was told "Preempting" from the pod's record and never
    woken. The kind is part of the key."""

    kind: Literal["gang", "pod"]
    name: str
    """``namespace/name`` of the gang, or of the pod."""

    @staticmethod
    def of_gang(key: GangKey) -> PreemptorId:
        return PreemptorId("gang", key)

    @staticmethod
    def of_pod(key: PodKey) -> PreemptorId:
        return PreemptorId("pod", key)

    @property
    def pod(self) -> PodKey | None:
        """The plain pod's key, None for a gang."""
        return PodKey(self.name) if self.kind == "pod" else None

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True, slots=True)
class Slot:
    """One preemptor member's place in the freed room: what the ledger reserves."""

    pod: PodKey
    node: NodeName
    requests: Resources


@dataclass(frozen=True, slots=True)
class InFlight:
    """One preemption between the eviction and the preemptor's admission."""

    preemptor: PreemptorId
    """The gang (or the plain pod) the victims were evicted for."""
    gang: GangKey | None
    priority: int
    victims: frozenset[PodKey]
    """Pods evicted and not yet seen gone."""
    victim_gangs: frozenset[GangKey]
    slots: tuple[Slot, ...]
    freed: Mapping[NodeName, Resources]
    started: float
    deadline: float
    gone: frozenset[PodKey] = field(default_factory=frozenset)
    plain: int = 0
    """Victim pods outside any gang."""
    moves: bool = False
    """Pods moved to make room (``coscheduling.defrag``), not victims: at or below the
    preemptor's priority, each with room reserved for its replacement."""

    @property
    def waiting_for(self) -> frozenset[PodKey]:
        return self.victims - self.gone


@dataclass(frozen=True, slots=True)
class AlreadyInFlight:
    """The preemptor already has victims terminating: no second set until it ends."""

    record: InFlight


@dataclass(frozen=True, slots=True)
class BeingEvicted:
    """The gang is itself a victim of a preemption in flight."""

    gang: GangKey
    by: InFlight


@dataclass(frozen=True, slots=True)
class Completed:
    """Every victim is gone: admit the preemptor into the held slots."""

    record: InFlight


@dataclass(frozen=True, slots=True)
class PreemptionExpired:
    """The victims outlived the deadline: give the slots back and re-plan the preemptor."""

    record: InFlight
    still_there: frozenset[PodKey]


SLICE_PAUSE = 0.05
"""Seconds between two slices of a victim search that did not finish: the deadline timer
wakes the sweep again after that long, and verbs, the webhook and ``/healthz`` run between."""

SEARCH_IDLE = 5.0
"""A search no sweep resumed for this long is dropped (its preemptor was admitted, or went)."""


@dataclass(slots=True)
class Searching:
    """A victim search under way (:class:`~coscheduling.preemption.victims.VictimSearch`),
    resumed by the next sweep."""

    search: VictimSearch
    key: tuple[object, ...]
    """What the preemptor was when it began (members, priority, policy, level, quota): a
    preemptor that changed searches afresh."""
    last: float
    """When a slice last ran."""
    woken: float = float("-inf")
    """When the timer last asked the sweep to resume it."""

    @property
    def resume_at(self) -> float:
        return max(self.last, self.woken) + SLICE_PAUSE


def deadline_for(victims: Victims, now: float, margin: float = DEFAULT_MARGIN) -> float:
    """When to give the room back if the victims have not gone."""
    grace = max((p.grace_seconds for p in victims.evict), default=0.0)
    return now + grace + margin


def _slots(victims: Victims, requests: Mapping[PodKey, Resources]) -> tuple[Slot, ...]:
    return tuple(Slot(k, n, dict(requests.get(k, {})))
                 for k, n in sorted(victims.plan.assignments.items()))


@dataclass(slots=True)
class PreemptionBook:
    """Every preemption in flight, by preemptor."""

    by_preemptor: dict[PreemptorId, InFlight] = field(default_factory=dict)
    _by_victim: dict[PodKey, PreemptorId] = field(default_factory=dict)
    _by_victim_gang: dict[GangKey, PreemptorId] = field(default_factory=dict)
    searches: dict[PreemptorId, Searching] = field(default_factory=dict)
    """Victim searches under way, by preemptor."""
    budget: int = SEARCH_BUDGET
    """Search work one sweep (one ``now``) may do, all preemptors together."""
    _spent_at: float = float("nan")
    _spent: int = 0

    def budget_left(self, now: float) -> int:
        """What is left of this sweep's search budget; every call at one ``now`` is one
        sweep (or one verb call), so preemptors in one sweep share it."""
        if now != self._spent_at:
            self._spent_at, self._spent = now, 0
        return self.budget - self._spent

    def spend(self, now: float, work: int) -> None:
        self.budget_left(now)
        self._spent += work

    def idle_searches(self, now: float) -> None:
        """Drop searches no sweep has resumed for :data:`SEARCH_IDLE` seconds."""
        for who in [w for w, s in self.searches.items() if now - s.last >= SEARCH_IDLE]:
            del self.searches[who]

    def may_start(self, preemptor: PreemptorId, gang: GangKey | None
                  ) -> AlreadyInFlight | BeingEvicted | None:
        """None when ``preemptor`` may look for victims now."""
        mine = self.by_preemptor.get(preemptor)
        if mine is not None:
            return AlreadyInFlight(mine)
        if gang is not None and (by := self.evicting(gang)) is not None:
            return BeingEvicted(gang, by)
        return None

    def start(self, *, preemptor: PreemptorId, gang: GangKey | None, priority: int,
              victims: Victims, requests: Mapping[PodKey, Resources], now: float,
              margin: float = DEFAULT_MARGIN, moves: bool = False
              ) -> InFlight | AlreadyInFlight | BeingEvicted:
        """Record a decision the core is about to carry out (evict, then reserve the slots).

        ``requests`` are the preemptor members' requests, for the slots."""
        refused = self.may_start(preemptor, gang)
        if refused is not None:
            return refused
        rec = InFlight(
            preemptor=preemptor,
            gang=gang,
            priority=priority,
            victims=frozenset(p.key for p in victims.evict),
            victim_gangs=frozenset(victims.gangs),
            slots=_slots(victims, requests),
            freed=dict(victims.freed),
            started=now,
            deadline=deadline_for(victims, now, margin),
            plain=len(victims.pods),
            moves=moves,
        )
        self.by_preemptor[preemptor] = rec
        for k in rec.victims:
            self._by_victim[k] = preemptor
        for g in rec.victim_gangs:
            self._by_victim_gang[g] = preemptor
        return rec

    def get(self, preemptor: PreemptorId) -> InFlight | None:
        return self.by_preemptor.get(preemptor)

    def evicting(self, gang: GangKey) -> InFlight | None:
        """The preemption evicting ``gang``: its members (recreated ones too) wait."""
        who = self._by_victim_gang.get(gang)
        return self.by_preemptor.get(who) if who is not None else None

    def terminating(self) -> frozenset[PodKey]:
        """Victims not yet gone: never candidates for another preemption (their room is
        already held for somebody)."""
        return frozenset(k for rec in self.by_preemptor.values() for k in rec.waiting_for)

    def gone(self, pods: Iterable[PodKey]) -> list[Completed]:
        """The watch saw ``pods`` deleted (or finished); preemptions with nothing left to
        wait for are completed and leave the book."""
        touched: set[PreemptorId] = set()
        for k in pods:
            who = self._by_victim.get(k)
            rec = self.by_preemptor.get(who) if who is not None else None
            if rec is None or who is None:
                continue
            self.by_preemptor[who] = replace(rec, gone=rec.gone | {k})
            touched.add(who)
        done = []
        for who in sorted(touched):
            rec = self.by_preemptor[who]
            if not rec.waiting_for:
                self._drop(rec)
                done.append(Completed(rec))
        return done

    def expire(self, now: float) -> list[PreemptionExpired]:
        """Preemptions past their deadline leave the book: give their room back."""
        out = []
        for who in sorted(self.by_preemptor):
            rec = self.by_preemptor[who]
            if rec.deadline <= now:
                self._drop(rec)
                out.append(PreemptionExpired(rec, rec.waiting_for))
        return out

    def next_deadline(self) -> float | None:
        """The earliest record deadline, or the time a paused search is resumed."""
        times = [r.deadline for r in self.by_preemptor.values()]
        times += [s.resume_at for s in self.searches.values()]
        return min(times, default=None)

    def cancel(self, preemptor: PreemptorId) -> InFlight | None:
        """The preemptor went away (deleted, or admitted elsewhere): forget it, give back."""
        self.searches.pop(preemptor, None)
        rec = self.by_preemptor.get(preemptor)
        if rec is not None:
            self._drop(rec)
        return rec

    def _drop(self, rec: InFlight) -> None:
        del self.by_preemptor[rec.preemptor]
        for k in rec.victims:
            if self._by_victim.get(k) == rec.preemptor:
                del self._by_victim[k]
        for g in rec.victim_gangs:
            if self._by_victim_gang.get(g) == rec.preemptor:
                del self._by_victim_gang[g]

    def __len__(self) -> int:
        return len(self.by_preemptor)
