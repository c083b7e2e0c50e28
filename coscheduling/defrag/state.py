"""What the defragmentation wing remembers between events (:class:`DefragState`).

Every part is bounded: one entry per waiting gang (dropped when it is admitted or goes), the
moves of the last minute (at most the rate limit), one reservation per moved pod until its
replacement binds or the reservation lapses, and at most :data:`MOVED_KEPT` pods moved once.

A leaf of the wing: the core's state composes it; the carry part changes it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..records import GangKey, NodeName, PodKey
from ..resources import Resources

__all__ = ["MOVED_KEPT", "DefragState", "MoveSlot"]

MOVED_KEPT = 4096
"""Pods remembered as moved once (replacements steered to their reserved room): never moved
again while remembered. Oldest forgotten first."""


@dataclass(frozen=True, slots=True)
class MoveSlot:
    """Room reserved for the replacement of one moved pod: a nomination under ``hold`` (a key
    no pod can have) until the replacement comes to the filter and takes it."""

    hold: PodKey
    owner_uid: str
    namespace: str
    node: NodeName
    requests: Resources
    gang: GangKey
    """The gang the pod was moved for."""
    moved: PodKey
    """The pod that moved."""


@dataclass(slots=True)
class DefragState:
    waiting_since: dict[GangKey, float] = field(default_factory=dict)
    """When each gang was first found fitting overall but not where it needs: it waits
    ``--defrag-after`` from then before anything moves for it."""
    woken: set[GangKey] = field(default_factory=set)
    """Gangs already woken when their wait ended (the timer wakes each once)."""
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    """(when, pods moved) of the moves in the last minute: the cluster's rate limit."""
    slots: dict[PodKey, MoveSlot] = field(default_factory=dict)
    """Room reserved for moved pods' replacements, by hold key."""
    moved: OrderedDict[PodKey, GangKey] = field(default_factory=OrderedDict)
    """Replacements of moved pods, and the gang each was moved for: never moved again."""
    tried: dict[GangKey, tuple[int, str]] = field(default_factory=dict)
    """The store epoch at which each gang last searched for a move in vain, and why."""
    moves: int = 0
    """Pods moved since start (a counter for metrics)."""

    def remember_moved(self, pod: PodKey, gang: GangKey) -> None:
        self.moved[pod] = gang
        self.moved.move_to_end(pod)
        while len(self.moved) > MOVED_KEPT:
            self.moved.popitem(last=False)

    def moved_in_last_minute(self, now: float) -> int:
        while self.recent and self.recent[0][0] <= now - 60.0:
            self.recent.popleft()
        return sum(n for _, n in self.recent)
