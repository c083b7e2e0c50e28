"""What the preemption wing remembers between events (:class:`PreemptionState`): the
preemptions in flight, the room promised to plain pods that preempted, the disruption budgets
it spares, and who looked for victims in vain at which store epoch (so nobody searches again
until capacity or pods changed).

A leaf of the wing: the core's state (``corestate``) composes it, and the carry part
(``preemption.carry``) changes it; it imports no rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..records import GangKey, PodKey
from ..state.nominations import Nominations
from .budgets import Budget
from .inflight import PreemptionBook

__all__ = ["PreemptionState"]


@dataclass(slots=True)
class PreemptionState:
    nominations: Nominations
    """Room held for plain pods that preempted (a gang's is in the ledger); capacity reads
    it."""
    inflight: PreemptionBook = field(default_factory=PreemptionBook)
    """Preemptions whose victims are terminating, by preemptor gang."""
    budgets: dict[str, Budget] = field(default_factory=dict)
    """PodDisruptionBudgets by ``namespace/name``: preemption spares the pods they
    protect when it can."""
    tried: dict[GangKey, tuple[int, str]] = field(default_factory=dict)
    """The store epoch at which each gang last looked for victims in vain, and why it
    found none: it looks again only once capacity or pods changed."""
    unschedulable_plain: dict[PodKey, int] = field(default_factory=dict)
    """Plain pods of Lockstep's schedulers kube-scheduler found no node for, with their
    priority: each may preempt (no filter call comes for them)."""
    plain_tried: dict[PodKey, int] = field(default_factory=dict)
    """The store epoch at which each such pod last looked for victims in vain."""
