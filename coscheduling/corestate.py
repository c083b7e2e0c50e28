"""The core's state (:class:`CoreState`): everything the gang rules read and change, held in
one place the rule modules share. (The module was ``state``; ``corestate`` names the class it
holds, apart from the cluster as the API server showed it, ``cluster``.)

The rule modules (``ingest``, ``gang_admission``, ``creation.held``, ``filtering``, ``binding``,
``deadlines``, ``views``) are functions over one :class:`CoreState`; the
:class:`~coscheduling.core.Coscheduler` facade owns it and routes cluster events and verbs to
them. Three owners keep their own invariants inside it:

* :class:`~coscheduling.state.cluster.ClusterStore` holds what the API server sent and every cache
  derived from it;
* :class:`~coscheduling.state.ledger.Ledger` holds one reservation per planned pod;
* :class:`~coscheduling.state.gang.Gang` is each gang's state machine, the only code that reserves
  or unreserves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .actions import Answer, NoticeKind, Unparked
from .devices.inventory import DeviceInventory
from .placement.capacity import Capacity
from .podgroup import GangDefaults, GangKey, GangSpec, InvalidGang, Membership, MissingPodGroup
from .preemption.budgets import Budget
from .preemption.inflight import PreemptionBook
from .reasons import BindTargetGone, GangReason, NodeReason
from .records import NodeName, PodKey, PodRecord, PriorityClass
from .state.cluster import ClusterStore
from .state.gang import Gang
from .state.ledger import Ledger
from .state.nominations import Nominations
from .state.outbox import Outbox
from .state.waiting import WaitingMap
from .topology.domains import DEFAULT_LEVELS, Level

__all__ = ["GONE_REMEMBERED", "VERDICTS_REMEMBERED", "CoreState", "HeldReviews", "PlainVerdict",
           "Settings"]

GONE_REMEMBERED = 10000
VERDICTS_REMEMBERED = 10000


@dataclass(slots=True)
class HeldReviews:
    """The reviews of one gang the webhook is holding, waiting for the ones that complete its
    quorum (:class:`~coscheduling.actions.AwaitQuorum`, ``coscheduling.creation.placer``)."""

    spec: GangSpec
    first: float
    until: float
    pods: dict[PodKey, PodRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_names: frozenset[str] = frozenset({"lockstep"})
    defaults: GangDefaults = GangDefaults()
    backoff_seconds: float = 30.0
    levels: tuple[Level, ...] = DEFAULT_LEVELS
    preemption: bool = True
    """Gangs that do not fit evict whole lower-priority gangs and pods (``--preemption``)."""


@dataclass(frozen=True, slots=True)
class PlainVerdict:
    """What Lockstep last answered for a pod outside any gang."""

    filtered_at: float | None = None
    passed: int = 0
    """Candidate nodes the filter passed."""
    refused: Mapping[NodeName, NodeReason] = field(default_factory=dict)
    """Candidates the filter turned away, and why (another gang's reservation)."""
    bind_at: float | None = None
    bind_node: NodeName | None = None
    bind_refused: GangReason | NodeReason | None = None
    preemption: str = ""
    """What its last look for victims did (it preempts, or why it cannot)."""


class CoreState:
    """The store, the ledger, the waiting map, the gangs and each pod's membership."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = ClusterStore(settings.levels)
        self.ledger = Ledger(on_change=self.store.touch)
        self.nominations = Nominations(on_change=self.store.touch)
        """Room held for plain pods that preempted (a gang's is in the ledger)."""
        self.devices = DeviceInventory()
        """DRA devices, claims and the devices admitted gangs hold (``coscheduling.devices``)."""
        self.capacity = Capacity(self.store, self.ledger, self.nominations, self.devices)
        self.waiting = WaitingMap()
        self.gangs: dict[GangKey, Gang] = {}
        self.membership: dict[PodKey, Membership] = {}
        self.outbox = Outbox()
        self.held_touched: set[GangKey] = set()
        """Gangs with held members whose admission may have become possible."""
        self.held_blocked: set[GangKey] = set()
        """Held gangs that did not fit: planned again when capacity changed."""
        self.held_epoch = -1
        self.held_swept = float("-inf")
        self.partial_gangs = 0
        """Gangs left partly bound by a permanently failed binding (a counter for metrics)."""
        self.assumed: dict[PodKey, tuple[str, NodeName]] = {}
        """Pods Lockstep bound (uid, node) that the watch has not shown bound yet: counted on
        their node at once, as kube-scheduler's cache assumes a pod, so no plan is made on
        the room they took; kept until the watch confirms or contradicts it."""
        self.provisional: dict[PodKey, float] = {}
        """Members pinned at creation that the watch has not shown yet, with the time their
        slot is given back if it never does (``coscheduling.creation.placer``)."""
        self.holds: dict[GangKey, HeldReviews] = {}
        """Reviews the webhook holds until their gang's quorum exists
        (``coscheduling.creation.placer``): nothing is reserved for them."""
        self.slow_gangs: OrderedDict[GangKey, None] = OrderedDict()
        """Gangs whose members were created one at a time: their reviews are gated, not held."""
        self.creation_answers: dict[PodKey, Answer] = {}
        """Answers for held reviews decided since the webhook last asked."""
        self.pods_revision = 0
        """The newest pod resourceVersion the watch (or a list) has delivered: a pod in a verb
        call that is newer is one the watch has not reached yet; an older one absent from the
        store is gone."""
        self.gone: OrderedDict[str, None] = OrderedDict()
        """UIDs of pods the watch showed deleted (the latest ``GONE_REMEMBERED``): a filter
        call for one is kube-scheduler's stale view, never a pod to learn from the call."""
        self.unschedulable_plain: dict[PodKey, int] = {}
        """Plain pods of Lockstep's schedulers kube-scheduler found no node for, with their
        priority: each may preempt (no filter call comes for them)."""
        self.plain_tried: dict[PodKey, int] = {}
        """The store epoch at which each such pod last looked for victims in vain."""
        self.pending_plain: dict[PodKey, int] = {}
        """Pods of Lockstep's schedulers outside any gang that kube-scheduler is placing now
        (unbound, ungated, not marked unschedulable), with their priority: a gang of lower
        priority is not admitted onto the room they need."""
        self.budgets: dict[str, Budget] = {}
        """PodDisruptionBudgets by ``namespace/name``: preemption spares the pods they
        protect when it can."""
        self.priority_classes: dict[str, PriorityClass] = {}
        """PriorityClass values by name, for groups that name a class themselves (Volcano
        and upstream PodGroups): pods carry their resolved priority, groups do not."""
        self.preemptions = PreemptionBook()
        """Preemptions whose victims are terminating, by preemptor gang."""
        self.preempt_tried: dict[GangKey, tuple[int, str]] = {}
        """The store epoch at which each gang last looked for victims in vain, and why it
        found none: it looks again only once capacity or pods changed."""
        self.plain_verdicts: OrderedDict[PodKey, PlainVerdict] = OrderedDict()
        """The last filter and bind answer for each pod outside a gang (the latest
        ``VERDICTS_REMEMBERED``), for ``explain``."""

    def forget_gone(self, uid: str) -> None:
        if uid:
            self.gone[uid] = None
            while len(self.gone) > GONE_REMEMBERED:
                self.gone.popitem(last=False)

    def verdict(self, pod: PodKey, **changes: object) -> None:
        """Record part of a plain pod's last answer (filter or bind)."""
        old = self.plain_verdicts.pop(pod, None) or PlainVerdict()
        fields = {k: getattr(old, k) for k in PlainVerdict.__slots__}
        fields.update(changes)
        self.plain_verdicts[pod] = PlainVerdict(**fields)
        while len(self.plain_verdicts) > VERDICTS_REMEMBERED:
            self.plain_verdicts.popitem(last=False)

    def gang_priority(self, g: Gang) -> int:
        """A gang's priority: its group object's when it has one (an upstream PodGroup's
        ``spec.priority``, else the value of the class a Volcano or upstream PodGroup
        names), as Volcano's and the native gang scheduler read it; otherwise its highest
        member's, as kube-scheduler's queue orders it."""
        spec = g.spec
        if spec is not None:
            if spec.priority is not None:
                return spec.priority
            if spec.priority_class is not None:
                pc = self.priority_classes.get(spec.priority_class)
                if pc is not None:
                    return pc.value
        return max((p.priority for k in g.members if (p := self.store.pods.get(k))),
                   default=0)

    def unit_priority(self, pod: PodRecord, cache: dict[GangKey, int] | None = None) -> int:
        """The priority preemption and reservations measure ``pod`` by: its gang's
        (:meth:`gang_priority`) when it is a gang member, its own when it is a plain pod.

        The preemptor is measured by :meth:`gang_priority`, so a victim must be too: a
        Volcano gang whose PodGroup names a class of 1000 while its pods carry 0 would
        otherwise be a victim of a priority-10 gang and then evict it back, round after
        round. ``cache`` holds gang priorities already computed (one per gang, not one per
        member) for a caller that measures many pods at once."""
        m = self.membership.get(pod.key)
        key = m.key if isinstance(m, GangSpec | InvalidGang | MissingPodGroup) else None
        g = self.gangs.get(key) if key is not None else None
        if key is None or g is None:
            return pod.priority
        if cache is None:
            return self.gang_priority(g)
        got = cache.get(key)
        if got is None:
            got = cache[key] = self.gang_priority(g)
        return got

    def live(self, g: Gang) -> list[PodRecord]:
        """The gang's members that exist and are not finishing, in name order."""
        out = []
        for k in sorted(g.members):
            p = self.store.pods.get(k)
            if p is not None and p.active:
                out.append(p)
        return out

    def notice(self, kind: NoticeKind, gang: GangKey | None, pods: Sequence[PodKey],
               reason: GangReason | None = None, detail: str = "") -> None:
        self.outbox.notice(kind, gang, pods, reason, detail)

    def unpark(self, g: Gang, pod: PodKey, what: str) -> None:
        """Let go of ``pod``'s parked bind call, if any, saying why."""
        node = self.waiting.node(pod)
        if node is not None:
            self.waiting.remove(pod)
            self.outbox.unparked.append(
                Unparked(g.key, {pod: node}, BindTargetGone(g.key, pod, what)))
