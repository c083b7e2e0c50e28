"""Gangs whose GPUs are DRA ResourceClaims, on the default install (Lockstep with its webhook
and its own certificate) and the real control plane: kube-apiserver serving
``resource.k8s.io/v1``, the stock kube-scheduler with its DynamicResources plugin,
kube-controller-manager's resourceclaim controller making each pod's claim from its
ResourceClaimTemplate, and the fake NVIDIA driver's ResourceSlices on KWOK nodes
(``testbed.dra``).

Besides what each test asserts, the binding recorder checks every claim allocation it saw when
the test ends (``testbed.claims``): no member parked with devices for long, no device held by
two claims, no claim on another node than its pod.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.dra import API, claim, claim_template, device_class, partitionable_slice
from testbed.workloads import gang, pod

from .conftest import Cluster, ClusterFactory, settle


def templates(c: Cluster, *objs: dict[str, object]) -> None:
    for obj in objs:
        c.kube.create(f"{API}/namespaces/{c.ns}/resourceclaimtemplates",
                      {**obj, "metadata": {**obj["metadata"], "namespace": c.ns}})  # type: ignore[dict-item]


def whole(c: Cluster, names: list[str]) -> bool:
    bound = c.bound()
    return all(n in bound for n in names)


def devices_of(c: Cluster, names: list[str]) -> dict[str, tuple[str, ...]]:
    held = c.recorder.allocated(c.ns)
    return {n: held[n] for n in names if n in held}


def test_seed_case_with_dra_gpus_one_gang_runs_whole_the_other_holds_no_device(
        cluster: ClusterFactory) -> None:
    """3 nodes x 2 DRA GPUs, two 4-pod gangs of 1-GPU claims created interleaved: one runs
    4/4 holding its 4 devices, the other has 0 bound and 0 devices; it runs 4/4 once the
    first is deleted. (Before Lockstep saw devices, neither bound: each parked member held a
    device the other gang needed, and both timed out.)"""
    c = cluster("dra-tiny-3x2")
    templates(c, claim_template("one-gpu"))
    a = gang("a", 4, claim_template="one-gpu")
    b = gang("b", 4, claim_template="one-gpu")
    for x, y in zip(a, b, strict=True):
        c.create(x, y)
    names = {g: c.names(g, 4) for g in ("a", "b")}
    winner = c.kube.wait("one gang bound whole", lambda: next(
        (g for g, n in names.items() if whole(c, n)), None), timeout=45)
    loser = "b" if winner == "a" else "a"
    settle(3)
    held = devices_of(c, names[winner])
    assert len(held) == 4 and len({d for ds in held.values() for d in ds}) == 4, held
    assert not any(n in c.bound() for n in names[loser]), c.bound()
    assert devices_of(c, names[loser]) == {}
    c.recorder.assert_gang_invariants(c.ns)

    c.delete(*names[winner])
    c.wait_bound(names[loser], timeout=45)
    c.kube.wait("the second gang's 4 devices", lambda: len(devices_of(c, names[loser])) == 4,
                timeout=10)
    c.recorder.assert_gang_invariants(c.ns)


def test_a_mixed_cluster_runs_each_gang_on_the_gpus_its_pods_ask_for(
        cluster: ClusterFactory) -> None:
    """Device-plugin nodes (``nvidia.com/gpu: 4``) beside DRA-only nodes (4 devices each, no
    ``nvidia.com/gpu``): a gang asking for ``nvidia.com/gpu`` runs on the first, a gang
    claiming devices on the second, both at once, and the DRA gang's devices are on the
    nodes its pods run on."""
    c = cluster("mixed-dp-dra")
    templates(c, claim_template("two-gpus", count=2))
    dp = gang("dp", 4, gpus=2)
    dra = gang("dra", 4, claim_template="two-gpus")
    for x, y in zip(dp, dra, strict=True):
        c.create(x, y)
    bound = c.wait_bound(c.names("dp", 4) + c.names("dra", 4), timeout=45)
    assert {bound[n] for n in c.names("dp", 4)} <= {"dp-r0-n0", "dp-r1-n0"}, bound
    assert {bound[n] for n in c.names("dra", 4)} <= {"dra-r0-n0", "dra-r1-n0"}, bound
    held = devices_of(c, c.names("dra", 4) + c.names("dp", 4))
    assert sorted(held) == c.names("dra", 4), held  # device-plugin pods have no claims
    for name, devices in held.items():
        assert len(devices) == 2 and all(d.split("/")[1] == bound[name] for d in devices)
    assert len({d for ds in held.values() for d in ds}) == 8
    c.wait_running(c.names("dra", 4))  # KWOK runs a pod with allocated claims as any other
    c.recorder.assert_gang_invariants(c.ns)


ROOT_0 = "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:10'"


def test_one_members_first_fit_choice_does_not_block_another(cluster: ClusterFactory) -> None:
    """kubernetes/kubernetes#138765's failure in GA terms: one node, gpu-0 on PCIe root
    pci0000:10 and gpu-1 on pci0000:50; gang ``g`` of two, ``g-0`` takes any GPU and ``g-1``
    only one on pci0000:10. kube-scheduler allocates one pod at a time, first fit: ``g-0``
    (created first, scheduled first) would get gpu-0 and leave ``g-1`` nothing. Planned
    jointly, ``g-0`` runs on gpu-1 and ``g-1`` on gpu-0."""
    c = cluster("dra-pcie-roots-1x2")
    templates(c, claim_template("any-gpu"), claim_template("root-0-gpu", selectors=(ROOT_0,)))
    c.create(pod("g-0").gang("g", 2).claim(template="any-gpu").build())
    c.create(pod("g-1").gang("g", 2).claim(template="root-0-gpu").build())
    c.wait_bound(["g-0", "g-1"], timeout=45)
    c.kube.wait("both claims allocated", lambda: len(devices_of(c, ["g-0", "g-1"])) == 2, 10)
    assert devices_of(c, ["g-0", "g-1"]) == {
        "g-0": ("gpu.nvidia.com/dra-r0-n0/gpu-1",), "g-1": ("gpu.nvidia.com/dra-r0-n0/gpu-0",)}
    c.recorder.assert_gang_invariants(c.ns)


def test_the_first_fit_case_of_138765_whole_or_half_of_a_partitionable_gpu(
        cluster: ClusterFactory, tmp_path: Path) -> None:
    """kubernetes/kubernetes#138765 exactly: one GPU that is either whole or two halves (a
    shared counter; DRAPartitionableDevices, alpha in 1.34, on for this bed), each member's
    claim a prioritized list preferring the whole GPU, then a half (DRAPrioritizedList, beta
    and on); a gang of two, each with its own claim. First fit gives the first member the
    whole GPU and the second nothing; the gang fits only as two halves."""
    topology = tmp_path / "one-node.yaml"
    topology.write_text(yaml.safe_dump({"groups": [{"name": "mig", "count": 1, "gpus": 0}]}))
    c = cluster(str(topology), dra=True, feature_gates=("DRAPartitionableDevices=true",))
    node = c.kube.node("mig-r0-n0")
    c.kube.create(f"{API}/deviceclasses", device_class())
    c.kube.create(f"{API}/deviceclasses", device_class("mig.nvidia.com", device_type="mig"))
    c.kube.create(f"{API}/resourceslices", partitionable_slice(node))
    whole_or_half = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                     "metadata": {"name": "whole-or-half"}, "spec": {"spec": {"devices": {
                         "requests": [{"name": "gpu", "firstAvailable": [
                             {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
                             {"name": "half", "deviceClassName": "mig.nvidia.com"}]}]}}}}
    templates(c, whole_or_half)
    for i in range(2):
        c.create(pod(f"g-{i}").gang("g", 2).claim(template="whole-or-half").build())
    try:
        c.wait_bound(["g-0", "g-1"], timeout=45)
    except TimeoutError as e:
        raise AssertionError(f"{e}; Lockstep: {c.lockstep('/debug/gangs')}") from e
    c.kube.wait("both claims allocated", lambda: len(devices_of(c, ["g-0", "g-1"])) == 2, 10)
    assert sorted(d for ds in devices_of(c, ["g-0", "g-1"]).values() for d in ds) == [
        "gpu.nvidia.com/mig-r0-n0/gpu-0-mig-0", "gpu.nvidia.com/mig-r0-n0/gpu-0-mig-1"]
    c.recorder.assert_gang_invariants(c.ns)


def test_two_models_by_device_class_each_member_on_one_pcie_root(
        cluster: ClusterFactory) -> None:
    """The fake driver's attributes as CEL sees them, in Lockstep and in kube-scheduler
    alike: a DeviceClass per model (``productName`` as NVML spells it) sends a gang of A100
    claims to the A100 nodes and one of H100 claims to the H100 nodes, each member's 2
    devices on one PCIe root."""
    c = cluster("dra-two-models")
    for name, product in (("a100", "NVIDIA A100 SXM4 40GB"), ("h100", "NVIDIA H100 80GB HBM3")):
        c.kube.create(f"{API}/deviceclasses", device_class(name, product=product))
        templates(c, claim_template(f"two-{name}", count=2, device_class_name=name))
    a = gang("a", 2, claim_template="two-a100")
    h = gang("h", 4, claim_template="two-h100")
    c.create(*a, *h)
    bound = c.wait_bound(c.names("a", 2) + c.names("h", 4), timeout=45)
    assert {bound[n].split("-")[0] for n in c.names("a", 2)} == {"a100"}, bound
    assert {bound[n].split("-")[0] for n in c.names("h", 4)} == {"h100"}, bound
    c.kube.wait("6 pods' devices", lambda: len(devices_of(c, list(bound))) == 6, 10)
    roots = {s["spec"]["nodeName"]: {d["name"]: d["attributes"][
        "resource.kubernetes.io/pcieRoot"]["string"] for d in s["spec"]["devices"]}
        for s in c.kube.list(f"{API}/resourceslices")}
    for name, held in devices_of(c, list(bound)).items():
        node = bound[name]
        assert len({roots[node][d.split("/")[2]] for d in held}) == 1, (name, held)
    c.recorder.assert_gang_invariants(c.ns)


def test_a_gang_of_whole_nodes_stays_within_one_nvlink_clique(cluster: ClusterFactory) -> None:
    """GB200 with DRA: two NVLink cliques (``nvidia.com/gpu.clique``) of 4 nodes x 4 GPUs, one
    node of each clique already busy. A gang of 3 pods x 4 GPUs fits in either clique; it
    runs in one."""
    c = cluster("dra-gb200-cliques")
    templates(c, claim_template("four-gpus", count=4))
    for i, node in enumerate(("gb200-r0-n0", "gb200-r1-n0")):  # plain pods, one per clique
        c.create(pod(f"busy-{i}").claim(template="four-gpus")
                 .node_selector({"kubernetes.io/hostname": node}).build())
    c.wait_bound(c.names("busy", 2), 45)
    c.create(*gang("g", 3, claim_template="four-gpus"))
    bound = c.wait_bound(c.names("g", 3), 45)
    cliques = {n["metadata"]["name"]: n["metadata"]["labels"]["nvidia.com/gpu.clique"]
               for n in c.kube.nodes()}
    assert len({cliques[bound[n]] for n in c.names("g", 3)}) == 1, bound
    c.recorder.assert_gang_invariants(c.ns)


def test_gang_members_sharing_one_claim_run_together_on_its_device(
        cluster: ClusterFactory) -> None:
    """One ResourceClaim (1 GPU) named by both members of a gang: both run on the node of its
    device, the claim reserved for both. (Upstream's own gang path looped here,
    kubernetes/kubernetes#137617, since closed: the first member waited in Permit with the
    claim in flight, so the second was told the claim "is in the process of being
    allocated". Parked at Lockstep's bind, the first member's claim is already written.)"""
    c = cluster("dra-tiny-3x2")
    c.kube.create(f"{API}/namespaces/{c.ns}/resourceclaims",
                  {**claim("shared-gpu"), "metadata": {"name": "shared-gpu",
                                                       "namespace": c.ns}})
    for i in range(2):
        c.create(pod(f"s-{i}").gang("s", 2).claim(claim="shared-gpu").build())
    bound = c.wait_bound(["s-0", "s-1"], timeout=45)
    assert bound["s-0"] == bound["s-1"], bound
    status = c.kube.get(f"{API}/namespaces/{c.ns}/resourceclaims/shared-gpu")["status"]
    assert sorted(r["name"] for r in status["reservedFor"]) == ["s-0", "s-1"]
    (result,) = status["allocation"]["devices"]["results"]
    assert result["pool"] == bound["s-0"]
    c.recorder.assert_gang_invariants(c.ns)
