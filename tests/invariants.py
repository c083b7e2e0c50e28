"""The gang promises as a checker: run after every step of the model test.

:func:`check_invariants` raises :class:`InvariantBroken` naming the first broken rule:

1. reservations equal the plans, pod by pod, and the per-node totals are their sum;
2. no node's bound usage plus reservations exceeds its allocatable (for what is reserved);
3. only ADMITTED and RELEASED gangs hold slots (a gang that fell back keeps only in-flight
   bindings), each slot is a live, unbound member of that gang on a node that exists, and an
   ADMITTED gang's slots plus bound members cover ``minMember`` (a whole plan, never part);
4. every parked call belongs to an ADMITTED gang and sits on its planned node;
5. the derived caches equal a fresh computation (plain-pod scores, free GPUs, topology
   domains);
6. a member pinned to a node (Lockstep lifted its gate) is only ever planned on that node,
   and no gated member (its gate still on) is parked;
7. preemptions in flight evict only strictly lower priorities, and victim gangs whole; room
   nominated to a plain pod that preempted is held only for a pending plain pod (and counts
   under 2 with the reservations);
8. what the Volcano gangs of a queue hold (reservations and bound members) stays within the
   queue's capability, for each resource it names (a capability lowered under running
   gangs would break this by the user's hand: the model only raises it);
9. a member pinned at creation that the watch has not shown is not created yet in the core's
   view either (no UID);
10. no empty gang survives a step: every gang the core keeps has a member that exists (a pod
    the API server holds, or one pinned at creation whose creation is still in flight: its
    provisional deadline, when ``now`` is given, not passed yet);
11. nothing is reserved for a gang none of whose members exists: ledger reservations
    (a preemption's held room among them) and provisional pins both count;
12. victims are compared with their preemptor by one measure: a victim gang whose group
    names a priority (an upstream PodGroup's ``priority``, a Volcano or upstream PodGroup's
    ``priorityClassName``) is below the preemptor by that priority, not by its pods'; a
    member whose binding is in flight counts as bound (a victim gang is evicted whole with
    it, or not at all); a gang told it is preempting waits on a preemption of its own (not
    on a plain pod's of the same namespace/name);
13. a slot sits on a node the member may run on (its nodeSelector and required affinity
    admit the node: a pin another webhook's nodeSelector excludes holds nothing);
14. a member whose binding is in flight holds its slot until the watch shows it bound (or
    Lockstep assumes it bound) or the binding fails, even when its node was deleted: a bind
    POST to a node created again under that name succeeds, so the room is never planned
    for another gang meanwhile (rules 3 and 13 let such a slot sit on a missing node);
19. a group of groups never holds part of a subgroup (a subgroup with a slot has its
    minimum among its bound members and slots), and a released one holds its minimum of
    whole subgroups (:func:`subgroup_binding_problems` is the same rule over recorded
    bindings, for the e2e binding recorder).
20. pods moved to make room for a gang (defragmentation) are plain pods a controller
    recreates, at or below the gang's priority, never moved twice, never against a budget
    that allows no disruption, each with room for its replacement reserved on another node
    (:func:`_check_moves`; rule 2 counts that room with the reservations).

:func:`check_rank_order` holds rule 18, of each plan as the planner makes it (the model test
checks every plan its runs make): ranked members that may swap slots stand in topology order,
on the same nodes in the same counts. It is a promise of one plan: a member planned later on
its own (an extra, a lost slot placed again, one kube-scheduler narrowed to one node) takes
the node it is given, so a gang's plan as a whole need not stay in rank order.

:func:`check_fenced` holds rule 17, of two replicas: no write of a deposed replica reaches
the API server once the standby may hold the Lease (one replica acts at a time), however
long the write waited in the client (the model test's failover).

:func:`cluster_facts` is what a core rebuilt from the same API-server state must agree on
(each gang's priority among it: a group object's priority edited away must not linger).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from coscheduling.core import Coscheduler
from coscheduling.defrag.movable import RECREATING_KINDS
from coscheduling.devices.model import Claim, DeviceId
from coscheduling.devices.room import held_devices
from coscheduling.gang.gating import pinned_node
from coscheduling.gang.queue_gate import holds, queue_of
from coscheduling.placement.member import Member
from coscheduling.placement.rankorder import interchangeable, slot_key
from coscheduling.podgroup import MatchPolicy
from coscheduling.reasons import Preempting
from coscheduling.records import GangKey, NodeName, NodeRecord, PodKey, PodRecord
from coscheduling.resources import Resources, add, sub
from coscheduling.state.gang import Gang, GangPhase
from coscheduling.state.ledger import LedgerDrift, check_ledger
from coscheduling.topology.domains import Level, domain_of
from coscheduling.topology.eligibility import eligible
from tests.internals import state_of

__all__ = ["InvariantBroken", "check_devices", "check_fenced", "check_invariants",
           "check_rank_order", "cluster_facts", "subgroup_binding_problems"]


class InvariantBroken(AssertionError):
    pass


def check_invariants(core: Coscheduler, now: float | None = None) -> None:
    """Raise :class:`InvariantBroken` for the first broken rule; ``now`` (the model's clock)
    lets rule 10 tell a creation still in flight from one that never landed."""
    check_devices(core)
    try:
        check_ledger(state_of(core).ledger, core.queries.plans())
    except LedgerDrift as e:
        raise InvariantBroken(f"reservations != plans: {e}") from None
    store = state_of(core).store
    leaving = state_of(core).preemption.inflight.terminating()
    _check_preemptions(core)
    _check_moves(core)
    _check_queues(core)
    _check_provisional(core)
    _check_gangs_exist(core, now)
    nominations = state_of(core).preemption.nominations
    flying = {k for g in core.queries.gangs.values() for k in g.binding}
    for n in sorted({*state_of(core).ledger.nodes(), *nominations.total}):
        if n not in store.nodes:
            if n in nominations.total or any(r.pod not in flying
                                             for r in state_of(core).ledger.on_node(n)):
                raise InvariantBroken(f"reservation on node {n} that is not in the store")
            continue  # 14: bindings in flight to a deleted node keep their room
        # Victims of a preemption in flight still count as usage; their room is reserved
        # for the preemptor already (counted twice, never lent to a third party).
        holding = add(state_of(core).ledger.reserved_on(n), nominations.held_on(n))
        left = sub(sub(store.nodes[n].allocatable, store.used.get(n, {})), holding)
        for k in leaving:
            p = store.pods.get(k)
            if p is not None and p.node_name == n and p.holds_capacity:
                left = add(left, p.requests)
        for res, amount in holding.items():
            if amount > 0 and left.get(res, 0) < 0:
                raise InvariantBroken(
                    f"node {n}: usage + reservations exceed allocatable {res} by "
                    f"{-left[res]} (reserved {state_of(core).ledger.by_gang_on(n)}, nominated "
                    f"{[x.pod for x in nominations.on(n)]})")
    _check_subgroups(core)
    for key, g in core.queries.gangs.items():
        live = {p.key: p for p in core.queries.members_of(key) if p.active}
        if g.plan and g.phase not in (GangPhase.ADMITTED, GangPhase.RELEASED):
            stray = set(g.plan) - g.binding
            if stray:
                raise InvariantBroken(f"gang {key} is {g.phase.value} but holds slots "
                                      f"{sorted(stray)}")
        for pod, node in g.plan.items():
            p = live.get(pod)
            if p is None:
                raise InvariantBroken(f"gang {key} holds a slot for {pod}, not a live member")
            if p.node_name is not None:
                raise InvariantBroken(f"gang {key} holds a slot for {pod}, already bound")
            if node not in store.nodes:
                if pod in g.binding:
                    continue  # 14: its binding may still land on a node of that name
                raise InvariantBroken(f"gang {key} holds {pod} on missing node {node}")
            pin = pinned_node(p.required_affinity)
            if pin is not None and pin != node:
                raise InvariantBroken(f"gang {key} plans {pod} on {node}, pinned to {pin}")
            if not eligible(p, store.nodes[node]):
                raise InvariantBroken(f"gang {key} holds a slot for {pod} on {node}, where its "
                                      f"nodeSelector or required affinity does not admit it")
        for pod in sorted(g.binding):
            p = live.get(pod)
            if p is not None and p.node_name is None and pod not in g.plan:
                raise InvariantBroken(f"gang {key}: {pod}'s binding is in flight but its "
                                      f"room is no longer counted (it may be planned again)")
        if g.phase is GangPhase.ADMITTED:
            if g.spec is None:
                raise InvariantBroken(f"gang {key} admitted without a declaration")
            bound = [p.key for p in live.values() if p.node_name is not None]
            if not core.queries.meets_quorum(g.spec, [*g.plan, *bound]):
                raise InvariantBroken(
                    f"gang {key} admitted with a partial plan: {len(g.plan)} slots + {len(bound)} "
                    f"bound < minMember {g.spec.min_member}")
            if g.deadline is None:
                raise InvariantBroken(f"gang {key} admitted without a deadline")
    for gang in state_of(core).waiting.gangs():
        owner = core.queries.gangs.get(gang)
        for pod, node in state_of(core).waiting.parked(gang).items():
            if owner is None or owner.phase is not GangPhase.ADMITTED:
                raise InvariantBroken(f"{pod} parked for gang {gang}, which is not admitted")
            rec = store.pods.get(pod)
            if rec is not None and rec.gated:
                raise InvariantBroken(f"{pod} is parked with Lockstep's gate still on")
            if owner.plan.get(pod) != node:
                raise InvariantBroken(
                    f"{pod} parked on {node}, plan holds {owner.plan.get(pod)}")
    for gpus, per_node in store.scores.items():
        for n, cached in per_node.items():
            if n in store.nodes and core.queries.explain_score(n, gpus).total != cached:
                raise InvariantBroken(f"stale cached score for {n} ({gpus} GPU)")
    def fresh_free_gpus(n: NodeName) -> int:
        return store.nodes[n].allocatable.get("nvidia.com/gpu", 0) - store.used.get(
            n, {}).get("nvidia.com/gpu", 0) - state_of(core).ledger.reserved_on(n).get(
            "nvidia.com/gpu", 0) - state_of(core).preemption.nominations.held_on(n).get(
            "nvidia.com/gpu", 0)

    for n, cached_gpus in store.free_gpu.items():
        if n in store.nodes:
            fresh_gpus = fresh_free_gpus(n)
            if cached_gpus != fresh_gpus:
                raise InvariantBroken(f"stale cached free GPUs for {n}: {cached_gpus} "
                                      f"!= {fresh_gpus}")
    for index in range(len(core.settings.levels)):
        fresh: dict[tuple[str, ...], list[NodeName]] = {}
        for n in sorted(store.nodes):
            d = domain_of(core.settings.levels, index, store.nodes[n])
            if d is not None:
                fresh.setdefault(d, []).append(n)
        if {d: list(ns) for d, ns in store.domains(index).items()} != fresh:
            raise InvariantBroken(f"stale topology domains at level {index}")
        fresh_ranked = sorted((sum(map(fresh_free_gpus, ns)), d) for d, ns in fresh.items())
        if list(state_of(core).capacity.domains_by_free_gpus(index)) != fresh_ranked:
            raise InvariantBroken(f"stale free GPUs per domain at level {index}")


def _check_subgroups(core: Coscheduler) -> None:
    """19. a group of groups never holds part of a subgroup: a subgroup with a slot has its
    minimum among its bound members and slots (its members bind whole, never a part); and
    a released group (match policy other than once-satisfied) holds its quorum, min_parts
    whole subgroups of its current stage, among its bound members, bindings and slots."""
    st = state_of(core)
    for key, g in st.gangs.items():
        spec = g.spec
        if spec is None or not spec.subgroups:
            continue
        live = [p for p in core.queries.members_of(key) if p.active]
        held = Counter(st.membership[p.key].part for p in live  # type: ignore[union-attr]
                       if p.node_name is not None or p.key in g.plan)
        for s in spec.subgroups:
            slots = sorted(k for k in g.plan if getattr(st.membership.get(k), "part", None)
                           == s.key and k not in g.binding)
            if slots and held[s.key] < s.min_member:
                raise InvariantBroken(
                    f"rule 19: gang {key} holds part of subgroup {s.key}: {held[s.key]} "
                    f"bound or planned of its minimum {s.min_member} (slots {slots})")
        if g.phase is GangPhase.RELEASED and spec.match_policy is not MatchPolicy.ONCE_SATISFIED:
            have = [p.key for p in live if p.node_name is not None or p.key in g.plan
                    or p.key in g.binding]
            if not core.queries.meets_quorum(spec, have):
                raise InvariantBroken(f"rule 19: gang {key} is released below its minimum "
                                      f"of subgroups ({len(have)} members held)")


def subgroup_binding_problems(bound_at: Mapping[str, Sequence[float]],
                              mins: Mapping[str, int], min_parts: int | None,
                              window: float = 1.0) -> list[str]:
    """Rule 19 over recorded bindings (what the e2e binding recorder can check, given each
    bound pod's subgroup and the subgroups' minimums): within ``window`` of a subgroup's
    first binding it has its minimum bound (no subgroup rests partly bound), and once any
    is bound, ``min_parts`` (all of ``mins`` when None) subgroups are whole within
    ``window`` of the first binding of the set."""
    out = []
    whole_at: list[float] = []
    for part, times in sorted(bound_at.items()):
        ts = sorted(times)
        need = mins.get(part, 1)
        if len(ts) < need:
            out.append(f"subgroup {part}: rests partly bound ({len(ts)}/{need})")
        elif ts[need - 1] - ts[0] > window:
            out.append(f"subgroup {part}: took {ts[need - 1] - ts[0]:.2f}s to be whole")
        else:
            whole_at.append(ts[need - 1])
    need_parts = len(mins) if min_parts is None else min_parts
    first = min((t for ts in bound_at.values() for t in ts), default=None)
    if first is not None:
        in_time = sorted(t for t in whole_at if t - first <= window)
        if len(in_time) < need_parts:
            out.append(f"set: {len(in_time)} whole subgroups bound within {window}s, "
                       f"below its minimum of {need_parts}")
    return out


def _check_provisional(core: Coscheduler) -> None:
    """9. a member pinned at creation is provisional only until the watch shows it created."""
    st = state_of(core)
    for key in st.creation.pinned:
        p = st.store.pods.get(key)
        if p is not None and p.uid:
            raise InvariantBroken(f"{key} is created (uid {p.uid}) but still provisional")


def check_rank_order(placed: Mapping[PodKey, NodeName], ordered: Mapping[PodKey, NodeName],
                     members: Sequence[Member], nodes: Mapping[NodeName, NodeRecord],
                     levels: Sequence[Level]) -> None:
    """18. rank order, of every plan the planner makes (``placed``, then ``ordered`` by the
    rank pass): the same nodes hold the same counts of each shape (feasibility unchanged);
    only interchangeable ranked members move; and among those free to move (candidates,
    when known, holding every slot of their group), slot order never falls as rank rises."""
    shapes = {m.pod.key: interchangeable(m.pod) for m in members}
    if sorted(ordered) != sorted(placed):
        raise InvariantBroken("rule 18: the rank pass changed which members are planned")
    if Counter((shapes[k], n) for k, n in placed.items() if k in shapes) != \
            Counter((shapes[k], n) for k, n in ordered.items() if k in shapes):
        raise InvariantBroken("rule 18: the rank pass changed how many of a shape a node holds")
    groups: dict[tuple[object, ...], list[Member]] = {}
    for m in members:
        k = m.pod.key
        if k not in placed:
            continue
        shape = shapes[k]
        if shape is None:
            if ordered[k] != placed[k]:
                raise InvariantBroken(f"rule 18: {k} moved, but it may not (bound, claims or "
                                      f"no rank)")
            continue
        groups.setdefault(shape, []).append(m)
    for group in groups.values():
        slots = {placed[m.pod.key] for m in group}
        free = sorted((m for m in group if m.candidates is None or m.candidates >= slots),
                      key=lambda m: (m.pod.rank, m.pod.key))
        for m in group:
            if m not in free and ordered[m.pod.key] != placed[m.pod.key]:
                raise InvariantBroken(f"rule 18: {m.pod.key} moved off its candidates")
        where = [slot_key(levels, nodes.get(ordered[m.pod.key]), ordered[m.pod.key])
                 for m in free]
        for a, b, wa, wb in zip(free, free[1:], where, where[1:], strict=False):
            if wb < wa:
                raise InvariantBroken(
                    f"rule 18: {b.pod.key} (rank {b.pod.rank}) planned on "
                    f"{ordered[b.pod.key]}, before {a.pod.key} (rank {a.pod.rank}) on "
                    f"{ordered[a.pod.key]} in topology order")

def _check_gangs_exist(core: Coscheduler, now: float | None) -> None:
    """10. no empty gang; 11. nothing reserved for a gang with no member that exists."""
    st = state_of(core)

    def exists(k: PodKey) -> bool:
        p = st.store.pods.get(k)
        if p is None:
            return False
        if p.uid:
            return True
        landing_by = st.creation.pinned.get(k)  # pinned at creation, creation in flight
        return landing_by is not None and (now is None or now < landing_by)

    alive: dict[GangKey, bool] = {}
    for key, g in st.gangs.items():
        alive[key] = any(exists(k) for k in g.members)
        if not alive[key]:
            raise InvariantBroken(f"gang {key} survives with no member that exists "
                                  f"(members {sorted(g.members)}, phase {g.phase.value})")
    reserving: dict[GangKey, str] = {}
    for r in state_of(core).ledger.by_pod.values():
        reserving.setdefault(r.gang, f"a reservation for {r.pod} on {r.node}")
    for k in st.creation.pinned:
        m = st.membership.get(k)
        owner = getattr(m, "key", None)
        if owner is not None:
            reserving.setdefault(GangKey(owner), f"a provisional pin of {k}")
    for gang, what in sorted(reserving.items()):
        if not alive.get(gang, False):
            raise InvariantBroken(f"{what} is held for gang {gang}, none of whose members "
                                  f"exists")


def group_priority(core: Coscheduler, g: Gang, pods: Mapping[PodKey, PodRecord] | None = None
                   ) -> int:
    """12. the one measure both sides of a preemption are compared by: the group's own
    priority when its group object names one (a value, else a PriorityClass), otherwise its
    highest member's (among ``pods``: every pod the store holds unless given)."""
    spec = g.spec
    if spec is not None and spec.priority is not None:
        return spec.priority
    if spec is not None and spec.priority_class is not None:
        pc = state_of(core).store.priority_classes.get(spec.priority_class)
        if pc is not None:
            return pc.value
    among = core.queries.pods if pods is None else pods
    return max((p.priority for k in g.members if (p := among.get(k)) is not None), default=0)


def cluster_facts(core: Coscheduler) -> dict[str, Any]:
    """Everything that follows from the API server's objects alone (no reservations,
    parked calls or timers): a rebuilt core must compute exactly these."""
    store = state_of(core).store
    st = state_of(core)
    pods = {k: p for k, p in store.pods.items()
            if k not in st.creation.pinned}  # not created yet
    # Bindings Lockstep assumed (in flight, not shown by the watch yet) are its own, not
    # the API server's: counted as the API server shows them.
    assumed = {k: p for k, p in pods.items() if k in st.assumed and p.node_name is not None}
    used = {n: dict(r) for n, r in store.used.items()}
    for p in assumed.values():
        assert p.node_name is not None
        used[p.node_name] = sub(used.get(p.node_name, {}), p.requests)
    return {
        "nodes": sorted(store.nodes),
        "pods": sorted((k, p.uid, None if k in assumed else p.node_name, p.phase)
                       for k, p in pods.items()),
        "used": {n: {k: v for k, v in r.items() if v} for n, r in used.items()
                 if any(r.values())},
        "membership": {k: core.queries.gang_of(k) for k in sorted(pods)},
        "gangs": {k: (sorted(m for m in g.members if m in pods),
                      g.spec.min_member if g.spec else None)
                  for k, g in sorted(core.queries.gangs.items()) if set(g.members) & set(pods)},
        "priorities": {k: group_priority(core, g, pods)
                       for k, g in sorted(core.queries.gangs.items())
                       if set(g.members) & set(pods)},
        "domains": [{d: list(ns) for d, ns in store.domains(i).items()}
                    for i in range(len(core.settings.levels))],
        "scores": {n: core.queries.explain_score(n, 1).total for n in sorted(store.nodes)
                   if not core.queries.reserved_on(n)
                   and n not in state_of(core).preemption.nominations.total
                   and all(p.node_name != n for p in assumed.values())},
    }


def _check_preemptions(core: Coscheduler) -> None:
    """7. every victim of a preemption in flight has a priority strictly below its
    preemptor's (12: a victim gang by its group's priority when the group names one), and a
    victim gang is evicted whole: none of its members is bound and running, or has its
    binding in flight, outside the victim set; a gang told it is preempting has a preemption
    of its own in flight."""
    store = state_of(core).store
    st = state_of(core)
    for rec in st.preemption.inflight.by_preemptor.values():
        if rec.moves:
            continue  # 19: pods moved to make room, checked by their own rule
        for k in rec.waiting_for:
            p = store.pods.get(k)
            if p is not None and (prio := state_of(core).unit_priority(p)) >= rec.priority:
                raise InvariantBroken(f"{k} (priority {prio}) evicted for "
                                      f"{rec.preemptor} (priority {rec.priority})")
        for victim in rec.victim_gangs:
            g = st.gangs.get(victim)
            named = g is not None and g.spec is not None and (
                g.spec.priority is not None or g.spec.priority_class in st.store.priority_classes)
            if g is not None and named and group_priority(core, g) >= rec.priority:
                raise InvariantBroken(
                    f"gang {victim} (group priority {group_priority(core, g)}) evicted for "
                    f"{rec.preemptor} (priority {rec.priority})")
            binding = g.binding if g is not None else set()
            for p in core.queries.members_of(victim):
                if p.key in rec.victims or p.deleting:
                    continue
                if p.holds_capacity:
                    raise InvariantBroken(f"gang {victim} evicted for {rec.preemptor} in part: "
                                          f"{p.key} on {p.node_name} is not a victim")
                if p.key in binding:
                    raise InvariantBroken(f"gang {victim} evicted for {rec.preemptor} in part: "
                                          f"{p.key}'s binding is in flight")
    own = {rec.gang for rec in st.preemption.inflight.by_preemptor.values() if rec.gang is not None}
    for key, g in st.gangs.items():
        if g.phase is GangPhase.WAITING and isinstance(g.reason, Preempting) \
                and key not in own:
            raise InvariantBroken(f"gang {key} is told it is preempting, with no preemption "
                                  f"of its own in flight (another preemptor's record?)")
    for n in state_of(core).preemption.nominations.by_pod.values():
        if n.pod in st.defrag.slots:
            continue  # 19: room held for a moved pod's replacement, not for a pod yet
        p = store.pods.get(n.pod)
        if p is None or p.node_name is not None or not p.active \
                or core.queries.gang_of(n.pod) is not None:
            raise InvariantBroken(f"room on {n.node} is nominated to {n.pod}, which is not a "
                                  f"pending plain pod")
        if n.node not in store.nodes:
            raise InvariantBroken(f"room nominated to {n.pod} on {n.node}, not a node")


def _check_moves(core: Coscheduler) -> None:
    """20. pods moved to make room for a gang (defragmentation): each is a plain pod (a gang
    moves whole or not at all: none moves), owned by a controller that recreates it, at or
    below the gang's priority, not moved before (no chain of moves returns), and not
    protected by a PodDisruptionBudget that allows no disruption; room is reserved for each
    one's replacement on another node (a nomination under its hold key, whose slot names
    the same node) until the replacement takes it over or the reservation lapses."""
    st = state_of(core)
    store = st.store
    slot_of = {s.moved: s for s in st.defrag.slots.values()}
    for rec in st.preemption.inflight.by_preemptor.values():
        if not rec.moves:
            continue
        for k in rec.waiting_for:
            p = store.pods.get(k)
            if p is None:
                continue
            if core.queries.gang_of(k) is not None:
                raise InvariantBroken(f"rule 20: {k}, a gang member, moved for {rec.gang}")
            if p.owner is None or p.owner.kind not in RECREATING_KINDS:
                raise InvariantBroken(f"rule 20: {k} moved, and no controller recreates it")
            if p.priority > rec.priority:
                raise InvariantBroken(f"rule 20: {k} (priority {p.priority}) moved for "
                                      f"{rec.gang} (priority {rec.priority})")
            if k in st.defrag.moved:
                raise InvariantBroken(f"rule 20: {k} moved again (moved once for "
                                      f"{st.defrag.moved[k]})")
            for b in st.preemption.budgets.values():
                if b.selects(p) and b.disruptions_allowed <= 0:
                    raise InvariantBroken(f"rule 20: {k} moved against budget {b.key}")
            slot = slot_of.get(k)
            if slot is not None and slot.node == p.node_name:
                raise InvariantBroken(f"rule 20: {k}'s replacement has room reserved on the "
                                      f"node it leaves ({slot.node})")
    for hold, slot in st.defrag.slots.items():
        n = st.preemption.nominations.get(hold)
        if n is not None and n.node != slot.node:
            raise InvariantBroken(f"rule 20: {hold} nominated on {n.node}, slot on {slot.node}")
    for n in st.preemption.nominations.by_pod.values():
        if n.pod.endswith("~moved") and n.pod not in st.defrag.slots:
            raise InvariantBroken(f"rule 20: room held for {n.pod}, a replacement no slot "
                                  f"names")


def _check_queues(core: Coscheduler) -> None:
    """8. no Volcano queue's gangs hold more than its capability."""
    st = state_of(core)
    if st.store.queues is None:
        return
    held: dict[str, Resources] = {}
    for g in st.gangs.values():
        queue = queue_of(st, g)
        if queue is not None:
            held[queue] = add(held.get(queue, {}), holds(st, g))
    for name, amount in sorted(held.items()):
        q = st.store.queues.get(name)
        if q is None:
            continue
        over = {r: amount.get(r, 0) for r, cap in q.capability.items() if amount.get(r, 0) > cap}
        if over:
            raise InvariantBroken(f"Volcano queue {name} holds {over}, over its capability "
                                  f"{q.capability}")


def check_devices(core: Coscheduler, claims: Mapping[str, Claim] | None = None,
                  drained: Mapping[str, object] | None = None) -> None:
    """Rules 15 and 16 (DRA). ``claims``: the API server's (default: the core's view);
    ``drained``: claims the app was told to clear and has not yet (besides the outbox)."""
    st = state_of(core)
    inv = st.devices
    held_devices(inv, st.ledger.get)  # only live plans count
    owner: dict[DeviceId, PodKey] = {}
    claim_of: dict[DeviceId, str] = {}
    for pod, pd in inv.planned.items():
        for held_by, d in pd.devices:
            # One claim shared by several members is planned under each: one holder.
            if d in owner and owner[d] != pod and claim_of[d] != held_by:
                raise InvariantBroken(f"rule 15: device {d} planned for {owner[d]} and {pod}")
            owner[d], claim_of[d] = pod, held_by
    claims = inv.claims if claims is None else claims
    queued = {**st.outbox.deallocate, **(drained or {})}
    for c in claims.values():
        if c.allocated is None:
            continue
        mine = PodKey(f"{c.namespace}/{c.owner}") if c.owner else None
        _check_member_claim(core, c, mine, owner, queued)


def _check_member_claim(core: Coscheduler, c: Claim, mine: PodKey | None,
                        owner: Mapping[DeviceId, PodKey], queued: Mapping[str, object]
                        ) -> None:
    st = state_of(core)
    pod = st.store.pods.get(mine) if mine is not None else None
    m = st.membership.get(mine) if mine is not None else None
    key = getattr(m, "key", None)
    g = st.gangs.get(key) if key is not None else None
    if pod is None or pod.node_name is not None or g is None or mine is None:
        return
    gang_devices = {d for d, p in owner.items() if p in g.plan}
    outside = [d for d in c.allocated or () if d not in gang_devices]
    if c.reserved_for:
        parked = st.waiting.node(mine) is not None or mine in g.binding
        if parked and (g.phase not in (GangPhase.ADMITTED, GangPhase.RELEASED) or outside):
            raise InvariantBroken(
                f"rule 16: parked {mine}'s claim {c.key} is allocated "
                f"({outside or 'in plan'}) while its gang {g.key} is {g.phase.value}")
        return
    outside = [d for d in c.allocated or () if owner.get(d) not in (None, mine)]
    if mine not in st.devices.planned:  # its gang's plan no longer holds it
        outside = list(c.allocated or ())
    if outside and c.key not in queued:
        raise InvariantBroken(f"rule 16: {mine}'s unreserved claim {c.key} holds {outside}, "
                              "outside its gang's plan, and is not queued to be cleared")


def check_fenced(sent: Iterable[tuple[str, float, float]]) -> None:
    """Rule 17. ``sent``: writes a deposed replica's client sent, each (what, the instant
    its bytes went out, the earliest instant the standby could hold the Lease), on one
    clock. Each went out before that instant: the two replicas never act at once."""
    for what, at, lease_passes in sent:
        if at >= lease_passes:
            raise InvariantBroken(
                f"rule 17: {what} sent at {at:g} s by a deposed replica, when the standby may "
                f"hold the Lease from {lease_passes:g} s (checked before it waited, not when "
                "it was sent?)")
