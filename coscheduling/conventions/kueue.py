"""Kueue's plain-pod groups: the group's name and its total count on each pod. A pod behind
Kueue's own ``kueue.x-k8s.io/admission`` gate does not count until Kueue admits the group."""

from __future__ import annotations

from .base import Convention, Key, Source

__all__ = ["ADMISSION_GATE", "CONVENTION", "GROUP", "TOTAL"]

GROUP = "kueue.x-k8s.io/pod-group-name"
TOTAL = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"

CONVENTION = Convention(Source.KUEUE, declares=(Key(GROUP, "either"),),
                        size=((Key(TOTAL, "either"), None),))
