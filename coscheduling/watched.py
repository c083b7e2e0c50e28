"""What the core reads from the API server, as one table the adapter loops over.

Each entry joins a :class:`~coscheduling.conventions.base.Watch` (where an object is served,
how it is parsed, the key of a deleted one) with the ingest table entry its events go to
(``coscheduling.ingest``). Kubernetes' own kinds are declared here; the conventions declare
their own objects (``Convention.watches``), and :func:`table` takes them from the registry as
it is, each paired with its entry by ``ingest.kind_of``. The adapter's cache (``app.cache``)
lists and watches exactly these, in this order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import conventions, ingest
from .conventions.base import Watch
from .ingest import Kind
from .preemption.budgets import budget_from_json
from .records import NodeName, node_from_json, pod_from_json, pod_key, priority_class_from_json
from .topology import nrt_from_json

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
)
"""Kubernetes' own kinds the core reads."""


def table() -> tuple[Watched, ...]:
    """Everything the core reads: Kubernetes' own kinds, then each registered convention's
    objects in registry order."""
    return OWN + tuple(Watched(w, ingest.kind_of(c, w))
                       for c in conventions.REGISTRY for w in c.watches)
