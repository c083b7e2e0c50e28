"""What a gang convention is: the small interface every module in this package fills in.

As data: the keys a pod names its gang by, the keys that give its size and timeout, the pod
spec fields that point at a gang object, and the API of the PodGroup object it has (where the
adapter watches it, how its JSON becomes a record, where its status is written). As
behaviour, two optional steps of the resolver (``coscheduling.conventions``):
``from_object`` reads the size from the convention's PodGroup object (run when the pod
declares the convention), and ``refine`` adds the convention's own options to a resolved spec
(run for every gang: Koordinator's options may sit on a scheduler-plugins PodGroup).

This module imports only the value modules (the gang declaration, the pod record), so each
convention module stays near the bottom of the import graph and the webhook, the store and
the resolver can all read them without a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..podgroup import GangKey, GangSpec, InvalidGang, MissingPodGroup, Source
from ..records import PodRecord, gang_key
from ..resources import Resources

__all__ = [
    "MAX_GANG_SIZE_FLAG",
    "Convention",
    "Found",
    "Key",
    "ObjectStep",
    "Objects",
    "PodGroupAPI",
    "PodGroupRecord",
    "RefineStep",
    "Source",
    "Watch",
    "lookup",
]


MAX_GANG_SIZE_FLAG = "--max-gang-size"
"""What a reason names as the limit of a gang's size (the flag that sets it)."""


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
    and watches each one (``coscheduling.watched``)."""

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

    @staticmethod
    def of(api: PodGroupAPI, name: str) -> Watch:
        """The watch of a convention's PodGroup object."""
        return Watch(name, lambda obj, _: api.parse(obj), api.path)


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

    @property
    def size_key(self) -> str:
        """The key a person should set when the size is missing."""
        return self.size[0][0].name if self.size else "minMember"
