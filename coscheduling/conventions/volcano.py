"""Volcano: a pod annotation names the gang; its size comes from Volcano's ``PodGroup`` of
that name (or from ``group-min-member`` on the pod). Lockstep plays Volcano's enqueue step and
writes the PodGroup's phase."""

from __future__ import annotations

from .base import Convention, Key, PodGroupAPI, Source

__all__ = ["API", "CONVENTION", "GROUP", "MIN_MEMBER"]

GROUP = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
MIN_MEMBER = "scheduling.volcano.sh/group-min-member"
API = PodGroupAPI("scheduling.volcano.sh", "v1beta1", "podgroups")

CONVENTION = Convention(
    Source.VOLCANO,
    declares=tuple(Key(k, "annotation") for k in GROUP),
    size=((Key(MIN_MEMBER, "either"), None),),
    podgroup=API,
)
