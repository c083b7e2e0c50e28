"""Per-NUMA free capacity from ``NodeResourceTopology`` objects (``topology.node.k8s.io``).

Clusters running Node Feature Discovery's topology updater (or the NFD-like exporters that
scheduler-plugins' NodeResourceTopologyMatch and KAI read) publish one object per node, with
a zone per NUMA node and, for each resource, what is still *available* there. When present,
that live figure beats anything Lockstep can infer from labels; when absent, the
``lockstep.dev/`` labels and bin-packing model stand in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .records import NodeName
from .resources import QuantityError, parse_quantity
from .topology import GPU

__all__ = ["NumaZones", "nrt_from_json"]


@dataclass(frozen=True, slots=True)
class NumaZones:
    node: NodeName
    gpus_available: tuple[int, ...]
    """Available GPUs per NUMA zone, in the object's zone order."""

    def best_fit(self, gpus: int) -> int | None:
        """Free GPUs left in the tightest zone that holds ``gpus``; None if none does."""
        fitting = [a - gpus for a in self.gpus_available if a >= gpus]
        return min(fitting) if fitting else None


def nrt_from_json(obj: Mapping[str, Any]) -> NumaZones | None:
    """NUMA zones of one NodeResourceTopology; None when it says nothing about GPUs."""
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        return None
    zones = []
    seen = False
    for zone in obj.get("zones") or ():
        if not isinstance(zone, Mapping) or zone.get("type", "Node") != "Node":
            continue
        available = 0
        for res in zone.get("resources") or ():
            if isinstance(res, Mapping) and res.get("name") == GPU:
                seen = True
                try:
                    available = parse_quantity(res.get("available", res.get("allocatable", 0)))
                except QuantityError:
                    return None
        zones.append(available)
    if not seen:
        return None
    return NumaZones(NodeName(name), tuple(zones))
