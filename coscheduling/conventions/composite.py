"""Kubernetes' ``CompositePodGroup`` (``scheduling.k8s.io/v1alpha3``, 1.37, feature gate
``CompositePodGroup``), read as a Lockstep group of groups.

A workload controller (JobSet, LWS) creates one CompositePodGroup and one PodGroup per child
group; each PodGroup names its parent in ``spec.parentCompositePodGroupName``, and pods name
their PodGroup as usual (``spec.schedulingGroup.podGroupName``). Read from
``k8s.io/api@v0.37.2/scheduling/v1alpha3/types.go``:

==============================================  ==============================================
CompositePodGroup field                         Lockstep
==============================================  ==============================================
``spec.schedulingPolicy.gang.minGroupCount``    ``GangSpec.min_parts``: that many child groups
                                                admitted together, each whole (at its own
                                                ``gang.minCount``); the rest elastic
``spec.schedulingPolicy.basic``                 no group: each child PodGroup is its own gang
``spec.schedulingConstraints.topology[0].key``  ``GangSpec.topology``: the whole set in one
                                                domain of that level
child PodGroup's own topology constraint        ``GangSpec.part_topology``: that child in one
                                                domain of its level
``spec.priority`` / ``priorityClassName`` /     the group's priority, as a PodGroup's (the
``preemptionPolicy``                            child's own when the composite names none)
``spec.parentCompositePodGroupName``            refused: one level of nesting only
``spec.disruptionMode``                         not read: a victim group is evicted whole
                                                (docs/preemption.md)
==============================================  ==============================================

The children are the PodGroups that name the composite (the store keeps them by parent),
at most :data:`MAX_CHILDREN`. A child PodGroup with a ``basic`` policy inside a gang
composite is a subgroup of minimum 1. Each child PodGroup gets its
``PodGroupInitiallyScheduled`` condition from its own members and minimum, with the group's
reason (``upstream.status_patches``); the composite's own status is not written yet.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..podgroup import (
    INT32_MAX,
    MAX_NAME_CHARS,
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    MissingPodGroup,
    Source,
    gang_key,
    int_field,
    shown,
)
from ..topology.domains import Level, level_by_name
from .upstream_objects import Priority, UpstreamComposite

__all__ = ["COMPOSITE_VERSIONS", "MAX_CHILDREN", "compose", "composite_from_json",
           "composite_key", "priority_fields"]

GROUP = "scheduling.k8s.io"
COMPOSITE_VERSIONS = ("v1alpha3",)
"""Versions serving CompositePodGroups, most preferred first (1.37 serves v1alpha3 only)."""
MAX_CHILDREN = 32
"""The most child PodGroups a composite may have (Lockstep's limit, as for Koordinator's
gang groups; every member's resolve lists them)."""
MAX_LABEL_KEY_CHARS = 317
INT32_MIN = -(2**31)


def composite_key(namespace: str, name: str) -> GangKey:
    """The gang of a composite's pods: ``:`` occurs in no object name, so it never collides
    with a PodGroup's key."""
    return gang_key(namespace, f"compositepodgroup:{name}")


def composite_from_json(obj: Mapping[str, Any], version: str) -> UpstreamComposite:
    """A CompositePodGroup as served; a bad field becomes the record's ``error`` (naming
    it), which every member's declaration then reports."""
    meta = obj.get("metadata") or {}
    key = gang_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    kind = f"CompositePodGroup ({GROUP}/{version})"
    spec = obj.get("spec")

    def bad(fld: str, raw: object, problem: str) -> UpstreamComposite:
        return UpstreamComposite(key, version, None, None,
                                 InvalidGang(key, f"{kind}.spec.{fld}", shown(raw), problem))

    if not isinstance(spec, Mapping):
        return bad("", spec, "missing")
    if spec.get("parentCompositePodGroupName") is not None:
        return bad("parentCompositePodGroupName", spec["parentCompositePodGroupName"],
                   "nested composite pod groups are not supported by Lockstep (one level)")
    policy = spec.get("schedulingPolicy")
    if not isinstance(policy, Mapping) or (policy.get("basic") is None) == (
            policy.get("gang") is None):
        return bad("schedulingPolicy", policy, "exactly one of basic or gang")
    min_groups: int | None = None
    if policy.get("gang") is not None:
        gang = policy["gang"]
        raw = gang.get("minGroupCount") if isinstance(gang, Mapping) else None
        if not isinstance(raw, int) or isinstance(raw, bool):
            return bad("schedulingPolicy.gang.minGroupCount", raw, "not a whole number")
        count = int_field(raw, f"{kind}.spec.schedulingPolicy.gang.minGroupCount", key,
                          limit=MAX_CHILDREN, limit_name="Lockstep's child groups")
        if isinstance(count, InvalidGang):
            return UpstreamComposite(key, version, None, None, count)
        min_groups = count
    topology: str | None = None
    constraints = spec.get("schedulingConstraints")
    items = constraints.get("topology") if isinstance(constraints, Mapping) else None
    if items:
        if not isinstance(items, list) or len(items) != 1:
            return bad("schedulingConstraints.topology", items,
                       "Lockstep honours exactly one topology constraint")
        raw_key = items[0].get("key") if isinstance(items[0], Mapping) else None
        if not isinstance(raw_key, str) or not raw_key or len(raw_key) > MAX_LABEL_KEY_CHARS:
            return bad("schedulingConstraints.topology[0].key", raw_key,
                       f"not a label key (1 to {MAX_LABEL_KEY_CHARS} characters)")
        topology = raw_key
    prio = priority_fields(spec, f"{kind}.spec", key)
    if isinstance(prio, InvalidGang):
        return UpstreamComposite(key, version, None, None, prio)
    return UpstreamComposite(key, version, min_groups, topology, None, prio)


def compose(spec: GangSpec | None, child: GangKey, parent: str,
            composites: Mapping[GangKey, UpstreamComposite],
            children: Mapping[GangKey, Collection[GangKey]], levels: Sequence[Level]
            ) -> GangSpec | InvalidGang | MissingPodGroup | None:
    """The group of groups a child PodGroup's pod is in: ``spec`` is the child's own gang
    (None for a ``basic`` child: a subgroup of minimum 1), ``parent`` the composite it
    names. A ``basic`` composite leaves the child its own gang."""
    ns = child.split("/", 1)[0]
    ckey = gang_key(ns, parent)
    key = composite_key(ns, parent)
    c = composites.get(ckey)
    if c is None:
        return MissingPodGroup(key, f"{GROUP} CompositePodGroup {parent}")
    if c.error is not None:
        return replace(c.error, key=key)
    if c.min_groups is None:
        return spec
    kids = tuple(sorted(children.get(ckey, ())))
    if len(kids) > MAX_CHILDREN:
        return InvalidGang(key, "PodGroup.spec.parentCompositePodGroupName", parent,
                           f"{len(kids)} PodGroups name this composite, above the limit of "
                           f"{MAX_CHILDREN}")
    topology: str | None = None
    if c.topology_key is not None:
        level = level_by_name(levels, c.topology_key)
        if level is None:
            known = "; ".join(f"{lv.name}: {', '.join(lv.keys)}" for lv in levels)
            return InvalidGang(key, "CompositePodGroup.spec.schedulingConstraints.topology"
                               "[0].key", c.topology_key,
                               f"not a topology label Lockstep has a level for ({known})")
        topology = level.name
    if spec is None:
        spec = GangSpec(child, 1, GangDefaults().timeout_seconds, Source.UPSTREAM)
    prio = c.priority
    named = prio is not None and (prio.value is not None or prio.class_name is not None)
    return replace(
        spec, key=key, part=child, group=kids or (child,), min_parts=c.min_groups,
        part_topology=spec.topology, topology=topology,
        priority=prio.value if named and prio is not None else spec.priority,
        priority_class=prio.class_name if named and prio is not None else spec.priority_class,
        preempt_never=prio.never if prio is not None and named else spec.preempt_never)


def priority_fields(spec: Mapping[str, Any], where: str, key: GangKey) -> Priority | InvalidGang:
    """A group's priority fields (PodGroup and CompositePodGroup alike): ``priority``,
    ``priorityClassName``, ``preemptionPolicy``, each bounded."""
    value = spec.get("priority")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        return InvalidGang(key, f"{where}.priority", shown(value), "not a whole number")
    if value is not None and not INT32_MIN <= value <= INT32_MAX:
        return InvalidGang(key, f"{where}.priority", shown(value),
                           f"is outside {INT32_MIN}..{INT32_MAX} (int32, as a priority is)")
    name = spec.get("priorityClassName")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
        return InvalidGang(key, f"{where}.priorityClassName", shown(name),
                           f"not a PriorityClass name (at most {MAX_NAME_CHARS} characters)")
    policy = spec.get("preemptionPolicy")
    if policy not in (None, "Never", "PreemptLowerPriority"):
        return InvalidGang(key, f"{where}.preemptionPolicy", shown(policy),
                           "must be Never or PreemptLowerPriority")
    return Priority(value, str(name) if isinstance(name, str) and name else None,
                    policy == "Never")
