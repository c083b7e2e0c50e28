"""The bind verb and what the API server said to the bindings: park, release, settle.

A gang member's bind call is parked in the waiting map until its gang's quorum is parked (or
bound); then every parked call is answered at once with one group of bindings. Before the
first binding every parked member and its node are checked again, so a gang never starts
binding onto something that went away. A binding that failed for good after its siblings
bound is reported as a partial gang.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..actions import (
    BindDecision,
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    NoticeKind,
    Park,
    Reject,
    Unparked,
)
from ..corestate import CoreState
from ..devices.align import outside
from ..events.ingest import assume_bound, forget_assumed
from ..gang.admission import reconcile
from ..gang.membership import bound_count, meets_quorum
from ..podgroup import GangKey, GangSpec, InvalidGang, MatchPolicy, MissingPodGroup, gang_of
from ..reasons import (
    BeingPreempted,
    BindTargetGone,
    DevicesNotReady,
    GangReason,
    InvalidDeclaration,
    PartiallyBound,
    PodGroupNotFound,
    PodNotInCache,
    ReservedForGangs,
    WaitingForMembers,
    WrongNode,
)
from ..records import NodeName, PodKey, PodRecord
from ..resources import fits, shortfall
from ..state.gang import Gang, GangPhase
from ..topology.domains import GPU
from .filtering import filter_pod

__all__ = ["bind", "bind_outcomes"]


def bind(st: CoreState, key: PodKey, node: NodeName, now: float, uid: str = ""
         ) -> BindDecision:
    pod = st.store.pods.get(key)
    if pod is None or (uid and pod.uid and uid != pod.uid):
        return Reject(PodNotInCache(key, uid, pod.uid if pod is not None else None))
    m = st.membership.get(key)
    if m is None:
        refused, displaced = _bind_unplanned(st, pod, node)
        st.plain.verdict(key, bind_at=now, bind_node=node,
                   bind_refused=refused.reason if refused is not None else None)
        if refused is not None:
            return refused
        # Assumed on the node from now, as kube-scheduler assumes a pod it is binding:
        # nothing is planned onto this room while the binding is in flight.
        assume_bound(st, key, node)
        for gang in displaced:
            reconcile(st, st.gangs[gang])
        return BindNow(key, node)
    if isinstance(m, InvalidGang):
        return Reject(InvalidDeclaration(m))
    if isinstance(m, MissingPodGroup):
        return Reject(PodGroupNotFound(m.key, m.api))
    g = st.gangs[m.key]
    if (by := st.preemption.inflight.evicting(g.key)) is not None:
        # Its gang is a victim of a preemption in flight, chosen with the members bound
        # then: a member that binds now (its filter passed before) would outlive the
        # eviction, a gang evicted in part.
        return Reject(BeingPreempted(g.key, str(by.preemptor)))
    spec = g.spec or m
    planned = g.plan.get(key)
    if planned is not None and planned != node:
        return Reject(WrongNode(g.key, planned, node))
    if pod.claims and (taken := outside(st.devices, st.ledger.get, pod)):
        # kube-scheduler wrote this allocation in PreBind, before this call: refusing it
        # makes its Unreserve take the pod out of the claims' reservedFor (docs/dra.md).
        return Reject(DevicesNotReady(g.key, key, "kube-scheduler allocated "
                                      f"{', '.join('/'.join(d) for d in taken[:4])}, which "
                                      "another gang's plan holds"))
    if planned is None and g.phase is GangPhase.RELEASED and spec.subgroups:
        # A group's member no slot holds binds only beside its whole subgroup: the filter
        # places the subgroup (or says why it waits) first, as it would have.
        decision = filter_pod(st, pod, [node], now)
        if decision.passed != [node]:
            return Reject(decision.unresolvable or WrongNode(g.key, None, node))
        planned = g.plan.get(key)
    if planned is None and g.phase is not GangPhase.RELEASED:
        # No plan holds this pod (e.g. Lockstep restarted after filter): admit it now.
        decision = filter_pod(st, pod, [node], now)
        if decision.passed != [node]:
            return Reject(decision.unresolvable or WrongNode(g.key, None, node))
    if g.phase is GangPhase.RELEASED:
        if planned is None:
            no, displaced = _bind_unplanned(st, pod, node)
            if no is not None:
                return no
            # No slot holds its room while the POST is in flight: assume it bound there
            # now, as a plain pod is, so no gang is planned onto that room meanwhile.
            assume_bound(st, key, node)
            for gang in displaced:
                reconcile(st, st.gangs[gang])
            return BindNow(key, node)
        g.binding.add(key)
        return BindNow(key, node)
    if g.phase is not GangPhase.ADMITTED:
        return Reject(g.reason or WaitingForMembers(g.key, 0, spec.min_member))
    assert g.deadline is not None
    bound = bound_count(st, g)
    if bound > 0 and not st.waiting.count(g.key) \
            and spec.match_policy is not MatchPolicy.ONLY_WAITING:
        # Already partly bound at the API server (Lockstep died between a group's
        # bindings, or a binding failed after its siblings'): parking the rest would only
        # keep the gang partial for longer. The plan is whole, so release it now.
        g.release({key})
        st.notice(NoticeKind.RELEASED, g.key, (key,),
                  detail=f"{bound}/{spec.min_member} already bound; completing")
        return BindNow(key, node)
    return _park_until_quorum(st, g, spec, key, pod, node)


def _park_until_quorum(st: CoreState, g: Gang, spec: GangSpec, key: PodKey, pod: PodRecord,
                       node: NodeName) -> BindDecision:
    """Park an admitted gang's member on its planned node; once the parked and bound members
    meet the quorum (and none of them is gone), release every parked bind at once. Apart from
    :func:`bind` so the verb reads as its checks, and the all-or-nothing release as one step."""
    assert g.deadline is not None  # ADMITTED: bind checked it
    st.waiting.park(g.key, key, node, pod.uid)
    counted = list(st.waiting.parked(g.key))
    if spec.match_policy is not MatchPolicy.ONLY_WAITING:
        counted += [p.key for p in st.live(g) if p.node_name is not None]
    if not meets_quorum(st, spec, counted):
        return Park(g.key, g.deadline)
    gone = _check_quorum(st, g)
    if gone:
        mine = gone.pop(key, None)
        for other, reason in gone.items():
            st.outbox.unparked.append(Unparked(g.key, {other: st.waiting.node(other)
                                                     or node}, reason))
            st.waiting.remove(other)
        if mine is not None:
            st.waiting.remove(key)
            return Reject(mine)
        return Park(g.key, g.deadline)
    binds = st.waiting.pop_gang(g.key)
    g.release(set(binds))
    st.notice(NoticeKind.RELEASED, g.key, (key,),
              detail=f"{len(binds) + bound_count(st, g)}/{spec.min_member}")
    return BindGroup(g.key, binds)


def _bind_unplanned(st: CoreState, pod: PodRecord, node: NodeName
                    ) -> tuple[Reject | None, list[GangKey]]:
    """A pod no plan holds may not bind into capacity a gang of its priority or higher
    reserved since its filter call; a gang of lower priority makes room.

    Between kube-scheduler's filter and bind calls Lockstep may admit a gang (another
    member's filter, or a gated gang) onto the node the pod was then free to use. kube-
    scheduler's queue served the pod first, so when it outranks every gang holding the
    node, the pod binds and those gangs' slots there are planned again elsewhere (or the
    gangs give all back); binding it over a gang of its own priority or higher would
    over-commit the node and strand that gang's members, so that is refused.

    Returns the refusal, or the gangs that lost slots (the caller re-plans them once the pod
    is counted on the node)."""
    if not st.ledger.reserved_on(node) and not st.preemption.nominations.held_on(node):
        return None, []
    # A released gang's extra is measured by its gang's priority, as every victim and
    # preemptor is (``CoreState.unit_priority``): one measure on both sides.
    priority = st.unit_priority(pod)
    free = st.capacity.free_for_plain(node, pod.key, priority)
    if fits(pod.requests, free):
        return None, []
    holders = sorted(st.ledger.gangs_on(node))
    nominated = tuple(n.pod for n in st.preemption.nominations.on(node)
                      if n.pod != pod.key and n.priority >= priority)
    if nominated or any(st.gang_priority(st.gangs[k]) >= priority for k in holders):
        return Reject(ReservedForGangs(node, tuple(holders), shortfall(pod.requests, free),
                                       nominated)), []
    return None, _make_room(st, pod, node, priority)


def _make_room(st: CoreState, pod: PodRecord, node: NodeName, priority: int
               ) -> list[GangKey]:
    """Take lower-priority gangs' slots off ``node`` (lowest priority first, then the
    largest slot) until ``pod`` fits; the gangs that lost one."""
    slots = sorted(((st.gang_priority(st.gangs[k]), -r.requests.get(GPU, 0), r.pod, k)
                    for r in st.ledger.on_node(node) for k in (r.gang,)),
                   key=lambda t: (t[0], t[1], t[2]))
    touched: list[GangKey] = []
    for _, _, member, gang in slots:
        if fits(pod.requests, st.capacity.free_for_gang(node)):
            break
        g = st.gangs[gang]
        if member in g.binding:
            continue  # a binding in flight cannot be taken back
        st.unpark(g, member, f"node {node} was taken by {pod.key} (priority {priority})")
        g.drop_slot(member)
        if gang not in touched:
            touched.append(gang)
    return touched


def _check_quorum(st: CoreState, g: Gang) -> dict[PodKey, GangReason]:
    """Before the first binding: every parked member and its node still exist, with the UID
    that was parked and the slot the plan holds."""
    gone: dict[PodKey, GangReason] = {}
    for key, node in st.waiting.parked(g.key).items():
        pod = st.store.pods.get(key)
        uid = st.waiting.uid(key)
        what = ""
        if pod is None or not pod.active:
            what = f"pod {key} is gone"
        elif uid and pod.uid != uid:
            what = f"pod {key} was recreated (uid {uid} -> {pod.uid})"
        elif node not in st.store.nodes:
            what = f"node {node} is gone"
        elif g.plan.get(key) != node:
            what = f"the plan no longer holds {node} for {key}"
        if what:
            gone[key] = BindTargetGone(g.key, key, what)
    return gone


def _stale(st: CoreState, o: BindOutcome) -> bool:
    """``o`` is for a pod that is no longer the one under its name (deleted, recreated)."""
    pod = st.store.pods.get(o.pod)
    return bool(o.uid) and pod is not None and bool(pod.uid) and pod.uid != o.uid


def bind_outcomes(st: CoreState, outcomes: Sequence[BindOutcome]) -> PartiallyBound | None:
    """What the API said to bindings the core asked for; a partial gang is reported.
    An outcome for another UID than the pod now under its name is about a pod deleted
    since (its namesake's own binding, if any, reports for itself): it is dropped."""
    outcomes = [o for o in outcomes if not _stale(st, o)]
    for o in outcomes:
        if isinstance(o, Bound):
            assume_bound(st, o.pod, o.node)
        elif o.pod in st.assumed:
            forget_assumed(st, o.pod)
    by_gang: dict[GangKey, list[BindOutcome]] = {}
    stranded: set[GangKey] = set()
    for o in outcomes:
        gang = gang_of(st.membership.get(o.pod))
        g = st.gangs.get(gang) if gang is not None else None
        if g is None:
            continue
        by_gang.setdefault(g.key, []).append(o)
        if isinstance(o, BindFailed):
            had = o.pod in g.plan
            g.bind_settled(o.pod)
            st.waiting.remove(o.pod)
            if had and o.pod not in g.plan:
                # A gang admitted again while this binding flew kept its slot only for the
                # flight: the plan lost a slot, so it is completed again or falls back (a
                # transient failure reaches no other reconcile below).
                stranded.add(g.key)
            if (node := g.plan.get(o.pod)) is not None and node not in st.store.nodes:
                # Its node was deleted while the binding was in flight (the slot was
                # kept for it): nothing will land there now.
                g.drop_slot(o.pod)
                stranded.add(g.key)
    for gang in sorted(stranded):
        reconcile(st, st.gangs[gang])
    report = None
    for gang, items in by_gang.items():
        g = st.gangs[gang]
        spec = g.spec
        failed = [o for o in items if isinstance(o, BindFailed) and o.permanent]
        if spec is None or not failed:
            continue
        ok = {o.pod for o in items if isinstance(o, Bound)}
        bound_keys = {p.key for p in st.live(g) if p.node_name is not None} | ok
        bound = len(bound_keys)
        if bound and not meets_quorum(st, spec, bound_keys):
            report = PartiallyBound(g.key, bound, spec.min_member, tuple(
                f"{o.pod}: {o.message}" for o in failed)[:5])
            g.partial = report
            st.partial_gangs += 1
            st.notice(NoticeKind.PARTIALLY_BOUND, g.key, sorted(g.members), report)
        reconcile(st, g)
    return report
