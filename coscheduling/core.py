"""The coscheduler: cluster state, gang admission, reservations and the waiting map.

Everything here is synchronous and takes ``now``: each verb decides and reserves in one block
with no ``await`` in between, which is what makes admission atomic under asyncio (the same
guarantee HiveD gets from one lock). The app feeds it list/watch updates and verb calls and
renders what it returns.

Gang phases and their transitions::

    Waiting --plan fits--> Admitted --quorum parked--> Released --quorum bound--> (Bound)
       ^                      |
       |                      +--deadline--> BackingOff --backoff over--> Waiting
       +----- members gone / plan released ---+

``Released`` is the permit: from then on every member binds as soon as it asks.
Deadlock freedom comes from admission: a gang is admitted only when all its members fit in
capacity no other admitted gang holds, and admission reserves that capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import filterfalse

from .decisions import (
    BindDecision,
    BindGroup,
    BindNow,
    Expired,
    FilterDecision,
    Notice,
    NoticeKind,
    Park,
    Reject,
)
from .ledger import Ledger
from .numa import NumaZones
from .planner import Member, NoFit, Plan, plan_gang
from .podgroup import (
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    Membership,
    MissingPodGroup,
    PodGroupRecord,
    resolve,
)
from .reasons import (
    BackingOff,
    DoesNotFit,
    ExtraMemberWaits,
    GangReason,
    InvalidDeclaration,
    NodeReason,
    NotEnoughMinResources,
    PlannedNodeLost,
    PodGroupNotFound,
    ReservedForGangs,
    TimedOut,
    WaitingForMembers,
    WrongNode,
)
from .records import NodeName, NodeRecord, PodKey, PodRecord
from .resources import Resources, add, fits, shortfall
from .topology import (
    DEFAULT_LEVELS,
    GPU,
    GpuLayout,
    Level,
    Score,
    domain_of,
    explain_score,
    gpu_layout,
    level_by_name,
)
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


class GangPhase(Enum):
    WAITING = "Waiting"
    """Fewer than minMember members exist, or no plan fits yet."""
    ADMITTED = "Admitted"
    """A plan fits; its capacity is reserved and the deadline runs."""
    RELEASED = "Released"
    """minMember members reached bind together: every member now binds at once."""
    BACKING_OFF = "BackingOff"
    """Timed out; capacity released so other gangs can use it."""
    INVALID = "Invalid"
    """The declaration cannot be honoured (see the reason)."""


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_names: frozenset[str] = frozenset({"lockstep"})
    defaults: GangDefaults = GangDefaults()
    backoff_seconds: float = 30.0
    levels: tuple[Level, ...] = DEFAULT_LEVELS


@dataclass(slots=True)
class _Gang:
    key: GangKey
    members: set[PodKey] = field(default_factory=set)
    plan: dict[PodKey, NodeName] = field(default_factory=dict)
    """Reserved slots of members not yet bound."""
    plan_level: str | None = None
    admitted_at: float | None = None
    deadline: float | None = None
    released: bool = False
    backoff_until: float | None = None
    backoff_cause: TimedOut | None = None
    reason: GangReason | None = None
    """The last reason members were turned away, for Events and explain."""


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


class Coscheduler:
    """Cluster state plus the gang rules; one instance per Lockstep process."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.ledger = Ledger()
        self.nodes = self.ledger.nodes
        self.pods: dict[PodKey, PodRecord] = {}
        self.podgroups: dict[GangKey, PodGroupRecord] = {}
        self._membership: dict[PodKey, Membership] = {}
        self._gangs: dict[GangKey, _Gang] = {}
        self.waiting = WaitingMap()
        self._notices: list[Notice] = []
        self._requeue: set[PodKey] = set()
        self._layouts: dict[NodeName, tuple[NodeRecord, GpuLayout]] = {}
        self._domains: dict[int, dict[tuple[str, ...], list[NodeName]]] = {}
        """Nodes by topology domain per level; rebuilt only when nodes or their labels change."""
        self.numa: dict[NodeName, NumaZones] = {}
        """Per-NUMA free GPUs from NodeResourceTopology objects, where a cluster has them."""

    # ------------------------------------------------------------------ cache updates

    def upsert_node(self, node: NodeRecord) -> None:
        old = self.nodes.get(node.name)
        if old is None or old.labels != node.labels:
            self._domains.clear()
        self.ledger.put_node(node)

    def delete_node(self, name: NodeName) -> None:
        self.ledger.drop_node(name)
        self._layouts.pop(name, None)
        self._domains.clear()

    def upsert_numa(self, zones: NumaZones) -> None:
        self.numa[zones.node] = zones
        self.ledger.drop_scores(zones.node)

    def delete_numa(self, node: NodeName) -> None:
        self.numa.pop(node, None)
        self.ledger.drop_scores(node)

    def replace_numa(self, items: Iterable[NumaZones]) -> None:
        fresh = {z.node: z for z in items}
        for name in [n for n in self.numa if n not in fresh]:
            self.delete_numa(name)
        for z in fresh.values():
            self.upsert_numa(z)

    def upsert_podgroup(self, pg: PodGroupRecord) -> None:
        self.podgroups[pg.key] = pg
        self._reresolve(pg.key)

    def delete_podgroup(self, key: GangKey) -> None:
        self.podgroups.pop(key, None)
        self._reresolve(key)

    def _reresolve(self, key: GangKey) -> None:
        ns, name = key.split("/", 1)
        for pod in list(self.pods.values()):
            if pod.namespace == ns and pod.labels.get("scheduling.x-k8s.io/pod-group") == name:
                self.upsert_pod(pod)

    def upsert_pod(self, pod: PodRecord) -> None:
        old = self.pods.get(pod.key)
        if old is not None and old.uid != pod.uid and old.uid and pod.uid:
            self.delete_pod(pod.key)  # same name, new pod: forget the old one first
            old = None
        if old is not None and old.holds_capacity:
            self.ledger.release_usage(old)
        self.pods[pod.key] = pod
        if pod.holds_capacity:
            self.ledger.add_usage(pod)
        membership = self._resolve(pod)
        old_gang = self._gang_key(self._membership.get(pod.key))
        new_gang = self._gang_key(membership)
        self._membership[pod.key] = membership
        if old_gang is not None and old_gang != new_gang:
            self._leave(old_gang, pod.key)
        if new_gang is not None:
            g = self._gangs.setdefault(new_gang, _Gang(new_gang))
            g.members.add(pod.key)
            if pod.node_name is not None:
                self._unreserve(g, pod.key)  # the reservation became real usage
            if (
                isinstance(membership, GangSpec)
                and membership.capped_from is not None
                and old is None
            ):
                    self._notice(
                        NoticeKind.TIMEOUT_CAPPED,
                        g.key,
                        (pod.key,),
                        detail=f"{membership.capped_from:g}s capped to "
                        f"{membership.timeout_seconds:g}s",
                    )
        if isinstance(membership, InvalidGang) and (
            old is None or self._membership_changed(old, pod)
        ):
            self._notice(
                NoticeKind.INVALID, membership.key, (pod.key,), InvalidDeclaration(membership)
            )

    @staticmethod
    def _membership_changed(old: PodRecord, new: PodRecord) -> bool:
        return old.annotations != new.annotations or old.labels != new.labels

    def delete_pod(self, key: PodKey) -> None:
        pod = self.pods.pop(key, None)
        if pod is None:
            return
        if pod.holds_capacity:
            self.ledger.release_usage(pod)
        gang = self._gang_key(self._membership.pop(key, None))
        if gang is not None:
            self._leave(gang, key)

    def replace_pods(self, pods: Iterable[PodRecord]) -> None:
        """After a relist: make the pod set exactly ``pods``, deletions included."""
        fresh = {p.key: p for p in pods}
        for key in [k for k in self.pods if k not in fresh]:
            self.delete_pod(key)
        for p in fresh.values():
            self.upsert_pod(p)

    def replace_nodes(self, nodes: Iterable[NodeRecord]) -> None:
        fresh = {n.name: n for n in nodes}
        for name in [n for n in self.nodes if n not in fresh]:
            self.delete_node(name)
        self.nodes.update(fresh)

    def replace_podgroups(self, groups: Iterable[PodGroupRecord]) -> None:
        fresh = {g.key: g for g in groups}
        for key in [k for k in self.podgroups if k not in fresh]:
            self.delete_podgroup(key)
        for g in fresh.values():
            self.upsert_podgroup(g)

    def _leave(self, gang: GangKey, pod: PodKey) -> None:
        g = self._gangs.get(gang)
        if g is None:
            return
        g.members.discard(pod)
        self._unreserve(g, pod)
        self.waiting.remove(pod)
        if not g.members:
            self._release_plan(g)
            self._gangs.pop(gang, None)

    # ------------------------------------------------------------------ capacity

    def free(self, node: NodeName) -> Resources:
        return self.ledger.free(node)

    def reserved_on(self, node: NodeName) -> dict[GangKey, Resources]:
        return dict(self.ledger.reserved.get(node, {}))

    def free_outside(self, node: NodeName, gang: GangKey | None) -> Resources:
        return self.ledger.free_outside(node, gang)

    def _reserve(self, g: _Gang, pod: PodKey, node: NodeName) -> None:
        g.plan[pod] = node
        self.ledger.reserve(g.key, node, self.pods[pod].requests)

    def _unreserve(self, g: _Gang, pod: PodKey) -> None:
        node = g.plan.pop(pod, None)
        if node is None:
            return
        p = self.pods.get(pod)
        self.ledger.unreserve(g.key, node, p.requests if p is not None else None)
        if not g.plan:
            g.plan_level = None

    def _release_plan(self, g: _Gang) -> None:
        for pod in list(g.plan):
            self._unreserve(g, pod)
        g.admitted_at = None
        g.deadline = None

    # ------------------------------------------------------------------ membership

    def _resolve(self, pod: PodRecord) -> Membership:
        if pod.scheduler_name not in self.settings.scheduler_names:
            return None
        return resolve(pod, self.podgroups, self.settings.defaults)

    @staticmethod
    def _gang_key(m: Membership) -> GangKey | None:
        if isinstance(m, GangSpec | MissingPodGroup):
            return m.key
        if isinstance(m, InvalidGang):
            return m.key
        return None

    def membership(self, pod: PodKey) -> Membership:
        return self._membership.get(pod)

    def _spec(self, g: _Gang) -> GangSpec | None:
        for k in sorted(g.members):
            m = self._membership.get(k)
            if isinstance(m, GangSpec):
                return m
        return None

    def _live_members(self, g: _Gang) -> list[PodRecord]:
        out = []
        for k in sorted(g.members):
            p = self.pods.get(k)
            if p is not None and not p.deleting and p.phase != "Failed":
                out.append(p)
        return out

    def _bound_count(self, g: _Gang) -> int:
        return sum(1 for p in self._live_members(g) if p.node_name is not None)

    def _satisfied(self, g: _Gang, spec: GangSpec) -> bool:
        return g.released or self._bound_count(g) >= spec.min_member

    def phase(self, g: _Gang, now: float) -> GangPhase:
        spec = self._spec(g)
        if spec is None:
            return GangPhase.INVALID
        if self._satisfied(g, spec):
            return GangPhase.RELEASED
        if g.backoff_until is not None and now < g.backoff_until:
            return GangPhase.BACKING_OFF
        if g.admitted_at is not None:
            return GangPhase.ADMITTED
        return GangPhase.WAITING

    # ------------------------------------------------------------------ notices

    def _notice(
        self,
        kind: NoticeKind,
        gang: GangKey | None,
        pods: Sequence[PodKey],
        reason: GangReason | None = None,
        detail: str = "",
    ) -> None:
        self._notices.append(Notice(kind, gang, tuple(pods), reason, detail))

    def drain_notices(self) -> list[Notice]:
        out, self._notices = self._notices, []
        return out

    def drain_requeue(self) -> list[PodKey]:
        """Pods kube-scheduler should look at again (no API event would wake them)."""
        out = sorted(k for k in self._requeue if k in self.pods and self.pods[k].node_name is None)
        self._requeue.clear()
        return out

    def _turn_away(self, g: _Gang, reason: GangReason) -> GangReason:
        if g.reason != reason and not _same_kind_same_numbers(g.reason, reason):
            self._notice(NoticeKind.WAITING, g.key, sorted(g.members), reason)
        g.reason = reason
        return reason

    # ------------------------------------------------------------------ filter

    def filter(
        self, pod: PodRecord, candidates: Sequence[NodeName], now: float
    ) -> FilterDecision:
        """Which candidates ``pod`` may use; for gang pods exactly the planned node."""
        if pod.key not in self.pods:
            # Cache lag: the watch has not delivered the pod yet; use what the request carries.
            self.upsert_pod(pod)
        m = self._membership.get(pod.key)
        if m is None:
            return self._filter_plain(pod, candidates, None)
        if isinstance(m, InvalidGang):
            return FilterDecision([], unresolvable=InvalidDeclaration(m))
        if isinstance(m, MissingPodGroup):
            return FilterDecision([], unresolvable=PodGroupNotFound(m.key))
        g = self._gangs[m.key]
        spec = self._spec(g) or m
        if spec.min_member != m.min_member:
            return FilterDecision([], unresolvable=InvalidDeclaration(InvalidGang(
                m.key, "min-member", str(m.min_member),
                f"members of the gang disagree (others say {spec.min_member})",
            )))
        # An admitted plan holds this pod's slot: hand out exactly that node (idempotent).
        planned = g.plan.get(pod.key)
        if planned is not None and (g.admitted_at is not None or g.released):
            if planned in candidates:
                return FilterDecision([planned])
            return self._replan(g, spec, pod, candidates, now)
        if self._satisfied(g, spec):
            # Elastic extras: ordinary pods, but never on capacity reserved for others.
            return self._filter_plain(pod, candidates, g.key)
        if g.backoff_until is not None:
            if now < g.backoff_until:
                return FilterDecision([], unresolvable=self._turn_away(
                    g, BackingOff(g.key, g.backoff_until - now, g.backoff_cause)))
            g.backoff_until = None
        live = self._live_members(g)
        if len(live) < spec.min_member:
            return FilterDecision([], unresolvable=self._turn_away(
                g, WaitingForMembers(g.key, len(live), spec.min_member)))
        if g.admitted_at is not None:
            # Admitted without this pod (it came later): add it if it fits, else it waits.
            return self._extend(g, spec, pod, candidates)
        return self._admit(g, spec, pod, candidates, now)

    def _filter_plain(
        self, pod: PodRecord, candidates: Sequence[NodeName], own: GangKey | None
    ) -> FilterDecision:
        # kube-scheduler's own filters already checked raw capacity (a node our cache has
        # not seen yet included), so only nodes holding reservations can turn this pod away:
        # the work is O(reserved nodes), plus one C-speed pass when some node fails.
        everything = candidates if isinstance(candidates, list) else list(candidates)
        if not self.ledger.reserved:
            return FilterDecision(everything)
        cand = set(candidates) if len(self.ledger.reserved) > 8 else None
        failed: dict[NodeName, NodeReason] = {}
        for node, per in self.ledger.reserved.items():
            if own is not None and len(per) == 1 and own in per:
                continue
            free = self.free_outside(node, None)
            if fits(pod.requests, free):
                continue
            if (cand is not None and node not in cand) or (cand is None and node not in everything):
                continue
            others = tuple(sorted(g for g in per if g != own))
            failed[node] = ReservedForGangs(node, others, shortfall(pod.requests, free))
        if not failed:
            return FilterDecision(everything)
        return FilterDecision(list(filterfalse(failed.__contains__, everything)), failed)

    def _levels_for(self, g: _Gang) -> tuple[Level | None, GangReason | None]:
        for k in sorted(g.members):
            p = self.pods.get(k)
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

    def _members_to_plan(
        self, g: _Gang, pod: PodRecord, candidates: Sequence[NodeName]
    ) -> list[Member]:
        cand = frozenset(candidates)
        out = [Member(pod, cand)]
        for p in self._live_members(g):
            if p.key != pod.key and p.node_name is None:
                out.append(Member(p))
        return out

    def _admit(
        self, g: _Gang, spec: GangSpec, pod: PodRecord, candidates: Sequence[NodeName],
        now: float,
    ) -> FilterDecision:
        required, bad = self._levels_for(g)
        if bad is not None:
            return FilterDecision([], unresolvable=self._turn_away(g, bad))
        if spec.min_resources:
            total: Resources = {}
            for n in self.nodes:
                total = add(total, {k: max(0, v) for k, v in self.free_outside(n, g.key).items()})
            if not fits(spec.min_resources, total):
                return FilterDecision([], unresolvable=self._turn_away(
                    g, NotEnoughMinResources(g.key, spec.min_resources, total)))
        members = self._members_to_plan(g, pod, candidates)
        need = spec.min_member - self._bound_count(g)
        view = _View(self, g.key)
        result = plan_gang(members, view, self.settings.levels, required=required)
        if isinstance(result, NoFit) and len(members) > need > 0:
            result = plan_gang(members[:need], view, self.settings.levels, required=required)
        if isinstance(result, NoFit):
            return FilterDecision([], unresolvable=self._turn_away(
                g, DoesNotFit(g.key, result, self.ledger.reserving_gangs(g.key))))
        self._apply_plan(g, result, now, spec)
        node = result.assignments[pod.key]
        return FilterDecision([node])

    def _apply_plan(self, g: _Gang, plan: Plan, now: float, spec: GangSpec) -> None:
        for key, node in plan.assignments.items():
            if key not in g.plan:
                self._reserve(g, key, node)
        g.plan_level = plan.level
        if g.admitted_at is None:
            g.admitted_at = now
            g.deadline = now + spec.timeout_seconds
            g.reason = None
            self._notice(NoticeKind.ADMITTED, g.key, sorted(g.members), detail=_plan_text(plan))
            # Members turned away earlier sit in kube-scheduler's unschedulable queue and no
            # API event will wake them: ask the app to nudge them.
            self._requeue.update(k for k in plan.assignments)

    def _extend(
        self, g: _Gang, spec: GangSpec, pod: PodRecord, candidates: Sequence[NodeName]
    ) -> FilterDecision:
        required, _ = self._levels_for(g)
        fixed = dict(g.plan)
        result = plan_gang(
            [Member(pod, frozenset(candidates))], _View(self, g.key), self.settings.levels,
            required=required, fixed=fixed,
        )
        if isinstance(result, NoFit):
            return FilterDecision([], unresolvable=ExtraMemberWaits(g.key, len(g.plan)))
        node = result.assignments[pod.key]
        self._reserve(g, pod.key, node)
        return FilterDecision([node])

    def _replan(
        self, g: _Gang, spec: GangSpec, pod: PodRecord, candidates: Sequence[NodeName],
        now: float,
    ) -> FilterDecision:
        """The planned node is no longer a candidate: move this member if possible."""
        lost = g.plan[pod.key]
        self._unreserve(g, pod.key)
        required, _ = self._levels_for(g)
        fixed = {k: n for k, n in g.plan.items() if self.waiting.is_parked(k)}
        result = plan_gang(
            [Member(pod, frozenset(candidates))], _View(self, g.key), self.settings.levels,
            required=required, fixed=fixed,
        )
        if isinstance(result, NoFit):
            reason = PlannedNodeLost(g.key, lost, result)
            if not g.released:
                return FilterDecision([], unresolvable=self._turn_away(g, reason))
            return FilterDecision([], unresolvable=reason)
        node = result.assignments[pod.key]
        self._reserve(g, pod.key, node)
        return FilterDecision([node])

    # ------------------------------------------------------------------ prioritize

    def prioritize(self, pod: PodRecord, nodes: Sequence[NodeName]) -> list[int]:
        """A 0..10 score for each of ``nodes``, in the same order."""
        gpus = pod.requests.get(GPU, 0)
        own = self._gang_key(self._membership.get(pod.key))
        if own is not None:
            return [self._score(n, gpus, own) for n in nodes]
        # Plain pods: scores depend only on the node's state and the GPU count, so they are
        # cached per GPU count and dropped whenever a node's usage or reservations change.
        cache = self.ledger.scores.setdefault(gpus, {})
        get = cache.get
        out = [get(n, -1) for n in nodes]
        if -1 in out:
            for i, n in enumerate(nodes):
                if out[i] < 0:
                    out[i] = cache[n] = self._score(n, gpus, None)
        return out

    def _score(self, n: NodeName, gpus: int, own: GangKey | None) -> int:
        node = self.nodes.get(n)
        if node is None:
            return 0
        return self.explain_score(n, gpus, own).total

    def explain_score(self, n: NodeName, gpus: int, own: GangKey | None) -> Score:
        node = self.nodes[n]
        numa = self.numa.get(n)
        return explain_score(
            node, gpus, self.ledger.free_gpus(n, own), self.ledger.gpu_pods.get(n, {}).values(),
            self._layout(node), numa.gpus_available if numa is not None else None,
        )

    def _layout(self, node: NodeRecord) -> GpuLayout:
        cached = self._layouts.get(node.name)
        if cached is None or cached[0] is not node:
            cached = (node, gpu_layout(node))
            self._layouts[node.name] = cached
        return cached[1]

    # ------------------------------------------------------------------ bind

    def bind(self, key: PodKey, node: NodeName, now: float) -> BindDecision:
        m = self._membership.get(key)
        if m is None or key not in self.pods:
            return BindNow(key, node)
        if isinstance(m, InvalidGang):
            return Reject(InvalidDeclaration(m))
        if isinstance(m, MissingPodGroup):
            return Reject(PodGroupNotFound(m.key))
        g = self._gangs[m.key]
        spec = self._spec(g) or m
        planned = g.plan.get(key)
        if planned is not None and planned != node:
            return Reject(WrongNode(g.key, planned, node))
        if self._satisfied(g, spec):
            return BindNow(key, node)
        if planned is None:
            # No plan holds this pod (e.g. Lockstep restarted after filter): admit it now.
            decision = self.filter(self.pods[key], [node], now)
            if decision.passed != [node]:
                return Reject(decision.unresolvable or WrongNode(g.key, None, node))
        assert g.deadline is not None
        parked = self.waiting.park(g.key, key, node)
        if parked + self._bound_count(g) >= spec.min_member:
            g.released = True
            g.deadline = None
            binds = self.waiting.pop_gang(g.key)
            self._notice(NoticeKind.RELEASED, g.key, sorted(binds),
                         detail=f"{len(binds) + self._bound_count(g)}/{spec.min_member}")
            return BindGroup(g.key, binds)
        return Park(g.key, g.deadline)

    def bind_failed(self, key: PodKey) -> None:
        """A bind call failed at the API: the pod goes back through filter to its slot."""
        self.waiting.remove(key)

    def abandon(self, key: PodKey) -> None:
        """kube-scheduler gave up on a parked call (connection closed): unpark it."""
        self.waiting.remove(key)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        times = [g.deadline for g in self._gangs.values() if g.deadline is not None]
        times += [g.backoff_until for g in self._gangs.values() if g.backoff_until is not None]
        return min(times, default=None)

    def expire(self, now: float) -> list[Expired]:
        """Time out admitted gangs past their deadline and end finished backoffs."""
        out = []
        for g in list(self._gangs.values()):
            if g.backoff_until is not None and now >= g.backoff_until:
                g.backoff_until = None
                self._requeue.update(g.members)
            if g.deadline is None or now < g.deadline or g.released:
                continue
            spec = self._spec(g)
            parked = self.waiting.pop_gang(g.key)
            stragglers = tuple(
                f"{k} ({self.pods[k].node_name or 'not placed'})"
                for k in sorted(g.members)
                if k not in parked and k in self.pods and self.pods[k].node_name is None
            )
            reason = TimedOut(
                g.key, len(parked), spec.min_member if spec else 0,
                spec.timeout_seconds if spec else 0.0, stragglers[:5],
            )
            self._release_plan(g)
            g.backoff_until = now + self.settings.backoff_seconds
            g.backoff_cause = reason
            g.reason = reason
            self._notice(NoticeKind.TIMED_OUT, g.key, sorted(g.members), reason)
            out.append(Expired(g.key, parked, reason))
            # Capacity came free: wake the gangs that were waiting for it.
            for other in self._gangs.values():
                if other is not g and isinstance(other.reason, DoesNotFit | PlannedNodeLost):
                    self._requeue.update(other.members)
        return out

    # ------------------------------------------------------------------ views

    def gang_of(self, pod: PodKey) -> GangKey | None:
        return self._gang_key(self._membership.get(pod))

    def gang_view(self, key: GangKey, now: float) -> GangView | None:
        g = self._gangs.get(key)
        if g is None:
            return None
        return GangView(
            key=g.key,
            phase=self.phase(g, now),
            spec=self._spec(g),
            members=len(self._live_members(g)),
            bound=self._bound_count(g),
            parked=self.waiting.count(g.key),
            plan=dict(g.plan),
            plan_level=g.plan_level,
            deadline=g.deadline,
            backoff_until=g.backoff_until,
            reason=g.reason,
        )

    def gang_views(self, now: float) -> list[GangView]:
        views = (self.gang_view(k, now) for k in sorted(self._gangs))
        return [v for v in views if v is not None]

    def domains(self, index: int) -> dict[tuple[str, ...], list[NodeName]]:
        cached = self._domains.get(index)
        if cached is None:
            cached = {}
            for n in sorted(self.nodes):
                d = domain_of(self.settings.levels, index, self.nodes[n])
                if d is not None:
                    cached.setdefault(d, []).append(n)
            self._domains[index] = cached
        return cached

    def reserved_total(self) -> Mapping[NodeName, Mapping[GangKey, Resources]]:
        return self.ledger.reserved




class _View:
    """The planner's read-only window: capacity as seen by one gang."""

    def __init__(self, core: Coscheduler, gang: GangKey) -> None:
        self._core = core
        self._gang = gang
        self.nodes = core.nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        return self._core.free_outside(node, self._gang)

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        return list(self._core.ledger.gpu_pods.get(node, {}).values())

    def free_gpus(self, node: NodeName) -> int:
        return self._core.ledger.free_gpus(node, self._gang)

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self._core.domains(index)


def _plan_text(plan: Plan) -> str:
    nodes = sorted(set(plan.assignments.values()))
    where = f"one {plan.level}" if plan.level else "spread"
    listed = ", ".join(nodes[:8])
    return f"{len(plan.assignments)} members on {len(nodes)} node(s), {where}: {listed}"


def _same_kind_same_numbers(a: GangReason | None, b: GangReason) -> bool:
    """Backoff countdowns differ every call; one Event per backoff is enough."""
    return isinstance(a, BackingOff) and isinstance(b, BackingOff)
