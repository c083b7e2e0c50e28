"""A gang member as the planner and the rank-order pass read it: the pod, and the nodes
kube-scheduler's own filters passed for it when the call is about this pod."""

from __future__ import annotations

from dataclasses import dataclass

from ..records import NodeName, PodKey, PodRecord

__all__ = ["Member"]


@dataclass(frozen=True, slots=True)
class Member:
    pod: PodRecord
    candidates: frozenset[NodeName] | None = None
    """Nodes kube-scheduler's own filters passed (known only for the pod being filtered)."""

    @property
    def key(self) -> PodKey:
        return self.pod.key
