"""Gang admission: a gang is planned whole and reserved at once, or told why not.

Admission in Kueue's and Volcano's sense (a gang let into reserved capacity), not Kubernetes'
admission webhook, which is the placement-at-creation wing (``creation/``).

Deadlock freedom comes from here: a gang is admitted only when all of it fits in capacity no
other gang holds, and an admitted gang always holds a whole plan. A lost member or node is
re-placed at once (:func:`complete_plan`, :func:`replan`), or the gang gives everything back
(:func:`fall_back`). Each function decides and reserves in one synchronous block, which is
what makes admission atomic under asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..actions import FilterDecision, NoticeKind, Unparked
from ..corestate import CoreState
from ..defrag.carry import try_defrag
from ..devices.align import align
from ..devices.budget import Budget as DeviceBudget
from ..devices.demand import CLAIMS_FIELD, pod_demand
from ..devices.room import record
from ..placement.planner import Member, Plan, plan_gang
from ..placement.subgroups import Part, plan_subgroups
from ..podgroup import GangKey, GangSpec, InvalidGang, MatchPolicy
from ..preemption.carry import blocked, preempting_reason, try_preempt, victims_hold
from ..preemption.inflight import PreemptorId
from ..reasons import (
    BackingOff,
    DevicesNotReady,
    DoesNotFit,
    ExtraMemberWaits,
    GangReason,
    HigherPriorityPodsWaiting,
    InvalidDeclaration,
    MembersLost,
    NoFit,
    NotEnoughMinResources,
    PlannedNodeLost,
    WaitingForMembers,
)
from ..records import NodeName, PodKey, PodRecord
from ..resources import Resources, add, fits, sub
from ..state.gang import Gang, GangPhase
from ..topology.domains import GPU, Level, level_by_name
from ..topology.eligibility import eligible
from .gating import pinned_node
from .membership import (
    countable,
    departed,
    meets_quorum,
    part_of,
    pick,
    subgroup_short,
    whole_members,
)
from .queue_gate import queue_gate

__all__ = [
    "TOPOLOGY_REQUIRED",
    "admit",
    "admit_by_preemption",
    "admit_subgroup",
    "devices_ready",
    "extend",
    "fall_back",
    "free_outside_reservations",
    "levels_for",
    "outranked",
    "pinned_pending",
    "plan_members",
    "reconcile",
    "replan",
    "try_admit",
    "turn_away",
    "yield_to_higher_priority",
]

TOPOLOGY_REQUIRED = "lockstep.dev/topology-required"


def reconcile(st: CoreState, g: Gang) -> None:
    """Bring the gang's phase back in line with its members after any change."""
    spec = g.spec
    live = st.live(g)
    held = [p.key for p in live if p.gated]
    if held:
        st.creation.gated.touched.add(g.key)
        st.outbox.lift.update(held)
    elif g.phase is GangPhase.WAITING and any(pinned_pending(p) for p in live):
        st.creation.gated.touched.add(g.key)  # pinned at creation or lifted: the sweep admits it
    if spec is None:
        if g.phase in (GangPhase.ADMITTED, GangPhase.RELEASED):
            fall_back(st, g, MembersLost(g.key, len(live), 0, ("no valid declaration",)))
        return
    bound = [p.key for p in live if p.node_name is not None]
    if g.phase is GangPhase.RELEASED:
        if spec.match_policy is MatchPolicy.ONCE_SATISFIED:
            return  # Koordinator: once satisfied, later members are plain pods
        if spec.subgroups:
            drop_partial(st, g, spec, live)
        held = [p.key for p in live
                if p.node_name is not None or p.key in g.binding or p.key in g.plan]
        if not meets_quorum(st, spec, held):
            fall_back(st, g, MembersLost(g.key, len(live), spec.min_member,
                                         departed(g, live)))
    elif g.phase is GangPhase.ADMITTED:
        complete_plan(st, g, spec, live, bound)
        if spec.subgroups and g.phase is GangPhase.ADMITTED:
            drop_partial(st, g, spec, live)
            if not meets_quorum(st, spec, [*g.plan, *bound]):
                fall_back(st, g, MembersLost(g.key, len(live), spec.min_member,
                                             departed(g, live)))
    elif bound and meets_quorum(st, spec, bound):
        g.satisfied()
    elif meets_quorum(st, spec, countable(spec, live)) \
            and isinstance(g.reason, WaitingForMembers):
        # Enough members now: wake those turned away for being too few, so admission
        # does not wait for the newest member (kube-scheduler may never send it to us).
        g.reason = None
        st.outbox.requeue.update(g.wake())


def drop_partial(st: CoreState, g: Gang, spec: GangSpec, live: list[PodRecord]) -> None:
    """A group of groups never holds part of a subgroup: the slots of a subgroup whose
    bound members and slots fell below its minimum (a member with a slot left) are given
    back, bindings in flight aside. Its members are placed again, whole, when enough of
    them exist (:func:`admit_subgroup`)."""
    held: dict[GangKey | None, int] = {}
    for p in live:
        if p.node_name is not None or p.key in g.plan:
            part = part_of(st, p.key)
            held[part] = held.get(part, 0) + 1
    mins = {s.key: s.min_member for s in spec.subgroups}
    for k in [k for k in g.plan if k not in g.binding]:
        part = part_of(st, k)
        if part in mins and held.get(part, 0) < mins[part]:
            g.drop_slot(k)


def plan_members(st: CoreState, g: Gang, members: Sequence[Member], required: Level | None,
                 fixed: Mapping[PodKey, NodeName]) -> Plan | NoFit:
    """The planner's answer for ``members`` beside ``fixed``: a flat gang's by the planner
    alone (its cost unchanged); a group of groups' subgroup by subgroup, each in its own
    tightest domain (``placement.subgroups``), every member beside its subgroup's bound
    and planned members. A group whose members have DRA claims is planned as one gang."""
    spec, levels = g.spec, st.settings.levels
    if spec is None or not spec.subgroups or any(m.pod.claims for m in members):
        return plan_gang(members, st.capacity, levels, required=required, fixed=fixed)
    beside = dict(fixed)
    for p in st.live(g):
        if p.node_name is not None:
            beside.setdefault(p.key, p.node_name)
    by_part: dict[GangKey | None, list[Member]] = {}
    for m in members:
        by_part.setdefault(part_of(st, m.key), []).append(m)
    for k in beside:
        if (part := part_of(st, k)) in by_part and (pod := st.store.pods.get(k)) is not None:
            by_part[part].append(Member(pod))
    parts = [Part(s, level_by_name(levels, s.topology) if s.topology else None,
                  by_part[s.key]) for s in spec.subgroups if s.key in by_part]
    reserved = st.ledger.reserved_on
    result = plan_subgroups(
        parts, st.capacity, levels, required=required, fixed=beside,
        occupied=lambda n: bool(st.store.gpu_pods.get(n)) or any(
            v > 0 for v in reserved(n).values()))
    if isinstance(result, NoFit):
        return result
    keep = {m.key for m in members} | set(fixed)
    return Plan({k: n for k, n in result.assignments.items() if k in keep}, result.level,
                result.domain)


def admit_subgroup(st: CoreState, g: Gang, pod: PodRecord, candidates: Sequence[NodeName]
                   ) -> FilterDecision | None:
    """A group of groups already admitted or released: ``pod``'s subgroup, when its bound
    members and slots are fewer than its minimum, is placed whole and alone (an elastic
    subgroup beyond ``min_parts``, or one recreated), or turned away whole; None when the
    subgroup is whole already (``pod`` is an extra, as in any gang)."""
    spec = g.spec
    part = part_of(st, pod.key)
    sub = next((s for s in spec.subgroups if s.key == part), None) if spec else None
    if spec is None or sub is None:
        return None
    mine = [p for p in st.live(g) if part_of(st, p.key) == part]
    held = [p.key for p in mine if p.node_name is not None or p.key in g.plan]
    if len(held) >= sub.min_member:
        return None
    pending = [p for p in mine if p.node_name is None and p.key not in g.plan]
    if len(held) + len(pending) < sub.min_member:
        return FilterDecision([], unresolvable=turn_away(st, pod.key, g, WaitingForMembers(
            sub.key, len(held) + len(pending), sub.min_member)))
    required, _ = levels_for(st, g)
    members = [Member(pod, frozenset(candidates))]
    members += [Member(p) for p in pending if p.key != pod.key]
    result = plan_members(st, g, members, required, dict(g.plan))
    if isinstance(result, NoFit):
        return FilterDecision([], unresolvable=turn_away(
            st, pod.key, g, DoesNotFit(sub.key, result, st.ledger.reserving_gangs(g.key))))
    for m in members:
        g.add_slot(m.key, result.assignments[m.key], m.pod.requests)
    record(st.devices, result.devices)
    st.outbox.requeue.update(k for k in g.wake() if k != pod.key)
    st.outbox.lift.update(p.key for p in pending if p.gated)
    return FilterDecision([result.assignments[pod.key]])


def complete_plan(st: CoreState, g: Gang, spec: GangSpec, live: list[PodRecord],
                  bound: list[PodKey]) -> None:
    """An admitted gang holds a whole plan, or nothing: a member that left is replaced by
    one without a slot, and a slot that was lost is placed again."""
    if not meets_quorum(st, spec, countable(spec, live)):
        fall_back(st, g, MembersLost(g.key, len(live), spec.min_member, departed(g, live)))
        return
    have = list(g.plan)
    if spec.match_policy is not MatchPolicy.ONLY_WAITING:
        have += bound
    todo = [p.key for p in live if p.node_name is None and p.key not in g.plan]
    chosen = pick(st, spec, have, todo)
    if chosen == []:
        return
    result: Plan | NoFit = NoFit(spec.min_member - len(have), {}, 0, 0)
    if chosen is not None:
        required, _ = levels_for(st, g)
        result = plan_members(st, g, [Member(st.store.pods[k]) for k in chosen], required,
                              dict(g.plan))
    if isinstance(result, NoFit):
        fall_back(st, g, DoesNotFit(g.key, result, st.ledger.reserving_gangs(g.key)))
        return
    for key, node in result.assignments.items():
        if key not in g.plan:
            g.add_slot(key, node, st.store.pods[key].requests)


def pinned_pending(pod: PodRecord) -> bool:
    """A member kube-scheduler cycles on one node: pinned (at creation or by a lift) and
    not bound. A restarted Lockstep re-admits its gang from the pins, not the filter call."""
    return pod.node_name is None and not pod.gated and pod.required_affinity != () \
        and pinned_node(pod.required_affinity) is not None


def fall_back(st: CoreState, g: Gang, reason: GangReason) -> None:
    """Give back everything the gang holds and answer its parked calls with ``reason``."""
    parked = st.waiting.pop_gang(g.key)
    if parked:
        st.outbox.unparked.append(Unparked(g.key, parked, reason))
    g.fall_back(reason)
    st.notice(NoticeKind.WAITING, g.key, sorted(g.members), reason)


def turn_away(st: CoreState, pod: PodKey, g: Gang, reason: GangReason) -> GangReason:
    """Record why ``pod`` waits, telling it by an Event only when the reason changed."""
    # The Event goes to the pod turned away, not to every member: a gang of N arriving
    # one by one would otherwise cost N^2 Events (kube-scheduler's FailedScheduling
    # Event on each pod carries the same reason anyway).
    told = g.told.get(pod)
    if told != reason and not (isinstance(told, BackingOff)
                               and isinstance(reason, BackingOff)):
        st.notice(NoticeKind.WAITING, g.key, (pod,), reason)
        g.told[pod] = reason
    g.reason = reason
    return reason


def levels_for(st: CoreState, g: Gang) -> tuple[Level | None, GangReason | None]:
    """The topology level the gang must fit in, or why its declaration is unusable."""
    levels = st.settings.levels
    for s in g.spec.subgroups if g.spec is not None else ():
        if s.topology is not None and level_by_name(levels, s.topology) is None:
            names = ", ".join(lv_.name for lv_ in levels)
            return None, InvalidDeclaration(InvalidGang(
                s.key, "subgroup topology", s.topology, f"unknown level (known: {names})"))
    if g.spec is not None and g.spec.topology is not None:  # upstream, checked on resolve
        lv = level_by_name(levels, g.spec.topology)
        if lv is not None:
            return lv, None
    for k in sorted(g.members):
        p = st.store.pods.get(k)
        if p is None:
            continue
        want = p.annotations.get(TOPOLOGY_REQUIRED)
        if want:
            lv = level_by_name(levels, want)
            if lv is None:
                names = ", ".join(lv_.name for lv_ in levels)
                return None, InvalidDeclaration(InvalidGang(
                    g.key, TOPOLOGY_REQUIRED, want, f"unknown level (known: {names})"))
            return lv, None
    return None, None


def free_outside_reservations(st: CoreState) -> Resources:
    """The cluster's free capacity that no gang holds, summed over every node."""
    total: Resources = {}
    for n in st.store.nodes:
        total = add(total, {k: max(0, v) for k, v in st.capacity.free_for_gang(n).items()})
    return total


def admit(st: CoreState, g: Gang, spec: GangSpec, pod: PodRecord,
          candidates: Sequence[NodeName], live: list[PodRecord], now: float) -> FilterDecision:
    """A member's filter call admits its gang: exactly its planned node, or why not."""
    outcome = try_admit(st, g, spec, live, now, pod, candidates)
    if not isinstance(outcome, dict):
        return FilterDecision([], unresolvable=turn_away(st, pod.key, g, outcome))
    node = outcome[pod.key]
    if node not in candidates and (waits := preempting_reason(st, g)) is not None:
        # Admitted by a preemption onto a node its victims still hold.
        return FilterDecision([], unresolvable=turn_away(st, pod.key, g, waits))
    if (waits := victims_hold(st, g, node)) is not None:
        # kube-scheduler found room there, but not counting all its holders.
        return FilterDecision([], unresolvable=turn_away(st, pod.key, g, waits))
    if (short := devices_ready(st, g, pod, node)) is not None:
        return FilterDecision([], unresolvable=turn_away(st, pod.key, g, short))
    return FilterDecision([node])



def claims_problem(st: CoreState, g: Gang, live: Sequence[PodRecord]
                   ) -> InvalidDeclaration | None:
    """A member whose DRA claims cannot be planned (an unknown class or template, a
    selector that does not compile, a number over its limit): the gang is invalid until it
    is fixed, with the reason naming the field. Looked at again when devices change.
    Compiling the members' selectors shares one work budget: what it leaves uncompiled is
    compiled by the next calls (a member deferred so is no problem; the plan says why)."""
    budget = DeviceBudget()
    for p in live:
        if p.claims and isinstance(why := pod_demand(st.devices, p, budget), str):
            return InvalidDeclaration(InvalidGang(g.key, f"{p.key} {CLAIMS_FIELD}", "", why))
    return None


def devices_ready(st: CoreState, g: Gang, pod: PodRecord, node: NodeName
                  ) -> DevicesNotReady | None:
    """None when kube-scheduler's first fit on ``node`` gives ``pod`` devices its plan can
    take (``coscheduling.devices.align``); else why the member waits."""
    if not pod.claims:
        return None
    why = align(st.devices, st.store.nodes, st.store.pods, st.ledger.get,
                lambda p: r.gang if (r := st.ledger.get(p)) is not None else "?", pod, node)
    return DevicesNotReady(g.key, pod.key, why) if why is not None else None


def try_admit(st: CoreState, g: Gang, spec: GangSpec, live: list[PodRecord], now: float,
              pod: PodRecord | None = None, candidates: Sequence[NodeName] = (),
              may_preempt: bool = True) -> dict[PodKey, NodeName] | GangReason:
    """Plan the whole gang and reserve the plan, or say why not.

    ``pod`` is the member whose filter call asks (limited to kube-scheduler's
    ``candidates``); without one, the gang's members are held behind Lockstep's gate and
    every node Lockstep knows is a candidate. ``may_preempt`` is False for a gang planned
    at its first member's creation: nothing is evicted for members that may never come."""
    required, bad = levels_for(st, g)
    if bad is not None:
        return bad
    if (waits_for := blocked(st, g)) is not None:
        return waits_for
    if (queue_says := queue_gate(st, g, spec, live)) is not None:
        return queue_says  # a Volcano gang whose queue is closed, missing or full
    if (bad_claims := claims_problem(st, g, live)) is not None:
        return bad_claims
    short: NotEnoughMinResources | None = None
    if spec.min_resources:
        total = free_outside_reservations(st)
        if not fits(spec.min_resources, total):
            short = NotEnoughMinResources(g.key, spec.min_resources, total)
            # Evictions may free the room (the filter path reaches preemption through
            # admit_by_preemption; a gated gang only through here), but only for a gang
            # whose minResources would fit once every lower-priority pod were gone.
            if not may_preempt or not st.settings.preemption \
                    or not fits(spec.min_resources, add(total, _preemptible(st, g))):
                return short
    # Bindings still in flight from before a fall-back keep their slots: fixed.
    fixed = {k: n for k, n in g.plan.items() if k in g.binding}
    have = list(fixed)
    if spec.match_policy is not MatchPolicy.ONLY_WAITING:
        have += [p.key for p in live if p.node_name is not None]
    members = [Member(pod, frozenset(candidates))] if pod is not None else []
    members += [Member(p) for p in live
                if (pod is None or p.key != pod.key) and p.node_name is None
                and p.key not in fixed]
    if spec.subgroups:
        # A group of groups plans whole subgroups only: a member of one short of its
        # minimum waits for it (planning it would bind part of a subgroup).
        whole = set(whole_members(st, spec, have, [m.key for m in members]))
        if pod is not None and pod.key not in whole:
            part = subgroup_short(st, spec, pod.key, [*have, *(m.key for m in members)])
            return WaitingForMembers(*part) if part is not None \
                else WaitingForMembers(g.key, len(live), spec.min_member)
        members = [m for m in members if m.key in whole]
    result = plan_members(st, g, members, required, fixed)
    if isinstance(result, NoFit):
        # All of them do not fit: a quorum might (the asking pod always among them).
        chosen = pick(st, spec, have, [m.key for m in members])
        if chosen and (pod is None or chosen[0] == pod.key) and len(chosen) < len(members):
            keep = set(chosen)
            result = plan_members(st, g, [m for m in members if m.key in keep], required,
                                  fixed)
    timeout = spec.timeout_seconds
    if short is not None and not isinstance(result, NoFit):
        return short  # the members fit, but the group asks for more than is free
    if isinstance(result, NoFit):
        if fixed or not may_preempt:  # in-flight bindings' leftovers are planned first
            return short or DoesNotFit(g.key, result, st.ledger.reserving_gangs(g.key))
        chosen = pick(st, spec, have, [m.key for m in members]) or [m.key for m in members]
        found = try_preempt(st, g, [st.store.pods[k] for k in chosen], required, now)
        if found is None or isinstance(found, str):  # no victims: moving pods may help
            found = try_defrag(st, g, [st.store.pods[k] for k in chosen], required, now, found)
        if isinstance(found, Plan):
            result = found
            if (rec := st.preemption.inflight.get(PreemptorId.of_gang(g.key))) is not None:
                timeout += max(0.0, rec.deadline - now)  # the victims' grace comes first
        elif found is None or isinstance(found, str):
            return short or DoesNotFit(g.key, result, st.ledger.reserving_gangs(g.key),
                                       found or "")
        else:
            return found
    requests = {k: st.store.pods[k].requests for k in result.assignments}
    if (st.preemption.inflight.get(PreemptorId.of_gang(g.key)) is None
            and (waits := outranked(st, g, result.assignments, requests)) is not None):
        return waits
    g.admit(result.assignments, requests, result.level, now, timeout)
    record(st.devices, result.devices)
    first = pod.key if pod is not None else (members[0].key if members else live[0].key)
    # One Event per admission, on the member whose filter call admitted the gang.
    st.notice(NoticeKind.ADMITTED, g.key, (first,), detail=_plan_text(result))
    # Members turned away earlier sit in kube-scheduler's unschedulable queue and no
    # API event will wake them: ask the app to nudge them. Gated members lose the gate.
    st.outbox.requeue.update(k for k in g.wake() if k != first or pod is None)
    st.outbox.lift.update(p.key for p in live if p.gated)
    return result.assignments


def admit_by_preemption(st: CoreState, g: Gang, live: list[PodRecord], now: float) -> bool:
    """Admit a waiting gang whose members kube-scheduler found no node for by its own
    filters (so no filter call reaches Lockstep) into room a preemption frees. Says whether
    the gang is admitted (its members are woken once the victims are gone).

    Only for a gang that does not fit Lockstep's view either: one that does was turned
    away by something Lockstep does not model, which no eviction would fix."""
    spec = g.spec
    if spec is None or g.phase is not GangPhase.WAITING or g.binding or g.plan:
        return False
    if not meets_quorum(st, spec, countable(spec, live)):
        return False
    required, bad = levels_for(st, g)
    if bad is not None or blocked(st, g) is not None:
        return False
    if queue_gate(st, g, spec, live) is not None:
        return False  # no eviction for a gang its Volcano queue holds back
    pending = [p for p in live if p.node_name is None and not p.gated]
    have = [p.key for p in live if p.node_name is not None] \
        if spec.match_policy is not MatchPolicy.ONLY_WAITING else []
    todo = [p.key for p in pending]
    if spec.subgroups:
        todo = whole_members(st, spec, have, todo)
    chosen = pick(st, spec, have, todo) or todo
    members = [st.store.pods[k] for k in chosen]
    nofit = plan_gang([Member(p) for p in members], st.capacity, st.settings.levels,
                      required=required)
    if not isinstance(nofit, NoFit):
        return False
    found = try_preempt(st, g, members, required, now)
    if found is None or isinstance(found, str):  # no victims: moving pods may help
        found = try_defrag(st, g, members, required, now, found)
    if not isinstance(found, Plan):
        if isinstance(found, str):
            g.reason = DoesNotFit(g.key, nofit, st.ledger.reserving_gangs(g.key), found)
        return False
    rec = st.preemption.inflight.get(PreemptorId.of_gang(g.key))
    timeout = spec.timeout_seconds + (max(0.0, rec.deadline - now) if rec is not None else 0.0)
    requests = {k: st.store.pods[k].requests for k in found.assignments}
    g.admit(found.assignments, requests, found.level, now, timeout)
    record(st.devices, found.devices)
    st.notice(NoticeKind.ADMITTED, g.key, (members[0].key,), detail=_plan_text(found))
    return True


def _preemptible(st: CoreState, g: Gang) -> Resources:
    """What every pod strictly below ``g`` holds, each measured as preemption measures it
    (:meth:`~coscheduling.corestate.CoreState.unit_priority`): the most evictions could free
    for ``g``. An upper bound, cheap (one pass over the pods), used only to refuse a
    preemption that could never make a group's ``minResources`` fit."""
    below = st.gang_priority(g)
    prio: dict[GangKey, int] = {}
    total: Resources = {}
    for p in st.store.pods.values():
        if p.holds_capacity and p.node_name is not None \
                and st.unit_priority(p, prio) < below:
            total = add(total, p.requests)
    return total


MAX_OUTRANKING_CHECKED = 64
"""Above this many higher-priority pods in flight the gang simply waits for them: checking
where each would fit costs a pass over the nodes per pod, and they are placed in seconds."""


def outranked(st: CoreState, g: Gang, plan: Mapping[PodKey, NodeName],
               requests: Mapping[PodKey, Resources]) -> HigherPriorityPodsWaiting | None:
    """Why the gang must wait for pods of higher priority outside any gang, or None when
    they all still fit beside ``plan``.

    kube-scheduler's queue pops the higher-priority pods first; admitting the gang onto the
    room they need would make the outcome depend on which event reached Lockstep first.
    Pods kube-scheduler is placing now make the gang wait when they would not fit beside the
    plan; pods it found no node for make it wait only when the plan takes room they would
    fit in (one that fits nowhere either way must not hold the gang back for ever)."""
    priority = st.gang_priority(g)
    placing = [k for k, p in st.plain.pending.items() if p > priority]
    # Of the pods kube-scheduler found no node for, those Lockstep's filter turned away
    # for a reservation: the room they need is a gang's (others are held back by
    # something no reservation changes, and must not hold a gang back).
    found_none = [k for k, p in st.preemption.unschedulable_plain.items() if p > priority
                  and (v := st.plain.verdicts.get(k)) is not None and v.refused]
    if not placing and not found_none:
        return None
    pods = sorted((pod for k in (*placing, *found_none) if (pod := st.store.pods.get(k))),
                  key=lambda p: (-p.priority, -p.requests.get(GPU, 0), p.key))
    if len(pods) > MAX_OUTRANKING_CHECKED:
        return HigherPriorityPodsWaiting(g.key, priority, tuple(p.key for p in pods[:5]),
                                         len(pods))
    own = _own_room(st, g)  # as if the gang gave back what it holds already
    taken: dict[NodeName, Resources] = {}
    for key, node in plan.items():
        taken[node] = add(taken.get(node, {}), requests[key])
    base = {n: add(st.capacity.free_for_gang(n), own.get(n, {})) for n in st.store.nodes}
    beside = {n: sub(base[n], taken.get(n, {})) for n in base}
    stuck_beside = _stuck(st, pods, beside)
    stuck_alone = _stuck(st, pods, base) if stuck_beside else set()
    pending = set(placing)
    waiting_for = [p for p in pods if p.key in stuck_beside
                   and (p.key in pending or p.key not in stuck_alone)]
    if not waiting_for:
        return None
    return HigherPriorityPodsWaiting(g.key, priority, tuple(p.key for p in waiting_for[:5]),
                                     len(waiting_for))


def _own_room(st: CoreState, g: Gang) -> dict[NodeName, Resources]:
    """What ``g`` holds on each node (its reservation, counted as free to test giving it
    back)."""
    out: dict[NodeName, Resources] = {}
    for key, node in g.plan.items():
        slot = st.ledger.get(key)
        if slot is not None:
            out[node] = add(out.get(node, {}), slot.requests)
    return out


def _stuck(st: CoreState, pods: list[PodRecord], free: dict[NodeName, Resources]
           ) -> set[PodKey]:
    """The pods of ``pods`` (in order, each on the first node it fits) left without room."""
    return _place(st, pods, free)[0]


def _place(st: CoreState, pods: list[PodRecord], free: dict[NodeName, Resources]
           ) -> tuple[set[PodKey], dict[NodeName, Resources]]:
    """Place ``pods`` in order, each on the first node it fits: those left without room, and
    the room left on each node."""
    free = dict(free)
    stuck: set[PodKey] = set()
    for pod in pods:
        at = next((n for n, left in free.items()
                   if fits(pod.requests, left) and eligible(pod, st.store.nodes[n])), None)
        if at is None:
            stuck.add(pod.key)
        else:
            free[at] = sub(free[at], pod.requests)
    return stuck, free


def yield_to_higher_priority(st: CoreState) -> list[GangKey]:
    """Admitted gangs none of whose members is bound (nor binding, nor admitted by a
    preemption of their own) give their reservation back when a pod of higher priority
    outside any gang needs that room: nothing is evicted, the gang waits (its members gated
    or on their pins) and is planned again once those pods are placed.

    A gang admitted at its members' creation, or while those pods were not in the watch
    yet, would otherwise bind and then be evicted whole for them. The pods are placed once
    on the room no reservation holds (at most ``MAX_OUTRANKING_CHECKED`` of them); only when
    some find none is each yielding candidate's own room tried for them, lowest priority
    first, so a sweep costs one pass over the nodes and a look at each candidate's few
    nodes. Says which gangs yielded; the pods they yielded to are woken (no API event would
    tell kube-scheduler)."""
    if not st.plain.pending and not st.preemption.unschedulable_plain:
        return []
    gangs = sorted(((st.gang_priority(g), g) for g in st.gangs.values()
                    if g.phase is GangPhase.ADMITTED and g.plan and not g.binding
                    and preempting_reason(st, g) is None
                    and not any(p.node_name is not None for p in st.live(g))),
                   key=lambda t: (t[0], t[1].key))
    if not gangs:
        return []
    low = gangs[0][0]
    keys = [k for k, p in st.plain.pending.items() if p > low]
    keys += [k for k, p in st.preemption.unschedulable_plain.items() if p > low
             and (v := st.plain.verdicts.get(k)) is not None and v.refused]
    pods = sorted((pod for k in keys if (pod := st.store.pods.get(k))),
                  key=lambda p: (-p.priority, -p.requests.get(GPU, 0), p.key)
                  )[:MAX_OUTRANKING_CHECKED]
    if not pods:
        return []
    stuck_keys, left = _place(st, pods, {n: st.capacity.free_for_gang(n)
                                         for n in st.store.nodes})
    stuck = [p for p in pods if p.key in stuck_keys]
    out = []
    for priority, g in gangs:
        own = _own_room(st, g)
        helped = next((p for p in stuck if p.priority > priority and any(
            fits(p.requests, add(left.get(n, {}), room)) and eligible(p, st.store.nodes[n])
            for n, room in own.items() if n in st.store.nodes)), None)
        if helped is None:
            continue
        waiting = [p.key for p in stuck if p.priority > priority]
        reason = HigherPriorityPodsWaiting(g.key, priority, tuple(waiting[:5]), len(waiting))
        fall_back(st, g, reason)
        g.reason = reason
        for n, room in own.items():
            left[n] = add(left.get(n, {}), room)
        stuck.remove(helped)
        st.outbox.requeue.update(k for k, p in st.preemption.unschedulable_plain.items()
                                 if p > priority)
        out.append(g.key)
        if not stuck:
            break
    return out


def extend(st: CoreState, g: Gang, pod: PodRecord, candidates: Sequence[NodeName]
           ) -> FilterDecision:
    """An admitted gang's plan is whole; this pod is an extra beyond minMember."""
    if g.spec is not None and (full := queue_gate(st, g, g.spec, (), pod.requests)) is not None:
        return FilterDecision([], unresolvable=full)  # its Volcano queue has no room for it
    if g.spec is not None and g.spec.subgroups \
            and (whole := admit_subgroup(st, g, pod, candidates)) is not None:
        return whole  # a subgroup beyond the plan: placed whole, or waits whole
    required, _ = levels_for(st, g)
    result = plan_members(st, g, [Member(pod, frozenset(candidates))], required,
                          dict(g.plan))
    if isinstance(result, NoFit):
        return FilterDecision([], unresolvable=ExtraMemberWaits(g.key, len(g.plan)))
    node = result.assignments[pod.key]
    g.add_slot(pod.key, node, pod.requests)
    record(st.devices, result.devices)
    return FilterDecision([node])


def replan(st: CoreState, g: Gang, pod: PodRecord, candidates: Sequence[NodeName]
           ) -> FilterDecision:
    """The planned node is no longer a candidate: move this member, or give all back."""
    lost = g.drop_slot(pod.key)
    assert lost is not None
    required, _ = levels_for(st, g)
    result = plan_members(st, g, [Member(pod, frozenset(candidates))], required,
                          dict(g.plan))
    if isinstance(result, NoFit):
        reason = PlannedNodeLost(g.key, lost, result)
        if g.phase is GangPhase.ADMITTED:
            fall_back(st, g, reason)
        else:
            reconcile(st, g)
        return FilterDecision([], unresolvable=turn_away(st, pod.key, g, reason))
    node = result.assignments[pod.key]
    g.add_slot(pod.key, node, pod.requests)
    record(st.devices, result.devices)
    return FilterDecision([node])


def _plan_text(plan: Plan) -> str:
    nodes = sorted(set(plan.assignments.values()))
    where = f"one {plan.level}" if plan.level else "spread"
    listed = ", ".join(nodes[:8])
    return f"{len(plan.assignments)} members on {len(nodes)} node(s), {where}: {listed}"
