"""What the core reads from the API server, as one table the adapter loops over.

Each entry joins a :class:`~coscheduling.conventions.base.Watch` (where an object is served,
how it is parsed, the key of a deleted one) with the ingest table entry its events go to
(``coscheduling.ingest``). The conventions declare their own objects (``WATCHES`` in each
convention module); Kubernetes' own kinds are declared here. The adapter's cache
(``app.cache``) lists and watches exactly these, in this order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import dra_events as devices
from . import ingest
from .conventions import scheduler_plugins, upstream, volcano
from .conventions.base import Watch
from .devices.wire import claim_from_json, class_from_json, slice_from_json, template_from_json
from .ingest import Kind
from .numa import nrt_from_json
from .preemption.budgets import budget_from_json
from .records import NodeName, node_from_json, pod_from_json, pod_key, priority_class_from_json

__all__ = ["WATCHED", "Watched"]


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
         key_of: Callable[[str, str], Any]) -> Watch:
    return Watch(plural, devices.watch_parse(parse), "", key_of,
                 discover=(DRA_GROUP, plural, DRA_VERSIONS))


_SP = scheduler_plugins.WATCHES
_VOLCANO = volcano.WATCHES
_UPSTREAM = upstream.WATCHES

WATCHED: tuple[Watched, ...] = (
    Watched(Watch("nodes", lambda o, _: node_from_json(o), "/api/v1/nodes", _cluster_scoped,
                  optional=False), ingest.NODES, protobuf=True, first_from_cache=True),
    Watched(Watch("pods", lambda o, _: pod_from_json(o), "/api/v1/pods", pod_key,
                  optional=False), ingest.PODS),
    Watched(_SP[0], ingest.SP_PODGROUPS),
    Watched(_VOLCANO[0], ingest.VOLCANO_PODGROUPS),
    Watched(_VOLCANO[1], ingest.QUEUES),
    Watched(Watch("noderesourcetopologies", lambda o, _: nrt_from_json(o),
                  "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
                  _cluster_scoped), ingest.NUMA),
    Watched(Watch("poddisruptionbudgets", lambda o, _: budget_from_json(o),
                  "/apis/policy/v1/poddisruptionbudgets", lambda ns, name: f"{ns}/{name}",
                  optional=False), ingest.PDBS),
    Watched(Watch("priorityclasses", lambda o, _: priority_class_from_json(o),
                  "/apis/scheduling.k8s.io/v1/priorityclasses", _cluster_scoped,
                  optional=False), ingest.PRIORITY_CLASSES),
    Watched(_UPSTREAM[0], ingest.UPSTREAM_PODGROUPS),
    Watched(_UPSTREAM[1], ingest.WORKLOADS),
    # Dynamic Resource Allocation (GA in 1.34): optional, found by discovery, so a cluster
    # without the API (or an older one) runs as before (docs/dra.md).
    Watched(_dra("deviceclasses", class_from_json, _cluster_scoped), devices.CLASSES),
    Watched(_dra("resourceslices", slice_from_json, _cluster_scoped), devices.SLICES),
    Watched(_dra("resourceclaims", claim_from_json, _namespaced), devices.CLAIMS),
    Watched(_dra("resourceclaimtemplates", template_from_json, _namespaced),
            devices.TEMPLATES),
)
