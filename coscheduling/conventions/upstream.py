"""The upstream gang API (``scheduling.k8s.io`` Workload / PodGroup), read as Lockstep gangs.

Kubernetes grew its own gang API behind the ``GenericWorkload`` feature gate (off by default
in every release so far). Controllers (Job, JobSet, LWS, Kueue, Trainer) are adopting it, so a
cluster that creates these objects should get Lockstep's all-or-nothing semantics from them
on a kube-scheduler whose native gang plugin is off. The shapes, read from each release's
``k8s.io/api`` (not from memory), differ by version:

==========  =====================================================  ===========================
served as   pod -> group                                           gang size / topology
==========  =====================================================  ===========================
v1alpha1    ``spec.workloadRef`` {name, podGroup,                  Workload ``spec.podGroups[]
(1.35)      podGroupReplicaKey} -> a Workload                      .policy.gang.minCount``; no
                                                                   topology field
v1alpha2    ``spec.schedulingGroup.podGroupName`` -> a PodGroup    PodGroup ``spec.
(1.36)      (``spec.workloadRef`` is gone from pods)               schedulingPolicy.gang.
                                                                   minCount``,
                                                                   ``spec.schedulingConstraints
                                                                   .topology[].key``
v1alpha3,   same                                                   same
v1beta1
(1.37)
==========  =====================================================  ===========================

From 1.36 on, a PodGroup carries its own copy of the policy (controllers copy it from the
Workload's ``podGroupTemplates``), so Lockstep needs Workloads only for 1.35's pods. A
``basic`` policy means "no gang": the pod is an ordinary pod as far as this API goes.

The scheduler's verdict goes into the PodGroup's status as one condition, whose type depends
on the version: ``PodGroupScheduled`` (v1alpha2) or ``PodGroupInitiallyScheduled`` (v1alpha3,
v1beta1), with the native plugin's reasons (``Scheduled``, ``Unschedulable``,
``SchedulerError``). ``PodGroupInitiallyScheduled`` is terminal once True, and the native
plugin never turns a True condition back to False; Lockstep does the same. A condition some
other field manager wrote (the native gang plugin, when its gate is on) is left alone: two
schedulers must not argue in one PodGroup's status.

Topology constraints map onto Lockstep's levels by label key (``level_by_name``: the zone,
block, rack, clique and hostname labels Lockstep reads, or the level names). A key Lockstep
has no level for is a ``GangInvalid`` naming the field, never a silently dropped constraint.
Not honoured (rejected the same way): composite pod groups (``parentCompositePodGroupName``,
1.37 alpha), and more than one topology constraint (the API allows one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..podgroup import (
    MAX_NAME_CHARS,
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    Membership,
    MissingPodGroup,
    Source,
    gang_key,
    int_field,
    shown,
)
from ..reasons import (
    BackingOff,
    DoesNotFit,
    GangReason,
    InvalidDeclaration,
    NotEnoughMinResources,
    PlannedNodeLost,
    TimedOut,
)
from ..records import PodRecord
from ..topology.domains import Level, level_by_name
from .base import (
    FIELD_MANAGER,
    Convention,
    Render,
    StatusModel,
    StatusPatch,
    StatusWrite,
    Watch,
)
from .composite import COMPOSITE_VERSIONS, compose, composite_from_json, priority_fields
from .upstream_objects import (
    Condition,
    GroupPolicy,
    Priority,
    UpstreamComposite,
    UpstreamPodGroup,
    UpstreamWorkload,
)

__all__ = [
    "CONDITION_TYPES",
    "CONVENTION",
    "GROUP",
    "PODGROUP_VERSIONS",
    "SCHEDULING_GROUP_FIELD",
    "WATCHES",
    "WORKLOAD_REF_FIELD",
    "WORKLOAD_VERSIONS",
    "Condition",
    "ConditionUpdate",
    "GangProgress",
    "GroupPolicy",
    "Priority",
    "UpstreamComposite",
    "UpstreamPodGroup",
    "UpstreamWorkload",
    "combine",
    "condition_updates",
    "resolve_upstream",
    "status_patches",
    "upstream_podgroup_from_json",
    "upstream_workload_from_json",
    "workload_gang_key",
]

GROUP = "scheduling.k8s.io"
MAX_LABEL_KEY_CHARS = 317
"""A label key: a 253-character prefix, a slash and a 63-character name."""
MAX_WORKLOAD_GROUPS = 64
"""The most pod groups of a Workload read (the API allows far fewer)."""
PODGROUP_VERSIONS = ("v1beta1", "v1alpha3", "v1alpha2")
"""Versions serving standalone PodGroups, most preferred first (one is watched)."""
WORKLOAD_VERSIONS = ("v1alpha1",)
"""Versions whose Workload is what pods point at (1.35). Later Workloads only hold the
templates controllers copy into PodGroups, so Lockstep does not need them."""
CONDITION_TYPES = {
    "v1alpha2": "PodGroupScheduled",
    "v1alpha3": "PodGroupInitiallyScheduled",
    "v1beta1": "PodGroupInitiallyScheduled",
}
"""The PodGroup condition the native gang plugin writes, by served version."""
SCHEDULING_GROUP_FIELD = "spec.schedulingGroup.podGroupName"
WORKLOAD_REF_FIELD = "spec.workloadRef"


def workload_gang_key(namespace: str, ref: tuple[str, str, str]) -> GangKey:
    """The gang of a 1.35 pod's ``workloadRef``: one per Workload pod group and replica key
    (the policy applies to each replica separately). ``/`` cannot occur in the names, so the
    key never collides with a PodGroup's."""
    workload, group, replica = ref
    return gang_key(namespace, f"{workload}/{group}" + (f"/{replica}" if replica else ""))


# ---------------------------------------------------------------------------- parsing


def _key(obj: Mapping[str, Any]) -> GangKey:
    meta = obj.get("metadata") or {}
    return gang_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))


def _policy(policy: object, constraints: object, where: str, key: GangKey
            ) -> GroupPolicy | InvalidGang:
    """``{basic: {}}`` or ``{gang: {minCount: N}}``, exactly one (the API's union), plus at
    most one topology constraint."""
    if not isinstance(policy, Mapping):
        return InvalidGang(key, where, "", "missing: exactly one of basic or gang")
    basic, gang = policy.get("basic"), policy.get("gang")
    if basic is not None and gang is not None:
        return InvalidGang(key, where, "basic and gang", "exactly one of basic or gang")
    topology: str | None = None
    cwhere = where.rsplit(".", 1)[0] + ".schedulingConstraints.topology"
    if isinstance(constraints, Mapping) and constraints.get("topology"):
        items = constraints["topology"]
        if not isinstance(items, list) or len(items) != 1:
            return InvalidGang(key, cwhere, shown(items),
                               "Lockstep honours exactly one topology constraint")
        raw = items[0].get("key") if isinstance(items[0], Mapping) else None
        if not isinstance(raw, str) or not raw:
            return InvalidGang(key, f"{cwhere}[0].key", shown(raw), "missing")
        if len(raw) > MAX_LABEL_KEY_CHARS:
            return InvalidGang(key, f"{cwhere}[0].key", shown(raw),
                               f"is {len(raw)} characters long, above the limit of "
                               f"{MAX_LABEL_KEY_CHARS} (a label key's)")
        topology = raw
    if gang is None:
        if basic is None:
            return InvalidGang(key, where, "", "missing: exactly one of basic or gang")
        return GroupPolicy(None, topology, where)
    raw_min = gang.get("minCount") if isinstance(gang, Mapping) else None
    fld = f"{where}.gang.minCount"
    if raw_min is None:
        return InvalidGang(key, fld, "", "missing")
    if not isinstance(raw_min, int):  # text is not a number here: the API's type is int32
        return InvalidGang(key, fld, shown(raw_min), "not a whole number")
    count = int_field(raw_min, fld, key)
    if isinstance(count, InvalidGang):
        return count
    return GroupPolicy(count, topology, where)


def _condition(obj: Mapping[str, Any], ctype: str) -> Condition | None:
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conds if isinstance(conds, list) else ():
        if isinstance(c, Mapping) and c.get("type") == ctype:
            return Condition(ctype, str(c.get("status") or ""), str(c.get("reason") or ""),
                             str(c.get("message") or ""), str(c.get("lastTransitionTime") or ""))
    return None


def _condition_managers(obj: Mapping[str, Any], ctype: str) -> tuple[str, ...]:
    """Who wrote the condition, from server-side field tracking: the entry of each manager
    that owns ``f:status.f:conditions.k:{"type":"<ctype>"}``."""
    want = f'k:{{"type":"{ctype}"}}'
    out = []
    for mf in (obj.get("metadata") or {}).get("managedFields") or ():
        if not isinstance(mf, Mapping):
            continue
        fields = mf.get("fieldsV1")
        conds = (((fields or {}).get("f:status") or {}).get("f:conditions") or {}) \
            if isinstance(fields, Mapping) else {}
        if isinstance(conds, Mapping) and want in conds:
            out.append(str(mf.get("manager") or ""))
    return tuple(sorted(set(out)))


def upstream_podgroup_from_json(obj: Mapping[str, Any], version: str) -> UpstreamPodGroup:
    """A PodGroup as served at ``version``: the policy and constraints sit in ``spec`` at
    every version that has standalone PodGroups."""
    key = _key(obj)
    spec = obj.get("spec") or {}
    kind = f"PodGroup ({GROUP}/{version})"
    ctype = CONDITION_TYPES.get(version, "")
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    condition = _condition(obj, ctype) if ctype else None
    managers = _condition_managers(obj, ctype) if ctype else ()
    gen = generation if isinstance(generation, int) else 0

    def made(result: GroupPolicy | InvalidGang, prio: Priority | None = None
             ) -> UpstreamPodGroup:
        if isinstance(result, InvalidGang):
            return UpstreamPodGroup(key, version, None, result, condition, managers, gen)
        return UpstreamPodGroup(key, version, result, None, condition, managers, gen, prio)

    if not isinstance(spec, Mapping):
        return made(InvalidGang(key, f"{kind}.spec", "", "missing"))
    parent = spec.get("parentCompositePodGroupName")
    if parent is not None and (not isinstance(parent, str) or not parent
                               or len(parent) > MAX_NAME_CHARS):
        return made(InvalidGang(key, f"{kind}.spec.parentCompositePodGroupName",
                                shown(parent), f"not an object name (a string of 1 to "
                                f"{MAX_NAME_CHARS} characters)"))
    prio = priority_fields(spec, f"{kind}.spec", key)
    if isinstance(prio, InvalidGang):
        return made(prio)
    out = made(_policy(spec.get("schedulingPolicy"), spec.get("schedulingConstraints"),
                       f"{kind}.spec.schedulingPolicy", key), prio)
    return replace(out, parent=parent) if parent else out


def upstream_workload_from_json(obj: Mapping[str, Any], version: str) -> UpstreamWorkload:
    """A 1.35 (v1alpha1) Workload: ``spec.podGroups[]`` with ``name`` and ``policy``."""
    key = _key(obj)
    spec = obj.get("spec") or {}
    groups: dict[str, GroupPolicy | InvalidGang] = {}
    items = spec.get("podGroups") if isinstance(spec, Mapping) else None
    for item in items[:MAX_WORKLOAD_GROUPS] if isinstance(items, list) else ():
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) \
                or not item["name"] or len(item["name"]) > MAX_NAME_CHARS:
            continue
        name = item["name"]
        where = f"Workload ({GROUP}/{version}).spec.podGroups[name={name}].policy"
        groups[name] = _policy(item.get("policy"), None, where, key)
    return UpstreamWorkload(key, version, groups)


# ---------------------------------------------------------------------------- resolving


def resolve_upstream(
    pod: PodRecord,
    podgroups: Mapping[GangKey, UpstreamPodGroup],
    workloads: Mapping[GangKey, UpstreamWorkload],
    defaults: GangDefaults,
    levels: Sequence[Level],
    composites: Mapping[GangKey, UpstreamComposite] | None = None,
    children: Mapping[GangKey, Collection[GangKey]] | None = None,
) -> GangSpec | InvalidGang | MissingPodGroup | None:
    """The gang the pod's upstream reference declares; None for none (or a basic policy).
    A PodGroup naming a parent ``CompositePodGroup`` (``composites``, with each one's
    ``children``) is a subgroup of the composite's group (``conventions.composite``).

    The upstream API has no timeout: the gang gets Lockstep's default (a pod that also says
    ``lockstep.dev/pod-group`` with the same name may set one, see :func:`combine`)."""
    spec = _resolve_own(pod, podgroups, workloads, defaults, levels)
    pg = podgroups.get(gang_key(pod.namespace, pod.scheduling_group)) \
        if pod.scheduling_group is not None else None
    if pg is None or pg.parent is None or pg.error is not None \
            or isinstance(spec, InvalidGang | MissingPodGroup):
        return spec
    return compose(spec, pg.key, pg.parent, composites or {}, children or {}, levels)


def _resolve_own(
    pod: PodRecord,
    podgroups: Mapping[GangKey, UpstreamPodGroup],
    workloads: Mapping[GangKey, UpstreamWorkload],
    defaults: GangDefaults,
    levels: Sequence[Level],
) -> GangSpec | InvalidGang | MissingPodGroup | None:
    """The gang of the pod's own PodGroup or Workload pod group."""
    if pod.scheduling_group is not None:
        key = gang_key(pod.namespace, pod.scheduling_group)
        pg = podgroups.get(key)
        if pg is None:
            return MissingPodGroup(key, GROUP)
        if pg.error is not None:
            return pg.error
        policy: GroupPolicy | InvalidGang | None = pg.policy
        prio = pg.priority or Priority()
    elif pod.workload_ref is not None:
        prio = Priority()
        key = workload_gang_key(pod.namespace, pod.workload_ref)
        wl = workloads.get(gang_key(pod.namespace, pod.workload_ref[0]))
        if wl is None:
            return MissingPodGroup(key, f"{GROUP} Workload {pod.workload_ref[0]}")
        policy = wl.groups.get(pod.workload_ref[1])
        if policy is None:
            have = ", ".join(sorted(wl.groups)) or "none"
            return InvalidGang(key, f"{WORKLOAD_REF_FIELD}.podGroup", pod.workload_ref[1],
                               f"Workload {pod.workload_ref[0]} has no such pod group "
                               f"(it has: {have})")
    else:
        return None
    if isinstance(policy, InvalidGang):
        return replace(policy, key=key)
    if policy is None or policy.min_count is None:
        return None  # basic: standard scheduling, no gang
    if policy.min_count > defaults.max_gang_size:
        return InvalidGang(key, f"{policy.where}.gang.minCount", str(policy.min_count),
                           f"is above the limit of {defaults.max_gang_size} (--max-gang-size)")
    topology: str | None = None
    if policy.topology_key is not None:
        level = level_by_name(levels, policy.topology_key)
        if level is None:
            known = "; ".join(f"{lv.name}: {', '.join(lv.keys)}" for lv in levels)
            where = policy.where.rsplit(".", 1)[0]
            return InvalidGang(key, f"{where}.schedulingConstraints.topology[0].key",
                               policy.topology_key,
                               f"not a topology label Lockstep has a level for ({known})")
        topology = level.name
    return GangSpec(key, policy.min_count, defaults.timeout_seconds, Source.UPSTREAM,
                    topology=topology, priority=prio.value, priority_class=prio.class_name,
                    preempt_never=prio.never)


def combine(other: Membership, upstream: Membership) -> Membership:
    """One membership from the annotation/label conventions (``other``) and the upstream
    reference: they must name the same gang and agree on its size, like any two conventions
    on one pod. The other convention's spec wins when they agree (it may carry a timeout);
    the upstream topology constraint and priority fields are kept."""
    if upstream is None:
        return other
    if other is None:
        return upstream
    if isinstance(other, InvalidGang):
        return other
    if other.key != upstream.key:
        return InvalidGang(None, "metadata", f"{other.key} and {upstream.key}",
                           "conflicting gang declarations (annotations and "
                           f"{SCHEDULING_GROUP_FIELD} or {WORKLOAD_REF_FIELD})")
    if isinstance(upstream, InvalidGang | MissingPodGroup):
        return upstream
    if isinstance(other, MissingPodGroup):
        return other
    if other.min_member != upstream.min_member:
        return InvalidGang(other.key, "spec.schedulingPolicy.gang.minCount",
                           str(upstream.min_member),
                           f"conflicts with min-member {other.min_member} declared elsewhere")
    return replace(other, topology=other.topology or upstream.topology,
                   priority=upstream.priority,
                   priority_class=upstream.priority_class or other.priority_class,
                   preempt_never=upstream.preempt_never)


# ---------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class GangProgress:
    """What the core knows of a Lockstep gang, for its PodGroup's condition."""

    bound: int
    min_member: int | None
    why: GangReason | None
    """Why it is not bound (an invalid declaration included), if it is not."""


@dataclass(frozen=True, slots=True)
class ConditionUpdate:
    """The condition Lockstep should write on an upstream PodGroup's status."""

    key: GangKey
    version: str
    type: str
    scheduled: bool
    reason: str
    why: GangReason | None
    """Rendered into the message by the app; None when ``detail`` says it all."""
    detail: str
    generation: int


_UNSCHEDULABLE = (DoesNotFit, NotEnoughMinResources, PlannedNodeLost, TimedOut, BackingOff)


def condition_updates(
    podgroups: Mapping[GangKey, UpstreamPodGroup],
    gangs: Mapping[GangKey, GangProgress],
    *,
    manager: str,
) -> list[ConditionUpdate]:
    """The conditions to write, in the native plugin's vocabulary: True ``Scheduled`` once
    minCount members are bound, False ``Unschedulable`` when the gang cannot be placed, False
    ``SchedulerError`` for a declaration Lockstep cannot honour. Only for PodGroups whose
    members are Lockstep's (``gangs``), whose condition no other ``manager`` wrote, and whose
    condition is not True already (terminal). A gang merely waiting for its members gets
    nothing: the native plugin writes nothing before it tries either."""
    out = []
    for key in sorted(podgroups):
        pg = podgroups[key]
        progress = gangs.get(key)
        ctype = CONDITION_TYPES.get(pg.version)
        if progress is None or ctype is None:
            continue
        if any(m != manager for m in pg.condition_managers):
            continue  # the native gang plugin (or someone else) owns this group's status
        if pg.condition is not None and pg.condition.status == "True":
            continue
        why = progress.why
        if pg.error is not None:
            why = InvalidDeclaration(pg.error)
        if progress.min_member and progress.bound >= progress.min_member and pg.error is None:
            upd = ConditionUpdate(key, pg.version, ctype, True, "Scheduled", None,
                                  f"{progress.bound}/{progress.min_member} members bound "
                                  "together by Lockstep", pg.generation)
        elif isinstance(why, InvalidDeclaration):
            upd = ConditionUpdate(key, pg.version, ctype, False, "SchedulerError", why, "",
                                  pg.generation)
        elif isinstance(why, _UNSCHEDULABLE):
            upd = ConditionUpdate(key, pg.version, ctype, False, "Unschedulable", why, "",
                                  pg.generation)
        else:
            continue
        out.append(upd)
    return out


WATCHES = (
    Watch("upstream-podgroups", upstream_podgroup_from_json,
          discover=(GROUP, "podgroups", PODGROUP_VERSIONS), into="upstream-podgroups"),
    Watch("upstream-workloads", upstream_workload_from_json,
          discover=(GROUP, "workloads", WORKLOAD_VERSIONS), into="upstream-workloads"),
    Watch("upstream-compositepodgroups", composite_from_json,
          discover=(GROUP, "compositepodgroups", COMPOSITE_VERSIONS),
          into="upstream-composites"),
)
"""What the adapter watches for the upstream gang API: whichever version of each the API
server serves (API discovery), or nothing (before 1.35, or the feature gate off)."""


def status_patches(model: StatusModel, render: Render, now: str) -> list[StatusPatch]:
    """The scheduling condition on upstream PodGroups whose pods are Lockstep's (rules in
    :func:`condition_updates`), from the core's status model. A strategic merge patch
    touches only that condition; the watch brings it back, and a condition already saying
    the same is not written again."""
    groups = model.upstream
    if not groups:
        return []
    gangs = {g.key: GangProgress(g.members.bound, g.min_member, g.reason)
             for g in model.gangs.values() if g.key in groups}
    # A CompositePodGroup's children: each child PodGroup's condition from its own members
    # and minimum, with the group's reason (``conventions.composite``).
    gangs.update({part.key: GangProgress(part.members.bound, part.min_member, g.reason)
                  for g in model.gangs.values() for part in g.parts if part.key in groups})
    out: list[StatusPatch] = []
    for upd in condition_updates(groups, gangs, manager=FIELD_MANAGER):
        status = "True" if upd.scheduled else "False"
        message = (upd.detail or (render(upd.why) if upd.why else ""))[:1024]
        cur = groups[upd.key].condition
        if cur is not None and (cur.status, cur.reason, cur.message) == (
                status, upd.reason, message):
            continue
        cond = {"type": upd.type, "status": status, "reason": upd.reason,
                "message": message, "observedGeneration": upd.generation,
                "lastTransitionTime": cur.last_transition
                if cur is not None and cur.status == status and cur.last_transition
                else now}
        ns, name = upd.key.split("/", 1)
        path = f"/apis/{GROUP}/{upd.version}/namespaces/{ns}/podgroups/{name}/status"
        out.append(StatusPatch(upd.key, path, {"conditions": [cond]}, strategic=True,
                               remembered=False))
    return out


CONVENTION = Convention(
    Source.UPSTREAM,
    spec_fields=(tuple(SCHEDULING_GROUP_FIELD.split(".")),
                 (*WORKLOAD_REF_FIELD.split("."), "name")),
    watches=WATCHES,
    status=StatusWrite(GROUP, status_patches),
)
"""The pod spec names the gang's object; no metadata key does. Its objects' versions are
found by discovery (:data:`PODGROUP_VERSIONS`, :data:`WORKLOAD_VERSIONS`), so the convention
has no fixed ``podgroup`` API; :func:`resolve_upstream` reads them."""
