"""The core's state (:class:`CoreState`): everything the gang rules read and change, one
composition the rule modules are handed.

The rule modules (``events.ingest``, ``gang.admission``, ``creation``, ``verbs``,
``preemption.carry``, ``readmodel``) are functions over one :class:`CoreState`; the
:class:`~coscheduling.core.Coscheduler` facade owns it and routes cluster events and verbs to
them. Its parts each keep their own invariants:

* :class:`~coscheduling.state.cluster.ClusterStore` holds what the API server sent and every cache
  derived from it;
* :class:`~coscheduling.state.ledger.Ledger` holds one reservation per planned pod;
* :class:`~coscheduling.state.gang.Gang` is each gang's state machine, the only code that reserves
  or unreserves;
* each wing owns what it remembers: preemption
  (:class:`~coscheduling.preemption.state.PreemptionState`), creation
  (:class:`~coscheduling.creation.state.CreationState`) and the devices
  (:class:`~coscheduling.devices.inventory.DeviceInventory`); pods outside any gang are
  :class:`~coscheduling.state.plain.PlainPods`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .actions import NoticeKind, Unparked
from .creation.state import CreationState
from .defrag.state import DefragState
from .devices.inventory import DeviceInventory
from .placement.capacity import Capacity
from .podgroup import GangDefaults, GangKey, GangSpec, InvalidGang, Membership, MissingPodGroup
from .preemption.state import PreemptionState
from .reasons import BindTargetGone, GangReason
from .records import NodeName, PodKey, PodRecord
from .state.cluster import ClusterStore
from .state.gang import Gang
from .state.ledger import Ledger
from .state.nominations import Nominations
from .state.outbox import Outbox
from .state.plain import PlainPods, PlainVerdict
from .state.waiting import WaitingMap
from .topology.domains import DEFAULT_LEVELS, Level

__all__ = ["CoreState", "PlainVerdict", "Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_names: frozenset[str] = frozenset({"lockstep"})
    defaults: GangDefaults = GangDefaults()
    backoff_seconds: float = 30.0
    levels: tuple[Level, ...] = DEFAULT_LEVELS
    preemption: bool = True
    """Gangs that do not fit evict whole lower-priority gangs and pods (``--preemption``)."""
    defrag: bool = True
    """A gang that fits overall but not where it needs has pods moved (``--defrag``)."""
    defrag_after: float = 30.0
    """Seconds such a gang waits before anything moves for it (``--defrag-after``)."""
    defrag_rate: int = 10
    """Pods moved per minute in the whole cluster, at most (``--defrag-rate``)."""


class CoreState:
    """The cluster, the reservations, the gangs and each pod's membership, and each wing's
    own state."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = ClusterStore(settings.levels)
        self.ledger = Ledger(on_change=self.store.touch)
        self.preemption = PreemptionState(Nominations(on_change=self.store.touch))
        """The preemption wing's: preemptions in flight, nominations, budgets, who tried."""
        self.defrag = DefragState()
        """The defragmentation wing's: gangs waiting to move pods, moves, reserved room."""
        self.creation = CreationState()
        """The creation wing's: held reviews, slow gangs, answers, pinned members, gated
        gangs."""
        self.devices = DeviceInventory()
        """DRA devices, claims and the devices admitted gangs hold (``coscheduling.devices``)."""
        self.capacity = Capacity(self.store, self.ledger, self.preemption.nominations,
                                 self.devices)
        self.waiting = WaitingMap()
        self.gangs: dict[GangKey, Gang] = {}
        self.membership: dict[PodKey, Membership] = {}
        self.outbox = Outbox()
        self.plain = PlainPods()
        """Pods outside any gang being placed now, and the last answer for each."""
        self.partial_gangs = 0
        """Gangs left partly bound by a permanently failed binding (a counter for metrics)."""
        self.assumed: dict[PodKey, tuple[str, NodeName]] = {}
        """Pods Lockstep bound (uid, node) that the watch has not shown bound yet: counted on
        their node at once, as kube-scheduler's cache assumes a pod, so no plan is made on
        the room they took; kept until the watch confirms or contradicts it."""

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
                pc = self.store.priority_classes.get(spec.priority_class)
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
