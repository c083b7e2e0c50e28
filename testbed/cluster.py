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
        pods: "110"
        # count: 10                # instead of racks: this many nodes, racks filled in order
        # racks_per_block: 4       # -> lockstep.dev/block (default: all racks in one block)
        # island_size: 4           # nvlink-islands only
        # zone: zone-a
        # labels: {extra: label}
        # dra: true                # GPUs as ResourceSlices of the fake DRA driver (below)
        # pcie_roots: 2            # dra only: PCIe root complexes per node (default numa_nodes)
    # nodes: 1000                  # optional: scale the file to this many nodes (see below)

A top-level ``nodes: N`` (or ``nodes_from_topology(doc, nodes=N)``) scales a file for load
tests: every group's racks repeat in the same pattern until the cluster has at least N nodes,
then the list is cut at N (``bench-64x8`` with ``nodes: 1000`` is 125 racks of 8 H100 nodes).

Nodes carry what real nodes carry: ``nvidia.com/gpu`` allocatable, GPU Feature Discovery
labels, rack/block/zone and clique labels, and the ``lockstep.dev/`` interconnect labels the
node labeller would write. A group with ``dra: true`` is a DRA-only node: no ``nvidia.com/gpu``
capacity; ``create_nodes`` publishes its GPUs as a ResourceSlice of the fake NVIDIA driver
(``testbed.dra``), with the same labels.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from . import dra
from .kube import Kube

__all__ = [
    "TOPOLOGIES",
    "TopologyError",
    "create_nodes",
    "load_topology",
    "nodes_from_topology",
    "nrt_from_node",
]

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


def _group_sizes(doc: Mapping[str, Any], nodes: int | None) -> list[tuple[int, int | None]]:
    """(racks, node cap) per group after ``count`` and the ``nodes`` scale override."""
    sizes: list[tuple[int, int | None]] = []
    for g in doc["groups"]:
        per_rack = _int(g, "nodes_per_rack", 1) or 1
        if "count" in g:
            count = _int(g, "count", 0)
            sizes.append((-(-count // per_rack), count))
        else:
            sizes.append((_int(g, "racks", 1), None))
    want = nodes if nodes is not None else doc.get("nodes")
    if want is None:
        return sizes
    if not isinstance(want, int) or want < 1:
        raise TopologyError(f"nodes must be a whole number >= 1, not {want!r}")
    total = sum(
        cap if cap is not None else racks * (_int(g, "nodes_per_rack", 1) or 1)
        for g, (racks, cap) in zip(doc["groups"], sizes, strict=True))
    if total == 0:
        raise TopologyError("cannot scale a topology without nodes")
    factor = -(-want // total)
    return [(racks * factor, cap * factor if cap is not None else None)
            for racks, cap in sizes]


def nodes_from_topology(doc: Mapping[str, Any], nodes: int | None = None
                        ) -> list[dict[str, Any]]:
    """Node objects (JSON) for a topology document; ``nodes`` scales it (see module doc)."""
    out: list[dict[str, Any]] = []
    for g, (racks, cap) in zip(doc["groups"], _group_sizes(doc, nodes), strict=True):
        name = str(g.get("name") or "node")
        per_rack = _int(g, "nodes_per_rack", 1)
        made = 0
        gpus = _int(g, "gpus", 0)
        numa = _int(g, "numa_nodes", 1) or 1
        kind = str(g.get("interconnect", "nvswitch" if gpus >= 4 else "pcie"))
        if kind not in ("nvswitch", "nvlink-pairs", "nvlink-islands", "pcie"):
            raise TopologyError(f"group {name!r}: unknown interconnect {kind!r}")
        island = _ISLAND.get(kind) or _int(g, "island_size", gpus)
        product = str(g.get("product", "NVIDIA-H100-80GB-HBM3"))
        family = next((f for k, f in _FAMILY.items() if k in product), "unknown")
        racks_per_block = _int(g, "racks_per_block", max(racks, 1)) or 1
        use_dra = g.get("dra", False)
        if not isinstance(use_dra, bool):
            raise TopologyError(f"group {name!r}: dra must be true or false, not {use_dra!r}")
        for r in range(racks):
            for i in range(per_rack):
                if cap is not None and made >= cap:
                    break
                made += 1
                node = (f"{name}-r{r}-n{i}" if racks > 1 or g.get("racks") or "count" in g
                        else f"{name}-{i}")
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
                annotations = {"kwok.x-k8s.io/node": "fake"}
                if gpus and use_dra:
                    annotations[dra.DRA_GPUS] = str(gpus)
                    annotations[dra.PCIE_ROOTS] = str(_int(g, "pcie_roots", numa) or 1)
                elif gpus:
                    resources["nvidia.com/gpu"] = str(gpus)
                out.append({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node, "labels": labels, "annotations": annotations},
                    "spec": {},
                    "status": {"allocatable": resources, "capacity": resources},
                })
    want = nodes if nodes is not None else doc.get("nodes")
    return out[:want] if isinstance(want, int) else out


def nrt_from_node(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The NodeResourceTopology (topology.node.k8s.io/v1alpha2) a GPU node's exporter would
    publish: one zone per NUMA node with an equal share of its GPUs, all available.

    Create these only on a test bed started with ``TestBed(with_nrt=True)`` (the CRD)."""
    labels = node["metadata"].get("labels") or {}
    gpus = int(labels.get("nvidia.com/gpu.count", "0"))
    numa = int(labels.get("lockstep.dev/numa-nodes", "1")) or 1
    if not gpus or dra.is_dra_node(node):  # a DRA node's GPUs are no nvidia.com/gpu
        return None
    per = str(gpus // numa)
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node["metadata"]["name"]},
        "topologyPolicies": ["None"],
        "zones": [
            {"name": f"node-{z}", "type": "Node", "resources": [
                {"name": "nvidia.com/gpu", "capacity": per, "allocatable": per,
                 "available": per}]}
            for z in range(numa)
        ],
    }


def create_nodes(kube: Kube, nodes: Iterable[dict[str, Any]], workers: int = 32,
                 *, nrt: bool = False) -> int:
    """Create nodes concurrently (1,000 in about 2 s); returns how many were created.

    ``nrt`` also creates each GPU node's NodeResourceTopology (needs the NRT CRD). DRA nodes
    (``dra: true``) get their ResourceSlice, owned by the node, and the DeviceClass."""
    items = list(nodes)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        made = list(pool.map(lambda n: kube.create("/api/v1/nodes", n), items))
        if any(map(dra.is_dra_node, made)):
            dra.publish(kube, made)
        if nrt:
            objs = [o for o in map(nrt_from_node, items) if o is not None]
            list(pool.map(lambda o: kube.create(_NRTS, o), objs))
    return len(items)


_NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
