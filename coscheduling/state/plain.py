"""Pods of Lockstep's schedulers outside any gang (:class:`PlainPods`): which are being placed
now, and what Lockstep last answered for each.

Gangs are measured against them: a gang of lower priority is not admitted onto the room
pending plain pods need, and ``explain`` tells a plain pod's last filter and bind answer
(:class:`PlainVerdict`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..reasons import GangReason, NodeReason
from ..records import NodeName, PodKey

__all__ = ["VERDICTS_REMEMBERED", "PlainPods", "PlainVerdict"]

VERDICTS_REMEMBERED = 10000


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


@dataclass(slots=True)
class PlainPods:
    pending: dict[PodKey, int] = field(default_factory=dict)
    """Pods of Lockstep's schedulers outside any gang that kube-scheduler is placing now
    (unbound, ungated, not marked unschedulable), with their priority: a gang of lower
    priority is not admitted onto the room they need."""
    verdicts: OrderedDict[PodKey, PlainVerdict] = field(default_factory=OrderedDict)
    """The last filter and bind answer for each pod outside a gang (the latest
    :data:`VERDICTS_REMEMBERED`), for ``explain``."""

    def verdict(self, pod: PodKey, **changes: object) -> None:
        """Record part of a plain pod's last answer (filter or bind)."""
        old = self.verdicts.pop(pod, None) or PlainVerdict()
        fields = {k: getattr(old, k) for k in PlainVerdict.__slots__}
        fields.update(changes)
        self.verdicts[pod] = PlainVerdict(**fields)
        while len(self.verdicts) > VERDICTS_REMEMBERED:
            self.verdicts.popitem(last=False)
