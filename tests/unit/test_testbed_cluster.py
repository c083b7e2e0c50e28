"""Topology files expand into the Node objects real GPU nodes would present."""

from __future__ import annotations

import pytest

from testbed.cluster import TOPOLOGIES, TopologyError, load_topology, nodes_from_topology


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
