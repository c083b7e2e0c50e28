"""Names and keys every other module shares: a leaf module, so the pod record, the webhook's
decision, the lift and the gang declaration can all use them without importing behaviour."""

from __future__ import annotations

from typing import NewType

__all__ = ["GANG_GATE", "GangKey", "gang_key"]

GANG_GATE = "lockstep.dev/gang"
"""Lockstep's scheduling gate: a member carrying it waits outside kube-scheduler's queue until
Lockstep admits its gang and lifts it."""

GangKey = NewType("GangKey", str)
"""``namespace/name`` of a gang."""


def gang_key(namespace: str, name: str) -> GangKey:
    return GangKey(f"{namespace}/{name}")
