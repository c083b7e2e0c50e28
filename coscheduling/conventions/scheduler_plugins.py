"""scheduler-plugins Coscheduling: a pod label names a ``PodGroup`` object, which gives the
size (``minMember``), ``minResources`` and the timeout; Lockstep writes its status."""

from __future__ import annotations

from .base import Convention, Key, PodGroupAPI, Source

__all__ = ["API", "CONVENTION", "GROUP_LABEL"]

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
API = PodGroupAPI("scheduling.x-k8s.io", "v1alpha1", "podgroups")

CONVENTION = Convention(Source.SCHEDULER_PLUGINS, declares=(Key(GROUP_LABEL, "label"),),
                        podgroup=API)
