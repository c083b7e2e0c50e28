"""Simulated GPU clusters from a small declarative topology file.

A topology file lists node groups; each group says how many racks of how many nodes, what
GPUs they carry and how those GPUs are wired::

    groups:
      - name: h100                 # node names: h100-r0-n0, h100-r0-n1, ...
        racks: 2                   # -> lockstep.dev/rack (and block, zone)
        nodes_per_rack: 4
        gpus: 8
        product: NVIDIA-H100-80GB-HBM3
        memory_mib: 81559
        interconnect: nvswitch     # nvswitch | nvlink-pairs | nvlink-islands | pcie
        numa_nodes: 2
        clique_per_rack: false     # GB200 NVL72: each rack is one NVLink clique
        cpu: "192"
        memory: 2Ti

Nodes carry what real nodes carry: ``nvidia.com/gpu`` allocatable, GPU Feature Discovery
labels, rack/block/zone and clique labels, and the ``lockstep.dev/`` interconnect labels the
node labeller would write.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .kube import Kube

__all__ = ["TOPOLOGIES", "create_nodes", "load_topology", "nodes_from_topology"]

TOPOLOGIES = Path(__file__).with_name("topologies")
_FAMILY = {"H100": "hopper", "H200": "hopper", "GB200": "blackwell", "B200": "blackwell",
           "A100": "ampere", "L40S": "ada-lovelace", "L4": "ada-lovelace"}
_ISLAND = {"nvswitch": None, "nvlink-pairs": 2, "pcie": 1}


class TopologyError(ValueError):
    pass


def load_topology(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists() and (TOPOLOGIES / f"{path}.yaml").exists():
        p = TOPOLOGIES / f"{path}.yaml"
    doc = yaml.safe_load(p.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise TopologyError(f"{p}: expected a mapping with a 'groups' list")
    return doc


def _int(group: Mapping[str, Any], key: str, default: int) -> int:
    v = group.get(key, default)
    if not isinstance(v, int) or v < 0:
        raise TopologyError(f"group {group.get('name')!r}: {key} must be a whole number >= 0")
    return v


def nodes_from_topology(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for g in doc["groups"]:
        name = str(g.get("name") or "node")
        racks = _int(g, "racks", 1)
        per_rack = _int(g, "nodes_per_rack", 1)
        gpus = _int(g, "gpus", 0)
        numa = _int(g, "numa_nodes", 1) or 1
        kind = str(g.get("interconnect", "nvswitch" if gpus >= 4 else "pcie"))
        if kind not in ("nvswitch", "nvlink-pairs", "nvlink-islands", "pcie"):
            raise TopologyError(f"group {name!r}: unknown interconnect {kind!r}")
        island = _ISLAND.get(kind) or _int(g, "island_size", gpus)
        product = str(g.get("product", "NVIDIA-H100-80GB-HBM3"))
        family = next((f for k, f in _FAMILY.items() if k in product), "unknown")
        racks_per_block = _int(g, "racks_per_block", max(racks, 1)) or 1
        for r in range(racks):
            for i in range(per_rack):
                node = f"{name}-r{r}-n{i}" if racks > 1 or g.get("racks") else f"{name}-{i}"
                labels = {
                    "kubernetes.io/hostname": node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    "topology.kubernetes.io/zone": str(g.get("zone", "zone-a")),
                    "lockstep.dev/block": f"{name}-b{r // racks_per_block}",
                    "lockstep.dev/rack": f"{name}-r{r}",
                }
                if gpus:
                    labels.update({
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.count": str(gpus),
                        "nvidia.com/gpu.product": product,
                        "nvidia.com/gpu.memory": str(g.get("memory_mib", 81559)),
                        "nvidia.com/gpu.family": family,
                        "lockstep.dev/gpu-interconnect": kind,
                        "lockstep.dev/nvlink-island-size": str(island if kind != "nvswitch"
                                                               else gpus),
                        "lockstep.dev/numa-nodes": str(numa),
                        "lockstep.dev/gpus-per-numa": str(gpus // numa),
                    })
                    if g.get("clique_per_rack"):
                        labels["nvidia.com/gpu.clique"] = f"cluster-{name}.{r}"
                labels.update({str(k): str(v) for k, v in (g.get("labels") or {}).items()})
                resources = {
                    "cpu": str(g.get("cpu", "192")),
                    "memory": str(g.get("memory", "2Ti")),
                    "pods": str(g.get("pods", "110")),
                    "ephemeral-storage": "1Ti",
                }
                if gpus:
                    resources["nvidia.com/gpu"] = str(gpus)
                nodes.append({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node, "labels": labels,
                                 "annotations": {"kwok.x-k8s.io/node": "fake"}},
                    "spec": {},
                    "status": {"allocatable": resources, "capacity": resources},
                })
    return nodes


def create_nodes(kube: Kube, nodes: Iterable[dict[str, Any]], workers: int = 32) -> int:
    """Create nodes concurrently; returns how many were created."""
    items = list(nodes)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: kube.create("/api/v1/nodes", n), items))
    return len(items)
