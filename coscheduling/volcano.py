"""Volcano's enqueue step, played by Lockstep: when a Volcano PodGroup may start.

Volcano's own scheduler moves a PodGroup from ``Pending`` to ``Inqueue`` once its
``minResources`` fit, and controllers wait for that before creating pods (Kubeflow's
training-operator in volcano mode creates none until then). With Lockstep in place of
Volcano's scheduler nobody else would, so these rules decide the phase Lockstep writes, in
Volcano's vocabulary (``Pending``, ``Inqueue``, ``Running``, ``Completed``) with an
``Unschedulable`` condition saying why a group stays ``Pending``.

Capacity is handed out in order: a group enqueued but not running yet keeps its
``minResources`` out of what the next one may count, so two groups are never enqueued against
the same GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .podgroup import GangKey, PodGroupRecord
from .reasons import GangReason, InvalidDeclaration, NotEnoughMinResources
from .records import PodRecord
from .resources import Resources, fits, sub

__all__ = ["VolcanoStatus", "volcano_statuses"]

STARTED = ("Inqueue", "Running", "Unknown")


@dataclass(frozen=True, slots=True)
class VolcanoStatus:
    phase: str
    running: int
    succeeded: int
    failed: int
    waiting: GangReason | None = None
    """Why the group stays Pending (becomes an ``Unschedulable`` condition)."""


def volcano_statuses(
    groups: Mapping[GangKey, PodGroupRecord],
    members_of: Callable[[GangKey], Sequence[PodRecord]],
    free: Resources,
) -> dict[GangKey, VolcanoStatus]:
    """The status each Volcano PodGroup should show; ``free`` is the cluster's capacity
    outside bound pods and gang reservations."""
    budget = dict(free)
    out: dict[GangKey, VolcanoStatus] = {}
    pending: list[GangKey] = []
    for key in sorted(groups):
        pg = groups[key]
        pods = members_of(key)
        running = sum(1 for p in pods if p.phase == "Running")
        succeeded = sum(1 for p in pods if p.phase == "Succeeded")
        failed = sum(1 for p in pods if p.phase == "Failed")
        need = pg.min_member or 1
        if pg.error is not None:
            out[key] = VolcanoStatus(pg.phase or "Pending", running, succeeded, failed,
                                     InvalidDeclaration(pg.error))
        elif succeeded >= need:
            out[key] = VolcanoStatus("Completed", running, succeeded, failed)
        elif running >= need:
            out[key] = VolcanoStatus("Running", running, succeeded, failed)
        elif pg.phase in STARTED:
            # Enqueued and not running yet: its pods will need this capacity.
            bound = sum(1 for p in pods if p.node_name is not None and not p.terminal)
            if bound == 0:
                budget = sub(budget, pg.min_resources)
            out[key] = VolcanoStatus("Inqueue" if pg.phase == "Inqueue" else pg.phase,
                                     running, succeeded, failed)
        else:
            pending.append(key)
            out[key] = VolcanoStatus("Pending", running, succeeded, failed)
    for key in pending:
        pg = groups[key]
        st = out[key]
        if fits(pg.min_resources, budget):
            budget = sub(budget, pg.min_resources)
            out[key] = VolcanoStatus("Inqueue", st.running, st.succeeded, st.failed)
        else:
            shown = {k: max(0, v) for k, v in budget.items()}
            out[key] = VolcanoStatus("Pending", st.running, st.succeeded, st.failed,
                                     NotEnoughMinResources(key, pg.min_resources, shown))
    return out
