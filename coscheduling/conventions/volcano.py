"""Volcano: a pod annotation names the gang; its size comes from Volcano's ``PodGroup`` of
that name (or from ``group-min-member`` on the pod).

Lockstep also plays Volcano's enqueue step. Volcano's own scheduler moves a PodGroup from
``Pending`` to ``Inqueue`` once its ``minResources`` fit, and controllers wait for that before
creating pods (Kubeflow's training-operator in volcano mode creates none until then). With
Lockstep in place of Volcano's scheduler nobody else would, so :func:`volcano_statuses`
decides the phase Lockstep writes, in Volcano's vocabulary (``Pending``, ``Inqueue``,
``Running``, ``Completed``) with an ``Unschedulable`` condition saying why a group stays
``Pending``. It reads only the core's status model (``base.StatusModel``): each group's
members, what each gang holds in its queue, the Queues and the free capacity.

Capacity is handed out in order: a group enqueued but not running yet keeps its
``minResources`` out of what the next one may count, so two groups are never enqueued against
the same GPUs. The queues' rules are ``volcano_queues``; the same rules gate a Volcano gang's
admission in the core (``coscheduling.gang.queue_gate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..podgroup import MAX_NAME_CHARS, GangKey, InvalidGang, MissingPodGroup, Source, shown
from ..reasons import (
    GangReason,
    InvalidDeclaration,
    NotEnoughMinResources,
    QueueFull,
    QueueNotFound,
    QueueNotOpen,
)
from ..records import PodRecord
from ..resources import Resources, fits, sub
from .base import (
    Convention,
    Found,
    Key,
    MemberCounts,
    Objects,
    PodGroupAPI,
    PodGroupRecord,
    Render,
    StatusModel,
    StatusPatch,
    StatusWrite,
    Watch,
    lookup,
)
from .scheduler_plugins import podgroup_from_json
from .volcano_queues import DEFAULT_QUEUE, demand, queue_from_json, queue_use

__all__ = [
    "API",
    "CONVENTION",
    "GROUP",
    "MIN_MEMBER",
    "SIZE_FIELD",
    "WATCHES",
    "VolcanoStatus",
    "enqueued",
    "status_patches",
    "volcano_podgroup_from_json",
    "volcano_statuses",
]

GROUP = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
MIN_MEMBER = "scheduling.volcano.sh/group-min-member"
SIZE_FIELD = "PodGroup (scheduling.volcano.sh).spec.minMember"


def volcano_podgroup_from_json(obj: Mapping[str, Any]) -> PodGroupRecord:
    """A Volcano ``PodGroup`` (``scheduling.volcano.sh/v1beta1``): ``spec.minMember`` and
    ``spec.minResources`` are what Lockstep uses, the same fields as scheduler-plugins'; it
    has no timeout field. ``spec.priorityClassName`` gives the group's priority, as
    Volcano's scheduler reads it for job order and preemption; ``spec.queue`` (``default``
    when unset) the Queue it is enqueued into."""
    rec = podgroup_from_json(obj, kind="PodGroup (scheduling.volcano.sh)")
    spec = obj.get("spec")
    queue = spec.get("queue") if isinstance(spec, Mapping) else None
    name = spec.get("priorityClassName") if isinstance(spec, Mapping) else None
    if queue is not None and (not isinstance(queue, str) or len(queue) > MAX_NAME_CHARS):
        return replace(rec, error=rec.error or InvalidGang(
            rec.key, "PodGroup (scheduling.volcano.sh).spec.queue", shown(queue),
            f"not a Queue name (a string of at most {MAX_NAME_CHARS} characters)"))
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
        return replace(rec, queue=queue or DEFAULT_QUEUE, error=rec.error or InvalidGang(
            rec.key, "PodGroup (scheduling.volcano.sh).spec.priorityClassName", shown(name),
            f"not a PriorityClass name (a string of at most {MAX_NAME_CHARS} characters)"))
    return replace(rec, queue=queue or DEFAULT_QUEUE, priority_class=name or None)


API = PodGroupAPI("scheduling.volcano.sh", "v1beta1", "podgroups", volcano_podgroup_from_json,
                  SIZE_FIELD)
QUEUES_PATH = "/apis/scheduling.volcano.sh/v1beta1/queues"
WATCHES = (Watch.of(API, "volcano-podgroups"),
           Watch("volcano-queues", lambda obj, _: queue_from_json(obj), QUEUES_PATH,
                 key_of=lambda _, name: name, into="volcano-queues"))
"""What the adapter watches for this convention: its PodGroups and its (cluster-scoped)
Queues."""


def _from_object(pod: PodRecord, key: GangKey, found: Found, objects: Objects
                 ) -> Found | InvalidGang | MissingPodGroup:
    """What Volcano's job controller (and Kubeflow's in volcano mode) writes: only the group
    name on the pod; the size lives on Volcano's own PodGroup object. A pod that carries
    ``group-min-member`` itself needs no object."""
    vpg = objects.get(Source.VOLCANO, {}).get(key)
    if lookup(pod, MIN_MEMBER) is not None:
        return found if vpg is None else replace(found, priority_class=vpg.priority_class)
    if vpg is None:
        return MissingPodGroup(key, API.group)
    if vpg.error is not None:
        return vpg.error
    if found.min_member is not None and vpg.min_member != found.min_member:
        return InvalidGang(key, SIZE_FIELD,
                           str(vpg.min_member),
                           f"conflicts with min-member {found.min_member} declared elsewhere")
    return replace(found, min_member=vpg.min_member,
                   min_resources=found.min_resources or vpg.min_resources,
                   priority_class=vpg.priority_class, size_field=SIZE_FIELD)


# ---------------------------------------------------------------------------- status (enqueue)

STARTED = ("Inqueue", "Running", "Unknown")


@dataclass(frozen=True, slots=True)
class VolcanoStatus:
    phase: str
    running: int
    succeeded: int
    failed: int
    waiting: GangReason | None = None
    """Why the group stays Pending (becomes an ``Unschedulable`` condition)."""


def enqueued(groups: Mapping[GangKey, PodGroupRecord]) -> list[tuple[GangKey, str, Resources]]:
    """(group, queue, ``minResources``) of each group whose phase says it is enqueued: it
    holds that much in its queue while its pods are on their way (Volcano's ``inqueue``)."""
    return [(k, pg.queue, pg.min_resources) for k, pg in groups.items() if pg.phase == "Inqueue"]


def volcano_statuses(model: StatusModel) -> dict[GangKey, VolcanoStatus]:
    """The status each Volcano PodGroup should show, handing out ``model.free`` (the
    cluster's capacity outside bound pods and gang reservations) in name order. With
    ``model.queues`` (Volcano's Queue CRD is served), a group is enqueued only into an open
    queue with room under its capability (:mod:`~coscheduling.conventions.volcano_queues`);
    what each gang holds there is counted in it."""
    groups = model.objects.get(Source.VOLCANO, {})
    if not groups:
        return {}
    queues = None
    if model.queues is not None:
        allocated = ((g.key, g.queue, g.allocated) for g in model.gangs.values()
                     if g.queue is not None)
        queues = queue_use(model.queues, allocated, enqueued(groups))
    budget = dict(model.free)
    out: dict[GangKey, VolcanoStatus] = {}
    pending: list[GangKey] = []
    for key in sorted(groups):
        pg = groups[key]
        gang = model.gangs.get(key)
        m = gang.members if gang is not None else MemberCounts()
        running, succeeded, failed = m.running, m.succeeded, m.failed
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
            if m.placed == 0:
                budget = sub(budget, pg.min_resources)
            out[key] = VolcanoStatus("Inqueue" if pg.phase == "Inqueue" else pg.phase,
                                     running, succeeded, failed)
        else:
            pending.append(key)
            out[key] = VolcanoStatus("Pending", running, succeeded, failed)
    for key in pending:
        pg = groups[key]
        st = out[key]
        want: Resources = {}
        if queues is not None:
            gang = model.gangs.get(key)
            want = demand(pg.min_resources, pg.min_member or 1,
                          gang.requests if gang is not None else ())
            if (held_back := queues.check(key, pg.queue, want)) is not None:
                out[key] = VolcanoStatus("Pending", st.running, st.succeeded, st.failed,
                                         held_back)
                continue
        if fits(pg.min_resources, budget):
            budget = sub(budget, pg.min_resources)
            if queues is not None:
                queues.take(key, pg.queue, want)
            out[key] = VolcanoStatus("Inqueue", st.running, st.succeeded, st.failed)
        else:
            shown = {k: max(0, v) for k, v in budget.items()}
            out[key] = VolcanoStatus("Pending", st.running, st.succeeded, st.failed,
                                     NotEnoughMinResources(key, pg.min_resources, shown))
    return out


def status_patches(model: StatusModel, render: Render, now: str) -> list[StatusPatch]:
    """The status each Volcano PodGroup should show: its phase (Lockstep plays Volcano's
    enqueue step) and counts, and why it waits as an ``Unschedulable`` condition."""
    out: list[StatusPatch] = []
    for key, st in volcano_statuses(model).items():
        status: dict[str, Any] = {"phase": st.phase, "running": st.running,
                                  "succeeded": st.succeeded, "failed": st.failed}
        if st.waiting is not None:
            status["conditions"] = [{
                "type": "Unschedulable", "status": "True", "reason": _reason(st.waiting),
                "message": render(st.waiting)[:1024], "lastTransitionTime": now}]
        elif st.phase != "Pending":
            status["conditions"] = []
        out.append(StatusPatch(key, API.status_path(*key.split("/", 1)), status))
    return out


def _reason(why: GangReason) -> str:
    """The Unschedulable condition's reason: a Volcano queue that holds the group back is
    named for what the queue says, anything else is short of resources."""
    if isinstance(why, QueueFull | QueueNotFound | QueueNotOpen):
        return type(why).__name__
    return "NotEnoughResources"


CONVENTION = Convention(
    Source.VOLCANO,
    declares=tuple(Key(k, "annotation") for k in GROUP),
    size=((Key(MIN_MEMBER, "either"), None),),
    podgroup=API,
    from_object=_from_object,
    watches=WATCHES,
    status=StatusWrite(API.group, status_patches),
)
