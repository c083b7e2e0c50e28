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

from ..podgroup import (
    DEFAULT_MAX_GANG_SIZE,
    MAX_NAME_CHARS,
    MAX_PARTS,
    GangKey,
    GangSpec,
    InvalidGang,
    MissingPodGroup,
    Source,
    int_field,
    shown,
)
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
from ..topology.eligibility import match_expression
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
    SubGroupPolicy,
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
    policy = _subgroup_policy(spec.get("subGroupPolicy") if isinstance(spec, Mapping)
                              else None, rec.key)
    if isinstance(policy, InvalidGang):
        return replace(rec, queue=queue or DEFAULT_QUEUE, priority_class=name or None,
                       error=rec.error or policy)
    return replace(rec, queue=queue or DEFAULT_QUEUE, priority_class=name or None,
                   subgroups=policy)


POLICY_FIELD = "PodGroup (scheduling.volcano.sh).spec.subGroupPolicy"
MAX_SELECTOR_ITEMS = 32
"""Labels, expressions and label keys of a subgroup policy read (each bounded)."""
MAX_LABEL_CHARS = 317


def _subgroup_policy(raw: object, key: GangKey) -> SubGroupPolicy | InvalidGang | None:
    """Volcano 1.14's ``spec.subGroupPolicy`` (``volcano-sh/apis``
    ``pkg/apis/scheduling/v1beta1/types.go``: ``name``, ``subGroupSize``,
    ``minSubGroups``, ``labelSelector``, ``matchLabelKeys``, ``networkTopology``). Lockstep
    honours one entry: several would each ask their own minimum of subgroups of one gang."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], Mapping):
        return InvalidGang(key, POLICY_FIELD, shown(raw),
                           "Lockstep honours exactly one subgroup policy (a list of one)")
    item = raw[0]
    fld = f"{POLICY_FIELD}[0]"
    name = item.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        return InvalidGang(key, f"{fld}.name", shown(name),
                           f"not a name (1 to {MAX_NAME_CHARS} characters)")
    size = int_field(item.get("subGroupSize"), f"{fld}.subGroupSize", key,
                     limit=DEFAULT_MAX_GANG_SIZE, limit_name="--max-gang-size's default")
    if isinstance(size, InvalidGang):
        return size
    raw_min = item.get("minSubGroups")
    min_groups = 0
    if raw_min not in (None, 0):
        got = int_field(raw_min, f"{fld}.minSubGroups", key, limit=MAX_PARTS,
                        limit_name="Lockstep's subgroups of a gang")
        if isinstance(got, InvalidGang):
            return got
        min_groups = got
    sel = item.get("labelSelector") or {}
    labels = sel.get("matchLabels") or {} if isinstance(sel, Mapping) else None
    exprs = sel.get("matchExpressions") or [] if isinstance(sel, Mapping) else None
    keys = item.get("matchLabelKeys") or []
    if not isinstance(labels, Mapping) or not isinstance(exprs, list) \
            or not isinstance(keys, list) \
            or len(labels) + len(exprs) + len(keys) > MAX_SELECTOR_ITEMS \
            or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_LABEL_CHARS
                       and len(v) <= MAX_LABEL_CHARS for k, v in labels.items()) \
            or not all(isinstance(e, Mapping) for e in exprs) \
            or not all(isinstance(k, str) and len(k) <= MAX_LABEL_CHARS for k in keys):
        return InvalidGang(key, f"{fld}.labelSelector", shown(sel),
                           f"not a label selector and label keys Lockstep reads (at most "
                           f"{MAX_SELECTOR_ITEMS} items, strings)")
    tier: str | None = None
    topo = item.get("networkTopology")
    if isinstance(topo, Mapping) and (topo.get("mode") or "hard") == "hard":
        if topo.get("highestTierAllowed") is not None:
            return InvalidGang(key, f"{fld}.networkTopology.highestTierAllowed",
                               shown(topo["highestTierAllowed"]),
                               "a HyperNode tier by number; name a Lockstep level in "
                               "highestTierName instead")
        raw_tier = topo.get("highestTierName")
        if raw_tier is not None:
            if not isinstance(raw_tier, str) or len(raw_tier) > MAX_LABEL_CHARS:
                return InvalidGang(key, f"{fld}.networkTopology.highestTierName",
                                   shown(raw_tier), "not a level name")
            tier = raw_tier or None
    return SubGroupPolicy(name, size, min_groups, tuple(sorted(labels.items())),
                          tuple(exprs), tuple(keys), tier)


def _refine(spec: GangSpec, pod: PodRecord, sources: frozenset[Source], objects: Objects
            ) -> GangSpec | InvalidGang:
    """A Volcano gang whose PodGroup has a subgroup policy is a group of groups: the pod's
    subgroup is named by the policy and the values of its ``matchLabelKeys``; it holds
    ``subGroupSize`` pods; ``minSubGroups`` of them are admitted together (when 0, as many
    whole subgroups as ``minMember`` pods fill). The subgroups are those the pods show
    (an open group): Volcano lists none in advance."""
    if Source.VOLCANO not in sources:
        return spec
    vpg = objects.get(Source.VOLCANO, {}).get(spec.key)
    policy = vpg.subgroups if vpg is not None else None
    if policy is None:
        return spec
    fld = f"{POLICY_FIELD}[0].labelSelector"
    if not all(pod.labels.get(k) == v for k, v in policy.match_labels) \
            or not all(match_expression(e, pod.labels) for e in policy.match_expressions):
        return InvalidGang(spec.key, fld, policy.name,
                           f"pod {pod.key} matches no subgroup: Lockstep needs every member "
                           "of a PodGroup with a subgroup policy in a subgroup")
    values = ",".join(pod.labels.get(k, "") for k in policy.match_label_keys)
    part = GangKey(f"{spec.key}/{policy.name}[{values}]")
    need = policy.min_groups or max(1, -(-spec.min_member // policy.size))
    return replace(spec, min_member=policy.size, part=part, min_parts=need,
                   part_topology=policy.tier)


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
    refine=_refine,
    watches=WATCHES,
    status=StatusWrite(API.group, status_patches),
)
