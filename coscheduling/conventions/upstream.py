"""Kubernetes' own gang API (``scheduling.k8s.io``): the pod spec names its ``PodGroup``
(1.36+) or ``Workload`` (1.35); the objects are read and their condition written by
``coscheduling.upstream``, whose served version is found by discovery."""

from __future__ import annotations

from .base import Convention, Source

__all__ = ["CONVENTION", "GROUP", "SCHEDULING_GROUP_FIELD", "WORKLOAD_REF_FIELD"]

GROUP = "scheduling.k8s.io"
SCHEDULING_GROUP_FIELD = "spec.schedulingGroup.podGroupName"
WORKLOAD_REF_FIELD = "spec.workloadRef"

CONVENTION = Convention(
    Source.UPSTREAM,
    spec_fields=(tuple(SCHEDULING_GROUP_FIELD.split(".")),
                 (*WORKLOAD_REF_FIELD.split("."), "name")),
)
