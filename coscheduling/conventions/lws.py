"""LeaderWorkerSet (``leaderworkerset.x-k8s.io``, v0.7.0): each group, a leader and its
workers, is admitted whole; the set is elastic over its groups.

Read from the pods alone, as the LWS controller and its pod webhook write them
(``leaderworkerset_controller.go``, ``pod_controller.go``, ``pod_webhook.go``): every pod of
a set carries the label ``leaderworkerset.sigs.k8s.io/name``, its group's
``group-index`` and its own ``worker-index`` (0 for the leader), and the annotation
``leaderworkerset.sigs.k8s.io/size`` (pods per group); ``exclusive-topology``,
``subgroup-size`` and ``subgroup-exclusive-topology`` are copied from the set onto every
pod, ``subgroup-policy-type`` onto the leader only.

* **Without subgroups** the gang is the set (``namespace/<lws>``) and each group is a
  subgroup of it (``part``: ``namespace/<lws>-<group-index>``, the leader pod's name),
  ``size`` members each, at least one group at once (``min_parts`` 1) and the others as
  room allows, each whole. ``group`` lists every group the LeaderWorkerSet object's
  ``spec.replicas`` says (watched while its CRD is served; before it is seen, or past
  :data:`MAX_GROUPS`, it is empty: the set's subgroups are those its members name).
* **With** ``subgroup-size`` the gang is the group (``namespace/<lws>-<group-index>``) and
  its subgroups are LWS's (``part``: ``<group>-sg<index>``, the index as LWS computes it
  from the worker index), every one of them required; ``subgroup-exclusive-topology`` is
  each subgroup's own required level, exclusive. The leader counts with subgroup 0 (where
  ``LeaderWorker``, LWS's default, puts it; a ``LeaderExcluded`` leader is counted and
  placed with it too, since the workers cannot tell the policy apart).

A pod that declares its gang by another convention (LWS's Volcano provider writes
Volcano's ``scheduling.k8s.io/group-name``; a user may write Lockstep's own keys) is read by
that one alone, and ``lockstep.dev/gang-of: none`` on the set's template reads none. A set
whose object says ``startupPolicy: LeaderReady`` creates the workers only once the leader
runs, so its groups never exist whole before one is admitted: each of its pods is a gang of
one (LWS's own Volcano provider gives such a group a ``minMember`` of 1). A set with
``exclusive-topology`` is read as no gang at all: LWS creates its workers only once the
leader has a node (``pkg/controllers/pod_controller.go``) and pins them to the leader's
domain, and its webhook gives every pod anti-affinity to the other groups, which Lockstep's
planner does not read; its pods are plain pods, placed by kube-scheduler and LWS's own
affinities. Reserving a group's room in one domain when its leader binds, before its
workers exist, is not built yet.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..podgroup import (
    DEFAULT_MAX_GANG_SIZE,
    GangKey,
    GangSpec,
    InvalidGang,
    Source,
    gang_key,
    int_field,
    shown,
)
from ..records import PodRecord
from . import koordinator as koord
from . import kueue, lockstep, scheduler_plugins, volcano
from .base import Convention, Key, Objects, PodGroupRecord, Watch
from .jobset import OPT_IN, OPT_OUT_VALUE, topology_key_problem

__all__ = [
    "API_PATH",
    "CONVENTION",
    "EXCLUSIVE",
    "GROUP_INDEX",
    "LWS",
    "MAX_GROUPS",
    "NAME",
    "OPT_OUT_VALUE",
    "SIZE",
    "SUBGROUP_EXCLUSIVE",
    "SUBGROUP_SIZE",
    "WATCHES",
    "WORKER_INDEX",
    "LwsRecord",
    "lws_from_json",
]

LWS = Source("leaderworkerset")
NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
"""Labels on every pod of a set."""
SIZE = "leaderworkerset.sigs.k8s.io/size"
EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
SUBGROUP_SIZE = "leaderworkerset.sigs.k8s.io/subgroup-size"
SUBGROUP_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
"""Annotations on every pod of a set."""

_MAX_INDEX_CHARS = 10
"""An index is an int32 (a StatefulSet ordinal)."""

MAX_GROUPS = DEFAULT_MAX_GANG_SIZE
"""The most groups (``spec.replicas``) a set read here may list as its subgroups; a larger
set is read from its pods alone (its subgroups are those its members name)."""


@dataclass(frozen=True, slots=True)
class LwsRecord(PodGroupRecord):
    """A LeaderWorkerSet as the store keeps it (beside the PodGroups, by its key): what its
    pods do not say."""

    groups: tuple[GangKey, ...] = ()
    """Every group's subgroup key (``<lws>-<index>`` for each of ``spec.replicas``), sorted:
    one tuple shared by its members' specs."""
    leader_ready: bool = False
    """``spec.startupPolicy: LeaderReady``: the workers come once the leader runs."""


def lws_from_json(obj: Mapping[str, Any]) -> LwsRecord:
    """A served LeaderWorkerSet; ``spec.replicas`` beyond :data:`MAX_GROUPS` (or not a
    count) is kept as an error and its groups are not listed."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    key = gang_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    leader_ready = spec.get("startupPolicy") == "LeaderReady"
    raw = spec.get("replicas", 1)
    replicas = 0 if raw == 0 and not isinstance(raw, bool) else int_field(
        raw, "LeaderWorkerSet.spec.replicas", key, limit=MAX_GROUPS,
        limit_name="the groups Lockstep lists")
    if isinstance(replicas, InvalidGang):
        return LwsRecord(key, None, None, {}, replicas, leader_ready=leader_ready)
    name = key.split("/", 1)[1]
    groups = tuple(sorted(gang_key(key.split("/", 1)[0], f"{name}-{i}")
                          for i in range(replicas)))
    return LwsRecord(key, None, None, {}, groups=groups, leader_ready=leader_ready)


API_PATH = "/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets"
WATCHES = (Watch("leaderworkersets", lambda obj, _: lws_from_json(obj), API_PATH),)
"""The sets, kept with the PodGroups (``into="groups"``) while the CRD is served."""


_OTHERS = tuple(c.CONVENTION for c in (lockstep, scheduler_plugins, volcano, koord, kueue))
"""The conventions by which a pod may declare its gang explicitly: the LWS reading then
stands aside (Kubernetes' own gang API, declared in the spec, too)."""


def _explicit(pod: PodRecord) -> bool:
    return any(k.value(pod) for c in _OTHERS for k in c.declares) \
        or pod.scheduling_group is not None or pod.workload_ref is not None


@dataclass(frozen=True, slots=True)
class _SetName(Key):
    """The set's name names the gang, unless the pod says otherwise (see the module)."""

    def value(self, pod: PodRecord) -> str | None:
        name = pod.labels.get(self.name)
        if not name or SIZE not in pod.annotations or EXCLUSIVE in pod.annotations \
                or _explicit(pod) or pod.annotations.get(OPT_IN, "").strip() == OPT_OUT_VALUE:
            return None
        return name


def _index(pod: PodRecord, label: str, key: GangKey) -> int | InvalidGang:
    raw = pod.labels.get(label, "")
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_INDEX_CHARS):
        return InvalidGang(key, label, shown(raw), "not an index (a whole number from 0)")
    return int(text)


def _exclusive(pod: PodRecord, fld: str, key: GangKey) -> str | InvalidGang | None:
    raw = pod.annotations.get(fld)
    if raw is None:
        return None
    if problem := topology_key_problem(raw):
        return InvalidGang(key, fld, shown(raw), problem)
    return raw


def _refine(spec: GangSpec, pod: PodRecord, sources: frozenset[Source], objects: Objects
            ) -> GangSpec | InvalidGang:
    """Groups as subgroups of the set, or LWS's subgroups as subgroups of the group."""
    if LWS not in sources:
        return spec
    key, size = spec.key, spec.min_member
    group = _index(pod, GROUP_INDEX, key)
    if isinstance(group, InvalidGang):
        return group
    worker = _index(pod, WORKER_INDEX, key)
    if isinstance(worker, InvalidGang):
        return worker
    if worker >= size:
        return InvalidGang(key, WORKER_INDEX, str(worker), f"not below the size {size}")
    ns, name = key.split("/", 1)
    part = gang_key(ns, f"{name}-{group}")
    rec = objects.get(LWS, {}).get(key)
    if isinstance(rec, LwsRecord) and rec.leader_ready:
        # Its workers come once the leader runs: no group is ever whole before it is
        # admitted, so each pod goes alone (as LWS's own Volcano provider says, minMember 1).
        return replace(spec, key=part, min_member=1)
    raw_sub = pod.annotations.get(SUBGROUP_SIZE)
    if raw_sub is None:
        groups = rec.groups if isinstance(rec, LwsRecord) and part in rec.groups else ()
        return replace(spec, part=part, group=groups, min_parts=1)
    sub = int_field(raw_sub, SUBGROUP_SIZE, key, limit=size, limit_name=f"{SIZE} {size}")
    if isinstance(sub, InvalidGang):
        return sub
    sub_exclusive = _exclusive(pod, SUBGROUP_EXCLUSIVE, key)
    if isinstance(sub_exclusive, InvalidGang):
        return sub_exclusive
    # LWS's getSubGroupIndex: the leader is the extra pod when size - 1 divides evenly.
    extra = (size - 1) % sub == 0
    if not extra and size % sub:
        return InvalidGang(key, SUBGROUP_SIZE, raw_sub, f"divides neither {SIZE} {size} "
                           f"nor {size - 1}, as LWS requires")
    count = max((size - 1) // sub if extra else size // sub, 1)
    index = 0 if worker == 0 else ((worker - 1) // sub if extra else worker // sub)
    parts = _subgroups(ns, f"{name}-{group}", count)
    own = min(sub + 1, size) if extra and index == 0 else sub
    return replace(spec, key=part, part=gang_key(ns, f"{name}-{group}-sg{index}"),
                   group=parts, min_member=own, min_parts=None,
                   part_topology=sub_exclusive, part_exclusive=sub_exclusive is not None)


@functools.lru_cache(maxsize=256)
def _subgroups(namespace: str, group: str, count: int) -> tuple[GangKey, ...]:
    """A group's subgroup keys, sorted: one tuple shared by its members' specs (``count``
    is at most the group's size, bounded by ``--max-gang-size`` before this is built)."""
    return tuple(sorted(gang_key(namespace, f"{group}-sg{i}") for i in range(count)))


CONVENTION = Convention(
    LWS,
    declares=(_SetName(NAME, "label"),),
    size=((Key(SIZE, "annotation"), None),),
    refine=_refine,
    watches=WATCHES,
    reads_object=lambda pod: pod.labels.get(NAME),
)
