"""The names every module shares, and the slim records parsed once from raw Kubernetes JSON.

The names (a gang's and a pod's ``namespace/name`` key, a node's name, Lockstep's scheduling
gate) sit here, in this leaf module, so the pod record, the webhook's decision, the lift and
the gang declaration can all use them without importing behaviour. A pod's DRA claims
(``PodClaim``, ``spec.resourceClaims``) are parsed here with the pod, so the devices wing
(``coscheduling.devices``), which reads pod records, is imported by nothing it imports.

The cache and the planner work on these, never on the full objects: a 15,000-node cluster
then costs a few dicts per node, and nothing on the hot path walks nested JSON again.
Parsing is pure (dict in, record out) so the core can be tested without an API server.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, NewType

from .ranks import Rank, rank_of
from .resources import Resources, pod_requests, resource_list

__all__ = [
    "GANG_GATE",
    "MAX_POD_CLAIMS",
    "GangKey",
    "NodeName",
    "NodeRecord",
    "Owner",
    "PodClaim",
    "PodKey",
    "PodRecord",
    "PriorityClass",
    "RecordError",
    "Toleration",
    "gang_key",
    "node_from_json",
    "pod_claims",
    "pod_from_json",
    "pod_key",
    "priority_class_from_json",
    "status_only",
]

GANG_GATE = "lockstep.dev/gang"
"""Lockstep's scheduling gate: a member carrying it waits outside kube-scheduler's queue until
Lockstep admits its gang and lifts it."""

GangKey = NewType("GangKey", str)
"""``namespace/name`` of a gang."""

PodKey = NewType("PodKey", str)
"""``namespace/name``: how kube-scheduler's bind call names a pod."""
NodeName = NewType("NodeName", str)


def gang_key(namespace: str, name: str) -> GangKey:
    return GangKey(f"{namespace}/{name}")


def pod_key(namespace: str, name: str) -> PodKey:
    return PodKey(f"{namespace}/{name}")


class RecordError(ValueError):
    """A Kubernetes object that lacks what every such object has (a field is named)."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field_path = field_path
        self.reason = reason


MAX_POD_CLAIMS = 128
"""``spec.resourceClaims`` per pod (the API server's limit)."""


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One ``spec.resourceClaims[]`` entry of a pod, with the claim the resourceclaim
    controller made for it from a template (``status.resourceClaimStatuses``), if any."""

    name: str
    claim: str | None = None
    """``resourceClaimName``: a claim that exists on its own (possibly shared)."""
    template: str | None = None
    """``resourceClaimTemplateName``: a claim made for this pod alone."""
    generated: str | None = None
    """The name of the claim generated from ``template``, once the controller made it."""


def pod_claims(spec: Mapping[str, Any], status: Any) -> tuple[PodClaim, ...]:
    """A pod's claims; malformed entries are left out. More than :data:`MAX_POD_CLAIMS`
    (which the API server never serves) raise ``ValueError``."""
    raw = spec.get("resourceClaims")
    if not isinstance(raw, list) or not raw:
        return ()
    if len(raw) > MAX_POD_CLAIMS:
        raise ValueError(f"{len(raw)} resourceClaims, at most {MAX_POD_CLAIMS}")
    made: dict[str, str] = {}
    statuses = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    for s in statuses if isinstance(statuses, list) else ():
        if isinstance(s, Mapping) and isinstance(s.get("name"), str) \
                and isinstance(s.get("resourceClaimName"), str):
            made[s["name"]] = s["resourceClaimName"]
    out = []
    for c in raw:
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            continue
        claim, template = c.get("resourceClaimName"), c.get("resourceClaimTemplateName")
        out.append(PodClaim(c["name"], claim if isinstance(claim, str) else None,
                            template if isinstance(template, str) else None,
                            made.get(c["name"])))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str | None
    operator: str
    value: str | None
    effect: str | None

    def tolerates(self, taint: Mapping[str, Any]) -> bool:
        if self.effect and self.effect != taint.get("effect"):
            return False
        if self.key is None:  # empty key with Exists tolerates everything
            return self.operator == "Exists"
        if self.key != taint.get("key"):
            return False
        if self.operator == "Exists":
            return True
        return (self.value or "") == (taint.get("value") or "")


@dataclass(slots=True)
class NodeRecord:
    name: NodeName
    allocatable: Resources
    labels: dict[str, str]
    unschedulable: bool = False
    taints: tuple[dict[str, Any], ...] = ()

    def blocking_taints(self) -> tuple[dict[str, Any], ...]:
        return tuple(t for t in self.taints if t.get("effect") in ("NoSchedule", "NoExecute"))


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller: the object that recreates it when it is evicted."""

    kind: str
    name: str
    uid: str


@dataclass(slots=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    requests: Resources
    labels: dict[str, str]
    annotations: dict[str, str]
    scheduler_name: str
    node_name: NodeName | None = None
    phase: str = "Pending"
    deleting: bool = False
    created: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    required_affinity: tuple[dict[str, Any], ...] = ()
    """nodeSelectorTerms of requiredDuringSchedulingIgnoredDuringExecution (ORed)."""
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    other_gate: bool = False
    """``spec.schedulingGates`` holds a gate other than Lockstep's (Kueue's
    ``kueue.x-k8s.io/admission``, say): somebody else holds the pod back, so it cannot count
    toward a gang's quorum."""
    gated: bool = False
    """``spec.schedulingGates`` holds Lockstep's own gate (``coscheduling.gang.gating``): a member
    that counts, waiting outside kube-scheduler's queue for its gang's admission."""
    unschedulable: bool = False
    """kube-scheduler marked it ``PodScheduled=False, reason=Unschedulable``: it waits in the
    unschedulable queue, where only a cluster event (or a nudge) wakes it."""
    scheduling_group: str | None = None
    """``spec.schedulingGroup.podGroupName`` (Kubernetes >= 1.36): its upstream PodGroup."""
    workload_ref: tuple[str, str, str] | None = None
    """``spec.workloadRef`` (Kubernetes 1.35 only): Workload name, pod group in it, and
    ``podGroupReplicaKey`` ("" when unset)."""
    preempt_never: bool = False
    """``spec.preemptionPolicy: Never``: it waits for capacity and evicts nobody."""
    started: float = 0.0
    """``status.startTime`` in seconds since the epoch (0 when not started): the most
    recently started victims lose the least work."""
    grace_seconds: float = 30.0
    """``spec.terminationGracePeriodSeconds``: how long an evicted pod may take to go."""
    claims: tuple[PodClaim, ...] = ()
    """``spec.resourceClaims``: devices it asks for through DRA (``coscheduling.devices``)."""
    rank: Rank | None = None
    """Its index in its workload (``coscheduling.ranks``): adjacent ranks are placed side by
    side (``placement.rankorder``). None: no index, or one out of bounds."""
    owner: Owner | None = None
    """Its controller (the ``ownerReferences`` entry with ``controller: true``): defragmentation
    moves only pods a controller recreates (``coscheduling.defrag``)."""
    resource_version: int = field(default=0, compare=False)
    """``metadata.resourceVersion`` when it is a number (the API server's etcd revision), else
    0: tells a pod the watch has not reached yet from one it has already seen go. Not part of
    equality, so an unchanged pod relisted is not an update."""
    tolerated: frozenset[tuple[object, object, object]] = field(
        init=False, default=frozenset(), compare=False, repr=False)
    """The tolerations as a set (:func:`_toleration_index`), so checking a node's taints
    costs the same however many tolerations the pod lists."""
    key: PodKey = field(init=False, default=PodKey(""), compare=False, repr=False)
    """``namespace/name``, built once: the core reads it a few dozen times per event (a
    property building the string each time was ~4% of Lockstep's CPU in a burst). Records
    are not edited in place (``dataclasses.replace`` makes a new one, built again)."""

    def __post_init__(self) -> None:
        self.tolerated = _toleration_index(self.tolerations)
        self.key = pod_key(self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in _FINISHED

    @property
    def active(self) -> bool:
        """A member that counts toward its gang: not deleting, not finished, not gated."""
        return not (self.deleting or self.other_gate or self.phase in _FINISHED)

    @property
    def holds_capacity(self) -> bool:
        """Bound and not finished: what kube-scheduler counts against the node."""
        return self.node_name is not None and not self.terminal

    def tolerates_all(self, taints: tuple[dict[str, Any], ...]) -> bool:
        """Whether every taint is tolerated, as :meth:`Toleration.tolerates` decides: a few
        set lookups per taint, not a walk of the pod's tolerations (a pod may list 100,000,
        and this runs for every node)."""
        return all(_tolerated(self.tolerated, taint) for taint in taints)


def status_only(old: PodRecord, new: PodRecord) -> bool:
    """Whether ``new`` is ``old`` bound where it was, with only what the kubelet reports of
    a running pod changed: a phase that has not ended (Pending to Running), ``started``,
    and the fields no record keeps (podIP, conditions other than Unschedulable, ...).

    Every other field is compared, by the dataclass's own list (a field added later is
    compared too): the gang rules decide nothing by those two, so such an event changes nothing
    they decide (``ingest.upsert_pod`` stores it and skips re-deciding the gang)."""
    return (old.node_name is not None and old.phase not in _FINISHED
            and new.phase not in _FINISHED and _GANG_FIELDS(old) == _GANG_FIELDS(new))


_FINISHED = frozenset({"Succeeded", "Failed"})
"""The phases of a pod that ended (:attr:`PodRecord.terminal`)."""

_GANG_FIELDS = operator.attrgetter(*(
    f.name for f in fields(PodRecord) if f.compare and f.name not in ("phase", "started")))
"""Every field equality compares but the two :func:`status_only` lets change."""

_ANY = "\0any"
"""An ``Exists`` toleration's value in the index: no taint value is spelled so."""


def _toleration_index(tolerations: tuple[Toleration, ...]) -> frozenset[
        tuple[object, object, object]]:
    """(key, value or :data:`_ANY`, effect or None) per toleration. A key-less toleration
    tolerates only with ``Exists``; any operator but ``Exists`` compares values. Pods share
    a few short lists (the API server's two default tolerations), so a short list's index
    is shared; a long one is built for its pod alone (a cache must not keep it alive)."""
    if len(tolerations) <= _SHARED_TOLERATIONS:
        return _shared_index(tolerations)
    return _build_index(tolerations)


_SHARED_TOLERATIONS = 8


@functools.lru_cache(maxsize=1024)
def _shared_index(tolerations: tuple[Toleration, ...]) -> frozenset[
        tuple[object, object, object]]:
    return _build_index(tolerations)


def _build_index(tolerations: tuple[Toleration, ...]) -> frozenset[
        tuple[object, object, object]]:
    out: set[tuple[object, object, object]] = set()
    for t in tolerations:
        if t.operator == "Exists":
            out.add((t.key, _ANY, t.effect or None))
        elif t.key is not None:
            out.add((t.key, t.value or "", t.effect or None))
    return frozenset(out)


def _tolerated(index: frozenset[tuple[object, object, object]], taint: Mapping[str, Any]
               ) -> bool:
    key, value, effect = (v if isinstance(v, str) or v is None else object()
                          for v in (taint.get("key"), taint.get("value"), taint.get("effect")))
    value = value or ""
    return any((None, _ANY, e) in index or (key, _ANY, e) in index
               or (key, value, e) in index for e in (None, effect))


def _meta(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise RecordError(f"{kind}.metadata", "missing or not an object")
    if not isinstance(meta.get("name"), str) or not meta.get("name"):
        raise RecordError(f"{kind}.metadata.name", "missing or not a string")
    return meta


def _str_map(value: Any, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RecordError(path, "not an object")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, str):
            if not isinstance(v, int | float) or (isinstance(v, int) and v.bit_length() > 64):
                raise RecordError(path, "values must be strings")
            v = str(v)
        out[str(k)] = v
    return out


_MALFORMED = (AttributeError, TypeError, KeyError, RecursionError)
"""What reading a field of the wrong type raises (a list where an object belongs, say, or a
value nested past the interpreter's depth): the object is refused as a RecordError, which
every caller already handles, never an exception that ends a watch or answers 500."""


def node_from_json(obj: Mapping[str, Any]) -> NodeRecord:
    """A node's record; :class:`RecordError` (or ``QuantityError``) for one Lockstep cannot
    read."""
    try:
        return _node_from_json(obj)
    except _MALFORMED as e:
        raise RecordError("Node", f"malformed ({type(e).__name__})") from None


def _node_from_json(obj: Mapping[str, Any]) -> NodeRecord:
    meta = _meta(obj, "Node")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    return NodeRecord(
        name=NodeName(meta["name"]),
        allocatable=resource_list(alloc),
        labels=_str_map(meta.get("labels"), "Node.metadata.labels"),
        unschedulable=bool(spec.get("unschedulable")),
        # key, value and effect decide scheduling; timeAdded (set on NoExecute taints) would
        # only make a protobuf-listed node differ from the same node watched as JSON.
        taints=tuple({k: t[k] for k in ("key", "value", "effect") if t.get(k)}
                     for t in spec.get("taints") or () if isinstance(t, Mapping)),
    )


def _unschedulable(status: Any) -> bool:
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    return isinstance(conds, list) and any(
        isinstance(c, Mapping) and c.get("type") == "PodScheduled"
        and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in conds)


def _revision(raw: object) -> int:
    text = raw if isinstance(raw, str) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else 0


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""A priority's range: ``spec.priority`` and a PriorityClass's ``value`` are int32 (user
classes stop at 1,000,000,000; the system classes sit above it)."""


def _priority(raw: object, path: str) -> int:
    """A pod's or a PriorityClass's priority: an int32, or the object is refused (the API
    server never serves another, so only a hostile or broken source gives one)."""
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or not INT32_MIN <= raw <= INT32_MAX:
        raise RecordError(path, f"not a whole number in {INT32_MIN}..{INT32_MAX} (int32)")
    return raw


def pod_from_json(obj: Mapping[str, Any]) -> PodRecord:
    """A pod's record; :class:`RecordError` (or ``QuantityError``) for one Lockstep cannot
    read, whatever its JSON holds."""
    try:
        return _pod_from_json(obj)
    except _MALFORMED as e:
        raise RecordError("Pod", f"malformed ({type(e).__name__})") from None


def _pod_from_json(obj: Mapping[str, Any]) -> PodRecord:
    meta = _meta(obj, "Pod")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise RecordError("Pod.spec", "missing or not an object")
    status = obj.get("status") or {}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    tolerations = _tolerations(spec.get("tolerations"))
    node = spec.get("nodeName")
    gates = [g.get("name") for g in spec.get("schedulingGates") or () if isinstance(g, Mapping)]
    labels = _str_map(meta.get("labels"), "Pod.metadata.labels")
    annotations = _str_map(meta.get("annotations"), "Pod.metadata.annotations")
    return PodRecord(
        namespace=str(meta.get("namespace") or "default"),
        name=meta["name"],
        uid=str(meta.get("uid") or ""),
        requests=pod_requests(spec),
        labels=labels,
        annotations=annotations,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=NodeName(node) if node else None,
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        resource_version=_revision(meta.get("resourceVersion")),
        node_selector=_str_map(spec.get("nodeSelector"), "Pod.spec.nodeSelector"),
        required_affinity=tuple(affinity.get("nodeSelectorTerms") or ()),
        tolerations=tolerations,
        priority=_priority(spec.get("priority"), "Pod.spec.priority"),
        other_gate=any(g != GANG_GATE for g in gates),
        gated=GANG_GATE in gates,
        unschedulable=_unschedulable(status),
        scheduling_group=_scheduling_group(spec),
        workload_ref=_workload_ref(spec),
        preempt_never=spec.get("preemptionPolicy") == "Never",
        started=_timestamp(status.get("startTime")),
        grace_seconds=_grace(spec.get("terminationGracePeriodSeconds")),
        claims=_claims(spec, status),
        rank=rank_of(labels, annotations),
        owner=_owner(meta.get("ownerReferences")),
    )


def _owner(raw: Any) -> Owner | None:
    """The controller among ``ownerReferences`` (at most one has ``controller: true``)."""
    if not isinstance(raw, list):
        return None
    for ref in raw:
        if isinstance(ref, Mapping) and ref.get("controller") is True \
                and ref.get("kind") and ref.get("name") and ref.get("uid"):
            return Owner(str(ref["kind"]), str(ref["name"]), str(ref["uid"]))
    return None


def _tolerations(raw: Any) -> tuple[Toleration, ...]:
    """A pod's tolerations. Pods share a few short lists (the API server's two defaults),
    so a short list's records are made once and shared: a watch event of such a pod costs
    a tuple lookup, not a record per toleration."""
    if not raw:
        return ()
    fields_ = tuple((t.get("key") or None, t.get("operator") or "Equal", t.get("value"),
                     t.get("effect") or None) for t in raw if isinstance(t, Mapping))
    if len(fields_) <= _SHARED_TOLERATIONS:
        return _shared_tolerations(fields_)
    return tuple(Toleration(*f) for f in fields_)


@functools.lru_cache(maxsize=1024)
def _shared_tolerations(fields_: tuple[tuple[Any, str, Any, Any], ...]
                        ) -> tuple[Toleration, ...]:
    return tuple(Toleration(*f) for f in fields_)


def _claims(spec: Mapping[str, Any], status: object) -> tuple[PodClaim, ...]:
    try:
        return pod_claims(spec, status)
    except ValueError as e:
        raise RecordError("Pod.spec.resourceClaims", str(e)) from None


def _timestamp(raw: object) -> float:
    """An RFC 3339 time as the API server writes it, in seconds since the epoch; 0 if
    absent or unreadable (a pod whose start is unknown counts as the oldest)."""
    if not isinstance(raw, str) or not raw:
        return 0.0
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


MAX_GRACE_SECONDS = float(2**63 - 1)
"""``terminationGracePeriodSeconds`` is an int64."""


def _grace(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= \
            MAX_GRACE_SECONDS:
        return 30.0
    return float(raw)


def _scheduling_group(spec: Mapping[str, Any]) -> str | None:
    group = spec.get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return str(name) if name else None


def _workload_ref(spec: Mapping[str, Any]) -> tuple[str, str, str] | None:
    ref = spec.get("workloadRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return (str(ref["name"]), str(ref.get("podGroup") or ""),
            str(ref.get("podGroupReplicaKey") or ""))


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A ``scheduling.k8s.io/v1`` PriorityClass: the value a group naming it gets."""

    name: str
    value: int


def priority_class_from_json(obj: Mapping[str, Any]) -> PriorityClass:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise RecordError("PriorityClass.metadata.name", "missing")
    if obj.get("value") is None:
        raise RecordError("PriorityClass.value", "missing")
    return PriorityClass(str(meta["name"]), _priority(obj.get("value"), "PriorityClass.value"))
