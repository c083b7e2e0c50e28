"""What a gang convention is: the small interface every module in this package fills in.

As data: the keys a pod names its gang by, the keys that give its size and timeout, the pod
spec fields that point at a gang object, the API of the PodGroup object it has, the objects
the adapter watches for it and what each is to the core (:class:`Watch`, ``into``), and how
its status is written back (:class:`StatusWrite`). The core's ingest, the adapter's cache
and its status writer loop over these declarations, so adding a convention is adding its
module and its line in the registry. As behaviour, two optional steps of the resolver
(``coscheduling.conventions``):
``from_object`` reads the size from the convention's PodGroup object (run when the pod
declares the convention), and ``refine`` adds the convention's own options to a resolved spec
(run for every gang: Koordinator's options may sit on a scheduler-plugins PodGroup).

Status is written from one :class:`StatusModel`, which the core builds in one pass and the
adapter's writer hands to every convention's :class:`StatusWrite`: each gang's counts, reason
and queue (:class:`GangStatusModel`) and the objects as watched. A convention computes its own
patches from it, without reaching into the core, so each status is a pure function tested
over a model built by hand.

This module imports only the value modules (the gang declaration, the pod record, reasons)
and the record leaves of the objects the status model carries (Volcano's Queues, the upstream
PodGroups), so each convention module stays near the bottom of the import graph and the
webhook, the store and the resolver can all read them without a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..podgroup import GangKey, GangSpec, InvalidGang, MissingPodGroup, Source
from ..reasons import GangReason, PartiallyBound, Reason
from ..records import PodRecord, gang_key
from ..resources import Resources
from .upstream_objects import UpstreamPodGroup
from .volcano_queues import QueueRecord

__all__ = [
    "FIELD_MANAGER",
    "MAX_GANG_SIZE_FLAG",
    "Convention",
    "Found",
    "GangStatusModel",
    "Key",
    "MemberCounts",
    "ObjectStep",
    "Objects",
    "PodGroupAPI",
    "PodGroupRecord",
    "RefineStep",
    "Render",
    "Source",
    "StatusModel",
    "StatusPatch",
    "StatusWrite",
    "SubGroupPolicy",
    "Watch",
    "lookup",
]


MAX_GANG_SIZE_FLAG = "--max-gang-size"
"""What a reason names as the limit of a gang's size (the flag that sets it)."""

FIELD_MANAGER = "lockstep"
"""Lockstep's name in managedFields: a PodGroup condition another manager wrote (the native
gang plugin) is not Lockstep's to change."""


@dataclass(frozen=True, slots=True)
class Key:
    """A pod metadata key, and where the convention lets it be written."""

    name: str
    on: Literal["annotation", "label", "either"]

    def value(self, pod: PodRecord) -> str | None:
        """The key's value on ``pod`` (an annotation wins over a label for ``either``)."""
        if self.on == "either":
            return lookup(pod, self.name)
        return (pod.annotations if self.on == "annotation" else pod.labels).get(self.name)


def lookup(pod: PodRecord, name: str) -> str | None:
    """A key the convention reads from an annotation or, failing that, a label."""
    return pod.annotations.get(name) or pod.labels.get(name)


@dataclass(frozen=True, slots=True)
class PodGroupRecord:
    """A PodGroup object of a CRD convention, parsed (scheduler-plugins' and Volcano's have
    the same fields Lockstep reads)."""

    key: GangKey
    min_member: int | None
    timeout_seconds: float | None
    min_resources: Resources
    error: InvalidGang | None = None
    phase: str = ""
    """``status.phase`` as last written (Volcano's enqueue state lives there)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Koordinator reads its gang options from the PodGroup's annotations (CRD way)."""
    priority_class: str | None = None
    """``spec.priorityClassName`` (Volcano's PodGroup has one; scheduler-plugins' has not)."""
    queue: str = ""
    """Volcano's ``spec.queue`` (``default`` when unset); "" for other conventions."""
    subgroups: SubGroupPolicy | None = None
    """Volcano's ``spec.subGroupPolicy`` (1.14), when set (``conventions.volcano``)."""


@dataclass(frozen=True, slots=True)
class SubGroupPolicy:
    """One entry of a Volcano PodGroup's ``spec.subGroupPolicy``: the pods its label
    selector matches are split into subgroups by the values of ``match_label_keys``, each
    of ``size`` pods, ``min_groups`` of them admitted together."""

    name: str
    size: int
    min_groups: int
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Mapping[str, Any], ...] = ()
    match_label_keys: tuple[str, ...] = ()
    tier: str | None = None
    """``networkTopology.highestTierName`` in ``hard`` mode: the level each subgroup must
    fit in (a ``soft`` constraint is a preference, not read)."""


Objects = Mapping[Source, Mapping[GangKey, PodGroupRecord]]
"""The PodGroup objects the store holds, by the convention whose API they belong to."""


@dataclass(frozen=True, slots=True)
class Found:
    """What the resolver knows of a gang so far, convention by convention."""

    source: Source
    min_member: int | None = None
    timeout_seconds: float | None = None
    min_resources: Resources = field(default_factory=dict)
    priority_class: str | None = None
    size_field: str = ""
    """The object field ``min_member`` was read from, for a reason naming it."""


ObjectStep = Callable[[PodRecord, GangKey, Found, Objects],
                      Found | InvalidGang | MissingPodGroup]
"""Reads the gang's size from the convention's PodGroup object (or says it is missing)."""
RefineStep = Callable[[GangSpec, PodRecord, frozenset[Source], Objects], GangSpec | InvalidGang]
"""Adds the convention's own options to a resolved spec (run whether or not it is declared:
Koordinator's options may sit on a scheduler-plugins PodGroup)."""


@dataclass(frozen=True, slots=True)
class PodGroupAPI:
    """The convention's PodGroup object: ``/apis/{group}/{version}/{plural}``, and how a
    served object becomes the record the core stores."""

    group: str
    version: str
    plural: str
    parse: Callable[[Mapping[str, Any]], PodGroupRecord]
    """A served object's JSON to the record the store keeps (a bad spec field becomes the
    record's ``error``, which every member's declaration then reports)."""
    size_field: str = "PodGroup.spec.minMember"
    """The object's size field, as a reason names it (a group above ``--max-gang-size`` is
    kept with that error)."""

    @property
    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/{self.plural}"

    def status_path(self, namespace: str, name: str) -> str:
        return (f"/apis/{self.group}/{self.version}/namespaces/{namespace}/{self.plural}/"
                f"{name}/status")


@dataclass(frozen=True, slots=True)
class Watch:
    """An API object the core reads, declared as data: where it is served, how a served
    object becomes the core's record, and the core's key for a deleted one. The adapter lists
    and watches each one (``coscheduling.events.watched``)."""

    name: str
    """The resource's name in metrics and logs."""
    parse: Callable[[Mapping[str, Any], str], Any]
    """A served object's JSON and the version it was served at, to the core's record."""
    path: str = ""
    """The list path; "" when the version is found by API discovery (``discover``)."""
    key_of: Callable[[str, str], Any] = gang_key
    """(namespace, name) of a deleted object to the core's key for it."""
    optional: bool = True
    """It may not be served (a CRD not installed, an API not enabled): a 404 counts as an
    empty, synced list, looked for again later."""
    discover: tuple[str, str, tuple[str, ...]] | None = None
    """(API group, plural, versions by preference): the path is found by discovery."""
    into: Into = "groups"
    """What the objects are to the core, which picks the rules their events go through
    (``coscheduling.events.ingest``): ``groups``, PodGroup records kept by gang key whose pods are
    resolved again when one comes, changes or goes (any convention with a PodGroup object
    like scheduler-plugins'); the others are one convention's own objects, with their own
    rules in the core (Kubernetes' PodGroups and Workloads, Volcano's Queues)."""
    size_field: str = ""
    """For ``groups``: the object's size field a reason names."""

    @staticmethod
    def of(api: PodGroupAPI, name: str) -> Watch:
        """The watch of a convention's PodGroup object."""
        return Watch(name, lambda obj, _: api.parse(obj), api.path, size_field=api.size_field)


Into = Literal["groups", "upstream-podgroups", "upstream-workloads", "upstream-composites",
               "volcano-queues", "own"]
"""What a watched object is to the core (:attr:`Watch.into`); ``own`` marks Kubernetes'
own kinds (nodes, pods, ...), which ``coscheduling.events.watched`` pairs with their rules."""

Render = Callable[[Reason], str]
"""A reason in words (the adapter's ``app.render.render``): conditions carry the sentence
Events and ``explain`` say."""


@dataclass(frozen=True, slots=True)
class StatusPatch:
    """One status write: a PATCH of ``path`` with ``{"status": status}``."""

    key: GangKey
    path: str
    status: Mapping[str, Any]
    strategic: bool = False
    """A strategic merge patch as field manager :data:`FIELD_MANAGER` (a condition merged
    into the list by its type); otherwise a JSON merge patch."""
    remembered: bool = True
    """Not sent again while equal to the last one written (condition times aside). False
    when the convention compares with the object as the watch brought it back instead."""


@dataclass(frozen=True, slots=True)
class MemberCounts:
    """A gang's members as the cluster shows them (every phase), counted for its status."""

    total: int = 0
    scheduled: int = 0
    """On a node, finished ones too (scheduler-plugins' ``scheduled``)."""
    placed: int = 0
    """On a node and not finished, deleting ones too: they still take the node's room."""
    bound: int = 0
    """On a node and live (neither deleting, finished nor gated): what counts toward the
    gang's minimum."""
    running: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class GangStatusModel:
    """What any convention's status needs of one gang, as the core decided it."""

    key: GangKey
    source: Source | None
    """The convention its spec came from; None when its declaration is invalid."""
    min_member: int | None
    """Its minimum (None when its declaration is invalid)."""
    members: MemberCounts = field(default_factory=MemberCounts)
    holding: bool = False
    """It holds a reservation or parked binds: it is being scheduled."""
    partial: PartiallyBound | None = None
    """A binding failed for good after siblings bound (never hidden)."""
    reason: GangReason | None = None
    """Why it is not bound, when the core said; for an invalid declaration, its first
    member's, naming the field and its limit."""
    parts: tuple[GangStatusModel, ...] = ()
    """A Koordinator gang group's gangs (a PodGroup each), each with its own members and
    minimum, and the group's ``holding`` and ``partial``."""
    requests: tuple[Resources, ...] = ()
    """Its members' requests in name order (a Volcano group without ``minResources`` asks
    its queue for these)."""
    queue: str | None = None
    """Its Volcano queue; None for any other convention."""
    allocated: Resources = field(default_factory=dict)
    """For a Volcano gang, what it holds in its queue: its reservations and its bound live
    members' requests (Volcano's ``allocated``)."""


@dataclass(frozen=True, slots=True)
class StatusModel:
    """Everything the conventions' statuses are made from, one snapshot built by the core
    in one pass (``coscheduling.readmodel.status_model``): the statuses of one pass agree
    with each other, and none is computed while the core changes under it."""

    gangs: Mapping[GangKey, GangStatusModel] = field(default_factory=dict)
    """Every gang some status may speak of: one with an object of its key, a gang group, or
    a gang in a Volcano queue. A key not here has no members."""
    objects: Objects = field(default_factory=dict)
    """The PodGroup objects as watched, by convention (invalid ones with their error)."""
    upstream: Mapping[GangKey, UpstreamPodGroup] = field(default_factory=dict)
    """Kubernetes' own PodGroups, as watched."""
    queues: Mapping[str, QueueRecord] | None = None
    """Volcano's Queues by name; None while their CRD is not served (nothing is gated)."""
    free: Resources = field(default_factory=dict)
    """The cluster's capacity outside bound pods and gang reservations, which Volcano's
    enqueue step hands out; summed only while a Volcano PodGroup exists (no other status
    reads it, and it is a pass over every node)."""


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """How a convention's status is written back, which the adapter's one writer loop reads
    for every convention in the registry (``app.effects.status_writer``)."""

    group: str
    """The API group written to (for logs)."""
    patches: Callable[[StatusModel, Render, str], Iterable[StatusPatch]]
    """From the core's status model, the wording of reasons and now (RFC 3339): each status
    to write this pass."""


@dataclass(frozen=True, slots=True)
class Convention:
    source: Source
    declares: tuple[Key, ...] = ()
    """Keys whose value names the pod's gang, in the order they are looked at."""
    size: tuple[tuple[Key, Key | None], ...] = ()
    """(minimum-members key, timeout key or None) pairs read from the pod."""
    spec_fields: tuple[tuple[str, ...], ...] = ()
    """Pod spec paths whose value names a gang object (Kubernetes' own API)."""
    podgroup: PodGroupAPI | None = None
    """Its PodGroup object, when the convention has one Lockstep reads and writes back to."""
    from_object: ObjectStep | None = None
    refine: RefineStep | None = None
    watches: tuple[Watch, ...] = ()
    """The objects the adapter lists and watches for it, in order."""
    status: StatusWrite | None = None
    """How its status is written back; None when it has none (its gangs live on pods)."""
    reads_object: Callable[[PodRecord], str | None] | None = None
    """The name of an object of its ``watches`` a pod's resolution reads besides the one
    it declares (a JobSet, whose pods may declare their gang by another convention): the
    pod is resolved again when that object comes, changes or goes."""

    @property
    def size_key(self) -> str:
        """The key a person should set when the size is missing."""
        return self.size[0][0].name if self.size else "minMember"
