"""Cluster events in: one table entry (:class:`~coscheduling.events.kind.Kind`) per resource
kind the core reads. Kubernetes' own kinds are entries here (:data:`NODES`, :data:`PODS`,
...); each convention's objects get theirs from what the convention declares
(:func:`kind_of` its :class:`~coscheduling.conventions.base.Watch`, by ``into``), so the
registry (``coscheduling.conventions.REGISTRY``) is the one list of them: a convention with
a PodGroup object like scheduler-plugins' needs nothing here. The facade routes events to the
entries and the app's watches feed them (``coscheduling.events.watched``). What an event means for
the gangs is here too: a lost node gives back the slots on it, a PodGroup that came or went
re-resolves its pods, a pod that changed gang leaves the old one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from ..actions import NoticeKind, Unparked
from ..conventions import points_at_object, scheduler_plugins, volcano
from ..conventions.base import MAX_GANG_SIZE_FLAG, Convention, PodGroupRecord, Watch
from ..conventions.upstream import (
    UpstreamComposite,
    UpstreamPodGroup,
    UpstreamWorkload,
    workload_gang_key,
)
from ..conventions.volcano_queues import QueueRecord
from ..corestate import CoreState
from ..gang.admission import reconcile
from ..gang.gating import pinned_node
from ..gang.membership import declares_alike, refresh_spec, resolve_pod
from ..gang.queue_gate import queue_freed, wake_queued
from ..podgroup import GangKey, GangSpec, InvalidGang, Membership, gang_key, gang_of
from ..preemption.budgets import Budget
from ..preemption.carry import displaced, nominated_pod_done, victims_gone
from ..preemption.inflight import PreemptorId
from ..reasons import BindTargetGone, HigherPriorityPodsWaiting, InvalidDeclaration
from ..records import NodeName, NodeRecord, PodKey, PodRecord, PriorityClass, status_only
from ..state.gang import Gang
from ..topology.domains import NumaZones
from .dra import (
    DEVICE_CLASSES,
    DEVICE_KINDS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from .kind import Kind

__all__ = [
    "COMPOSITES",
    "DEVICE_CLASSES",
    "DEVICE_KINDS",
    "NODES",
    "NUMA",
    "PDBS",
    "PODS",
    "PRIORITY_CLASSES",
    "QUEUES",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "SP_PODGROUPS",
    "UPSTREAM_PODGROUPS",
    "VOLCANO_PODGROUPS",
    "WORKLOADS",
    "Kind",
    "assume_bound",
    "delete_pod",
    "forget_assumed",
    "kind_of",
    "learn_newer",
    "pods_listed",
    "upsert_pod",
    "upsert_pods",
    "watched_pod",
]

# ---------------------------------------------------------------------- nodes


def _upsert_node(st: CoreState, node: NodeRecord) -> None:
    st.store.put_node(node)


def _delete_node(st: CoreState, name: NodeName) -> None:
    if st.store.drop_node(name) is not None:
        _node_lost(st, name)


def _replace_nodes(st: CoreState, nodes: Iterable[NodeRecord]) -> None:
    """After a relist: the same path as events, so every derived cache is dropped."""
    for name in st.store.replace_nodes(nodes):
        _node_lost(st, name)


def _node_lost(st: CoreState, name: NodeName) -> None:
    """Give back what was held on node ``name``: nominations, parked calls and slots.

    A member whose binding is in flight keeps its slot: the bind POST does not check the
    node, so it lands whether or not a node of that name exists (one created again under
    the name, or none: the pod GC then deletes the orphan). Its room stays counted until
    the watch shows it bound or the binding fails; dropping it let another gang be planned
    into the room of a node created again before the binding landed (double-booked)."""
    for n in st.preemption.nominations.on(name):  # a plain pod's held room went with the node
        st.preemption.nominations.remove(n.pod)
        st.preemption.inflight.cancel(PreemptorId.of_pod(n.pod))
        st.preemption.plain_tried.pop(n.pod, None)
        st.outbox.requeue.add(n.pod)
    touched: dict[GangKey, Gang] = {}
    for r in st.ledger.on_node(name):
        g = st.gangs[r.gang]
        if r.pod in g.binding:
            continue
        if st.waiting.node(r.pod) == name:
            st.waiting.remove(r.pod)
            st.outbox.unparked.append(Unparked(g.key, {r.pod: name}, BindTargetGone(
                g.key, r.pod, f"node {name} was deleted")))
        g.drop_slot(r.pod)
        touched[g.key] = g
    for g in touched.values():
        reconcile(st, g)


# ---------------------------------------------------------------------- PodGroups


def _reresolve(st: CoreState, key: GangKey) -> None:
    """A PodGroup object of this name came, changed or went: re-resolve its pods and wake
    the members turned away before (kube-scheduler sees no pod event for this)."""
    ns, name = key.split("/", 1)
    for pod in list(st.store.pods.values()):
        if pod.namespace == ns and points_at_object(pod, name):
            upsert_pod(st, pod)
    g = st.gangs.get(key)
    if g is not None:
        st.outbox.requeue.update(g.wake())


def _group_kind(name: str, table: Callable[[CoreState], dict[GangKey, PodGroupRecord]],
                size_field: str) -> Kind[GangKey, PodGroupRecord]:
    """A PodGroup CRD (scheduler-plugins' or Volcano's): stored by key, pods re-resolved.
    A group larger than ``--max-gang-size`` is stored with that error, so its members and
    the status written back (Volcano's enqueue step included) all say so."""
    def put(st: CoreState, pg: PodGroupRecord) -> None:
        bounded = _within_size(st, pg, size_field)
        if table(st).get(pg.key) == bounded:
            return  # nothing resolution reads changed (a JobSet's status, say)
        table(st)[pg.key] = bounded
        _reresolve(st, pg.key)

    def drop(st: CoreState, key: GangKey) -> None:
        table(st).pop(key, None)
        _reresolve(st, key)

    return Kind(name, table, lambda pg: pg.key, put, drop)


def _within_size(st: CoreState, pg: PodGroupRecord, size_field: str) -> PodGroupRecord:
    limit = st.settings.defaults.max_gang_size
    if pg.error is not None or pg.min_member is None or pg.min_member <= limit:
        return pg
    return replace(pg, error=InvalidGang(pg.key, size_field, str(pg.min_member),
                                         f"is above the limit of {limit} ({MAX_GANG_SIZE_FLAG})"))


def _upsert_upstream(st: CoreState, pg: UpstreamPodGroup) -> None:
    """A scheduling.k8s.io PodGroup. Only a change of what it declares re-resolves its pods:
    the condition Lockstep writes comes back as an event too. A gang larger than
    ``--max-gang-size`` is stored with that error, so its condition says so."""
    limit = st.settings.defaults.max_gang_size
    if pg.policy is not None and pg.policy.min_count is not None \
            and pg.policy.min_count > limit:
        pg = replace(pg, policy=None, priority=None, error=InvalidGang(
            pg.key, f"{pg.policy.where}.gang.minCount", str(pg.policy.min_count),
            f"is above the limit of {limit} ({MAX_GANG_SIZE_FLAG})"))
    old = st.store.upstream.get(pg.key)
    st.store.upstream[pg.key] = pg
    if old is None or (old.policy, old.error, old.priority, old.parent) != (
            pg.policy, pg.error, pg.priority, pg.parent):
        _reresolve(st, pg.key)  # the priority fields too: the gang's spec carries them
        _adopt(st, pg.key, old.parent if old is not None else None, pg.parent)


def _delete_upstream(st: CoreState, key: GangKey) -> None:
    old = st.store.upstream.pop(key, None)
    if old is not None:
        _reresolve(st, key)
        _adopt(st, key, old.parent, None)


def _adopt(st: CoreState, key: GangKey, old: str | None, new: str | None) -> None:
    """A PodGroup's parent composite changed (it came, went, or names another): the
    composites' children follow, and the pods of every sibling are resolved again (their
    group of groups lists the children)."""
    ns = key.split("/", 1)[0]
    for parent, add in ((old, False), (new, True)):
        if parent is None or old == new:
            continue
        ckey = gang_key(ns, parent)
        kids = st.store.children.setdefault(ckey, set())
        if add:
            kids.add(key)
        else:
            kids.discard(key)
        for sibling in sorted(kids - {key}):
            _reresolve(st, sibling)
        if not kids:
            del st.store.children[ckey]


def _upsert_composite(st: CoreState, c: UpstreamComposite) -> None:
    """A CompositePodGroup: its children's pods are resolved again when what it declares
    changed (the condition written back comes as an event too)."""
    old = st.store.composites.get(c.key)
    st.store.composites[c.key] = c
    if old != c:
        for child in sorted(st.store.children.get(c.key, ())):
            _reresolve(st, child)


def _delete_composite(st: CoreState, key: GangKey) -> None:
    if st.store.composites.pop(key, None) is not None:
        for child in sorted(st.store.children.get(key, ())):
            _reresolve(st, child)


def _upsert_workload(st: CoreState, wl: UpstreamWorkload) -> None:
    """A 1.35 Workload: its pods' gangs are ``workload/podGroup[/replicaKey]``."""
    old = st.store.workloads.get(wl.key)
    st.store.workloads[wl.key] = wl
    if old is None or old.groups != wl.groups:
        _reresolve_workload(st, wl.key)


def _delete_workload(st: CoreState, key: GangKey) -> None:
    if st.store.workloads.pop(key, None) is not None:
        _reresolve_workload(st, key)


def _reresolve_workload(st: CoreState, key: GangKey) -> None:
    ns, name = key.split("/", 1)
    gangs = set()
    for pod in list(st.store.pods.values()):
        ref = pod.workload_ref
        if pod.namespace == ns and ref is not None and ref[0] == name:
            upsert_pod(st, pod)
            gangs.add(workload_gang_key(ns, ref))
    for k in sorted(gangs):
        if (g := st.gangs.get(k)) is not None:
            st.outbox.requeue.update(g.wake())


# ---------------------------------------------------------------------- pods


def upsert_pod(st: CoreState, pod: PodRecord, *, watched: bool = False) -> None:
    """The pod came or changed. ``watched``: it is a watch event (not the stored record
    handed back to be resolved again), so one that changes only a bound member's running
    status (:func:`~coscheduling.records.status_only`) is stored without re-deciding its
    gang: its membership, the gang's spec and phase are what they were."""
    _upsert_pod(st, pod, watched, None)


def upsert_pods(st: CoreState, pods: Sequence[PodRecord],
                known: tuple[PodRecord, Membership] | None = None) -> None:
    """Each of ``pods`` came or changed, as :func:`upsert_pod` one after another leaves
    them, each gang they touch decided (its spec refreshed, its phase reconciled) once at
    the end rather than once per pod: the members of a gang pinned at creation together
    cost one pass over the gang, not one per member (8 for a gang of 8).

    Only a record that changes nothing those passes read but its own required affinity is
    taken this way (:func:`_counted_again`: a member pinned at creation, already counted
    with the same membership, its pin on its planned node); any other is upserted the
    full way at its turn, the gangs gathered so far decided first.

    ``known``: a record and the membership the caller resolved for it against the objects
    as they are (the placer's own review). Upserting pods changes none of the objects a
    membership is resolved against, so a pod that declares alike (:func:`declares_alike`)
    the last record resolved has its membership, not resolved again (a gang's members
    created from one template all do)."""
    gather: dict[GangKey, Gang] = {}
    for pod in pods:
        if known is not None and declares_alike(known[0], pod):
            m = known[1]
        else:
            m = resolve_pod(st, pod)
            known = (pod, m)
        g = _counted_again(st, pod, m)
        if g is not None:
            gather.setdefault(g.key, g)
            continue
        _decide(st, gather)
        _upsert_pod(st, pod, False, (m,))
    _decide(st, gather)


def _counted_again(st: CoreState, pod: PodRecord, m: Membership) -> Gang | None:
    """Store ``pod`` without deciding its gang, when :func:`upsert_pod` would do no more:
    it replaces a record without a UID (pinned at creation, not created yet) of a
    pending member counted in the same gang with the same membership, with nothing
    assumed for it, its pin (if any) on the node its slot is planned on and the slot sized
    for it. What is left is the gang's decision, the caller's (:func:`_decide`).
    None: not such a record, nothing done."""
    if pod.uid or pod.node_name is not None or not pod.active or pod.gated \
            or pod.unschedulable or pod.terminal or pod.key in st.assumed:
        return None
    old = st.store.pods.get(pod.key)
    if old is None or old.uid or not isinstance(m, GangSpec) \
            or st.membership.get(pod.key) != m:
        return None
    g = st.gangs.get(m.key)
    if g is None or pod.key not in g.members:
        return None
    pin = pinned_node(pod.required_affinity)
    if pin is not None and g.plan.get(pod.key) not in (None, pin):
        return None
    slot = st.ledger.get(pod.key)
    if slot is not None and slot.requests != pod.requests:
        return None
    st.store.put_pod(pod)
    st.membership[pod.key] = m
    _track_pending(st, pod, False)
    st.outbox.arrived(pod)
    return g


def _decide(st: CoreState, gangs: dict[GangKey, Gang]) -> None:
    """Each of ``gangs`` decided once, as :func:`upsert_pod` decides a gang it touched."""
    for g in gangs.values():
        refresh_spec(st, g)
        reconcile(st, g)
    gangs.clear()


def _upsert_pod(st: CoreState, pod: PodRecord, watched: bool,
                resolved: tuple[Membership] | None) -> None:
    pod = _with_assumption(st, pod)
    if pod.uid and st.creation.pinned:
        st.creation.pinned.pop(pod.key, None)  # pinned at creation, and now created
    change = st.store.put_pod(pod)
    if change.replaced is not None:  # same name, new UID: the old pod is gone
        st.store.forget_gone(change.replaced.uid)
        _pod_left(st, change.replaced)
    old = change.old
    # A membership is resolved from the fields declares_alike compares and the objects
    # whose events resolve every pod naming them again (_reresolve, _reresolve_workload):
    # a watch event that left those fields alike keeps the stored answer.
    kept = old if watched and pod.key in st.membership else None
    same = kept is not None and status_only(kept, pod)
    membership = st.membership[pod.key] if same or (
        kept is not None and declares_alike(kept, pod)) \
        else resolved[0] if resolved is not None else resolve_pod(st, pod)
    old_gang = gang_of(st.membership.get(pod.key))
    new_gang = gang_of(membership)
    st.membership[pod.key] = membership
    carried: NodeName | None = None
    if old_gang is not None and old_gang != new_gang:
        carried = _binding_node(st, old_gang, pod)
        _leave(st, old_gang, pod.key)
    if new_gang is not None:
        g = st.gangs.get(new_gang)
        if g is None:
            g = st.gangs[new_gang] = Gang(new_gang, st.ledger)
            same = False
        g.members.add(pod.key)
        pin = pinned_node(pod.required_affinity) if not same else None
        if pin is not None and g.plan.get(pod.key) not in (None, pin):
            # Its gate came off with a pin decided on an older plan: the slot must
            # follow the pin (re-placed on it below, or the gang gives all back).
            g.drop_slot(pod.key)
        slot = st.ledger.get(pod.key)
        if slot is not None and slot.requests != pod.requests:
            # Not the pod the slot was sized for: a pin given at creation whose pod never
            # landed, and a pod of another shape created under its name since. The slot
            # must hold what binds (re-placed below, or the gang gives all back).
            g.drop_slot(pod.key)
        if pod.node_name is not None or not pod.active:
            # Bound: the slot became usage. Finished or deleting: it never will be.
            st.unpark(g, pod.key, f"pod {pod.key} is "
                      + (f"bound to {pod.node_name}" if pod.node_name else "finishing"))
            g.drop_slot(pod.key)
            g.binding.discard(pod.key)
        if not same:
            # A status-only event leaves every member's fields these read as they were
            # when the gang was last reconciled (bound, same node, still counted).
            refresh_spec(st, g)
            reconcile(st, g)
        if isinstance(membership, GangSpec) and membership.capped_from is not None \
                and old is None:
            st.notice(NoticeKind.TIMEOUT_CAPPED, g.key, (pod.key,), detail=(
                f"{membership.capped_from:g}s capped to {membership.timeout_seconds:g}s"))
    if isinstance(membership, InvalidGang) and (
        old is None or old.annotations != pod.annotations or old.labels != pod.labels
    ):
        st.notice(NoticeKind.INVALID, membership.key, (pod.key,),
                  InvalidDeclaration(membership))
    if pod.gated:
        st.outbox.lift.add(pod.key)
    if pod.terminal:
        victims_gone(st, (pod.key,))
        if new_gang is not None and (g := st.gangs.get(new_gang)) is not None:
            queue_freed(st, g)
    elif pod.unschedulable and pod.node_name is None and new_gang is not None:
        st.creation.gated.touched.add(new_gang)  # kube-scheduler found no node: may preempt
    _track_pending(st, pod, membership is None)
    st.outbox.arrived(pod)
    if carried is not None:
        # It left its gang (its group made basic or deleted, say) while its binding was in
        # flight: the binding still lands, so its room stays counted, assumed as a plain
        # pod Lockstep binds is, until the outcome or the watch says how it went.
        assume_bound(st, pod.key, carried)


def _binding_node(st: CoreState, gang: GangKey, pod: PodRecord) -> NodeName | None:
    """The node ``pod``'s binding of gang ``gang`` is in flight to, if one is."""
    g = st.gangs.get(gang)
    if g is None or pod.key not in g.binding or pod.node_name is not None or not pod.active:
        return None
    return g.plan.get(pod.key)


def assume_bound(st: CoreState, key: PodKey, node: NodeName) -> None:
    """Lockstep bound ``key`` to ``node`` (the API server said so): count it there now,
    before the watch shows it, as kube-scheduler's cache assumes a pod it bound."""
    pod = st.store.pods.get(key)
    if pod is None or pod.node_name is not None:
        return
    st.assumed[key] = (pod.uid, node)
    upsert_pod(st, pod)


def forget_assumed(st: CoreState, key: PodKey) -> None:
    """The binding Lockstep assumed failed: the pod is pending again."""
    if st.assumed.pop(key, None) is None:
        return
    pod = st.store.pods.get(key)
    if pod is not None and pod.node_name is not None:
        upsert_pod(st, replace(pod, node_name=None))


def _with_assumption(st: CoreState, pod: PodRecord) -> PodRecord:
    """The pod as the core must count it: a watch event older than Lockstep's own binding
    (no ``nodeName`` yet, same UID, still running) keeps the assumed node; an event that
    shows it bound, finished or replaced ends the assumption."""
    assumed = st.assumed.get(pod.key)
    if assumed is None:
        return pod
    uid, node = assumed
    if pod.uid == uid and not pod.terminal and not pod.deleting:
        if pod.node_name is None:
            return replace(pod, node_name=node)
        if st.store.pods.get(pod.key) is pod:
            # The stored record itself, resolved again (its group came, changed or went),
            # not the watch showing it bound: the binding is still in flight.
            return pod
    del st.assumed[pod.key]
    return pod


def _track_pending(st: CoreState, pod: PodRecord, plain: bool) -> None:
    """Keep ``plain.pending`` (plain pods kube-scheduler is placing); when one leaves it,
    gangs that waited for it are tried again."""
    placing = (plain and pod.scheduler_name in st.settings.scheduler_names
               and pod.node_name is None and pod.active and not pod.gated
               and not pod.unschedulable)
    if placing:
        st.plain.pending[pod.key] = pod.priority
    elif st.plain.pending.pop(pod.key, None) is not None:
        _wake_deferred(st)
    # No node passed kube-scheduler's own filters: no filter call comes; it may preempt.
    if (plain and pod.scheduler_name in st.settings.scheduler_names
            and pod.node_name is None and pod.active and not pod.gated and pod.unschedulable):
        st.preemption.unschedulable_plain[pod.key] = pod.priority
    elif st.preemption.unschedulable_plain.pop(pod.key, None) is not None:
        st.preemption.plain_tried.pop(pod.key, None)
    if pod.node_name is not None or not pod.active:
        nominated_pod_done(st, pod)
        if pod.node_name is not None and pod.node_name in st.preemption.nominations.total:
            displaced(st, pod.node_name, pod.key)


def _wake_deferred(st: CoreState) -> None:
    for g in st.gangs.values():
        if isinstance(g.reason, HigherPriorityPodsWaiting):
            st.outbox.requeue.update(g.wake())
            st.creation.gated.touched.add(g.key)


def delete_pod(st: CoreState, key: PodKey, uid: str = "") -> None:
    """The pod is gone; a ``uid`` that is not the cached pod's is a stale event, ignored."""
    current = st.store.pods.get(key)
    if current is None or (uid and current.uid and uid != current.uid):
        return
    rec = st.store.drop_pod(key)
    if rec is not None:
        st.store.forget_gone(rec.uid)
        _pod_left(st, rec)


def watched_pod(st: CoreState, pod: PodRecord) -> None:
    """A pod as the watch delivers it: it also moves how far the watch has read. An event
    older than the version the core holds (a filter call brought a newer one first) is
    superseded: applying it would take the pod back in time, e.g. put a lifted gate back on
    a member whose bind is parked."""
    st.store.pods_revision = max(st.store.pods_revision, pod.resource_version)
    if not _superseded(st, pod):
        upsert_pod(st, pod, watched=True)


def learn_newer(st: CoreState, pod: PodRecord) -> bool:
    """A scheduler call carried ``pod``: take it when the core holds an older version of the
    same pod (kube-scheduler's watch ran ahead of Lockstep's). Says whether it was taken."""
    cached = st.store.pods.get(pod.key)
    if cached is not None and not cached.uid and pod.key in st.creation.pinned \
            and _created_since(st, pod):
        upsert_pod(st, pod)  # pinned at creation: the call shows it created
        return True
    if cached is None or not pod.uid or cached.uid != pod.uid \
            or not 0 < cached.resource_version < pod.resource_version:
        return False
    upsert_pod(st, pod)
    return True


def _created_since(st: CoreState, pod: PodRecord) -> bool:
    """``pod`` is newer than everything the watch or a list has shown: not a pod of the same
    name that was deleted before (a stale scheduler cache still calls with those)."""
    return bool(pod.uid) and pod.uid not in st.store.gone \
        and pod.resource_version > st.store.pods_revision


def _superseded(st: CoreState, pod: PodRecord) -> bool:
    cached = st.store.pods.get(pod.key)
    return (cached is not None and bool(pod.uid) and cached.uid == pod.uid
            and 0 < pod.resource_version < cached.resource_version)


def pods_listed(st: CoreState, revision: int) -> None:
    """A list or bookmark at ``revision``: everything up to it has been seen."""
    st.store.pods_revision = max(st.store.pods_revision, revision)


def _replace_pods(st: CoreState, pods: Iterable[PodRecord]) -> None:
    """After a relist: make the pod set exactly ``pods``, deletions included."""
    fresh = {p.key: p for p in pods}
    st.store.pods_revision = max([st.store.pods_revision,
                                  *(p.resource_version for p in fresh.values())])
    for key in [k for k in st.store.pods if k not in fresh]:
        if key not in st.creation.pinned:  # not created yet
            delete_pod(st, key)
    for p in fresh.values():
        if st.store.pods.get(p.key) != p:
            upsert_pod(st, p)
        # A (re)list may follow a restart: members the previous process turned away
        # carry kube-scheduler's Unschedulable condition, and only a nudge wakes them.
        gang = st.gangs.get(gang_of(st.membership.get(p.key)) or GangKey(""))
        if gang is not None and p.unschedulable and p.node_name is None and p.active:
            gang.turned_away.add(p.key)


def _pod_left(st: CoreState, rec: PodRecord) -> None:
    st.assumed.pop(rec.key, None)
    victims_gone(st, (rec.key,))
    nominated_pod_done(st, rec)
    st.preemption.unschedulable_plain.pop(rec.key, None)
    st.preemption.plain_tried.pop(rec.key, None)
    if st.plain.pending.pop(rec.key, None) is not None:
        _wake_deferred(st)
    gang = gang_of(st.membership.pop(rec.key, None))
    if gang is not None:
        _leave(st, gang, rec.key)


def _leave(st: CoreState, gang: GangKey, pod: PodKey) -> None:
    g = st.gangs.get(gang)
    if g is None:
        return
    g.members.discard(pod)
    g.turned_away.discard(pod)
    g.told.pop(pod, None)
    st.unpark(g, pod, f"pod {pod} was deleted or left the gang")
    g.drop_slot(pod)
    g.binding.discard(pod)
    queue_freed(st, g)  # before its spec may go with its last member
    refresh_spec(st, g)
    if not g.members and not g.plan and not g.binding:
        del st.gangs[gang]
        st.preemption.tried.pop(gang, None)
        return
    reconcile(st, g)


# ---------------------------------------------------------------------- the table

NODES: Kind[NodeName, NodeRecord] = Kind(
    "nodes", lambda st: st.store.nodes, lambda n: n.name,
    _upsert_node, _delete_node, _replace_nodes)
NUMA: Kind[NodeName, NumaZones] = Kind(
    "noderesourcetopologies", lambda st: st.store.numa, lambda z: z.node,
    lambda st, z: st.store.put_numa(z), lambda st, n: st.store.drop_numa(n),
    lambda st, items: st.store.replace_numa(items))
UPSTREAM_PODGROUPS: Kind[GangKey, UpstreamPodGroup] = Kind(
    "podgroups.scheduling.k8s.io", lambda st: st.store.upstream, lambda pg: pg.key,
    _upsert_upstream, _delete_upstream)
COMPOSITES: Kind[GangKey, UpstreamComposite] = Kind(
    "compositepodgroups.scheduling.k8s.io", lambda st: st.store.composites, lambda c: c.key,
    _upsert_composite, _delete_composite)
WORKLOADS: Kind[GangKey, UpstreamWorkload] = Kind(
    "workloads.scheduling.k8s.io", lambda st: st.store.workloads, lambda w: w.key,
    _upsert_workload, _delete_workload)
def _put_budget(st: CoreState, b: Budget) -> None:
    st.preemption.budgets[b.key] = b


def _drop_budget(st: CoreState, key: str) -> None:
    st.preemption.budgets.pop(key, None)


PDBS: Kind[str, Budget] = Kind(
    "poddisruptionbudgets", lambda st: st.preemption.budgets, lambda b: b.key, _put_budget,
    _drop_budget)


def _put_class(st: CoreState, c: PriorityClass) -> None:
    st.store.priority_classes[c.name] = c
    st.preemption.tried.clear()  # a group's priority may have changed: look for victims again


def _drop_class(st: CoreState, name: str) -> None:
    st.store.priority_classes.pop(name, None)
    st.preemption.tried.clear()


PRIORITY_CLASSES: Kind[str, PriorityClass] = Kind(
    "priorityclasses", lambda st: st.store.priority_classes, lambda c: c.name, _put_class,
    _drop_class)


def _put_queue(st: CoreState, q: QueueRecord) -> None:
    if st.store.queues is None:
        st.store.queues = {}
    st.store.queues[q.name] = q
    wake_queued(st, q.name)


def _drop_queue(st: CoreState, name: str) -> None:
    if st.store.queues is not None and st.store.queues.pop(name, None) is not None:
        wake_queued(st, name)


def _replace_queues(st: CoreState, queues: Iterable[QueueRecord]) -> None:
    st.store.queues = {q.name: q for q in queues}
    wake_queued(st)


def _queues_unserved(st: CoreState) -> None:
    if st.store.queues is not None:
        st.store.queues = None
        wake_queued(st)


QUEUES: Kind[str, QueueRecord] = Kind(
    "queues.scheduling.volcano.sh", lambda st: st.store.queues or {}, lambda q: q.name,
    _put_queue, _drop_queue, _replace_queues, _queues_unserved)


PODS: Kind[PodKey, PodRecord] = Kind(
    "pods", lambda st: st.store.pods, lambda p: p.key, watched_pod,
    delete_pod, _replace_pods)



_OWN_RULES: dict[str, Kind[Any, Any]] = {
    "upstream-podgroups": UPSTREAM_PODGROUPS,
    "upstream-workloads": WORKLOADS,
    "upstream-composites": COMPOSITES,
    "volcano-queues": QUEUES,
}
"""The entries of the objects one convention has its own rules for (``Watch.into``)."""


@functools.cache
def kind_of(conv: Convention, watch: Watch) -> Kind[Any, Any]:
    """The entry the events of one of a convention's watched objects go to: for ``groups``
    (PodGroup objects), the convention's PodGroups in the store, pods re-resolved as they
    come and go, one above ``--max-gang-size`` kept with that error; otherwise the entry of
    the rules the convention's objects have here."""
    if watch.into == "groups":
        source = conv.source
        return _group_kind(watch.name, lambda st: st.store.groups_of(source), watch.size_field)
    return _OWN_RULES[watch.into]


SP_PODGROUPS = kind_of(scheduler_plugins.CONVENTION, scheduler_plugins.WATCHES[0])
VOLCANO_PODGROUPS = kind_of(volcano.CONVENTION, volcano.WATCHES[0])
"""The entries of the shipped PodGroup conventions' objects, by name, for callers that upsert
them directly (tests, benchmarks). Nothing routes by them: the table the app watches comes
from the registry (``coscheduling.events.watched.table``)."""
