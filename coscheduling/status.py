"""What a gang's PodGroup object should say, decided once in the core.

The app only writes what this returns, in the vocabulary of the PodGroup's API
(scheduler-plugins' ``status.phase`` and counts, plus a ``GangPartiallyBound`` condition when
a binding failed for good after siblings bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .podgroup import GangSpec
from .reasons import PartiallyBound
from .records import PodRecord

__all__ = ["PodGroupStatus", "podgroup_status"]


@dataclass(frozen=True, slots=True)
class PodGroupStatus:
    phase: str
    scheduled: int
    running: int
    succeeded: int
    failed: int
    partial: PartiallyBound | None = None


def podgroup_status(spec: GangSpec, members: Sequence[PodRecord], *, holding: bool,
                    partial: PartiallyBound | None) -> PodGroupStatus:
    """scheduler-plugins' phases: Pending, Scheduling, Running, Finished, Failed.

    ``holding``: the gang holds a reservation or parked binds (it is being scheduled).
    """
    running = sum(1 for p in members if p.phase == "Running")
    succeeded = sum(1 for p in members if p.phase == "Succeeded")
    failed = sum(1 for p in members if p.phase == "Failed")
    scheduled = sum(1 for p in members if p.node_name is not None)
    if succeeded >= spec.min_member:
        phase = "Finished"
    elif running >= spec.min_member:
        phase = "Running"
    elif failed and failed > len(members) - spec.min_member:
        phase = "Failed"
    elif holding or scheduled or failed:
        phase = "Scheduling"
    else:
        phase = "Pending"
    return PodGroupStatus(phase, scheduled, running, succeeded, failed, partial)
