"""Everything the gang rules read and change, held in one place the rule modules share.

The rule modules (``ingest``, ``admission``, ``held``, ``filtering``, ``binding``,
``deadlines``, ``views``) are functions over one :class:`CoreState`; the
:class:`~coscheduling.core.Coscheduler` facade owns it and routes cluster events and verbs to
them. Three owners keep their own invariants inside it:

* :class:`~coscheduling.store.ClusterStore` holds what the API server sent and every cache
  derived from it;
* :class:`~coscheduling.ledger.Ledger` holds one reservation per planned pod;
* :class:`~coscheduling.gang.Gang` is each gang's state machine, the only code that reserves
  or unreserves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .capacity import Capacity
from .decisions import NoticeKind, Unparked
from .gang import Gang
from .ledger import Ledger
from .outbox import Outbox
from .podgroup import GangDefaults, GangKey, Membership
from .reasons import BindTargetGone, GangReason
from .records import PodKey, PodRecord
from .store import ClusterStore
from .topology import DEFAULT_LEVELS, Level
from .waiting import WaitingMap

__all__ = ["CoreState", "Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_names: frozenset[str] = frozenset({"lockstep"})
    defaults: GangDefaults = GangDefaults()
    backoff_seconds: float = 30.0
    levels: tuple[Level, ...] = DEFAULT_LEVELS


class CoreState:
    """The store, the ledger, the waiting map, the gangs and each pod's membership."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = ClusterStore(settings.levels)
        self.ledger = Ledger(on_change=self.store.touch)
        self.capacity = Capacity(self.store, self.ledger)
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
