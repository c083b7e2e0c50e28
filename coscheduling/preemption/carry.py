"""Preemption carried out in the core: a gang that does not fit evicts whole lower-priority
gangs and plain pods, and holds the room they free until they are gone.

:mod:`coscheduling.preemption.victims` decides *which* victims (pure, over a capacity view);
:mod:`coscheduling.preemption.inflight` remembers preemptions in flight. This module joins them
to the core's state (:class:`~coscheduling.corestate.CoreState`), whose preemption part
(:class:`~coscheduling.preemption.state.PreemptionState`) is this wing's own:

* :func:`try_preempt` is asked by admission when a gang's whole plan does not fit. It builds
  the candidates (every bound pod, each gang's bound members together), asks
  :func:`~coscheduling.preemption.victims.choose_victims`, records the preemption in the book and
  queues one :class:`~coscheduling.actions.Eviction` per victim. It returns the plan the
  gang is admitted into at once: the ledger reserves the victims' room for the preemptor
  while they terminate, so no third gang or plain pod can take it (the victims still count
  as usage until the watch shows them gone, so that room is counted twice, never lent).
* :func:`victims_gone` is told of every pod that left; a preemption with no victim left
  completes, and the preemptor's members are woken (and their gate lifted) to bind.
* :func:`expired` gives back preemptions whose victims outlived their grace period plus a
  margin; the deadline module then gives the gang's room back, and it is planned again.

Two rules make "no loop, no partial gang" hold by construction:

* One measure on both sides: a victim gang member is measured by its gang's priority
  (:meth:`~coscheduling.corestate.CoreState.unit_priority`, the group's when the group names
  one), exactly as the preemptor gang is (``gang_priority``); a plain pod by its own. Every
  eviction then goes strictly down one order, and no chain of them returns.
* A gang with a binding in flight (``Gang.binding``: a BindGroup issued, or a released
  gang's extra, not yet shown bound) is not a victim at all until its bindings land, and
  a gang that is a victim binds nothing more (``binding.bind`` refuses it). Of the two
  designs ("whole, in-flight members included" or "not at all") this is the one whose
  proof needs no new state: the victim set is always exactly the gang's bound members, as
  the ledger and the store already count them; evicting unbound pods whose binds may still
  land, and freeing room the ledger holds as their slots, would need three.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import replace

from ..actions import Eviction, NoticeKind
from ..conventions.kueue import quota_line
from ..corestate import CoreState
from ..placement.planner import Member, Plan, plan_gang
from ..podgroup import gang_of
from ..reasons import BeingPreempted, GangReason, Preempting, PreemptionStalled
from ..records import GangKey, NodeName, PodKey, PodRecord
from ..resources import Resources, add, fits
from ..state.gang import Gang
from ..state.nominations import BIND_WITHIN, Nomination
from ..topology.domains import GPU, Level
from ..topology.eligibility import affinity_problem
from .budgets import Budget, selecting
from .freed import freed_view
from .inflight import InFlight, PreemptionExpired, PreemptorId, Searching
from .units import (
    AlreadyFits,
    Candidate,
    NoPreemption,
    PreemptionPolicy,
    Preemptor,
    Victims,
    describe,
)
from .victims import BOOK_COST, Listing, Unfinished, VictimSearch

__all__ = ["blocked", "displaced", "expired", "nominated_pod_done",
           "preempt_for_plain", "preempting_reason", "try_preempt", "victims_gone",
           "victims_hold"]


def blocked(st: CoreState, g: Gang) -> GangReason | None:
    """Why the gang may not be admitted now because of a preemption, or None.

    A gang being evicted waits (its recreated members must not race the preemptor for the
    room); a preemptor that gave its room back waits for its victims to finish going."""
    by = st.preemption.inflight.evicting(g.key)
    if by is not None:
        return BeingPreempted(g.key, str(by.preemptor))
    return None


def preempting_reason(st: CoreState, g: Gang) -> Preempting | None:
    """The gang's preemption in flight, as a reason (for members whose planned node still
    holds victims), or None."""
    rec = st.preemption.inflight.get(PreemptorId.of_gang(g.key))
    if rec is None:
        return None
    return _reason(g.key, rec)


def victims_hold(st: CoreState, g: Gang, node: NodeName) -> Preempting | None:
    """The gang's preemption in flight, as a reason, while one of its victims still holds
    ``node``; else None.

    kube-scheduler's own filters do not see every holder of a node (a binding Lockstep
    issued and the API does not show yet): they may find room there while a victim still
    runs. A member bound then shares the node with its victim, and if the victim outlives
    the deadline the two (and the binding in flight) overcommit it."""
    rec = st.preemption.inflight.get(PreemptorId.of_gang(g.key))
    if rec is None:
        return None
    for k in rec.waiting_for:
        p = st.store.pods.get(k)
        if p is not None and p.node_name == node and p.holds_capacity:
            return _reason(g.key, rec)
    return None


def _reason(gang: GangKey, rec: InFlight) -> Preempting:
    gpus = sum(r.get(GPU, 0) for r in rec.freed.values())
    return Preempting(gang, tuple(sorted(str(v) for v in rec.victim_gangs)), rec.plain, gpus,
                      len(rec.waiting_for))


def try_preempt(st: CoreState, g: Gang, members: Sequence[PodRecord], required: Level | None,
                now: float) -> Plan | GangReason | str | None:
    """Evict for ``g`` so that ``members`` fit, and return the plan to admit them into.

    A reason when the gang waits on a preemption in flight; a sentence when preemption
    cannot help (why, for ``explain``); None when preemption is off or has nothing to say."""
    if not st.settings.preemption or not members:
        return None
    for p in members:
        if (problem := affinity_problem(p.required_affinity)) is not None:
            # Eligible nowhere whatever is evicted: no search (a pass over every pod).
            return f"no eviction can place {p.key}: {problem}"
    me = PreemptorId.of_gang(g.key)
    rec = st.preemption.inflight.get(me)
    if rec is not None:
        # Its room was given back (a deadline) while victims still go: no second set.
        return _reason(g.key, rec)
    epoch = st.store.epoch
    tried = st.preemption.tried.get(g.key)
    if tried is not None and tried[0] == epoch:
        return tried[1]
    priority = st.gang_priority(g)
    never = any(p.preempt_never for p in members) or (g.spec is not None
                                                        and g.spec.preempt_never)
    policy = PreemptionPolicy.NEVER if never else PreemptionPolicy.PREEMPT_LOWER_PRIORITY
    preemptor = Preemptor(str(g.key), tuple(Member(p) for p in members), priority, policy,
                          required, g.key, quota_line(members[0].namespace, members[0].labels))
    found = _decide(st, me, preemptor, now)
    if isinstance(found, Unfinished):
        st.creation.gated.touched.add(g.key)  # the next sweep goes on with it
        return _unfinished(found)
    if isinstance(found, AlreadyFits):
        # Only outside the nodes kube-scheduler's filters passed for the asking member:
        # no eviction helps that, and the member's next filter call decides.
        return None
    if not isinstance(found, Victims):
        why = describe(found)
        st.preemption.tried[g.key] = (epoch, why)
        return why
    requests = {p.key: p.requests for p in members}
    started = st.preemption.inflight.start(preemptor=me, gang=g.key, priority=priority,
                                   victims=found, requests=requests, now=now)
    if not isinstance(started, InFlight):  # refused above already; the book has the say
        return None
    st.preemption.tried.pop(g.key, None)
    _evict(st, found, str(g.key), f"by gang {g.key} (priority {priority})", priority)
    st.notice(NoticeKind.PREEMPTING, g.key, (members[0].key,), _reason(g.key, started))
    return found.plan


def _decide(st: CoreState, me: PreemptorId, preemptor: Preemptor, now: float
            ) -> Victims | NoPreemption | Unfinished:
    """One slice of ``me``'s victim search, within what is left of this sweep's budget.

    The search (:class:`~coscheduling.preemption.victims.VictimSearch`) is kept in the book between
    slices; a preemptor that changed (members, priority, policy) starts afresh. A set
    decided over several slices was chosen while the cluster changed: it is checked
    against the cluster of now (:func:`_recheck`), and searched again if it no longer
    holds."""
    book = st.preemption.inflight
    key = (tuple(m.key for m in preemptor.members), preemptor.priority, preemptor.policy,
           preemptor.required, preemptor.quota)
    run = book.searches.get(me)
    left = book.budget_left(now)
    # The first preemptor of a sweep always moves on; the others only within what is
    # left, and a new search is begun (its candidates listed) only in a fresh sweep.
    fresh = left >= book.budget
    if left <= 0 or (not fresh and (run is None or run.key != key)):
        return Unfinished(preemptor.name, run.search.work if run else 0,
                          run.search.slices if run else 0)
    if run is None or run.key != key:
        run = book.searches[me] = Searching(
            VictimSearch(preemptor, _listing(st, preemptor.priority), st.capacity,
                         st.settings.levels), key, now)
    before = run.search.work
    got = run.search.advance(left, must_move=fresh)
    book.spend(now, run.search.work - before)
    run.last = now
    if isinstance(got, Unfinished):
        return got
    del book.searches[me]
    if isinstance(got, Victims) and run.search.slices > 1:
        checked = _recheck(st, got, preemptor)
        if checked is None:  # the cluster moved under it: search again, from the start
            book.searches[me] = Searching(
                VictimSearch(preemptor, _listing(st, preemptor.priority), st.capacity,
                             st.settings.levels), key, now)
            return Unfinished(preemptor.name, 0, 0)
        got = checked
    return got


def _recheck(st: CoreState, found: Victims, pre: Preemptor) -> Victims | None:
    """``found`` as it stands in the cluster of now, or None when it no longer holds: every
    victim still bound where it was, not terminating, below the preemptor; every victim
    gang with no member bound outside the set and no binding in flight; and the preemptor
    still planned into the freed nodes (the planner's answer, on those nodes only)."""
    terminating = st.preemption.inflight.terminating()
    prio: dict[GangKey, int] = {}
    victims = {c.key for c in found.evict}
    for c in found.evict:
        p = st.store.pods.get(c.key)
        if p is None or not p.holds_capacity or p.node_name != c.node \
                or c.key in terminating or st.unit_priority(p, prio) >= pre.priority:
            return None
    for key in found.gangs:
        g = st.gangs.get(key)
        if g is None or binding_in_flight(g) or any(
                (p := st.store.pods.get(k)) is not None and p.holds_capacity
                and k not in victims for k in g.members):
            return None
    levels = st.settings.levels
    view = freed_view(st.capacity, levels, found.evict, within=set(found.plan.assignments
                                                                   .values()))
    plan = plan_gang(pre.members, view, levels, required=pre.required)
    return replace(found, plan=plan) if isinstance(plan, Plan) else None


def _unfinished(u: Unfinished) -> str:
    return (f"{u.preemptor} is searching for victims ({u.work} units of work over "
            f"{u.slices} sweep(s) so far; each sweep does at most a bounded share)")


def _resume_searches(st: CoreState, now: float) -> None:
    """The deadline timer: searches due for their next slice go back into the sweep (a
    gang's through ``creation.gated.touched``; a plain pod is in every sweep while
    unschedulable)."""
    book = st.preemption.inflight
    book.idle_searches(now)
    for who, run in book.searches.items():
        if run.resume_at <= now:
            run.woken = now
            if who.kind == "gang":
                st.creation.gated.touched.add(GangKey(who.name))


def _evict(st: CoreState, found: Victims, preemptor: str, by: str, priority: int) -> None:
    for c in found.evict:
        st.outbox.evictions.append(Eviction(c.key, st.store.pods[c.key].uid, c.node,
                                            preemptor, priority, c.gang))
    for victim in found.gangs:
        st.notice(NoticeKind.PREEMPTED, victim,
                  [c.key for c in found.evict if c.gang == victim], detail=by)
    for key in found.pods:
        st.notice(NoticeKind.PREEMPTED, None, (key,), detail=by)


def preempt_for_plain(st: CoreState, now: float) -> None:
    """Plain pods of Lockstep's schedulers that kube-scheduler found no node for look for
    victims, highest priority first (its own filters failed everywhere, so no filter call
    comes: this runs in the sweep after cluster events, as ``admit_by_preemption`` does
    for gangs). The room a preemption frees is held as the pod's nomination."""
    if not st.settings.preemption or not st.preemption.unschedulable_plain:
        return
    for key, _ in sorted(st.preemption.unschedulable_plain.items(), key=lambda t: (-t[1], t[0])):
        pod = st.store.pods.get(key)
        if pod is None or st.preemption.nominations.get(key) is not None \
                or st.preemption.inflight.get(PreemptorId.of_pod(key)) is not None \
                or st.preemption.plain_tried.get(key) == st.store.epoch:
            continue
        _preempt_for_plain(st, pod, now)


def _preempt_for_plain(st: CoreState, pod: PodRecord, now: float) -> None:
    policy = (PreemptionPolicy.NEVER if pod.preempt_never
              else PreemptionPolicy.PREEMPT_LOWER_PRIORITY)
    preemptor = Preemptor(str(pod.key), (Member(pod),), pod.priority, policy,
                          quota=quota_line(pod.namespace, pod.labels))
    found = _decide(st, PreemptorId.of_pod(pod.key), preemptor, now)
    if isinstance(found, Unfinished):  # the next sweep goes on with it
        st.plain.verdict(pod.key, preemption=_unfinished(found))
        return
    if not isinstance(found, Victims):
        # Nothing to do until capacity or pods change (AlreadyFits: kube-scheduler's own
        # filters turned it away for something no eviction changes).
        st.preemption.plain_tried[pod.key] = st.store.epoch
        if not isinstance(found, AlreadyFits):
            st.plain.verdict(pod.key, preemption=describe(found))
        return
    started = st.preemption.inflight.start(preemptor=PreemptorId.of_pod(pod.key), gang=None,
                                   priority=pod.priority, victims=found,
                                   requests={pod.key: pod.requests}, now=now)
    if not isinstance(started, InFlight):
        return
    st.preemption.plain_tried.pop(pod.key, None)
    node = found.plan.assignments[pod.key]
    st.preemption.nominations.add(Nomination(pod.key, node, dict(pod.requests), pod.priority,
                                  started.deadline + BIND_WITHIN))
    _evict(st, found, str(pod.key), f"by pod {pod.key} (priority {pod.priority})",
           pod.priority)
    units = len(found.gangs) + len(found.pods)
    st.plain.verdict(pod.key, preemption=(
        f"preempting {units} unit(s) ({len(found.evict)} pod(s)) on {node}; the room there "
        f"is held for this pod"))


def nominated_pod_done(st: CoreState, pod: PodRecord) -> None:
    """The pod bound, finished or left: its nomination (and a preemption still in flight
    for it) ends."""
    if st.preemption.nominations.remove(pod.key) is not None:
        st.preemption.inflight.cancel(PreemptorId.of_pod(pod.key))


def displaced(st: CoreState, node: NodeName, by: PodKey) -> None:
    """A pod bound on ``node`` (kube-scheduler placed it: a higher-priority pod may take a
    nomination's room). Nominations whose victims are gone and whose room is no longer
    there are given back, lowest priority first, and their pods tried again."""
    leaving: Resources = {}
    # Their room is on its way to a preemptor here.
    for k in st.preemption.inflight.terminating():
        p = st.store.pods.get(k)
        if p is not None and p.node_name == node and p.holds_capacity:
            leaving = add(leaving, p.requests)
    for n in st.preemption.nominations.on(node):
        if n.pod == by:
            continue
        if not fits(n.requests, add(add(st.capacity.free_for_gang(node), n.requests),
                                    leaving)):
            st.preemption.nominations.remove(n.pod)
            st.preemption.inflight.cancel(PreemptorId.of_pod(n.pod))
            st.preemption.plain_tried.pop(n.pod, None)
            st.outbox.requeue.add(n.pod)


def victims_gone(st: CoreState, pods: Iterable[PodKey]) -> None:
    """The watch showed these pods gone (deleted or finished)."""
    if not len(st.preemption.inflight):
        return
    for done in st.preemption.inflight.gone(pods):
        if done.record.gang is None:  # a plain pod: its room is free, wake it to bind there
            if (plain := done.record.preemptor.pod) is not None:
                st.outbox.requeue.add(plain)
            continue
        g = st.gangs.get(done.record.gang)
        if g is None:
            continue
        _no_longer_preempting(st, g, None)
        # The room is free now: members turned away while victims held it are woken, held
        # ones lose the gate (pinned to their slot).
        st.outbox.requeue.update(g.wake())
        st.outbox.lift.update(p.key for p in st.live(g) if p.gated)
        st.creation.gated.touched.add(g.key)


def _no_longer_preempting(st: CoreState, g: Gang, reason: GangReason | None) -> None:
    """The gang's own preemption ended (its victims went, or outlived the deadline): a
    "Preempting" reason it was told from that record goes with it. A gang that had given its
    room back (a member left) and was told it waits on the record would otherwise say so
    for good, with nothing in flight; its members are woken to be filtered afresh."""
    if isinstance(g.reason, Preempting):
        g.reason = reason
        st.outbox.requeue.update(g.wake())


def expired(st: CoreState, now: float) -> list[PreemptionExpired]:
    """Preemptions whose victims outlived the deadline; the caller gives a gang's room back,
    a plain pod's nomination is dropped here. Nominations whose pod never came to bind
    end too."""
    out = st.preemption.inflight.expire(now) if len(st.preemption.inflight) else []
    _resume_searches(st, now)
    for e in out:
        if (plain := e.record.preemptor.pod) is not None:
            st.preemption.nominations.remove(plain)
        elif e.record.gang is not None and (g := st.gangs.get(e.record.gang)) is not None:
            _no_longer_preempting(st, g, PreemptionStalled(g.key, len(e.still_there)))
    for n in st.preemption.nominations.expired(now):
        st.preemption.nominations.remove(n.pod)
        st.preemption.plain_tried.pop(n.pod, None)
    return out


LIST_GRAIN = 1_000
"""Pods read by one piece of a candidate listing (:func:`candidate_steps`): a few
milliseconds, so a slice of a victim search stops within its budget while it lists."""
LIST_COST = BOOK_COST
"""Units charged per pod read by one pass of the listing, as the search charges its own
arithmetic (:data:`~coscheduling.preemption.victims.BOOK_COST`)."""
RECORD_COST = 2 * BOOK_COST
"""Units charged per candidate built (its gang, priority, budgets and quota are read)."""


def _candidates(st: CoreState, below: int) -> list[Candidate]:
    """:func:`candidate_steps` in one go, however long it takes."""
    steps = candidate_steps(st, below)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        out: list[Candidate] = done.value
        return out


def _listing(st: CoreState, below: int) -> Callable[[], Listing]:
    """The candidates of a victim search, listed as its first budgeted pieces."""
    return lambda: candidate_steps(st, below)


def candidate_steps(st: CoreState, below: int) -> Generator[int, None, list[Candidate]]:
    """Every bound pod that could be a victim, each gang's bound members all together,
    listed in pieces of at most :data:`LIST_GRAIN` pods, each announced with its cost as
    a victim search's pieces are (:class:`~coscheduling.preemption.victims.VictimSearch`): a
    5,000-node cluster holds tens of thousands of pods, and reading them all in one piece
    held the event loop for a quarter of a second before the search's budget began.

    Every pod is measured as :meth:`~coscheduling.corestate.CoreState.unit_priority` measures
    it: a gang member by its gang's priority (the group's when it names one), a plain pod by
    its own. The preemptor is measured the same way, so one number stands on both sides of
    every comparison and an eviction always goes strictly down.

    Left out: victims already terminating (their room is on its way back to somebody), and
    every gang with a binding in flight (:func:`binding_in_flight`): such a gang is a victim
    whole or not at all, and "whole" is not known until its bindings land.

    Three passes: the first finds the plain pods and gangs below ``below`` (nothing else is
    ever a victim, and on most clusters that is nothing at all), the second every bound
    member of those gangs, only the third builds records. Between two pieces the cluster
    may change: a pod gone is skipped, and a set decided over several slices is checked
    against the cluster of its moment before anything is evicted (``_recheck``)."""
    terminating = st.preemption.inflight.terminating()
    prio: dict[GangKey, int] = {}
    keys = list(st.store.pods)
    plain: list[PodRecord] = []
    gangs_low: set[GangKey] = set()
    for i in range(0, len(keys), LIST_GRAIN):
        chunk = keys[i:i + LIST_GRAIN]
        yield len(chunk) * LIST_COST
        for k in chunk:
            p = st.store.pods.get(k)
            if p is None or not p.holds_capacity or k in terminating \
                    or st.unit_priority(p, prio) >= below:
                continue
            if (g := gang_of(st.membership.get(k))) is None:
                plain.append(p)
            else:
                gangs_low.add(g)
    if not plain and not gangs_low:
        return []
    pods = plain + (yield from _gang_members(st, sorted(gangs_low), terminating))
    budgets: dict[str, list[Budget]] = {}
    for b in st.preemption.budgets.values():
        budgets.setdefault(b.namespace, []).append(b)
    out: list[Candidate] = []
    for i in range(0, len(pods), LIST_GRAIN):
        some = pods[i:i + LIST_GRAIN]
        yield len(some) * RECORD_COST
        out += [Candidate(p.key, p.node_name, p.requests, st.unit_priority(p, prio),
                          gang_of(st.membership.get(p.key)), p.started,
                          selecting(p, budgets.get(p.namespace, ())), p.grace_seconds,
                          quota_line(p.namespace, p.labels))
                for p in some if p.node_name is not None]
    return out


def _gang_members(st: CoreState, gangs: Sequence[GangKey], terminating: frozenset[PodKey]
                  ) -> Generator[int, None, list[PodRecord]]:
    """Every bound member of ``gangs`` not terminating, gang by gang, members by key;
    gangs with a binding in flight left out. Pieces of about :data:`LIST_GRAIN` members."""
    out: list[PodRecord] = []
    batch: list[GangKey] = []
    size = 0
    for at, key in enumerate(gangs):
        gang = st.gangs.get(key)
        if gang is not None:
            batch.append(key)
            size += len(gang.members)
        if batch and (size >= LIST_GRAIN or at == len(gangs) - 1):
            yield size * LIST_COST
            for g in batch:
                gang = st.gangs.get(g)
                if gang is None or binding_in_flight(gang):
                    continue
                for k in sorted(gang.members):
                    p = st.store.pods.get(k)
                    if p is not None and p.holds_capacity and k not in terminating:
                        out.append(p)
            batch, size = [], 0
    return out


def binding_in_flight(g: Gang) -> bool:
    """The gang has bindings Lockstep issued that the watch has not shown bound yet (a
    BindGroup, or a released gang's extra). It is never a victim then: see
    ``docs/preemption.md``, "A binding in flight"."""
    return bool(g.binding)
