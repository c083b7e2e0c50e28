"""What the core asks the app to do outside a verb's own answer.

Three queues, each drained by the app after every verb and cache event: Events a person should
see (:class:`~coscheduling.actions.Notice`), pods to nudge back into kube-scheduler's active
queue (no API event would wake them: a gang was admitted, a backoff ended, a pod a verb asked
about arrived), and parked bind calls let go of by cluster events (:class:`Unparked`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..actions import Eviction, Notice, NoticeKind, Unparked
from ..reasons import GangReason
from ..records import GangKey, PodKey, PodRecord

__all__ = ["Outbox"]


@dataclass(slots=True)
class Outbox:
    notices: list[Notice] = field(default_factory=list)
    requeue: set[PodKey] = field(default_factory=set)
    unparked: list[Unparked] = field(default_factory=list)
    lift: set[PodKey] = field(default_factory=set)
    """Gated pods whose gate may have to come off (the core decides at drain time)."""
    awaited: set[PodKey] = field(default_factory=set)
    """Gang pods a verb asked about before the watch delivered them: nudged on arrival."""
    evictions: list[Eviction] = field(default_factory=list)
    """Victims of preemptions decided since the last drain."""
    deallocate: dict[str, tuple[str, str]] = field(default_factory=dict)
    """DRA claims (``namespace/name``) whose allocation the app clears, with the uid and
    resourceVersion it must still have (``coscheduling.devices.stale``)."""

    def notice(self, kind: NoticeKind, gang: GangKey | None, pods: Sequence[PodKey],
               reason: GangReason | None = None, detail: str = "") -> None:
        self.notices.append(Notice(kind, gang, tuple(pods), reason, detail))

    def arrived(self, pod: PodRecord) -> None:
        if pod.key in self.awaited:
            self.awaited.discard(pod.key)
            if pod.node_name is None:
                self.requeue.add(pod.key)

    def drain_notices(self) -> list[Notice]:
        out, self.notices = self.notices, []
        return out

    def drain_requeue(self, pods: Mapping[PodKey, PodRecord]) -> list[PodKey]:
        out = sorted(k for k in self.requeue if k in pods and pods[k].node_name is None)
        self.requeue.clear()
        return out

    def drain_evictions(self) -> list[Eviction]:
        out, self.evictions = self.evictions, []
        return out

    def drain_deallocate(self) -> list[tuple[str, str, str]]:
        out = sorted((k, uid, rv) for k, (uid, rv) in self.deallocate.items())
        self.deallocate.clear()
        return out

    def drain_unparked(self) -> list[Unparked]:
        out, self.unparked = self.unparked, []
        return out
