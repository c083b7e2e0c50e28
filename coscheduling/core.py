"""The coscheduler facade: cluster events in, typed verb decisions out.

It wires three owners together and adds the gang rules between them:

* :class:`~coscheduling.store.ClusterStore` holds what the API server sent and every cache
  derived from it;
* :class:`~coscheduling.ledger.Ledger` holds one reservation per planned pod;
* :class:`~coscheduling.gang.Gang` is each gang's state machine, the only code that reserves
  or unreserves.

Everything is synchronous and takes ``now``: each verb decides and reserves in one block with
no ``await`` in between, which is what makes admission atomic under asyncio (the guarantee
HiveD gets from one lock). Deadlock freedom comes from admission: a gang is admitted only
when all of it fits in capacity no other gang holds, and an admitted gang always holds a
whole plan (a lost member or node is re-placed at once, or the gang gives everything back).

Things the app must act on outside a verb's answer are queued and drained: Events
(:meth:`drain_notices`), requeue nudges (:meth:`drain_requeue`) and parked calls to answer
(:meth:`drain_unparked`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import filterfalse
from types import MappingProxyType

from .capacity import Capacity
from .decisions import (
    BindDecision,
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    Expired,
    FilterDecision,
    Lift,
    Notice,
    NoticeKind,
    Park,
    Reject,
    Unparked,
)
from .gang import Gang, GangPhase
from .gating import pinned_node
from .ledger import Ledger
from .numa import NumaZones
from .outbox import Outbox
from .planner import Member, NoFit, Plan, plan_gang
from .podgroup import (
    SP_GROUP_LABEL,
    VOLCANO_GROUP,
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    MatchPolicy,
    Membership,
    MissingPodGroup,
    Mode,
    PodGroupRecord,
    Source,
    resolve,
)
from .reasons import (
    BackingOff,
    BindTargetGone,
    DoesNotFit,
    ExtraMemberWaits,
    GangReason,
    InvalidDeclaration,
    MembersLost,
    NodeReason,
    NotEnoughMinResources,
    PartiallyBound,
    PlannedNodeLost,
    PodGroupNotFound,
    PodNotInCache,
    ReservedForGangs,
    TimedOut,
    WaitingForMembers,
    WrongNode,
)
from .records import NodeName, NodeRecord, PodKey, PodRecord
from .resources import Resources, add, fits, shortfall
from .status import PodGroupStatus, podgroup_status
from .store import ClusterStore
from .topology import DEFAULT_LEVELS, GPU, Level, Score, level_by_name
from .upstream import (
    UpstreamPodGroup,
    UpstreamWorkload,
    combine,
    resolve_upstream,
    workload_gang_key,
)
from .volcano import VolcanoStatus, volcano_statuses
from .waiting import WaitingMap

__all__ = [
    "BindGroup",
    "BindNow",
    "Coscheduler",
    "Expired",
    "FilterDecision",
    "GangPhase",
    "GangView",
    "Notice",
    "NoticeKind",
    "Park",
    "Reject",
    "Settings",
]

TOPOLOGY_REQUIRED = "lockstep.dev/topology-required"
TOPOLOGY_PREFERRED = "lockstep.dev/topology-preferred"
HELD_RETRY_SECONDS = 0.5
"""How often held gangs that did not fit are planned again while capacity keeps changing."""


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_names: frozenset[str] = frozenset({"lockstep"})
    defaults: GangDefaults = GangDefaults()
    backoff_seconds: float = 30.0
    levels: tuple[Level, ...] = DEFAULT_LEVELS


@dataclass(frozen=True, slots=True)
class GangView:
    key: GangKey
    phase: GangPhase
    spec: GangSpec | None
    members: int
    bound: int
    parked: int
    plan: dict[PodKey, NodeName]
    plan_level: str | None
    deadline: float | None
    backoff_until: float | None
    reason: GangReason | None
    partial: PartiallyBound | None = None


class Coscheduler:
    """Cluster state plus the gang rules; one instance per Lockstep process."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.store = ClusterStore(self.settings.levels)
        self.ledger = Ledger(on_change=self.store.touch)
        self.capacity = Capacity(self.store, self.ledger)
        self.waiting = WaitingMap()
        self._gangs: dict[GangKey, Gang] = {}
        self._membership: dict[PodKey, Membership] = {}
        self.outbox = Outbox()
        self._held_touched: set[GangKey] = set()
        """Gangs with held members whose admission may have become possible."""
        self._held_blocked: set[GangKey] = set()
        """Held gangs that did not fit: planned again when capacity changed."""
        self._held_epoch = -1
        self._held_swept = float("-inf")
        self.partial_gangs = 0
        """Gangs left partly bound by a permanently failed binding (a counter for metrics)."""

    # ------------------------------------------------------------------ read-only views

    @property
    def pods(self) -> Mapping[PodKey, PodRecord]:
        return MappingProxyType(self.store.pods)

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return MappingProxyType(self.store.nodes)

    def pod(self, key: PodKey) -> PodRecord | None:
        return self.store.pods.get(key)

    def node(self, name: NodeName) -> NodeRecord | None:
        return self.store.nodes.get(name)

    def has_node(self, name: str) -> bool:
        return name in self.store.nodes

    def node_names(self) -> list[NodeName]:
        return sorted(self.store.nodes)

    def node_count(self) -> int:
        return len(self.store.nodes)

    def pod_count(self) -> int:
        return len(self.store.pods)

    def free(self, node: NodeName) -> Resources:
        return self.store.free(node)

    def free_unreserved(self, node: NodeName) -> Resources:
        """Free capacity on ``node`` that no gang holds."""
        return self.capacity.free_unreserved(node)

    def reserved_on(self, node: NodeName) -> dict[GangKey, Resources]:
        return self.ledger.by_gang_on(node)

    def reserved_gpus(self) -> int:
        return sum(r.get(GPU, 0) for r in self.ledger.total.values())

    def is_parked(self, pod: PodKey) -> bool:
        return self.waiting.is_parked(pod)

    def parked_total(self) -> int:
        return self.waiting.total()

    def members_of(self, gang: GangKey) -> list[PodRecord]:
        g = self._gangs.get(gang)
        if g is None:
            return []
        return [self.store.pods[k] for k in sorted(g.members) if k in self.store.pods]

    # ------------------------------------------------------------------ nodes

    def upsert_node(self, node: NodeRecord) -> None:
        self.store.put_node(node)

    def delete_node(self, name: NodeName) -> None:
        if self.store.drop_node(name) is not None:
            self._node_lost(name)

    def replace_nodes(self, nodes: Iterable[NodeRecord]) -> None:
        """After a relist: the same path as events, so every derived cache is dropped."""
        for name in self.store.replace_nodes(nodes):
            self._node_lost(name)

    def _node_lost(self, name: NodeName) -> None:
        touched: dict[GangKey, Gang] = {}
        for r in self.ledger.on_node(name):
            g = self._gangs[r.gang]
            if self.waiting.node(r.pod) == name:
                self.waiting.remove(r.pod)
                self.outbox.unparked.append(Unparked(g.key, {r.pod: name}, BindTargetGone(
                    g.key, r.pod, f"node {name} was deleted")))
            g.drop_slot(r.pod)
            touched[g.key] = g
        for g in touched.values():
            self._reconcile(g)

    def upsert_numa(self, zones: NumaZones) -> None:
        self.store.put_numa(zones)

    def delete_numa(self, node: NodeName) -> None:
        self.store.drop_numa(node)

    def replace_numa(self, items: Iterable[NumaZones]) -> None:
        self.store.replace_numa(items)

    # ------------------------------------------------------------------ PodGroups

    def upsert_podgroup(self, pg: PodGroupRecord) -> None:
        self._put_group(self.store.podgroups, pg)

    def delete_podgroup(self, key: GangKey) -> None:
        self._drop_group(self.store.podgroups, key)

    def replace_podgroups(self, groups: Iterable[PodGroupRecord]) -> None:
        self._replace_groups(self.store.podgroups, groups)

    def upsert_volcano_podgroup(self, pg: PodGroupRecord) -> None:
        self._put_group(self.store.volcano, pg)

    def delete_volcano_podgroup(self, key: GangKey) -> None:
        self._drop_group(self.store.volcano, key)

    def replace_volcano_podgroups(self, groups: Iterable[PodGroupRecord]) -> None:
        self._replace_groups(self.store.volcano, groups)

    def upsert_upstream_podgroup(self, pg: UpstreamPodGroup) -> None:
        """A scheduling.k8s.io PodGroup. Only a change of what it declares re-resolves its
        pods: the condition Lockstep writes comes back as an event too."""
        old = self.store.upstream.get(pg.key)
        self.store.upstream[pg.key] = pg
        if old is None or (old.policy, old.error) != (pg.policy, pg.error):
            self._reresolve(pg.key)

    def delete_upstream_podgroup(self, key: GangKey) -> None:
        if self.store.upstream.pop(key, None) is not None:
            self._reresolve(key)

    def replace_upstream_podgroups(self, groups: Iterable[UpstreamPodGroup]) -> None:
        fresh = {g.key: g for g in groups}
        for key in [k for k in self.store.upstream if k not in fresh]:
            self.delete_upstream_podgroup(key)
        for g in fresh.values():
            self.upsert_upstream_podgroup(g)

    def upsert_workload(self, wl: UpstreamWorkload) -> None:
        """A 1.35 Workload: its pods' gangs are ``workload/podGroup[/replicaKey]``."""
        old = self.store.workloads.get(wl.key)
        self.store.workloads[wl.key] = wl
        if old is None or old.groups != wl.groups:
            self._reresolve_workload(wl.key)

    def delete_workload(self, key: GangKey) -> None:
        if self.store.workloads.pop(key, None) is not None:
            self._reresolve_workload(key)

    def replace_workloads(self, items: Iterable[UpstreamWorkload]) -> None:
        fresh = {w.key: w for w in items}
        for key in [k for k in self.store.workloads if k not in fresh]:
            self.delete_workload(key)
        for w in fresh.values():
            self.upsert_workload(w)

    def _reresolve_workload(self, key: GangKey) -> None:
        ns, name = key.split("/", 1)
        gangs = set()
        for pod in list(self.store.pods.values()):
            ref = pod.workload_ref
            if pod.namespace == ns and ref is not None and ref[0] == name:
                self.upsert_pod(pod)
                gangs.add(workload_gang_key(ns, ref))
        for k in sorted(gangs):
            if (g := self._gangs.get(k)) is not None:
                self.outbox.requeue.update(g.wake())

    def _put_group(self, into: dict[GangKey, PodGroupRecord], pg: PodGroupRecord) -> None:
        into[pg.key] = pg
        self._reresolve(pg.key)

    def _drop_group(self, into: dict[GangKey, PodGroupRecord], key: GangKey) -> None:
        into.pop(key, None)
        self._reresolve(key)

    def _replace_groups(self, into: dict[GangKey, PodGroupRecord],
                        groups: Iterable[PodGroupRecord]) -> None:
        """After a relist of either PodGroup API: exactly ``groups``, deletions included."""
        fresh = {g.key: g for g in groups}
        for key in [k for k in into if k not in fresh]:
            self._drop_group(into, key)
        for g in fresh.values():
            if into.get(g.key) != g:
                self._put_group(into, g)

    def _reresolve(self, key: GangKey) -> None:
        """A PodGroup object of this name came, changed or went: re-resolve its pods and wake
        the members turned away before (kube-scheduler sees no pod event for this)."""
        self._reresolve_pods(key)
        g = self._gangs.get(key)
        if g is not None:
            self.outbox.requeue.update(g.wake())

    def _reresolve_pods(self, key: GangKey) -> None:
        ns, name = key.split("/", 1)
        for pod in list(self.store.pods.values()):
            if pod.namespace == ns and (
                pod.labels.get(SP_GROUP_LABEL) == name
                or any(pod.annotations.get(k) == name for k in VOLCANO_GROUP)
                or pod.scheduling_group == name
            ):
                self.upsert_pod(pod)

    # ------------------------------------------------------------------ pods

    def upsert_pod(self, pod: PodRecord) -> None:
        change = self.store.put_pod(pod)
        if change.replaced is not None:  # same name, new UID: the old pod is gone
            self._pod_left(change.replaced)
        old = change.old
        membership = self._resolve(pod)
        old_gang = _gang_key(self._membership.get(pod.key))
        new_gang = _gang_key(membership)
        self._membership[pod.key] = membership
        if old_gang is not None and old_gang != new_gang:
            self._leave(old_gang, pod.key)
        if new_gang is not None:
            g = self._gangs.get(new_gang)
            if g is None:
                g = self._gangs[new_gang] = Gang(new_gang, self.ledger)
            g.members.add(pod.key)
            pin = pinned_node(pod.required_affinity)
            if pin is not None and g.plan.get(pod.key) not in (None, pin):
                # Its gate came off with a pin decided on an older plan: the slot must
                # follow the pin (re-placed on it below, or the gang gives all back).
                g.drop_slot(pod.key)
            if pod.node_name is not None or not _live(pod):
                # Bound: the slot became usage. Finished or deleting: it never will be.
                self._unpark(g, pod.key, f"pod {pod.key} is "
                             + (f"bound to {pod.node_name}" if pod.node_name else "finishing"))
                g.drop_slot(pod.key)
                g.binding.discard(pod.key)
            self._refresh_spec(g)
            self._reconcile(g)
            if isinstance(membership, GangSpec) and membership.capped_from is not None \
                    and old is None:
                self._notice(NoticeKind.TIMEOUT_CAPPED, g.key, (pod.key,), detail=(
                    f"{membership.capped_from:g}s capped to {membership.timeout_seconds:g}s"))
        if isinstance(membership, InvalidGang) and (
            old is None or old.annotations != pod.annotations or old.labels != pod.labels
        ):
            self._notice(NoticeKind.INVALID, membership.key, (pod.key,),
                         InvalidDeclaration(membership))
        if pod.held:
            self.outbox.lift.add(pod.key)
        self.outbox.arrived(pod)

    def delete_pod(self, key: PodKey, uid: str = "") -> None:
        """The pod is gone; a ``uid`` that is not the cached pod's is a stale event, ignored."""
        current = self.store.pods.get(key)
        if current is None or (uid and current.uid and uid != current.uid):
            return
        rec = self.store.drop_pod(key)
        if rec is not None:
            self._pod_left(rec)

    def replace_pods(self, pods: Iterable[PodRecord]) -> None:
        """After a relist: make the pod set exactly ``pods``, deletions included."""
        fresh = {p.key: p for p in pods}
        for key in [k for k in self.store.pods if k not in fresh]:
            self.delete_pod(key)
        for p in fresh.values():
            if self.store.pods.get(p.key) != p:
                self.upsert_pod(p)
            # A (re)list may follow a restart: members the previous process turned away
            # carry kube-scheduler's Unschedulable condition, and only a nudge wakes them.
            gang = self._gangs.get(self.gang_of(p.key) or GangKey(""))
            if gang is not None and p.unschedulable and p.node_name is None and _live(p):
                gang.turned_away.add(p.key)

    def _pod_left(self, rec: PodRecord) -> None:
        gang = _gang_key(self._membership.pop(rec.key, None))
        if gang is not None:
            self._leave(gang, rec.key)

    def _leave(self, gang: GangKey, pod: PodKey) -> None:
        g = self._gangs.get(gang)
        if g is None:
            return
        g.members.discard(pod)
        g.turned_away.discard(pod)
        g.told.pop(pod, None)
        self._unpark(g, pod, f"pod {pod} was deleted or left the gang")
        g.drop_slot(pod)
        g.binding.discard(pod)
        self._refresh_spec(g)
        if not g.members and not g.plan and not g.binding:
            del self._gangs[gang]
            return
        self._reconcile(g)

    def _unpark(self, g: Gang, pod: PodKey, what: str) -> None:
        node = self.waiting.node(pod)
        if node is not None:
            self.waiting.remove(pod)
            self.outbox.unparked.append(
                Unparked(g.key, {pod: node}, BindTargetGone(g.key, pod, what)))

    # ------------------------------------------------------------------ membership

    def _resolve(self, pod: PodRecord) -> Membership:
        if pod.scheduler_name not in self.settings.scheduler_names:
            return None
        m = resolve(pod, self.store.podgroups, self.settings.defaults, self.store.volcano)
        if pod.scheduling_group is None and pod.workload_ref is None:
            return m
        return combine(m, resolve_upstream(pod, self.store.upstream, self.store.workloads,
                                           self.settings.defaults, self.settings.levels))

    def membership(self, pod: PodKey) -> Membership:
        return self._membership.get(pod)

    def gang_of(self, pod: PodKey) -> GangKey | None:
        return _gang_key(self._membership.get(pod))

    def _refresh_spec(self, g: Gang) -> None:
        specs = [m for k in sorted(g.members)
                 if isinstance(m := self._membership.get(k), GangSpec)]
        if not specs or not specs[0].group:
            g.spec = specs[0] if specs else None
            return
        # A Koordinator gang group: every gang keeps its own minimum, and a gang none of
        # whose members exist yet needs at least one (so the group waits for it).
        mins: dict[GangKey, int] = {}
        for m in specs:
            if m.part is not None:
                mins.setdefault(m.part, m.min_member)
        parts = tuple((p, mins.get(p, 1)) for p in specs[0].group)
        g.spec = replace(specs[0], min_member=sum(n for _, n in parts), parts=parts,
                         part=None, timeout_seconds=min(m.timeout_seconds for m in specs))

    def _part_of(self, key: PodKey) -> GangKey | None:
        m = self._membership.get(key)
        return m.part if isinstance(m, GangSpec) else None

    def meets_quorum(self, spec: GangSpec, keys: Iterable[PodKey]) -> bool:
        """Whether ``keys`` are enough members: minMember of them, or for a gang group
        each gang's own minimum."""
        if not spec.parts:
            return sum(1 for _ in keys) >= spec.min_member
        have = Counter(self._part_of(k) for k in keys)
        return all(have[p] >= n for p, n in spec.parts)

    def _pick(self, spec: GangSpec, have: Sequence[PodKey], todo: Sequence[PodKey]
              ) -> list[PodKey] | None:
        """The fewest of ``todo`` (in order) that complete a quorum with ``have``."""
        if not spec.parts:
            need = max(0, spec.min_member - len(have))
            return list(todo[:need]) if len(todo) >= need else None
        count = Counter(self._part_of(k) for k in have)
        short = {p: max(0, n - count[p]) for p, n in spec.parts}
        out = []
        for k in todo:
            p = self._part_of(k)
            if p is not None and short.get(p, 0) > 0:
                out.append(k)
                short[p] -= 1
        return None if any(short.values()) else out

    @staticmethod
    def _countable(spec: GangSpec, live: Sequence[PodRecord]) -> list[PodKey]:
        """Members that count toward the quorum: Koordinator's ``only-waiting`` leaves out
        the bound ones."""
        if spec.match_policy is MatchPolicy.ONLY_WAITING:
            return [p.key for p in live if p.node_name is None]
        return [p.key for p in live]

    def _live(self, g: Gang) -> list[PodRecord]:
        out = []
        for k in sorted(g.members):
            p = self.store.pods.get(k)
            if p is not None and _live(p):
                out.append(p)
        return out

    def _bound_count(self, g: Gang) -> int:
        return sum(1 for p in self._live(g) if p.node_name is not None)

    # ------------------------------------------------------------------ gang rules

    def _reconcile(self, g: Gang) -> None:
        """Bring the gang's phase back in line with its members after any change."""
        spec = g.spec
        live = self._live(g)
        held = [p.key for p in live if p.held]
        if held:
            self._held_touched.add(g.key)
            self.outbox.lift.update(held)
        if spec is None:
            if g.phase in (GangPhase.ADMITTED, GangPhase.RELEASED):
                self._fall_back(g, MembersLost(g.key, len(live), 0, ("no valid declaration",)))
            return
        bound = [p.key for p in live if p.node_name is not None]
        if g.phase is GangPhase.RELEASED:
            if spec.match_policy is MatchPolicy.ONCE_SATISFIED:
                return  # Koordinator: once satisfied, later members are plain pods
            held = [p.key for p in live
                    if p.node_name is not None or p.key in g.binding or p.key in g.plan]
            if not self.meets_quorum(spec, held):
                self._fall_back(g, MembersLost(g.key, len(live), spec.min_member,
                                               self._departed(g, live)))
        elif g.phase is GangPhase.ADMITTED:
            self._complete_plan(g, spec, live, bound)
        elif bound and self.meets_quorum(spec, bound):
            g.satisfied()
        elif self.meets_quorum(spec, self._countable(spec, live)) \
                and isinstance(g.reason, WaitingForMembers):
            # Enough members now: wake those turned away for being too few, so admission
            # does not wait for the newest member (kube-scheduler may never send it to us).
            g.reason = None
            self.outbox.requeue.update(g.wake())

    def _departed(self, g: Gang, live: list[PodRecord]) -> tuple[str, ...]:
        alive = {p.key for p in live}
        return tuple(sorted(k for k in g.members if k not in alive))[:5]

    def _complete_plan(self, g: Gang, spec: GangSpec, live: list[PodRecord],
                       bound: list[PodKey]) -> None:
        """An admitted gang holds a whole plan, or nothing (issue 9, cases 1 and 2)."""
        if not self.meets_quorum(spec, self._countable(spec, live)):
            self._fall_back(g, MembersLost(g.key, len(live), spec.min_member,
                                           self._departed(g, live)))
            return
        have = list(g.plan)
        if spec.match_policy is not MatchPolicy.ONLY_WAITING:
            have += bound
        todo = [p.key for p in live if p.node_name is None and p.key not in g.plan]
        chosen = self._pick(spec, have, todo)
        if chosen == []:
            return
        result: Plan | NoFit = NoFit(spec.min_member - len(have), {}, 0, 0)
        if chosen is not None:
            required, _ = self._levels_for(g)
            result = plan_gang([Member(self.store.pods[k]) for k in chosen], self._view(),
                               self.settings.levels, required=required, fixed=dict(g.plan))
        if isinstance(result, NoFit):
            self._fall_back(g, DoesNotFit(g.key, result, self.ledger.reserving_gangs(g.key)))
            return
        for key, node in result.assignments.items():
            if key not in g.plan:
                g.add_slot(key, node, self.store.pods[key].requests)

    def _fall_back(self, g: Gang, reason: GangReason) -> None:
        parked = self.waiting.pop_gang(g.key)
        if parked:
            self.outbox.unparked.append(Unparked(g.key, parked, reason))
        g.fall_back(reason)
        self._notice(NoticeKind.WAITING, g.key, sorted(g.members), reason)

    # ------------------------------------------------------------------ notices

    def _notice(self, kind: NoticeKind, gang: GangKey | None, pods: Sequence[PodKey],
                reason: GangReason | None = None, detail: str = "") -> None:
        self.outbox.notice(kind, gang, pods, reason, detail)

    def drain_notices(self) -> list[Notice]:
        return self.outbox.drain_notices()

    def drain_requeue(self) -> list[PodKey]:
        """Pods kube-scheduler should look at again (no API event would wake them)."""
        return self.outbox.drain_requeue(self.store.pods)

    def drain_unparked(self) -> list[Unparked]:
        """Parked calls let go of by cluster events; the app answers each with its reason."""
        return self.outbox.drain_unparked()

    def _turn_away(self, pod: PodKey, g: Gang, reason: GangReason) -> GangReason:
        # The Event goes to the pod turned away, not to every member: a gang of N arriving
        # one by one would otherwise cost N^2 Events (kube-scheduler's FailedScheduling
        # Event on each pod carries the same reason anyway).
        told = g.told.get(pod)
        if told != reason and not (isinstance(told, BackingOff)
                                   and isinstance(reason, BackingOff)):
            self._notice(NoticeKind.WAITING, g.key, (pod,), reason)
            g.told[pod] = reason
        g.reason = reason
        return reason

    # ------------------------------------------------------------------ held gangs

    def admit_held(self, now: float) -> None:
        """Admit gangs whose members wait behind Lockstep's gate (``coscheduling.gating``).

        kube-scheduler never cycles a held member, so no filter call will ask for it:
        admission happens here, after each batch of cluster events, over every node
        Lockstep knows. A gang that does not fit is planned again when capacity has changed,
        at most every ``HELD_RETRY_SECONDS`` (planning a big gang on a big cluster costs
        milliseconds; every binding changes capacity)."""
        todo, self._held_touched = self._held_touched, set()
        if self._held_blocked and self.store.epoch != self._held_epoch \
                and now - self._held_swept >= HELD_RETRY_SECONDS:
            todo |= self._held_blocked
            self._held_epoch, self._held_swept = self.store.epoch, now
        for key in sorted(todo, key=self._queue_order):
            g = self._gangs.get(key)
            self._held_blocked.discard(key)
            if g is None or g.spec is None:
                continue
            if g.phase is GangPhase.BACKING_OFF:
                if g.backoff_until is not None and now < g.backoff_until:
                    continue  # expire() hands it back when the backoff ends
                g.backoff_over()
            if g.phase is not GangPhase.WAITING:
                continue
            live = self._live(g)
            held = [p.key for p in live if p.held]
            if not held:
                continue  # members kube-scheduler cycles are admitted by their filter call
            spec = g.spec
            if not self.meets_quorum(spec, self._countable(spec, live)):
                g.reason = WaitingForMembers(g.key, len(live), spec.min_member)
                continue
            outcome = self._try_admit(g, spec, live, now)
            if not isinstance(outcome, dict):
                self._held_blocked.add(key)
                self._turn_away(held[0], g, outcome)
                self._held_epoch, self._held_swept = self.store.epoch, now

    def _queue_order(self, key: GangKey) -> tuple[int, str, str]:
        """kube-scheduler's queue order for a gang: priority, then the oldest member."""
        g = self._gangs.get(key)
        pods = [p for k in (g.members if g is not None else ())
                if (p := self.store.pods.get(k)) is not None]
        return (-max((p.priority for p in pods), default=0),
                min((p.created for p in pods), default=""), key)

    def lift_target(self, key: PodKey) -> Lift | None:
        """Whether Lockstep's gate should come off ``key`` now, and the node to pin it to.

        A planned member is pinned to its slot. A held pod that is no gang member, or whose
        declaration is invalid, is let go unpinned (filter then says what is wrong), as is an
        extra beyond an admitted gang's plan. Members of a gang not admitted yet, or waiting
        for its PodGroup, stay held."""
        pod = self.store.pods.get(key)
        if pod is None or not pod.held or pod.node_name is not None or pod.deleting \
                or pod.scheduler_name not in self.settings.scheduler_names:
            return None
        m = self._membership.get(key)
        if m is None or isinstance(m, InvalidGang):
            return Lift(key, pod.uid, None)
        if isinstance(m, MissingPodGroup):
            return None
        g = self._gangs.get(m.key)
        if g is None:
            return None
        node = g.plan.get(key)
        if node is not None:
            return Lift(key, pod.uid, node)
        if g.phase in (GangPhase.ADMITTED, GangPhase.RELEASED):
            return Lift(key, pod.uid, None)
        return None

    def drain_lift(self) -> list[Lift]:
        """Held pods whose gate comes off now (decided now, from the current plan)."""
        keys, self.outbox.lift = self.outbox.lift, set()
        return [lift for k in sorted(keys) if (lift := self.lift_target(k)) is not None]

    # ------------------------------------------------------------------ filter

    def filter(self, pod: PodRecord, candidates: Sequence[NodeName], now: float
               ) -> FilterDecision:
        """Which candidates ``pod`` may use; for gang pods exactly the planned node."""
        cached = self.store.pods.get(pod.key)
        if cached is None or (pod.uid and cached.uid and pod.uid != cached.uid):
            # The watch has not delivered this pod yet, or it was deleted (issue 9, case 5):
            # answer from the request alone and never write it into the store.
            if self._resolve(pod) is None:
                return self._filter_plain(pod, candidates)
            self.outbox.awaited.add(pod.key)
            return FilterDecision([], unresolvable=PodNotInCache(
                pod.key, pod.uid, cached.uid if cached is not None else None))
        pod = cached
        m = self._membership.get(pod.key)
        if m is None:
            return self._filter_plain(pod, candidates)
        if isinstance(m, InvalidGang | MissingPodGroup):
            if m.key is not None and m.key in self._gangs:
                # Woken when its PodGroup appears or changes (no pod event would do it).
                self._gangs[m.key].turned_away.add(pod.key)
            if isinstance(m, InvalidGang):
                return FilterDecision([], unresolvable=InvalidDeclaration(m))
            return FilterDecision([], unresolvable=PodGroupNotFound(m.key, m.api))
        g = self._gangs[m.key]
        decision = self._filter_gang(g, m, pod, candidates, now)
        if decision.unresolvable is not None:
            g.turned_away.add(pod.key)
        else:
            g.turned_away.discard(pod.key)
        return decision

    def _filter_gang(self, g: Gang, m: GangSpec, pod: PodRecord,
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
            if planned in candidates:
                return FilterDecision([planned])
            return self._replan(g, spec, pod, candidates)
        if g.phase is GangPhase.RELEASED:
            # Elastic extras: ordinary pods, but never on capacity reserved for anyone.
            return self._filter_plain(pod, candidates)
        if g.phase is GangPhase.BACKING_OFF:
            assert g.backoff_until is not None
            if now < g.backoff_until:
                return FilterDecision([], unresolvable=self._turn_away(
                    pod.key, g, BackingOff(g.key, g.backoff_until - now, g.backoff_cause)))
            g.backoff_over()
        if g.phase is GangPhase.ADMITTED:
            return self._extend(g, pod, candidates)
        live = self._live(g)
        if not self.meets_quorum(spec, self._countable(spec, live)):
            return FilterDecision([], unresolvable=self._turn_away(
                pod.key, g, WaitingForMembers(g.key, len(live), spec.min_member)))
        return self._admit(g, spec, pod, candidates, live, now)

    def _filter_plain(self, pod: PodRecord, candidates: Sequence[NodeName]) -> FilterDecision:
        # kube-scheduler's own filters already checked raw capacity (a node our cache has
        # not seen yet included), so only nodes holding reservations can turn this pod away:
        # the work is O(reserved nodes), plus one C-speed pass when some node fails.
        everything = candidates if isinstance(candidates, list) else list(candidates)
        totals = self.ledger.total
        if not totals:
            return FilterDecision(everything)
        cand = set(everything) if len(totals) > 8 else None
        failed: dict[NodeName, NodeReason] = {}
        for node in totals:
            if (cand is not None and node not in cand) or (cand is None
                                                           and node not in everything):
                continue
            free = self.free_unreserved(node)
            if fits(pod.requests, free):
                continue
            gangs = tuple(sorted(self.ledger.gangs_on(node)))
            failed[node] = ReservedForGangs(node, gangs, shortfall(pod.requests, free))
        if not failed:
            return FilterDecision(everything)
        return FilterDecision(list(filterfalse(failed.__contains__, everything)), failed)

    def _levels_for(self, g: Gang) -> tuple[Level | None, GangReason | None]:
        if g.spec is not None and g.spec.topology is not None:  # upstream, checked on resolve
            lv = level_by_name(self.settings.levels, g.spec.topology)
            if lv is not None:
                return lv, None
        for k in sorted(g.members):
            p = self.store.pods.get(k)
            if p is None:
                continue
            want = p.annotations.get(TOPOLOGY_REQUIRED)
            if want:
                lv = level_by_name(self.settings.levels, want)
                if lv is None:
                    names = ", ".join(lv_.name for lv_ in self.settings.levels)
                    return None, InvalidDeclaration(InvalidGang(
                        g.key, TOPOLOGY_REQUIRED, want, f"unknown level (known: {names})"))
                return lv, None
        return None, None

    def _view(self) -> Capacity:
        return self.capacity

    def _admit(self, g: Gang, spec: GangSpec, pod: PodRecord, candidates: Sequence[NodeName],
               live: list[PodRecord], now: float) -> FilterDecision:
        outcome = self._try_admit(g, spec, live, now, pod, candidates)
        if not isinstance(outcome, dict):
            return FilterDecision([], unresolvable=self._turn_away(pod.key, g, outcome))
        return FilterDecision([outcome[pod.key]])

    def _try_admit(self, g: Gang, spec: GangSpec, live: list[PodRecord], now: float,
                   pod: PodRecord | None = None, candidates: Sequence[NodeName] = ()
                   ) -> dict[PodKey, NodeName] | GangReason:
        """Plan the whole gang and reserve the plan, or say why not.

        ``pod`` is the member whose filter call asks (limited to kube-scheduler's
        ``candidates``); without one, the gang's members are held behind Lockstep's gate and
        every node Lockstep knows is a candidate."""
        required, bad = self._levels_for(g)
        if bad is not None:
            return bad
        if spec.min_resources:
            total: Resources = {}
            for n in self.store.nodes:
                total = add(total, {k: max(0, v) for k, v in self.free_unreserved(n).items()})
            if not fits(spec.min_resources, total):
                return NotEnoughMinResources(g.key, spec.min_resources, total)
        # Bindings still in flight from before a fall-back keep their slots: fixed.
        fixed = {k: n for k, n in g.plan.items() if k in g.binding}
        have = list(fixed)
        if spec.match_policy is not MatchPolicy.ONLY_WAITING:
            have += [p.key for p in live if p.node_name is not None]
        members = [Member(pod, frozenset(candidates))] if pod is not None else []
        members += [Member(p) for p in live
                    if (pod is None or p.key != pod.key) and p.node_name is None
                    and p.key not in fixed]
        view = self._view()
        result = plan_gang(members, view, self.settings.levels, required=required, fixed=fixed)
        if isinstance(result, NoFit):
            # All of them do not fit: a quorum might (the asking pod always among them).
            chosen = self._pick(spec, have, [m.key for m in members])
            if chosen and (pod is None or chosen[0] == pod.key) and len(chosen) < len(members):
                keep = set(chosen)
                result = plan_gang([m for m in members if m.key in keep], view,
                                   self.settings.levels, required=required, fixed=fixed)
        if isinstance(result, NoFit):
            return DoesNotFit(g.key, result, self.ledger.reserving_gangs(g.key))
        requests = {k: self.store.pods[k].requests for k in result.assignments}
        g.admit(result.assignments, requests, result.level, now, spec.timeout_seconds)
        first = pod.key if pod is not None else (members[0].key if members else live[0].key)
        # One Event per admission, on the member whose filter call admitted the gang.
        self._notice(NoticeKind.ADMITTED, g.key, (first,), detail=_plan_text(result))
        # Members turned away earlier sit in kube-scheduler's unschedulable queue and no
        # API event will wake them: ask the app to nudge them. Held members lose the gate.
        self.outbox.requeue.update(k for k in g.wake() if k != first or pod is None)
        self.outbox.lift.update(p.key for p in live if p.held)
        return result.assignments

    def _extend(self, g: Gang, pod: PodRecord, candidates: Sequence[NodeName]
                ) -> FilterDecision:
        """An admitted gang's plan is whole; this pod is an extra beyond minMember."""
        required, _ = self._levels_for(g)
        result = plan_gang([Member(pod, frozenset(candidates))], self._view(),
                           self.settings.levels, required=required, fixed=dict(g.plan))
        if isinstance(result, NoFit):
            return FilterDecision([], unresolvable=ExtraMemberWaits(g.key, len(g.plan)))
        node = result.assignments[pod.key]
        g.add_slot(pod.key, node, pod.requests)
        return FilterDecision([node])

    def _replan(self, g: Gang, spec: GangSpec, pod: PodRecord, candidates: Sequence[NodeName]
                ) -> FilterDecision:
        """The planned node is no longer a candidate: move this member, or give all back."""
        lost = g.drop_slot(pod.key)
        assert lost is not None
        required, _ = self._levels_for(g)
        result = plan_gang([Member(pod, frozenset(candidates))], self._view(),
                           self.settings.levels, required=required, fixed=dict(g.plan))
        if isinstance(result, NoFit):
            reason = PlannedNodeLost(g.key, lost, result)
            if g.phase is GangPhase.ADMITTED:
                self._fall_back(g, reason)
            else:
                self._reconcile(g)
            return FilterDecision([], unresolvable=self._turn_away(pod.key, g, reason))
        node = result.assignments[pod.key]
        g.add_slot(pod.key, node, pod.requests)
        return FilterDecision([node])

    # ------------------------------------------------------------------ prioritize

    def prioritize(self, pod: PodRecord, nodes: Sequence[NodeName]) -> list[int]:
        """A 0..10 score for each of ``nodes``, in the same order."""
        own = pod.key if self.gang_of(pod.key) is not None else None
        return self.capacity.scores(nodes, pod.requests.get(GPU, 0), own)

    def free_gpus(self, n: NodeName, own: PodKey | None = None) -> int:
        return self.capacity.free_gpus(n, own)

    def explain_score(self, n: NodeName, gpus: int, own: PodKey | None = None) -> Score:
        return self.capacity.explain_score(n, gpus, own)

    # ------------------------------------------------------------------ bind

    def bind(self, key: PodKey, node: NodeName, now: float, uid: str = "") -> BindDecision:
        pod = self.store.pods.get(key)
        if pod is None or (uid and pod.uid and uid != pod.uid):
            return Reject(PodNotInCache(key, uid, pod.uid if pod is not None else None))
        m = self._membership.get(key)
        if m is None:
            return self._bind_unplanned(pod, node) or BindNow(key, node)
        if isinstance(m, InvalidGang):
            return Reject(InvalidDeclaration(m))
        if isinstance(m, MissingPodGroup):
            return Reject(PodGroupNotFound(m.key, m.api))
        g = self._gangs[m.key]
        spec = g.spec or m
        planned = g.plan.get(key)
        if planned is not None and planned != node:
            return Reject(WrongNode(g.key, planned, node))
        if planned is None and g.phase is not GangPhase.RELEASED:
            # No plan holds this pod (e.g. Lockstep restarted after filter): admit it now.
            decision = self.filter(pod, [node], now)
            if decision.passed != [node]:
                return Reject(decision.unresolvable or WrongNode(g.key, None, node))
        if g.phase is GangPhase.RELEASED:
            if planned is None and (no := self._bind_unplanned(pod, node)) is not None:
                return no
            g.binding.add(key)
            return BindNow(key, node)
        if g.phase is not GangPhase.ADMITTED:
            return Reject(g.reason or WaitingForMembers(g.key, 0, spec.min_member))
        assert g.deadline is not None
        bound = self._bound_count(g)
        if bound > 0 and not self.waiting.count(g.key) \
                and spec.match_policy is not MatchPolicy.ONLY_WAITING:
            # Already partly bound at the API server (Lockstep died between a group's
            # bindings, or a binding failed after its siblings'): parking the rest would only
            # keep the gang partial for longer. The plan is whole, so release it now.
            g.release({key})
            self._notice(NoticeKind.RELEASED, g.key, (key,),
                         detail=f"{bound}/{spec.min_member} already bound; completing")
            return BindNow(key, node)
        self.waiting.park(g.key, key, node, pod.uid)
        counted = list(self.waiting.parked(g.key))
        if spec.match_policy is not MatchPolicy.ONLY_WAITING:
            counted += [p.key for p in self._live(g) if p.node_name is not None]
        if not self.meets_quorum(spec, counted):
            return Park(g.key, g.deadline)
        gone = self._check_quorum(g)
        if gone:
            mine = gone.pop(key, None)
            for other, reason in gone.items():
                self.outbox.unparked.append(Unparked(g.key, {other: self.waiting.node(other)
                                                       or node}, reason))
                self.waiting.remove(other)
            if mine is not None:
                self.waiting.remove(key)
                return Reject(mine)
            return Park(g.key, g.deadline)
        binds = self.waiting.pop_gang(g.key)
        g.release(set(binds))
        self._notice(NoticeKind.RELEASED, g.key, (key,),
                     detail=f"{len(binds) + self._bound_count(g)}/{spec.min_member}")
        return BindGroup(g.key, binds)

    def _bind_unplanned(self, pod: PodRecord, node: NodeName) -> Reject | None:
        """A pod no plan holds may not bind into capacity reserved since its filter call.

        Between kube-scheduler's filter and bind calls Lockstep may admit a gang (another
        member's filter, or a held gang) onto the node the pod was then free to use; binding
        it anyway would over-commit the node and strand the gang's pinned members."""
        if not self.ledger.reserved_on(node) or fits(pod.requests, self.free_unreserved(node)):
            return None
        free = self.free_unreserved(node)
        return Reject(ReservedForGangs(node, tuple(sorted(self.ledger.gangs_on(node))),
                                       shortfall(pod.requests, free)))

    def _check_quorum(self, g: Gang) -> dict[PodKey, GangReason]:
        """Before the first binding: every parked member and its node still exist, with the
        UID that was parked and the slot the plan holds (issue 9, case 6)."""
        gone: dict[PodKey, GangReason] = {}
        for key, node in self.waiting.parked(g.key).items():
            pod = self.store.pods.get(key)
            uid = self.waiting.uid(key)
            what = ""
            if pod is None or not _live(pod):
                what = f"pod {key} is gone"
            elif uid and pod.uid != uid:
                what = f"pod {key} was recreated (uid {uid} -> {pod.uid})"
            elif node not in self.store.nodes:
                what = f"node {node} is gone"
            elif g.plan.get(key) != node:
                what = f"the plan no longer holds {node} for {key}"
            if what:
                gone[key] = BindTargetGone(g.key, key, what)
        return gone

    def bind_outcomes(self, outcomes: Sequence[BindOutcome]) -> PartiallyBound | None:
        """What the API said to bindings the core asked for; a partial gang is reported."""
        by_gang: dict[GangKey, list[BindOutcome]] = {}
        for o in outcomes:
            gang = self.gang_of(o.pod)
            g = self._gangs.get(gang) if gang is not None else None
            if g is None:
                continue
            by_gang.setdefault(g.key, []).append(o)
            if isinstance(o, BindFailed):
                g.bind_settled(o.pod)
                self.waiting.remove(o.pod)
        report = None
        for gang, items in by_gang.items():
            g = self._gangs[gang]
            spec = g.spec
            failed = [o for o in items if isinstance(o, BindFailed) and o.permanent]
            if spec is None or not failed:
                continue
            ok = {o.pod for o in items if isinstance(o, Bound)}
            bound_keys = {p.key for p in self._live(g) if p.node_name is not None} | ok
            bound = len(bound_keys)
            if bound and not self.meets_quorum(spec, bound_keys):
                report = PartiallyBound(g.key, bound, spec.min_member, tuple(
                    f"{o.pod}: {o.message}" for o in failed)[:5])
                g.partial = report
                self.partial_gangs += 1
                self._notice(NoticeKind.PARTIALLY_BOUND, g.key, sorted(g.members), report)
            self._reconcile(g)
        return report

    def abandon(self, key: PodKey) -> None:
        """kube-scheduler gave up on a parked call (connection closed): unpark it."""
        self.waiting.remove(key)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        times = [t for g in self._gangs.values()
                 for t in (g.deadline, g.backoff_until) if t is not None]
        if self._held_blocked and self.store.epoch != self._held_epoch:
            times.append(self._held_swept + HELD_RETRY_SECONDS)
        return min(times, default=None)

    def expire(self, now: float) -> list[Expired]:
        """Time out admitted gangs past their deadline and end finished backoffs."""
        out = []
        for g in list(self._gangs.values()):
            if g.phase is GangPhase.BACKING_OFF and g.backoff_until is not None \
                    and now >= g.backoff_until:
                g.backoff_over()
                self.outbox.requeue.update(g.wake())
                self._held_touched.add(g.key)
            if g.phase is not GangPhase.ADMITTED or g.deadline is None or now < g.deadline:
                continue
            spec = g.spec
            parked = self.waiting.pop_gang(g.key)
            pods = self.store.pods
            stragglers = tuple(
                f"{k} ({pods[k].node_name or 'not placed'})"
                for k in sorted(g.members)
                if k not in parked and k in pods and pods[k].node_name is None)
            reason = TimedOut(g.key, len(parked), spec.min_member if spec else 0,
                              spec.timeout_seconds if spec else 0.0, stragglers[:5])
            # Koordinator's NonStrict: try again at once rather than after a backoff.
            backoff = 0.0 if spec is not None and spec.mode is Mode.NON_STRICT \
                else self.settings.backoff_seconds
            g.expire(now, backoff, reason)
            self._notice(NoticeKind.TIMED_OUT, g.key, sorted(g.members), reason)
            out.append(Expired(g.key, parked, reason))
            # Capacity came free: wake the gangs that were waiting for it.
            for other in self._gangs.values():
                if other is not g and isinstance(other.reason, DoesNotFit | PlannedNodeLost):
                    self.outbox.requeue.update(other.wake())
        return out

    # ------------------------------------------------------------------ views

    def gang_view(self, key: GangKey, now: float) -> GangView | None:
        g = self._gangs.get(key)
        if g is None:
            return None
        live = self._live(g)
        return GangView(
            key=g.key,
            phase=g.phase if g.spec is not None else GangPhase.INVALID,
            spec=g.spec,
            members=len(live),
            bound=sum(1 for p in live if p.node_name is not None),
            parked=self.waiting.count(g.key),
            plan=dict(g.plan),
            plan_level=g.plan_level,
            deadline=g.deadline,
            backoff_until=g.backoff_until,
            reason=g.reason,
            partial=g.partial,
        )

    def gang_views(self, now: float) -> list[GangView]:
        views = (self.gang_view(k, now) for k in sorted(self._gangs))
        return [v for v in views if v is not None]

    def podgroup_status(self, key: GangKey) -> PodGroupStatus | None:
        """The status a PodGroup object of this gang should show (rules live here)."""
        g = self._gangs.get(key)
        if g is None or g.spec is None:
            return None
        return podgroup_status(g.spec, self.members_of(key),
                               holding=bool(g.plan) or self.waiting.count(key) > 0,
                               partial=g.partial)

    def podgroup_statuses(self) -> dict[GangKey, PodGroupStatus]:
        """Every scheduler-plugins PodGroup's status; a Koordinator gang group declared the
        CRD way reports on each member PodGroup with that gang's own members and minimum."""
        out: dict[GangKey, PodGroupStatus] = {}
        for key, g in self._gangs.items():
            spec = g.spec
            if spec is None or spec.source is not Source.SCHEDULER_PLUGINS:
                continue
            if not spec.group:
                st = self.podgroup_status(key)
                if st is not None:
                    out[key] = st
                continue
            holding = bool(g.plan) or self.waiting.count(key) > 0
            members = self.members_of(key)
            mins = dict(spec.parts)
            for part in spec.group:
                if part not in self.store.podgroups:
                    continue
                own = [p for p in members if self._part_of(p.key) == part]
                out[part] = podgroup_status(
                    replace(spec, key=part, min_member=mins.get(part, 1), parts=(), group=()),
                    own, holding=holding, partial=g.partial)
        return out

    def volcano_statuses(self) -> dict[GangKey, VolcanoStatus]:
        """The phase each Volcano PodGroup should show (Lockstep plays Volcano's enqueue)."""
        if not self.store.volcano:
            return {}
        free: Resources = {}
        for n in self.store.nodes:
            free = add(free, {k: max(0, v) for k, v in self.free_unreserved(n).items()})
        return volcano_statuses(self.store.volcano, self.members_of, free)

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self.store.domains(index)

    def reserved_total(self) -> dict[NodeName, dict[GangKey, Resources]]:
        return {n: self.ledger.by_gang_on(n) for n in self.ledger.nodes()}

    def plans(self) -> dict[GangKey, dict[PodKey, NodeName]]:
        return {k: dict(g.plan) for k, g in self._gangs.items() if g.plan}

    def gangs(self) -> Mapping[GangKey, Gang]:
        return MappingProxyType(self._gangs)


def _live(p: PodRecord) -> bool:
    return p.active


def _gang_key(m: Membership) -> GangKey | None:
    if isinstance(m, GangSpec | MissingPodGroup | InvalidGang):
        return m.key
    return None


def _plan_text(plan: Plan) -> str:
    nodes = sorted(set(plan.assignments.values()))
    where = f"one {plan.level}" if plan.level else "spread"
    listed = ", ".join(nodes[:8])
    return f"{len(plan.assignments)} members on {len(nodes)} node(s), {where}: {listed}"
