"""Koordinator: gang annotations on the pod (or the same keys on a scheduler-plugins
``PodGroup``, the CRD way), and the retired lightweight-coscheduling labels it still honours.
Its options (total number, mode, match policy, gang groups) are read by
``coscheduling.podgroup``."""

from __future__ import annotations

from .base import Convention, Key, Source

__all__ = [
    "CONVENTION",
    "GROUP",
    "GROUPS",
    "LIGHT_GROUP",
    "LIGHT_MIN",
    "MATCH",
    "MATCH_ALIAS",
    "MIN",
    "MODE",
    "OPTIONS",
    "TOTAL",
    "WAIT",
]

GROUP = "gang.scheduling.koordinator.sh/name"
MIN = "gang.scheduling.koordinator.sh/min-available"
WAIT = "gang.scheduling.koordinator.sh/waiting-time"
TOTAL = "gang.scheduling.koordinator.sh/total-number"
MODE = "gang.scheduling.koordinator.sh/mode"
GROUPS = "gang.scheduling.koordinator.sh/groups"
MATCH = "gang.scheduling.koordinator.sh/match-policy"
MATCH_ALIAS = "pod-group.scheduling.sigs.k8s.io/match-policy"
LIGHT_GROUP = "pod-group.scheduling.sigs.k8s.io/name"
"""The retired lightweight-coscheduling labels; Koordinator still honours them."""
LIGHT_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
OPTIONS = (TOTAL, MODE, GROUPS, MATCH, MATCH_ALIAS)
"""Read from the pod, or from its scheduler-plugins PodGroup's annotations."""

CONVENTION = Convention(
    Source.KOORDINATOR,
    declares=(Key(GROUP, "annotation"), Key(LIGHT_GROUP, "label")),
    size=((Key(MIN, "either"), Key(WAIT, "either")), (Key(LIGHT_MIN, "either"), None)),
)
