"""Topology-aware placement on the real test bed (kube-scheduler + Lockstep)."""

from __future__ import annotations

from testbed.workloads import gang, pod

from .conftest import ClusterFactory, settle


def rack(node: str) -> str:
    return node.split("-n")[0]  # h100-r0-n3 -> h100-r0


def test_full_rack_gang_lands_in_one_rack(cluster: ClusterFactory) -> None:
    c = cluster("racks-2x4-h100")
    c.create(*gang("big", 4, gpus=8))
    bound = c.wait_bound(c.names("big", 4), 30)
    assert len({rack(n) for n in bound.values()}) == 1, bound
    c.recorder.assert_gang_invariants(c.ns)


def test_two_16_gpu_gangs_each_stay_inside_a_rack(cluster: ClusterFactory) -> None:
    """Each rack has 24 free GPUs (one node busy): 16 + 16 fits the cluster, and could be split
    8 + 8 across racks; Lockstep keeps each gang inside one rack, so one lands per rack."""
    c = cluster("racks-2x4-h100")
    c.create(pod("busy-0").gpu(8).build())
    c.create(pod("busy-1").gpu(8).build())
    busy = c.wait_bound(["busy-0", "busy-1"], 30)
    if rack(busy["busy-0"]) == rack(busy["busy-1"]):  # both landed in one rack: move one
        c.delete("busy-1")
        other = "h100-r1" if rack(busy["busy-0"]) == "h100-r0" else "h100-r0"
        c.create(pod("busy-2").gpu(8).node_selector({"lockstep.dev/rack": other}).build())
        c.wait_bound(["busy-2"], 30)
    for g in ("a", "b"):
        c.create(*gang(g, 4, gpus=4))
    a = c.wait_bound(c.names("a", 4), 30)
    b = c.wait_bound(c.names("b", 4), 30)
    racks_a, racks_b = {rack(n) for n in a.values()}, {rack(n) for n in b.values()}
    assert len(racks_a) == 1 and len(racks_b) == 1, (a, b)
    assert racks_a != racks_b
    c.recorder.assert_gang_invariants(c.ns)


def test_topology_required_rack_waits_instead_of_spreading(cluster: ClusterFactory) -> None:
    c = cluster("racks-2x4-h100")
    wide = [pod(f"wide-{i}").gang("wide", 5).gpu(8)
            .annotate("lockstep.dev/topology-required", "rack").build() for i in range(5)]
    c.create(*wide)  # 40 GPUs: the cluster has 64, no rack has more than 32
    event = c.wait_event("wide-0", "GangWaiting", "topology-required")
    assert "inside one rack" in event["message"] and "holds 4" in event["message"]
    settle(2)
    assert c.bound() == {}
    # Without the requirement the same shape spreads over both racks and runs.
    c.create(*gang("spread", 5, gpus=8))
    spread = c.wait_bound(c.names("spread", 5), 30)
    assert len({rack(n) for n in spread.values()}) == 2
    c.recorder.assert_gang_invariants(c.ns)


def test_two_gpu_pods_take_a_whole_free_nvlink_pair(cluster: ClusterFactory) -> None:
    """pcie-pairs: 4 GPUs per node, NVLink bridges pair GPU0-1 and GPU2-3.

    Lockstep cannot see which physical GPUs a pod got; it models the device plugin as
    allocating NVLink-aligned sets (as NVIDIA's preferred allocation does), packing pods into
    pairs best-fit. Here pcie-r0-n0 is left with one GPU (no pair), pcie-r0-n1 with three (one
    whole pair), pcie-r0-n2 with exactly one whole pair, pcie-r0-n3 empty: a 2-GPU pod must go
    where a whole pair is free, and prefers the node it completes.
    """
    c = cluster("pcie-pairs")
    for name, node, gpus in (("fill-0", "pcie-r0-n0", 3), ("fill-1", "pcie-r0-n1", 1),
                             ("fill-2", "pcie-r0-n2", 1), ("fill-3", "pcie-r0-n2", 1)):
        c.create(pod(name).gpu(gpus).node_selector({"kubernetes.io/hostname": node}).build())
    c.wait_bound(["fill-0", "fill-1", "fill-2", "fill-3"], 30)
    c.create(pod("pair").gpu(2).build())
    node = c.wait_bound(["pair"], 30)["pair"]
    assert node == "pcie-r0-n2"
    scores = {s["Host"]: s["Score"] for s in c.lockstep_prioritize(pod("probe").gpu(2).build())}
    assert scores["pcie-r0-n0"] == 0  # one GPU left: no pair, no fit
    c.recorder.assert_gang_invariants(c.ns)


def test_gang_stays_inside_one_nvlink_clique(cluster: ClusterFactory) -> None:
    """GB200 NVL72: 18 nodes x 4 GPUs share an NVLink domain (nvidia.com/gpu.clique). A 64-GPU
    gang fits one clique; a second one must take the other clique, not the 8 GPUs left."""
    c = cluster("gb200-nvl72")
    clique = {n["metadata"]["name"]: n["metadata"]["labels"]["nvidia.com/gpu.clique"]
              for n in c.kube.list("/api/v1/nodes")}
    c.create(*gang("nvl-a", 16, gpus=4), *gang("nvl-b", 16, gpus=4))
    a = c.wait_bound(c.names("nvl-a", 16), 60)
    b = c.wait_bound(c.names("nvl-b", 16), 60)
    cliques_a, cliques_b = {clique[n] for n in a.values()}, {clique[n] for n in b.values()}
    assert len(cliques_a) == 1 and len(cliques_b) == 1 and cliques_a != cliques_b
    c.recorder.assert_gang_invariants(c.ns)
