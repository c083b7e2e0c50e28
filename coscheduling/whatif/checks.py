"""The checks ``admission.try_admit`` makes before it plans, for a gang whose members are not
in the store yet: its priority, its required topology level, its Volcano queue; and whether
the webhook could pin a member at creation. Each mirrors the core's function it names, over
the manifest's pods instead of the store's (the core's read the gang's members from the
store, where a what-if's pods never go).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..conventions import kueue
from ..conventions.base import PodGroupRecord, Source
from ..conventions.volcano_queues import DEFAULT_QUEUE, asks, unlimited
from ..corestate import CoreState
from ..gang.admission import TOPOLOGY_REQUIRED
from ..gang.queue_gate import queue_use
from ..podgroup import GangSpec, InvalidGang
from ..reasons import GangReason, InvalidDeclaration
from ..records import PodRecord
from ..topology.domains import Level, level_by_name

__all__ = ["gang_priority", "gated_by_another", "queue_full", "required_level"]


def gated_by_another(pod: PodRecord) -> bool:
    """Another party holds the pod back at creation, so the webhook gates it rather than
    pinning it (``creation.placer``), and it is placed once that party lets it go: a gate of
    its own in the manifest, or Kueue's admission gate, which Kueue's webhook adds to every
    pod of its pod-group integration (a pod naming a LocalQueue)."""
    return pod.other_gate or kueue.QUEUE in pod.labels or kueue.GROUP in pod.labels


def gang_priority(st: CoreState, spec: GangSpec, pods: Sequence[PodRecord]) -> int:
    """``CoreState.gang_priority`` for a gang whose members are not in the store yet."""
    if spec.priority is not None:
        return spec.priority
    if spec.priority_class is not None and (pc := st.store.priority_classes.get(
            spec.priority_class)) is not None:
        return pc.value
    return max((p.priority for p in pods), default=0)


def required_level(st: CoreState, spec: GangSpec, pods: Sequence[PodRecord]
              ) -> Level | InvalidDeclaration | None:
    """``admission.levels_for`` for members not in the store yet."""
    levels = st.settings.levels
    if spec.topology is not None and (lv := level_by_name(levels, spec.topology)):
        return lv
    for p in pods:
        if want := p.annotations.get(TOPOLOGY_REQUIRED):
            lv = level_by_name(levels, want)
            if lv is None:
                names = ", ".join(x.name for x in levels)
                return InvalidDeclaration(InvalidGang(
                    spec.key, TOPOLOGY_REQUIRED, want, f"unknown level (known: {names})"))
            return lv
    return None


def queue_full(st: CoreState, spec: GangSpec, pods: Sequence[PodRecord],
           manifest: Mapping[str, PodGroupRecord]) -> GangReason | None:
    """``queue_gate.queue_gate`` for a Volcano gang not created yet: its queue is its
    PodGroup's, the manifest's own before one the store holds."""
    if spec.source is not Source.VOLCANO or st.store.queues is None:
        return None
    pg = manifest.get(str(spec.key)) or st.store.volcano.get(spec.key)
    queue = pg.queue if pg is not None else DEFAULT_QUEUE
    if unlimited(st.store.queues, queue):
        return None
    use = queue_use(st)
    if use is None:
        return None
    return use.check(spec.key, queue, asks(spec.min_resources, spec.min_member,
                                           [p.requests for p in pods]))
