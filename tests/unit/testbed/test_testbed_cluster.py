"""Topology files expand into the Node objects real GPU nodes would present."""

from __future__ import annotations

import pytest

from testbed.cluster import (
    TOPOLOGIES,
    TopologyError,
    load_topology,
    nodes_from_topology,
    nrt_from_node,
)


def test_two_racks_of_h100_boards() -> None:
    nodes = nodes_from_topology(load_topology("racks-2x4-h100"))
    assert len(nodes) == 8
    first = nodes[0]
    labels = first["metadata"]["labels"]
    assert first["metadata"]["name"] == "h100-r0-n0"
    assert first["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert first["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["lockstep.dev/gpu-interconnect"] == "nvswitch"
    assert labels["lockstep.dev/gpus-per-numa"] == "4"
    assert sorted({n["metadata"]["labels"]["lockstep.dev/rack"] for n in nodes}) == [
        "h100-r0", "h100-r1"]


@pytest.mark.parametrize(
    ("topology", "want_nodes", "want_gpus", "want_label"),
    [
        pytest.param("tiny-3x2", 3, 6, ("lockstep.dev/gpu-interconnect", "pcie"), id="tiny"),
        pytest.param("gb200-nvl72", 36, 144, ("nvidia.com/gpu.clique", "cluster-gb200.0"),
                     id="gb200-cliques"),
        pytest.param("pcie-pairs", 4, 16, ("lockstep.dev/nvlink-island-size", "2"), id="pairs"),
        pytest.param("bench-64x8", 64, 512, ("lockstep.dev/block", "h100-b0"), id="bench"),
    ],
)
def test_shipped_topologies(topology: str, want_nodes: int, want_gpus: int,
                            want_label: tuple[str, str]) -> None:
    nodes = nodes_from_topology(load_topology(topology))
    assert len(nodes) == want_nodes
    assert sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes) == want_gpus
    assert nodes[0]["metadata"]["labels"][want_label[0]] == want_label[1]
    assert len({n["metadata"]["name"] for n in nodes}) == want_nodes


@pytest.mark.parametrize("doc", [
    pytest.param({"groups": [{"name": "x", "gpus": -1}]}, id="negative"),
    pytest.param({"groups": [{"name": "x", "gpus": 4, "interconnect": "carrier-pigeon"}]},
                 id="unknown-interconnect"),
])
def test_bad_topologies_name_the_problem(doc: dict[str, object]) -> None:
    with pytest.raises(TopologyError, match="group 'x'"):
        nodes_from_topology(doc)


def test_every_shipped_file_loads() -> None:
    for path in TOPOLOGIES.glob("*.yaml"):
        assert nodes_from_topology(load_topology(path))


def test_nodes_override_scales_a_file_rack_by_rack() -> None:
    doc = load_topology("bench-64x8")
    nodes = nodes_from_topology(doc, nodes=1000)
    assert len(nodes) == 1000
    racks = {n["metadata"]["labels"]["lockstep.dev/rack"] for n in nodes}
    assert len(racks) == 125  # 8 nodes per rack, the pattern repeated
    assert len({n["metadata"]["name"] for n in nodes}) == 1000
    assert nodes_from_topology({**doc, "nodes": 10})[-1]["metadata"]["name"] == "h100-r1-n1"


def test_count_fills_racks_in_order() -> None:
    nodes = nodes_from_topology({"groups": [
        {"name": "a", "count": 5, "nodes_per_rack": 2, "gpus": 8},
        {"name": "cpu", "count": 1, "gpus": 0},
    ]})
    assert [n["metadata"]["name"] for n in nodes] == [
        "a-r0-n0", "a-r0-n1", "a-r1-n0", "a-r1-n1", "a-r2-n0", "cpu-r0-n0"]
    assert "nvidia.com/gpu" not in nodes[-1]["status"]["allocatable"]
    assert "nvidia.com/gpu.product" not in nodes[-1]["metadata"]["labels"]


def test_bad_nodes_override() -> None:
    with pytest.raises(TopologyError, match="nodes must be"):
        nodes_from_topology(load_topology("tiny-3x2"), nodes=0)


def test_node_resource_topology_splits_gpus_per_numa_zone() -> None:
    node = nodes_from_topology(load_topology("racks-2x4-h100"))[0]
    nrt = nrt_from_node(node)
    assert nrt is not None
    assert nrt["metadata"]["name"] == "h100-r0-n0"
    assert [(z["name"], z["resources"][0]["available"]) for z in nrt["zones"]] == [
        ("node-0", "4"), ("node-1", "4")]
    cpu_only = nodes_from_topology({"groups": [{"name": "c", "gpus": 0}]})[0]
    assert nrt_from_node(cpu_only) is None


def test_every_node_carries_the_labels_real_gpu_nodes_carry() -> None:
    want = {"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch", "type",
            "topology.kubernetes.io/zone", "nvidia.com/gpu.product", "nvidia.com/gpu.count",
            "nvidia.com/gpu.memory", "nvidia.com/gpu.family", "lockstep.dev/rack",
            "lockstep.dev/block", "lockstep.dev/gpu-interconnect",
            "lockstep.dev/nvlink-island-size", "lockstep.dev/numa-nodes",
            "lockstep.dev/gpus-per-numa"}
    for path in TOPOLOGIES.glob("*.yaml"):
        for n in nodes_from_topology(load_topology(path)):
            assert want <= set(n["metadata"]["labels"]), (path.name, n["metadata"]["name"])
            assert n["status"]["capacity"] == n["status"]["allocatable"]
            assert not n["spec"].get("taints")
