"""Every gang convention Lockstep reads, one module each, and the resolver that follows them.

Pods join gangs through the conventions the ecosystem already uses, so a job written for
scheduler-plugins, Volcano, Koordinator, Kueue or Kubernetes' own gang API works unchanged,
and JobSets, LeaderWorkerSets and Trainer v2's JobSets are read as groups of groups:

=====================  ===========================================  ===========================
convention             pod -> group                                 size / timeout
=====================  ===========================================  ===========================
Lockstep               ``lockstep.dev/pod-group`` (annotation/label)  ``lockstep.dev/min-member``,
                                                                    ``lockstep.dev/timeout-seconds``
scheduler-plugins      label ``scheduling.x-k8s.io/pod-group``       PodGroup ``spec.minMember``,
                                                                    ``scheduleTimeoutSeconds``
Volcano                ``scheduling.k8s.io/group-name`` or           ``scheduling.volcano.sh/
                       ``scheduling.volcano.sh/group-name``          group-min-member``
Koordinator            ``gang.scheduling.koordinator.sh/name``,      ``.../min-available``,
                       or the lightweight label                     ``.../waiting-time``,
                       ``pod-group.scheduling.sigs.k8s.io/name``    ``.../total-number``,
                                                                    ``.../mode``, ``.../groups``,
                                                                    ``.../match-policy``
Kueue plain pods       ``kueue.x-k8s.io/pod-group-name`` (label,     ``kueue.x-k8s.io/
                       or annotation)                               pod-group-total-count``
scheduling.k8s.io      ``spec.schedulingGroup`` / ``workloadRef``   PodGroup / Workload policy
JobSet                 ``lockstep.dev/gang-of: jobset`` (opt-in); any  its child Jobs (the JobSet
                       gang over a JobSet with ``dependsOn``        object), stages
LeaderWorkerSet        label ``leaderworkerset.sigs.k8s.io/name``   ``.../size`` per group
=====================  ===========================================  ===========================

A new convention is a new module defining its keys and its :class:`Convention`, plus its entry
in :data:`REGISTRY`. The order of :data:`REGISTRY` is the resolution order: declarations are
listed in it (the first names the gang's source), PodGroup objects are read in it, then the
size keys on the pod, then each convention's own options. The webhook
(``coscheduling.gang.gating``) gates every pod that names a gang by any registered key; the adapter
watches each convention's PodGroup API and writes its status there.

Beside them: ``base`` (what a convention is, and the status model every convention's status
is computed from), ``volcano_queues`` (Volcano's queue rules, a pure leaf that Volcano's
enqueue step in ``volcano`` and the core's queue gate in ``coscheduling.gang.queue_gate``
read), ``upstream_objects`` (the upstream gang API's records) and ``kueue.quota_line``
(Kueue's quota line, which preemption never crosses).

A pod may declare its gang by several conventions at once (a Kubeflow job, say, carries both
Volcano's and scheduler-plugins' keys): they must name the same gang and agree on its size,
or the pod gets an :class:`~coscheduling.podgroup.InvalidGang` naming the conflict.
"""

from __future__ import annotations

import functools

from ..podgroup import (
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    Membership,
    Source,
    gang_key,
    int_field,
    name_field,
    seconds_field,
    shown,
)
from ..records import PodRecord
from . import jobset, koordinator, kueue, lockstep, lws, scheduler_plugins, upstream, volcano
from .base import (
    MAX_GANG_SIZE_FLAG,
    Convention,
    Found,
    Key,
    Objects,
    PodGroupAPI,
    PodGroupRecord,
    lookup,
)

__all__ = [
    "REGISTRY",
    "Convention",
    "Key",
    "Objects",
    "PodGroupAPI",
    "PodGroupRecord",
    "Source",
    "declarations",
    "declaring_keys",
    "points_at_object",
    "resolve",
]

REGISTRY: tuple[Convention, ...] = (
    lockstep.CONVENTION,
    scheduler_plugins.CONVENTION,
    volcano.CONVENTION,
    koordinator.CONVENTION,
    kueue.CONVENTION,
    upstream.CONVENTION,
    jobset.CONVENTION,
    lws.CONVENTION,
)


DeclaringKeys = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]


def declaring_keys() -> DeclaringKeys:
    """(annotation keys, label keys, spec paths) by which a pod names a gang, in the
    registry as it is (worked out once per registry: the webhook asks for every pod)."""
    return _declaring_keys(REGISTRY)


@functools.cache
def _declaring_keys(registry: tuple[Convention, ...]) -> DeclaringKeys:
    keys = [k for c in registry for k in c.declares]
    return (tuple(k.name for k in keys if k.on in ("annotation", "either")),
            tuple(k.name for k in keys if k.on in ("label", "either")),
            tuple(p for c in registry for p in c.spec_fields))


def declarations(pod: PodRecord) -> list[tuple[Source, str, str]]:
    """(convention, key, gang name) for every key by which the pod names a gang."""
    return [(c.source, k.name, value) for c in REGISTRY for k in c.declares
            if (value := k.value(pod))]


def points_at_object(pod: PodRecord, name: str) -> bool:
    """Whether ``pod`` names a gang object called ``name`` (in its own namespace): a
    convention's PodGroup, or an upstream PodGroup by its spec. Such pods are resolved again
    when that object comes, changes or goes."""
    return pod.scheduling_group == name or any(
        k.value(pod) == name for c in REGISTRY if c.podgroup is not None for k in c.declares
    ) or any(c.reads_object(pod) == name for c in REGISTRY if c.reads_object is not None)


def resolve(pod: PodRecord, objects: Objects, defaults: GangDefaults) -> Membership:
    """The gang the pod's labels and annotations declare, or why the declaration is
    unusable; None when it names no gang. ``objects`` are the PodGroup objects the store
    holds, by the convention whose API they belong to. (Kubernetes' own API, declared in the
    pod's spec, is resolved by :func:`upstream.resolve_upstream` and combined.)"""
    decls = declarations(pod)
    if not decls:
        return None
    names = {v for _, _, v in decls}
    if len(names) > 1:
        listed = ", ".join(f"{f}={shown(v)}" for _, f, v in decls)
        return InvalidGang(None, "metadata", listed, "conflicting gang declarations")
    source, fld, name = decls[0]
    if (long := name_field(name, fld, None)) is not None:
        return long
    key = gang_key(pod.namespace, name)
    sources = frozenset(s for s, _, _ in decls)
    found = Found(source)
    for conv in REGISTRY:
        if conv.source in sources and conv.from_object is not None:
            step = conv.from_object(pod, key, found, objects)
            if not isinstance(step, Found):
                return step
            found = step
    on_pod = _sizes_on_pod(pod, key, sources, found, defaults)
    if isinstance(on_pod, InvalidGang):
        return on_pod
    min_member, timeout = on_pod

    if min_member is None:
        want = next(c.size_key for c in REGISTRY if c.source is found.source)
        return InvalidGang(key, want, "", f"missing: {fld}={name} needs {want}")
    if min_member > defaults.max_gang_size:  # read from a PodGroup object
        return InvalidGang(key, found.size_field or "minMember", str(min_member),
                           f"is above the limit of {defaults.max_gang_size} "
                           f"({MAX_GANG_SIZE_FLAG})")

    asked = timeout if timeout is not None else defaults.timeout_seconds
    capped: float | None = None
    if asked > defaults.max_timeout_seconds:
        asked, capped = defaults.max_timeout_seconds, asked
    spec = GangSpec(key, min_member, asked, found.source, found.min_resources, capped,
                    priority_class=found.priority_class)
    for conv in REGISTRY:
        if conv.refine is not None:
            refined = conv.refine(spec, pod, sources, objects)
            if isinstance(refined, InvalidGang):
                return refined
            spec = refined
    if spec.total is not None and spec.total > defaults.max_gang_size:
        return InvalidGang(key, koordinator.TOTAL, str(spec.total),
                           f"is above the limit of {defaults.max_gang_size} "
                           f"({MAX_GANG_SIZE_FLAG})")
    return spec


def _sizes_on_pod(pod: PodRecord, key: GangKey, sources: frozenset[Source], found: Found,
                  defaults: GangDefaults) -> tuple[int | None, float | None] | InvalidGang:
    """(minimum members, timeout) from the size and timeout keys on the pod of every
    convention it declares, starting from what the objects said: each bounded
    (``--max-gang-size``, int32 seconds), and all sizes agreeing."""
    min_member, timeout = found.min_member, found.timeout_seconds
    for conv in REGISTRY:
        if conv.source not in sources:
            continue
        for size_key, timeout_key in conv.size:
            raw_min = lookup(pod, size_key.name)
            if raw_min is not None:
                mm = int_field(raw_min, size_key.name, key, limit=defaults.max_gang_size,
                               limit_name=MAX_GANG_SIZE_FLAG)
                if isinstance(mm, InvalidGang):
                    return mm
                if min_member is not None and mm != min_member:
                    return InvalidGang(
                        key, size_key.name, raw_min,
                        f"conflicts with min-member {min_member} declared elsewhere",
                    )
                min_member = mm
            if timeout_key is not None and (raw_t := lookup(pod, timeout_key.name)) is not None:
                t = seconds_field(raw_t, timeout_key.name, key)
                if isinstance(t, InvalidGang):
                    return t
                timeout = t
    return min_member, timeout
