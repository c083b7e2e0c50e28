"""Topology from node labels: domains between nodes, GPU islands inside them, and scores.

Between nodes, topology is an ordered list of levels, coarse to fine, each read from the first
label a node carries out of several vendors' spellings (NVIDIA Topograph, GKE, AWS, OCI,
Volcano, our own). A domain is the path of values down to a level, so "rack r1" in block b1
and in block b2 are different domains.

Inside a node, no Kubernetes standard exists; the ``lockstep.dev/`` labels written by
``lockstep label-node`` describe NVLink islands and NUMA nodes. A node without them is treated
as one island of all its GPUs: plain bin-packing, never an error.

Per-NUMA free GPUs also come from ``NodeResourceTopology`` objects (``topology.node.k8s.io``,
:class:`NumaZones`). Clusters running Node Feature Discovery's topology updater (or the
NFD-like exporters that scheduler-plugins' NodeResourceTopologyMatch and KAI read) publish one
object per node, with a zone per NUMA node and, for each resource, what is still *available*
there. When present, that live figure beats anything Lockstep can infer from labels; when
absent, the labels and bin-packing model stand in. Both are where a node's GPUs sit, so they
are one module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..records import NodeName, NodeRecord
from ..resources import QuantityError, parse_quantity

__all__ = [
    "DEFAULT_LEVELS",
    "GPU",
    "GPUS_PER_NUMA_LABEL",
    "HOSTNAME",
    "INTERCONNECT_LABEL",
    "ISLAND_SIZE_LABEL",
    "NUMA_NODES_LABEL",
    "GpuLayout",
    "Level",
    "NumaZones",
    "Score",
    "domain_of",
    "explain_score",
    "gpu_layout",
    "level_by_name",
    "nrt_from_json",
    "pack_islands",
]

GPU = "nvidia.com/gpu"
HOSTNAME = "kubernetes.io/hostname"
INTERCONNECT_LABEL = "lockstep.dev/gpu-interconnect"
ISLAND_SIZE_LABEL = "lockstep.dev/nvlink-island-size"
NUMA_NODES_LABEL = "lockstep.dev/numa-nodes"
GPUS_PER_NUMA_LABEL = "lockstep.dev/gpus-per-numa"


@dataclass(frozen=True, slots=True)
class Level:
    name: str
    keys: tuple[str, ...]
    """Label keys that express this level, first present wins."""

    def value(self, labels: Mapping[str, str]) -> str | None:
        for k in self.keys:
            v = labels.get(k)
            if v:
                return v
        return None


DEFAULT_LEVELS: tuple[Level, ...] = (
    Level("zone", ("topology.kubernetes.io/zone",)),
    Level(
        "block",
        (
            "lockstep.dev/block",
            "fabric.topograph.run/tier-3",
            "cloud.google.com/gce-topology-block",
            "topology.k8s.aws/network-node-layer-1",
            "oci.oraclecloud.com/host.network_block_id",
            "network.topology.nvidia.com/spine",
        ),
    ),
    Level(
        "rack",
        (
            "lockstep.dev/rack",
            "fabric.topograph.run/tier-2",
            "cloud.google.com/gce-topology-subblock",
            "topology.k8s.aws/network-node-layer-2",
            "oci.oraclecloud.com/rack_id",
            "volcano.sh/tor",
            "network.topology.nvidia.com/accelerator",
        ),
    ),
    Level(
        "clique",
        (
            "nvidia.com/gpu.clique",
            "accelerator.topograph.run/domain",
            "fabric.topograph.run/tier-1",
            "topology.k8s.aws/network-node-layer-3",
        ),
    ),
    Level("hostname", (HOSTNAME,)),
)


def level_by_name(levels: Sequence[Level], name: str) -> Level | None:
    """A level by its short name ("rack") or by one of its label keys."""
    for lv in levels:
        if lv.name == name or name in lv.keys:
            return lv
    if name == "node":
        return level_by_name(levels, "hostname")
    return None


def domain_of(levels: Sequence[Level], index: int, node: NodeRecord) -> tuple[str, ...] | None:
    """The domain path of ``node`` down to ``levels[index]``; None when it lacks that level."""
    lv = levels[index]
    if lv.keys == (HOSTNAME,):
        own: str | None = node.labels.get(HOSTNAME) or node.name
    else:
        own = lv.value(node.labels)
    if own is None:
        return None
    return (*(lv_.value(node.labels) or "" for lv_ in levels[:index]), own)


@dataclass(frozen=True, slots=True)
class GpuLayout:
    islands: tuple[int, ...]
    """Sizes of the NVLink islands (one island of all GPUs for NVSwitch, 1s for PCIe)."""
    numa: tuple[int, ...]
    """GPUs per NUMA node."""
    labelled: bool


MAX_LABEL_INT = 10**6
"""The largest count a topology label is read as (an island of GPUs, say): a label value
may hold 63 digits, and no node has a million GPUs."""


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    """A positive count from a node label, or None: ASCII digits only (``int()`` also reads
    other scripts' digits), at most :data:`MAX_LABEL_INT`."""
    text = labels.get(key, "")
    if not text.isascii() or not text.isdigit() or len(text) > 7:
        return None
    v = int(text)
    return v if 0 < v <= MAX_LABEL_INT else None


def gpu_layout(node: NodeRecord) -> GpuLayout:
    total = node.allocatable.get(GPU, 0)
    kind = node.labels.get(INTERCONNECT_LABEL)
    size = _int_label(node.labels, ISLAND_SIZE_LABEL)
    labelled = kind is not None
    if kind == "pcie":
        size = 1
    elif kind == "nvswitch":
        size = total or size
    elif kind == "nvlink-pairs":
        size = 2
    if not size or total <= 0 or size > total:
        size, labelled = max(total, 1), False  # unknown or inconsistent: one island
    islands = tuple([size] * (total // size) + ([total % size] if total % size else []))
    numa_n = _int_label(node.labels, NUMA_NODES_LABEL)
    per = _int_label(node.labels, GPUS_PER_NUMA_LABEL)
    if numa_n and per and numa_n * per == total:
        numa = tuple([per] * numa_n)
    else:
        numa = (total,) if total else ()
    return GpuLayout(islands, numa, labelled)


def pack_islands(islands: Sequence[int], pods: Iterable[int]) -> list[int]:
    """Free GPUs left per island after placing ``pods`` (GPU counts) best-fit.

    Models a device plugin that allocates NVLink-aligned GPU sets (as NVIDIA's preferred
    allocation does): each pod goes to the island it fills most tightly, and a pod larger
    than any island takes whole islands.
    """
    free = list(islands)
    for g in sorted(pods, reverse=True):
        if g <= 0:
            continue
        candidates = [i for i, f in enumerate(free) if f >= g]
        if candidates:
            i = min(candidates, key=lambda i: (free[i] - g, i))
            free[i] -= g
            continue
        for i in sorted(range(len(free)), key=lambda i: -free[i]):
            take = min(free[i], g)
            free[i] -= take
            g -= take
            if g == 0:
                break
    return free


@dataclass(frozen=True, slots=True)
class Score:
    """A node's score for one pod and what it is made of, for the explain endpoint."""

    total: int
    packing: float
    """0..10: how full the node is after placement (fewer stranded remainders)."""
    locality: float
    """0..10: the pod's GPUs on one NVLink island / one NUMA zone."""
    why: str


def explain_score(
    node: NodeRecord,
    gpus: int,
    free_gpus: int,
    used_gpu_pods: Iterable[int],
    layout: GpuLayout | None = None,
    numa_free: Sequence[int] | None = None,
) -> Score:
    """Half bin-packing, half locality inside the node.

    Bin-packing: a fuller node after placement scores higher, so fewer nodes are left with
    stranded remainders. Locality: all the pod's GPUs on one NVLink island, else on one NUMA
    node; ``numa_free`` (per-NUMA available GPUs from NodeResourceTopology) is used when the
    cluster publishes it. A pod without GPUs prefers nodes without GPUs.
    """
    total = node.allocatable.get(GPU, 0)
    if gpus <= 0:
        if total == 0:
            return Score(10, 10.0, 10.0, "no GPUs requested, node has none")
        return Score(2, 0.0, 0.0, "no GPUs requested: keep GPU nodes for GPU pods")
    if total <= 0 or free_gpus < gpus:
        return Score(0, 0.0, 0.0, f"{free_gpus} GPUs free, {gpus} needed")
    pack = 10.0 * (total - free_gpus + gpus) / total
    layout = layout or gpu_layout(node)
    if len(layout.islands) == 1:
        locality, why = 10.0, "one NVLink domain" if layout.labelled else "no interconnect labels"
    else:
        island_free = pack_islands(layout.islands, used_gpu_pods)
        fitting = [f for f in island_free if f >= gpus]
        if fitting:
            exact = min(fitting) == gpus
            locality, why = (10.0, "fills an NVLink island") if exact else (
                9.0, "fits one NVLink island")
        elif gpus > max(layout.islands):
            locality, why = 7.0, "larger than any NVLink island"
        elif len(layout.numa) > 1 and gpus <= max(layout.numa):
            locality, why = 4.0, "no free NVLink island; one NUMA node"
        else:
            locality, why = 2.0, "no free NVLink island"
    if numa_free:
        zones = [a for a in numa_free if a >= gpus]
        if zones:
            numa = 10.0 if min(zones) == gpus else 9.0
        else:
            numa = 7.0 if gpus > max(layout.numa or (total,)) else 3.0
        locality = (locality + numa) / 2
        why += f"; NUMA free {list(numa_free)}"
    score = max(0, min(10, round(0.5 * pack + 0.5 * locality)))
    return Score(score, round(pack, 1), round(locality, 1), why)


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
