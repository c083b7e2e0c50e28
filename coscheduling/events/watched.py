"""What the core reads from the API server, as one table the adapter loops over.

Each entry joins a :class:`~coscheduling.conventions.base.Watch` (where an object is served,
how it is parsed, the key of a deleted one) with the ingest table entry its events go to
(``coscheduling.events.ingest``). Kubernetes' own kinds are declared here (DRA's four among them,
optional and found by discovery, their events fed to the devices wing); the conventions declare
their own objects (``Convention.watches``), and :func:`table` takes them from the registry as
it is, each paired with its entry by ``ingest.kind_of``. The adapter's cache (``app.kube.cache``)
lists and watches exactly these, in this order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import conventions
from ..conventions.base import Watch
from ..devices.wire import claim_from_json, class_from_json, slice_from_json, template_from_json
from ..preemption.budgets import budget_from_json
from ..records import NodeName, node_from_json, pod_from_json, pod_key, priority_class_from_json
from ..topology.domains import nrt_from_json
from . import ingest
from .ingest import Kind

__all__ = ["OWN", "Watched", "table"]


@dataclass(frozen=True, slots=True)
class Watched:
    """One resource the core reads: its watch and the ingest entry its events go to."""

    watch: Watch
    kind: Kind[Any, Any]
    protobuf: bool = False
    """Lists may be asked for in protobuf (built-in kinds only; nodes, whose JSON is big)."""
    first_from_cache: bool = False
    """The first list may come from the API server's watch cache (a small whole list)."""


def _cluster_scoped(_: str, name: str) -> NodeName:
    return NodeName(name)


def _namespaced(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1",)
"""``resource.k8s.io`` versions read: v1 only (its shape is the one parsed)."""


def _dra(plural: str, parse: Callable[[Mapping[str, Any]], Any],
         key_of: Callable[[str, str], Any]) -> Watched:
    """A DRA kind (GA in 1.34): optional, its path found by discovery, so a cluster without
    the API (or an older one) runs as before (docs/dra.md). The served version is always v1
    here, so the parse ignores it."""
    return Watched(Watch(plural, lambda obj, _version: parse(obj), "", key_of,
                         discover=(DRA_GROUP, plural, DRA_VERSIONS), into="own"),
                   ingest.DEVICE_KINDS[plural])


OWN: tuple[Watched, ...] = (
    Watched(Watch("nodes", lambda o, _: node_from_json(o), "/api/v1/nodes", _cluster_scoped,
                  optional=False, into="own"), ingest.NODES, protobuf=True, first_from_cache=True),
    Watched(Watch("pods", lambda o, _: pod_from_json(o), "/api/v1/pods", pod_key,
                  optional=False, into="own"), ingest.PODS),
    Watched(Watch("noderesourcetopologies", lambda o, _: nrt_from_json(o),
                  "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
                  _cluster_scoped, into="own"), ingest.NUMA),
    Watched(Watch("poddisruptionbudgets", lambda o, _: budget_from_json(o),
                  "/apis/policy/v1/poddisruptionbudgets", lambda ns, name: f"{ns}/{name}",
                  optional=False, into="own"), ingest.PDBS),
    Watched(Watch("priorityclasses", lambda o, _: priority_class_from_json(o),
                  "/apis/scheduling.k8s.io/v1/priorityclasses", _cluster_scoped,
                  optional=False, into="own"), ingest.PRIORITY_CLASSES),
    _dra("deviceclasses", class_from_json, _cluster_scoped),
    _dra("resourceslices", slice_from_json, _cluster_scoped),
    _dra("resourceclaims", claim_from_json, _namespaced),
    _dra("resourceclaimtemplates", template_from_json, _namespaced),
)
"""Kubernetes' own kinds the core reads, DRA's ``resource.k8s.io/v1`` kinds last."""


def table() -> tuple[Watched, ...]:
    """Everything the core reads: Kubernetes' own kinds, then each registered convention's
    objects in registry order."""
    return OWN + tuple(Watched(w, ingest.kind_of(c, w))
                       for c in conventions.REGISTRY for w in c.watches)
