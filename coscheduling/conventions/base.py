"""What a gang convention is, as data: the keys a pod names its gang by, the keys that give
its size and timeout, the pod spec fields that point at a gang object, and the API of the
PodGroup object it has (where the adapter watches it and writes its status).

A leaf: it imports nothing from the rest of the package, so the pod record, the webhook's
decision and the resolver can all read the conventions without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

__all__ = ["Convention", "Key", "PodGroupAPI", "Source"]


class Source(Enum):
    """Which convention a gang was declared by (what its status is written back as)."""

    LOCKSTEP = "lockstep"
    SCHEDULER_PLUGINS = "scheduler-plugins"
    VOLCANO = "volcano"
    KOORDINATOR = "koordinator"
    KUEUE = "kueue"
    UPSTREAM = "scheduling.k8s.io"
    """Kubernetes' own Workload / PodGroup API (``coscheduling/upstream.py``)."""


@dataclass(frozen=True, slots=True)
class Key:
    """A pod metadata key, and where the convention lets it be written."""

    name: str
    on: Literal["annotation", "label", "either"]


@dataclass(frozen=True, slots=True)
class PodGroupAPI:
    """The convention's PodGroup object: ``/apis/{group}/{version}/{plural}``."""

    group: str
    version: str
    plural: str

    @property
    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/{self.plural}"

    def status_path(self, namespace: str, name: str) -> str:
        return (f"/apis/{self.group}/{self.version}/namespaces/{namespace}/{self.plural}/"
                f"{name}/status")


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

    @property
    def size_key(self) -> str:
        """The key a person should set when the size is missing."""
        return self.size[0][0].name if self.size else "minMember"
