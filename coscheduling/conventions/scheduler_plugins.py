"""scheduler-plugins Coscheduling: a pod label names a ``PodGroup`` object, which gives the
size (``spec.minMember``), ``minResources`` and the timeout (``scheduleTimeoutSeconds``).

Lockstep writes the PodGroup's status as scheduler-plugins would (``status.phase`` and the
counts, plus a ``GangPartiallyBound`` condition when a binding failed for good after siblings
bound): the rules are :func:`podgroup_status`, decided once here; the app only writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..podgroup import (
    MAX_NAME_CHARS,
    GangKey,
    GangSpec,
    InvalidGang,
    MissingPodGroup,
    Source,
    gang_key,
    int_field,
    seconds_field,
    shown,
)
from ..reasons import PartiallyBound
from ..records import PodRecord
from ..resources import QuantityError, resource_list
from . import koordinator
from .base import Convention, Found, Key, Objects, PodGroupAPI, PodGroupRecord, Watch

__all__ = [
    "API",
    "CONVENTION",
    "GROUP_LABEL",
    "SIZE_FIELD",
    "WATCHES",
    "PodGroupStatus",
    "podgroup_from_json",
    "podgroup_status",
]

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
SIZE_FIELD = "PodGroup.spec.minMember"


def podgroup_from_json(obj: Mapping[str, Any], kind: str = "PodGroup") -> PodGroupRecord:
    """A PodGroup as served; a bad field becomes the record's ``error`` (naming it), which
    every member's declaration then reports."""
    meta = _mapping(obj.get("metadata"))
    key = gang_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    raw_spec = obj.get("spec")
    spec = _mapping(raw_spec)
    min_member: int | None = None
    timeout: float | None = None
    error: InvalidGang | None = None
    if raw_spec is not None and not isinstance(raw_spec, Mapping):
        error = InvalidGang(key, f"{kind}.spec", shown(raw_spec), "not an object")
    mm = int_field(spec.get("minMember", 1), f"{kind}.spec.minMember", key)
    if isinstance(mm, InvalidGang):
        error = error or mm
    else:
        min_member = mm
    if spec.get("scheduleTimeoutSeconds") is not None:
        t = seconds_field(
            spec["scheduleTimeoutSeconds"], f"{kind}.spec.scheduleTimeoutSeconds", key
        )
        if isinstance(t, InvalidGang):
            error = error or t
        else:
            timeout = t
    try:
        min_resources = resource_list(spec.get("minResources"))
    except QuantityError as e:
        min_resources = {}
        error = error or InvalidGang(key, f"{kind}.spec.minResources", shown(e.value),
                                     e.reason)
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    phase = phase[:MAX_NAME_CHARS] if isinstance(phase, str) else ""
    raw_ann = meta.get("annotations")
    # Only Koordinator's options are kept: they are all the resolver reads from a PodGroup's
    # annotations (its gang declared the CRD way).
    annotations = ({str(k): str(v) for k, v in raw_ann.items() if str(k) in koordinator.OPTIONS}
                   if isinstance(raw_ann, Mapping) else {})
    return PodGroupRecord(key, min_member, timeout, min_resources, error, phase, annotations)


def _mapping(raw: object) -> Mapping[str, Any]:
    """A field that should be an object: anything else reads as empty (a CRD without a
    schema lets a user write a string or a list there)."""
    return raw if isinstance(raw, Mapping) else {}


API = PodGroupAPI("scheduling.x-k8s.io", "v1alpha1", "podgroups", podgroup_from_json)
WATCHES = (Watch.of(API, "podgroups"),)
"""What the adapter watches for this convention."""


def _from_object(pod: PodRecord, key: GangKey, found: Found, objects: Objects
                 ) -> Found | InvalidGang | MissingPodGroup:
    """The PodGroup decides the size, timeout and minResources, and the gang is reported as
    scheduler-plugins' whatever else the pod says."""
    pg = objects.get(Source.SCHEDULER_PLUGINS, {}).get(key)
    if pg is None:
        return MissingPodGroup(key, API.group)
    if pg.error is not None:
        return pg.error
    return Found(Source.SCHEDULER_PLUGINS, pg.min_member, pg.timeout_seconds, pg.min_resources,
                 size_field=SIZE_FIELD)


CONVENTION = Convention(Source.SCHEDULER_PLUGINS, declares=(Key(GROUP_LABEL, "label"),),
                        podgroup=API, from_object=_from_object)


# ---------------------------------------------------------------------------- status


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
