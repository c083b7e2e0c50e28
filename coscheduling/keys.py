"""Names Lockstep writes into the cluster and reads back: a leaf module, so every other module
(the pod record, the webhook's decision, the lift) can name them without importing behaviour."""

from __future__ import annotations

__all__ = ["GANG_GATE"]

GANG_GATE = "lockstep.dev/gang"
"""Lockstep's scheduling gate: a member carrying it waits outside kube-scheduler's queue until
Lockstep admits its gang and lifts it."""
