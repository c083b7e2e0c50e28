"""Kueue's plain-pod groups: the group's name and its total count on each pod. A pod behind
Kueue's own ``kueue.x-k8s.io/admission`` gate does not count until Kueue admits the group."""

from __future__ import annotations

from collections.abc import Mapping

from .base import Convention, Key, Source

__all__ = ["ADMISSION_GATE", "CLUSTER_QUEUE", "CONVENTION", "GROUP", "LOCAL_QUEUE", "QUEUE",
           "TOTAL", "quota_line"]

GROUP = "kueue.x-k8s.io/pod-group-name"
TOTAL = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"

CONVENTION = Convention(Source.KUEUE, declares=(Key(GROUP, "either"),),
                        size=((Key(TOTAL, "either"), None),))

QUEUE = "kueue.x-k8s.io/queue-name"
"""Kueue's LocalQueue label as users write it (on plain pods of its ``pod`` integration, and
on jobs): Lockstep never evicts across quota lines (Kueue preempts for quota itself)."""
CLUSTER_QUEUE = "kueue.x-k8s.io/cluster-queue-name"
LOCAL_QUEUE = "kueue.x-k8s.io/local-queue-name"
"""What Kueue v0.17 puts on the pods of a job it admitted (``AssignQueueLabelsForPods``,
``pkg/controller/jobframework/reconciler.go``): a PyTorchJob's or batch Job's pods carry
these, not ``queue-name``."""


def quota_line(namespace: str, labels: Mapping[str, str]) -> str | None:
    """The quota a pod was admitted under, None for none. Kueue's unit of quota is the
    ClusterQueue, named on the pods of every job it admitted; a pod naming only its
    LocalQueue (a plain pod group) is under ``namespace/queue``. Two pods that name their
    line differently never evict each other: where Lockstep cannot tell, it stays out.
    Preemption asks it (:mod:`coscheduling.preemption.carry`): Kueue preempts for quota itself."""
    cq = labels.get(CLUSTER_QUEUE)
    if cq:
        return f"clusterqueue/{cq}"
    queue = labels.get(LOCAL_QUEUE) or labels.get(QUEUE)
    return f"{namespace}/{queue}" if queue else None
