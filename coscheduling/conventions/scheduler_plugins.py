"""scheduler-plugins Coscheduling: a pod label names a ``PodGroup`` object, which gives the
size (``spec.minMember``), ``minResources`` and the timeout (``scheduleTimeoutSeconds``).

Lockstep writes the PodGroup's status as scheduler-plugins would (``status.phase`` and the
counts, plus a ``GangPartiallyBound`` condition when a binding failed for good after siblings
bound): the rules are :func:`podgroup_status`, decided once here over the core's status
model (``base.StatusModel``), and the status object is built by :func:`status_patches` (the
convention's :class:`~.base.StatusWrite`); the app only sends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..podgroup import (
    MAX_NAME_CHARS,
    GangKey,
    InvalidGang,
    MissingPodGroup,
    Source,
    gang_key,
    int_field,
    seconds_field,
    shown,
)
from ..reasons import InvalidDeclaration, PartiallyBound
from ..records import PodRecord
from ..resources import QuantityError, resource_list
from . import koordinator
from .base import (
    Convention,
    Found,
    GangStatusModel,
    Key,
    Objects,
    PodGroupAPI,
    PodGroupRecord,
    Render,
    StatusModel,
    StatusPatch,
    StatusWrite,
    Watch,
)

__all__ = [
    "API",
    "CONVENTION",
    "GROUP_LABEL",
    "SIZE_FIELD",
    "WATCHES",
    "PodGroupStatus",
    "podgroup_from_json",
    "podgroup_status",
    "podgroup_statuses",
    "status_patches",
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


API = PodGroupAPI("scheduling.x-k8s.io", "v1alpha1", "podgroups", podgroup_from_json,
                  SIZE_FIELD)
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




# ---------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class PodGroupStatus:
    phase: str
    scheduled: int
    running: int
    succeeded: int
    failed: int
    partial: PartiallyBound | None = None


def podgroup_status(g: GangStatusModel) -> PodGroupStatus:
    """scheduler-plugins' phases: Pending, Scheduling, Running, Finished, Failed (the gang
    is being scheduled while it holds a reservation or parked binds, ``holding``)."""
    m, need = g.members, g.min_member or 1
    if m.succeeded >= need:
        phase = "Finished"
    elif m.running >= need:
        phase = "Running"
    elif m.failed and m.failed > m.total - need:
        phase = "Failed"
    elif g.holding or m.scheduled or m.failed:
        phase = "Scheduling"
    else:
        phase = "Pending"
    return PodGroupStatus(phase, m.scheduled, m.running, m.succeeded, m.failed, g.partial)


def podgroup_statuses(model: StatusModel) -> dict[GangKey, PodGroupStatus]:
    """Every scheduler-plugins PodGroup's status; a Koordinator gang group declared the CRD
    way reports on each of its PodGroups with that gang's own members and minimum, and a
    PodGroup read by subgroups (Trainer v2's, by its JobSet's stages) on the whole."""
    objects = model.objects.get(Source.SCHEDULER_PLUGINS, {})
    out: dict[GangKey, PodGroupStatus] = {}
    for g in model.gangs.values():
        if g.source is not Source.SCHEDULER_PLUGINS:
            continue
        if not g.parts or g.key in objects:
            out[g.key] = podgroup_status(g)
        for part in g.parts:
            if part.key in objects:
                out[part.key] = podgroup_status(part)
    return out


def status_patches(model: StatusModel, render: Render, now: str) -> list[StatusPatch]:
    """The status each scheduler-plugins PodGroup should show: the core's phases and counts,
    and for a group Lockstep cannot honour (a field out of range, say) phase ``Pending`` with
    a ``GangInvalid`` condition naming the field and its limit."""
    out: dict[GangKey, dict[str, Any]] = {}
    for key, st in podgroup_statuses(model).items():
        status: dict[str, Any] = {
            "phase": st.phase, "scheduled": st.scheduled, "running": st.running,
            "succeeded": st.succeeded, "failed": st.failed}
        if st.partial is not None:
            status["conditions"] = [{
                "type": "GangPartiallyBound", "status": "True",
                "reason": "BindingFailed", "message": render(st.partial)[:1024],
                "lastTransitionTime": now,
            }]
        out[key] = status
    for key, pg in model.objects.get(Source.SCHEDULER_PLUGINS, {}).items():
        if pg.error is not None and key not in out:
            out[key] = {"phase": "Pending", "conditions": [{
                "type": "GangInvalid", "status": "True", "reason": "InvalidDeclaration",
                "message": render(InvalidDeclaration(pg.error))[:1024],
                "lastTransitionTime": now}]}
    return [StatusPatch(key, API.status_path(*key.split("/", 1)), status)
            for key, status in out.items()]


CONVENTION = Convention(Source.SCHEDULER_PLUGINS, declares=(Key(GROUP_LABEL, "label"),),
                        podgroup=API, from_object=_from_object, watches=WATCHES,
                        status=StatusWrite(API.group, status_patches))
