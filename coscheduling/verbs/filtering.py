"""The filter verb: which of kube-scheduler's candidate nodes a pod may use.

A gang member gets exactly its planned node (admitting its gang first when it is not yet
admitted); a pod outside any gang, or an extra of a released gang, gets every candidate whose
capacity outside other gangs' reservations fits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import filterfalse

from ..actions import FilterDecision
from ..corestate import CoreState
from ..defrag.carry import steer
from ..devices.align import spared
from ..events.ingest import learn_newer, upsert_pod
from ..gang.admission import admit, admit_subgroup, devices_ready, extend, replan, turn_away
from ..gang.membership import countable, meets_quorum, resolve_pod
from ..gang.queue_gate import queue_gate
from ..podgroup import GangSpec, InvalidGang, MissingPodGroup
from ..preemption.carry import blocked, preempting_reason, victims_hold
from ..reasons import (
    BackingOff,
    InvalidDeclaration,
    NodeReason,
    PodGroupNotFound,
    PodNotInCache,
    ReservedForGangs,
    WaitingForMembers,
)
from ..records import NodeName, PodRecord
from ..resources import fits, shortfall
from ..state.gang import Gang, GangPhase

__all__ = ["filter_plain", "filter_pod"]


def filter_pod(st: CoreState, pod: PodRecord, candidates: Sequence[NodeName], now: float
               ) -> FilterDecision:
    """Which candidates ``pod`` may use; for gang pods exactly the planned node."""
    cached = st.store.pods.get(pod.key)
    if cached is None and pod.uid and pod.uid not in st.store.gone \
            and pod.resource_version > st.store.pods_revision:
        # The watch has not reached this pod yet (it is newer than anything delivered): the
        # call carries it, as the API server gave it to kube-scheduler, so learn it now
        # rather than turn it away for a backoff (the watch's own event replaces it). An
        # older pod absent from the store was deleted, and is not brought back.
        upsert_pod(st, pod)
        cached = st.store.pods.get(pod.key)
    elif cached is not None and learn_newer(st, pod):
        cached = st.store.pods.get(pod.key)
    if cached is None or (pod.uid and cached.uid and pod.uid != cached.uid):
        # Deleted (or recreated) since kube-scheduler saw it: answer from the request alone
        # and never write it into the store.
        if resolve_pod(st, pod) is None:
            return _filter_plain_pod(st, pod, candidates, now)
        st.outbox.awaited.add(pod.key)
        return FilterDecision([], unresolvable=PodNotInCache(
            pod.key, pod.uid, cached.uid if cached is not None else None))
    pod = cached
    m = st.membership.get(pod.key)
    if m is None:
        return _filter_plain_pod(st, pod, candidates, now)
    if isinstance(m, InvalidGang | MissingPodGroup):
        if m.key is not None and m.key in st.gangs:
            # Woken when its PodGroup appears or changes (no pod event would do it).
            st.gangs[m.key].turned_away.add(pod.key)
        if isinstance(m, InvalidGang):
            return FilterDecision([], unresolvable=InvalidDeclaration(m))
        return FilterDecision([], unresolvable=PodGroupNotFound(m.key, m.api))
    g = st.gangs[m.key]
    decision = _filter_gang(st, g, m, pod, candidates, now)
    if decision.unresolvable is not None:
        g.turned_away.add(pod.key)
    else:
        g.turned_away.discard(pod.key)
    return decision


def _filter_gang(st: CoreState, g: Gang, m: GangSpec, pod: PodRecord,
                 candidates: Sequence[NodeName], now: float) -> FilterDecision:
    spec = g.spec or m
    expected = dict(spec.parts).get(m.part or m.key, m.min_member) if spec.parts \
        else spec.min_member
    if expected != m.min_member:
        return FilterDecision([], unresolvable=InvalidDeclaration(InvalidGang(
            m.part or m.key, "min-member", str(m.min_member),
            f"members of the gang disagree (others say {expected})")))
    planned = g.plan.get(pod.key)
    if planned is not None:
        # The plan holds this pod's slot: hand out exactly that node (idempotent).
        if planned in candidates and victims_hold(st, g, planned) is None:
            if (waits := devices_ready(st, g, pod, planned)) is not None:
                return FilterDecision([], unresolvable=turn_away(st, pod.key, g, waits))
            return FilterDecision([planned])
        if (preempting := preempting_reason(st, g)) is not None:
            # Its victims still hold the planned node (kube-scheduler's own filters said
            # so, or Lockstep's book does). The slot stays; the member is woken when the
            # victims are gone.
            return FilterDecision([], unresolvable=turn_away(st, pod.key, g, preempting))
        return replan(st, g, pod, candidates)
    if g.phase is GangPhase.RELEASED:
        # Elastic extras: ordinary pods, but never on capacity reserved for anyone, nor
        # beyond what the gang's Volcano queue has room for.
        if (full := queue_gate(st, g, spec, (), pod.requests)) is not None:
            return FilterDecision([], unresolvable=full)  # as extend() answers an extra
        if (evicted := blocked(st, g)) is not None:
            return FilterDecision([], unresolvable=evicted)  # being evicted whole
        if spec.subgroups and (whole := admit_subgroup(st, g, pod, candidates)) is not None:
            return whole  # a group's subgroup beyond its quorum: placed whole, alone
        return filter_plain(st, pod, candidates)
    if g.phase is GangPhase.BACKING_OFF:
        assert g.backoff_until is not None
        if now < g.backoff_until:
            return FilterDecision([], unresolvable=turn_away(
                st, pod.key, g, BackingOff(g.key, g.backoff_until - now, g.backoff_cause)))
        g.backoff_over()
    if g.phase is GangPhase.ADMITTED:
        return extend(st, g, pod, candidates)
    live = st.live(g)
    if not meets_quorum(st, spec, countable(spec, live)):
        return FilterDecision([], unresolvable=turn_away(
            st, pod.key, g, WaitingForMembers(g.key, len(live), spec.min_member)))
    return admit(st, g, spec, pod, candidates, live, now)


def _filter_plain_pod(st: CoreState, pod: PodRecord, candidates: Sequence[NodeName],
                      now: float) -> FilterDecision:
    """A pod outside any gang; its answer is kept for ``explain``. The replacement of a
    pod moved to make room for a gang gets exactly the node reserved for it."""
    reserved = steer(st, pod)
    decision = filter_plain(st, pod, candidates)
    if reserved is not None and reserved in decision.passed:
        decision = FilterDecision([reserved])
    st.plain.verdict(pod.key, filtered_at=now, passed=len(decision.passed),
               refused=dict(decision.failed))
    return decision


def _devices_spared(st: CoreState, pod: PodRecord, candidates: list[NodeName]
                    ) -> tuple[list[NodeName], dict[NodeName, NodeReason]]:
    """Candidates where kube-scheduler's first fit for ``pod``'s claims would take devices
    an admitted gang's plan cannot spare are turned away (``devices.align.spared``)."""
    ok: list[NodeName] = []
    failed: dict[NodeName, NodeReason] = {}
    for n in candidates:
        holder = spared(st.devices, st.store.nodes, st.store.pods, st.ledger.get, pod, n)
        if holder is None:
            ok.append(n)
            continue
        r = st.ledger.get(holder)
        failed[n] = ReservedForGangs(n, (r.gang,) if r is not None else (), {"devices": 1})
    return ok, failed


def filter_plain(st: CoreState, pod: PodRecord, candidates: Sequence[NodeName]
                 ) -> FilterDecision:
    """A pod no plan holds: every candidate whose capacity outside reservations fits it."""
    # kube-scheduler's own filters already checked raw capacity (a node our cache has
    # not seen yet included), so only nodes holding reservations can turn this pod away:
    # the work is O(reserved nodes), plus one C-speed pass when some node fails.
    everything = candidates if isinstance(candidates, list) else list(candidates)
    if pod.claims and st.devices.planned:
        everything, taken = _devices_spared(st, pod, everything)
        if taken:
            rest = filter_plain(st, replace(pod, claims=()), everything)
            return FilterDecision(rest.passed, {**taken, **rest.failed}, rest.unresolvable)
    totals = st.ledger.total
    if st.preemption.nominations.total:  # room held for plain pods that preempted counts too
        totals = {**st.preemption.nominations.total, **totals}
    if not totals:
        return FilterDecision(everything)
    cand = set(everything) if len(totals) > 8 else None
    priority = st.unit_priority(pod)  # a released gang's extra: its gang's priority
    failed: dict[NodeName, NodeReason] = {}
    for node in totals:
        if (cand is not None and node not in cand) or (cand is None
                                                       and node not in everything):
            continue
        free = st.capacity.free_for_plain(node, pod.key, priority)
        if fits(pod.requests, free):
            continue
        gangs = tuple(sorted(st.ledger.gangs_on(node)))
        nominated = tuple(n.pod for n in st.preemption.nominations.on(node)
                          if n.pod != pod.key and n.priority >= priority)
        failed[node] = ReservedForGangs(node, gangs, shortfall(pod.requests, free), nominated)
    if not failed:
        return FilterDecision(everything)
    return FilterDecision(list(filterfalse(failed.__contains__, everything)), failed)
