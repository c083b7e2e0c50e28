"""The dry plan: what the core would decide for the proposal's units, against the live
state, without changing it.

Each unit takes the path the core takes when the same objects are created at once, in the
default install (the webhook on): a gang is planned whole over the capacity no reservation
holds (the webhook's ``try_admit`` at creation, which pins it when it fits), else by the
held-gang sweep that may preempt (the same victim search, run in the same bounded slices);
a pod outside any gang is placed by kube-scheduler on room no gang holds, and may preempt as
a plain pod. The rules are the core's own functions, called on read-only views
(:mod:`.views`); the only thing the dry plan writes is its own overlay of what earlier units
of the proposal took. Between two slices (:meth:`DryRun.advance`) the app lets the event
loop run, so a what-if never holds it longer than a verb.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace

from ..conventions.base import PodGroupRecord, Source
from ..conventions.kueue import quota_line
from ..corestate import CoreState
from ..gang.admission import free_outside_reservations, outranked
from ..placement.planner import CapacityView, Member, Plan, plan_gang
from ..placement.subgroups import Part, plan_subgroups
from ..podgroup import MAX_PARTS, GangSpec, InvalidGang, MissingPodGroup, Subgroup
from ..preemption.carry import candidate_steps
from ..preemption.units import (
    NoLowerPriority,
    PolicyNever,
    PreemptionPolicy,
    Preemptor,
    Victims,
    describe,
)
from ..preemption.victims import SEARCH_BUDGET, Unfinished, VictimSearch
from ..reasons import (
    DoesNotFit,
    GangReason,
    InvalidDeclaration,
    NoFit,
    NotEnoughMinResources,
    PodGroupNotFound,
    WaitingForMembers,
)
from ..records import GangKey
from ..resources import fits, format_resources
from ..state.gang import Gang
from ..topology.domains import GPU, Level, level_by_name
from .answer import Earliest, Outcome, Placed, Proposal, Verdict, VictimSet
from .capacity import SnapshotView, TakenView
from .checks import gang_priority, gated_by_another, queue_full, required_level
from .expand import Expanded
from .later import earliest_of, hints, known_events, never
from .members import Unit, ordered, units_of

__all__ = ["HEAVY_PAIRS", "DryRun", "Offload"]

HEAVY_PAIRS = 20_000
"""Members x nodes above which a unit's planning runs off the event loop, on a snapshot
(:class:`~.views.SnapshotView`): a planner call costs about a microsecond or two per pair,
and a 1,000-member gang spread over 5,000 nodes is seconds in one piece."""


@dataclass(frozen=True, slots=True)
class Offload:
    """Work the caller runs off the event loop (in a thread), sending its result back with
    :meth:`DryRun.advance`: it reads only a snapshot, never the live state."""

    work: Callable[[], object]


Step = Offload | None
Steps = Generator[Step, object, Outcome]


class DryRun:
    """One what-if, run in slices: :meth:`advance` until it returns the answer. Reading the
    manifest's pods (and refusing bad ones, :class:`~.answer.WhatIfError`) happens at
    construction, before any planning."""

    def __init__(self, st: CoreState, found: Expanded, now: float) -> None:
        self._st = st
        self._now = now
        self._notes = tuple(found.notes)
        self._units = units_of(st, found)
        self._volcano = found.groups.get(Source.VOLCANO, {})
        self._view = TakenView(st.capacity, st.settings.levels)
        self._reserving: list[GangKey] = []
        """Gangs of earlier units that are placed: admitted, they hold reservations."""
        self._steps = self._run()

    def advance(self, offloaded: object = None) -> Proposal | Offload | None:
        """One slice: the answer once it is complete; an :class:`Offload` to run off the
        loop and send back here as ``offloaded``; else None (call again)."""
        try:
            got = self._steps.send(offloaded)
        except StopIteration as done:
            result: Proposal = done.value
            return result
        return got

    def run(self) -> Proposal:
        """To the end, however long it takes, offloaded work inline (tests)."""
        got = self.advance()
        while not isinstance(got, Proposal):
            got = self.advance(got.work() if isinstance(got, Offload) else None)
        return got

    def _run(self) -> Generator[Step, object, Proposal]:
        outcomes: list[Outcome] = []
        for unit in self._units:
            if unit.gang is None:
                out = yield from _plain(self._st, unit, self._view, self._now)
            else:
                out = yield from _gang(self._st, unit, self._view, self._now, self._volcano,
                                       tuple(self._reserving))
            for p in out.placed:  # later units see this one's room as taken
                pod = next(q for q in unit.pods if q.key == p.pod)
                self._view.take(p.node, pod.requests)
            for key, planned in out.devices:  # and its DRA devices as held
                self._view.hold(key, planned)
            if unit.gang is not None and out.placed:
                self._reserving.append(unit.gang)
            outcomes.append(out)
            yield None
        verdict = max((o.verdict for o in outcomes), key=list(Verdict).index)
        return Proposal(verdict, tuple(outcomes), self._notes)


def _placed(st: CoreState, unit: Unit, plan: Plan, pin: bool) -> tuple[Placed, ...]:
    levels = st.settings.levels[:-1]
    pods = {p.key: p for p in unit.pods}
    out = []
    for key, node in sorted(plan.assignments.items()):
        rec = st.store.nodes.get(node)
        labels = rec.labels if rec is not None else {}
        doms = tuple((lv.name, v) for lv in levels if (v := lv.value(labels)))
        out.append(Placed(key, node, doms, pin and unit.named.get(str(key), False)
                          and not gated_by_another(pods[key])))
    return tuple(out)


def _gang(st: CoreState, unit: Unit, view: TakenView, now: float,
          volcano: Mapping[str, PodGroupRecord], reserving: tuple[GangKey, ...]) -> Steps:
    """A gang's answer, by the path ``creation.placer`` and ``creation.held`` take.
    ``reserving``: gangs of earlier units, admitted by then (a reason names them)."""
    spec, n = unit.membership, len(unit.pods)
    if isinstance(spec, InvalidGang):
        return Outcome(unit.name, True, Verdict.NEVER, n, reason=InvalidDeclaration(spec))
    if isinstance(spec, MissingPodGroup):
        return Outcome(unit.name, True, Verdict.WAITS, n,
                       reason=PodGroupNotFound(spec.key, spec.api),
                       hints=(f"its PodGroup {spec.key} ({spec.api}), created with it",))
    assert isinstance(spec, GangSpec)
    if spec.part is not None:
        return (yield from _group(st, unit, spec, view, now, reserving))
    pods = ordered(unit.pods)
    if n < spec.min_member:
        return Outcome(unit.name, True, Verdict.WAITS, n,
                       reason=WaitingForMembers(spec.key, n, spec.min_member),
                       hints=(f"{spec.min_member - n} more member(s)",))
    spec = replace(spec, priority=gang_priority(st, spec, pods))
    required = required_level(st, spec, pods)
    if isinstance(required, InvalidDeclaration):
        return Outcome(unit.name, True, Verdict.NEVER, n, reason=required)
    if (held := queue_full(st, spec, pods, volcano)) is not None:
        return Outcome(unit.name, True, Verdict.WAITS, n, reason=held,
                       hints=("capability in its Volcano queue, or its queue's other "
                              "groups done",))
    short = None
    if spec.min_resources and not fits(spec.min_resources, free := free_outside_reservations(st)):
        short = NotEnoughMinResources(spec.key, spec.min_resources, free)
    members = [Member(p) for p in pods]
    levels = st.settings.levels
    plan_view: CapacityView = view
    # A unit with DRA claims stays on the live view: the snapshot copies no devices.
    if n * len(st.store.nodes) > HEAVY_PAIRS and not any(p.claims for p in pods):
        plan_view = SnapshotView(view, levels)
        yield None
    result = yield from _maybe_off(plan_view is not view, lambda: _plan(
        members, plan_view, levels, required, spec.min_member))
    assert isinstance(result, Plan | NoFit)
    yield None
    if isinstance(result, Plan):
        if short is not None:
            return Outcome(unit.name, True, Verdict.WAITS, n, reason=short)
        fake = Gang(spec.key, st.ledger, spec=spec)  # never admitted: only read
        reqs = {k: p.requests for p in pods if (k := p.key) in result.assignments}
        if (waits := outranked(st, fake, result.assignments, reqs)) is not None:
            return Outcome(unit.name, True, Verdict.WAITS, n, reason=waits)
        # The webhook pins only once the quorum exists among the reviews it sees: members
        # with a name at creation that no other party holds back.
        seen = sum(1 for p in pods if unit.named.get(str(p.key)) and not gated_by_another(p))
        if n > spec.min_member:  # which reviews form the quorum is the order they arrive
            return replace(_fits(st, unit, result, pin=False), why=(
                f"{n} members for a minMember of {spec.min_member}: the first "
                f"{spec.min_member} created are pinned, the rest gated and placed beside them"))
        return _fits(st, unit, result, pin=seen >= spec.min_member)
    quota = quota_line(pods[0].namespace, pods[0].labels)
    never_ = any(p.preempt_never for p in pods) or spec.preempt_never
    pre = Preemptor(str(spec.key), tuple(Member(p) for p in pods[:spec.min_member]),
                    spec.priority or 0, PreemptionPolicy.NEVER if never_ else
                    PreemptionPolicy.PREEMPT_LOWER_PRIORITY, required, spec.key, quota)
    return (yield from _no_fit(st, unit, plan_view, now, result, pre, short, reserving))


def _group(st: CoreState, unit: Unit, spec: GangSpec, view: TakenView, now: float,
           reserving: tuple[GangKey, ...]) -> Steps:
    """A group of groups' answer, by the core's rules: its subgroups as its members declare
    them (``gang.membership.refresh_spec``), the quorum ``min_parts`` whole subgroups of its
    first stage, planned subgroup by subgroup (``placement.subgroups``); when they do not
    fit, the victim search for the group as one unit, as the core's preemption runs it."""
    n, levels = len(unit.pods), st.settings.levels
    pods = ordered(unit.pods)
    own: dict[GangKey, GangSpec] = {}
    by_part: dict[GangKey, list[Member]] = {}
    for p in pods:
        ms = unit.specs[str(p.key)]
        assert ms.part is not None
        own.setdefault(ms.part, ms)
        by_part.setdefault(ms.part, []).append(Member(p))
    declared = dict(spec.part_stages)
    group = spec.group or tuple(sorted(own))[:MAX_PARTS]
    subs = [Subgroup(k, o.min_member, o.part_topology, o.part_exclusive, o.stage)
            if (o := own.get(k)) is not None else Subgroup(k, 1, stage=declared.get(k, 0))
            for k in group]
    stage = min(s.stage for s in subs)
    now_subs = [s for s in subs if s.stage == stage]
    need = len(now_subs) if spec.min_parts is None else spec.min_parts
    whole = [s for s in subs if len(by_part.get(s.key, ())) >= s.min_member
             and s.stage >= stage]
    if sum(1 for s in whole if s.stage == stage) < need:
        short = next((s for s in now_subs if len(by_part.get(s.key, ())) < s.min_member),
                     None)
        key = short.key if short is not None else spec.key
        have = len(by_part.get(key, ())) if short is not None else len(whole)
        return Outcome(unit.name, True, Verdict.WAITS, n,
                       reason=WaitingForMembers(key, have, short.min_member if short
                                                else need),
                       hints=(f"{need} whole subgroup(s) of its first stage",))
    required = required_level(st, spec, pods)
    if isinstance(required, InvalidDeclaration):
        return Outcome(unit.name, True, Verdict.NEVER, n, reason=required)
    parts = []
    for s in whole:
        lv = level_by_name(levels, s.topology) if s.topology else None
        if s.topology and lv is None:
            return Outcome(unit.name, True, Verdict.NEVER, n, reason=InvalidDeclaration(
                InvalidGang(s.key, "subgroup topology", s.topology, "unknown level")))
        parts.append(Part(s, lv, by_part[s.key]))
    result = plan_subgroups(parts, view, levels, required=required)
    if isinstance(result, NoFit) and len(parts) > need:
        first = [p for p in parts if p.subgroup.stage == stage][:need]
        got = plan_subgroups(first, view, levels, required=required)
        result = got if isinstance(got, Plan) else result
    yield None
    if isinstance(result, Plan):
        return replace(_fits(st, unit, result, pin=False), why=(
            f"a group of {len(group)} subgroup(s), {need} admitted together, each whole in "
            "its own tightest domain; the rest, each whole, as room allows"))
    chosen = [m for p in parts if p.subgroup.stage == stage for m in p.members]
    pre = Preemptor(str(spec.key), tuple(chosen), gang_priority(st, spec, pods),
                    PreemptionPolicy.NEVER if spec.preempt_never
                    else PreemptionPolicy.PREEMPT_LOWER_PRIORITY, required, spec.key,
                    quota_line(pods[0].namespace, pods[0].labels))
    return (yield from _no_fit(st, unit, view, now, result, pre, None, reserving))


def _plan(members: list[Member], view: CapacityView, levels: Sequence[Level],
          required: Level | None, quorum: int) -> Plan | NoFit:
    """``try_admit``'s planning: every member, else a quorum of them (in name order)."""
    result = plan_gang(members, view, levels, required=required)
    if isinstance(result, NoFit) and len(members) > quorum:
        got = plan_gang(members[:quorum], view, levels, required=required)
        if isinstance(got, Plan):
            return got
    return result


def _maybe_off(off: bool, work: Callable[[], object]) -> Generator[Step, object, object]:
    """``work``'s result: handed to the caller to run off the loop when ``off`` (it then
    reads only a snapshot), else run here."""
    if not off:
        return work()
    return (yield Offload(work))


def _fits(st: CoreState, unit: Unit, plan: Plan, *, pin: bool) -> Outcome:
    left = tuple(p.key for p in ordered(unit.pods) if p.key not in plan.assignments)
    return Outcome(unit.name, unit.gang is not None, Verdict.FITS, len(unit.pods),
                   _placed(st, unit, plan, pin), left, plan.level,
                   devices=tuple(sorted(plan.devices.items())))


def _plain(st: CoreState, unit: Unit, view: TakenView, now: float) -> Steps:
    """A pod outside any gang: kube-scheduler places it on room no gang holds (Lockstep's
    filter); the node shown is the one the planner picks, kube-scheduler may pick another
    that fits as well. It is never pinned: the webhook leaves plain pods alone."""
    pod = unit.pods[0]
    result = plan_gang([Member(pod)], view, st.settings.levels)
    yield None
    if isinstance(result, Plan):
        return _fits(st, unit, result, pin=False)
    pre = Preemptor(str(pod.key), (Member(pod),), pod.priority,
                    PreemptionPolicy.NEVER if pod.preempt_never
                    else PreemptionPolicy.PREEMPT_LOWER_PRIORITY,
                    quota=quota_line(pod.namespace, pod.labels))
    return (yield from _no_fit(st, unit, view, now, result, pre, None))


SLICE = SEARCH_BUDGET // 4
"""Victim-search work per slice of a what-if: a quarter of the core's own sweep budget
(about 8 ms of CPU), so the verbs served between slices wait a quarter as long. The
search is the same; only where it pauses differs."""


def _never_why(proof: NoFit) -> str:
    """Why a unit never fits, from the planner's answer on the cluster as if empty."""
    shape = format_resources(proof.shape)
    if proof.required_level:
        return (f"does not fit even on the empty cluster: at most {proof.widest_domain_fit} "
                f"of its {proof.members} members of {shape} fit in one "
                f"{proof.required_level}")
    notes = f" ({'; '.join(proof.notes)})" if proof.notes else ""
    return (f"does not fit even on the empty cluster: {proof.free_units} of its "
            f"{proof.members} member(s) of {shape} fit on the {proof.eligible_nodes} node(s) "
            f"they may use, all empty{notes}")


def _search(st: CoreState, pre: Preemptor, view: CapacityView, off: bool
            ) -> Generator[Step, object, object]:
    """The victim search the held-gang sweep would run: slice by slice on the live view,
    or, for a big unit, its candidates listed here in slices and the search itself run off
    the loop on the snapshot (its pieces plan the unit over whole domains)."""
    if off:
        steps = candidate_steps(st, pre.priority)
        try:
            while True:
                next(steps)
                yield None
        except StopIteration as listed:
            candidates = listed.value
        levels = st.settings.levels
        return (yield Offload(lambda: VictimSearch(pre, candidates, view, levels)
                              .advance(None)))
    search = VictimSearch(pre, lambda: candidate_steps(st, pre.priority), view,
                          st.settings.levels)
    while isinstance(got := search.advance(SLICE), Unfinished):
        yield None
    return got


def _no_fit(st: CoreState, unit: Unit, view: CapacityView, now: float, nofit: NoFit,
            pre: Preemptor, short: NotEnoughMinResources | None,
            reserving: tuple[GangKey, ...] = ()) -> Steps:
    """Fits after preemption, waits, or never fits. ``view`` is a snapshot for a big unit:
    then the work is offloaded. ``reserving``: the proposal's gangs admitted before it."""
    n, is_gang, levels = len(unit.pods), unit.gang is not None, st.settings.levels
    off = isinstance(view, SnapshotView)
    proof = yield from _maybe_off(off, lambda: never(pre.members, view, levels, pre.required))
    if isinstance(proof, NoFit):  # no eviction helps: no victim search
        return Outcome(unit.name, is_gang, Verdict.NEVER, n, why=_never_why(proof))
    yield None
    found: object = None
    if st.settings.preemption:
        found = yield from _search(st, pre, view, off)
    if isinstance(found, Victims) and short is None:
        gpus = sum(r.get(GPU, 0) for r in found.freed.values())
        out = _fits(st, unit, found.plan, pin=False)
        return replace(out, verdict=Verdict.PREEMPTS, victims=VictimSet(
            found.gangs, found.pods, len(found.evict), gpus))
    why = describe(found) if found is not None and not isinstance(found, Victims) else ""  # type: ignore[arg-type]
    reason: GangReason | None = short
    if reason is None and unit.gang is not None:
        held = tuple(sorted({*st.ledger.reserving_gangs(unit.gang), *reserving}))
        reason = DoesNotFit(unit.gang, nofit, held, why)
    more = hints(pre.members, view, levels, pre.required, nofit)
    if isinstance(found, NoLowerPriority) and pre.quota:
        more.append(f"lower-priority pods in its quota line {pre.quota} (preemption never "
                    "evicts across quota lines; Kueue preempts for quota itself)")
    if isinstance(found, PolicyNever):
        more.append("preemptionPolicy other than Never, to evict lower-priority work")
    yield None
    events = known_events(st, now)
    first = yield from _maybe_off(off, lambda: earliest_of(events, pre.members, view, levels,
                                                           pre.required, now))
    assert first is None or isinstance(first, Earliest)
    return Outcome(unit.name, is_gang, Verdict.WAITS, n, reason=reason, nofit=nofit, why=why,
                   hints=tuple(more), earliest=first)
