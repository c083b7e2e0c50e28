"""DRA nodes in topology files, and the ResourceSlices and DeviceClass the fake NVIDIA driver
publishes for them (testbed.dra), shaped like k8s-dra-driver-gpu's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed import bins, dra
from testbed.bins import REPO
from testbed.cluster import TopologyError, load_topology, nodes_from_topology, nrt_from_node
from testbed.workloads import gang, pod


def by_name(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in nodes}


def test_a_dra_node_has_no_gpu_capacity_and_declares_its_devices() -> None:
    nodes = nodes_from_topology(load_topology("dra-tiny-3x2"))
    assert len(nodes) == 3
    for n in nodes:
        assert "nvidia.com/gpu" not in n["status"]["allocatable"]
        assert "nvidia.com/gpu" not in n["status"]["capacity"]
        assert dra.is_dra_node(n)
        assert n["metadata"]["annotations"][dra.DRA_GPUS] == "2"
        assert n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L40S"
        assert nrt_from_node(n) is None  # no nvidia.com/gpu zones either


def test_the_slice_of_a_node_is_shaped_like_nvidias() -> None:
    node = by_name(nodes_from_topology(load_topology("dra-two-models")))["h100-r0-n0"]
    node["metadata"]["uid"] = "uid-1"  # as the API server returns it
    s = dra.slice_for_node(node)
    assert s is not None
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "h100-r0-n0", "uid": "uid-1"}]
    spec = s["spec"]
    assert spec["driver"] == "gpu.nvidia.com" and spec["nodeName"] == "h100-r0-n0"
    assert spec["pool"] == {"name": "h100-r0-n0", "generation": 1, "resourceSliceCount": 1}
    devices = spec["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    first = devices[0]["attributes"]
    assert first["type"] == {"string": "gpu"}
    assert first["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert first["architecture"] == {"string": "Hopper"}
    assert first["cudaComputeCapability"] == {"version": "9.0.0"}
    assert first["uuid"]["string"].startswith("GPU-")
    assert devices[0]["capacity"] == {"memory": {"value": "81559Mi"}}
    assert len({d["attributes"]["uuid"]["string"] for d in devices}) == 8
    assert len({d["attributes"]["pcieBusID"]["string"] for d in devices}) == 8
    roots = [d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"] for d in devices]
    assert len(set(roots)) == 4  # pcie_roots: 4, two GPUs on each, in order
    assert roots[0] == roots[1] != roots[2] == roots[3]
    assert roots[0].startswith("pci0000:")


def test_two_models_and_cliques() -> None:
    models = {dra.slice_for_node(n)["spec"]["devices"][0]["attributes"]["productName"]["string"]  # type: ignore[index]
              for n in nodes_from_topology(load_topology("dra-two-models"))}
    assert models == {"NVIDIA H100 80GB HBM3", "NVIDIA A100 SXM4 40GB"}
    a100 = by_name(nodes_from_topology(load_topology("dra-two-models")))["a100-r0-n0"]
    s = dra.slice_for_node(a100)
    assert s is not None and "ownerReferences" not in s["metadata"]  # no uid yet
    assert s["spec"]["devices"][0]["attributes"]["architecture"] == {"string": "Ampere"}
    # numa_nodes: 2 and no pcie_roots: one root per NUMA node
    assert len({d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
                for d in s["spec"]["devices"]}) == 2
    cliques = {n["metadata"]["labels"]["nvidia.com/gpu.clique"]
               for n in nodes_from_topology(load_topology("dra-gb200-cliques"))}
    assert cliques == {"cluster-gb200.0", "cluster-gb200.1"}


def test_a_mixed_cluster_has_both_kinds_of_node() -> None:
    nodes = by_name(nodes_from_topology(load_topology("mixed-dp-dra")))
    assert nodes["dp-r0-n0"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert not dra.is_dra_node(nodes["dp-r0-n0"])
    assert dra.slice_for_node(nodes["dp-r0-n0"]) is None
    assert "nvidia.com/gpu" not in nodes["dra-r0-n0"]["status"]["allocatable"]
    assert len(dra.slice_for_node(nodes["dra-r0-n0"])["spec"]["devices"]) == 4  # type: ignore[index]


@pytest.mark.parametrize("group", [
    pytest.param({"name": "x", "gpus": 2, "dra": "yes"}, id="dra-not-a-bool"),
    pytest.param({"name": "x", "gpus": 2, "dra": True, "pcie_roots": -1}, id="negative-roots"),
])
def test_bad_dra_groups_name_the_problem(group: dict[str, object]) -> None:
    with pytest.raises(TopologyError, match="group 'x'"):
        nodes_from_topology({"groups": [group]})


def test_device_classes_and_claims() -> None:
    cls = dra.device_class()
    assert cls["metadata"]["name"] == "gpu.nvidia.com"
    assert cls["spec"]["selectors"] == [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && "
        "device.attributes['gpu.nvidia.com'].type == 'gpu'")}}]
    a100 = dra.device_class("a100", product="NVIDIA A100 SXM4 40GB")
    assert a100["spec"]["selectors"][0]["cel"]["expression"].endswith(
        "productName == 'NVIDIA A100 SXM4 40GB'")
    t = dra.claim_template("one-gpu", namespace="ns", count=2, selectors=("true",))
    assert t["kind"] == "ResourceClaimTemplate" and t["metadata"]["namespace"] == "ns"
    assert t["spec"]["spec"]["devices"]["requests"] == [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2,
        "selectors": [{"cel": {"expression": "true"}}]}}]
    whole = dra.claim("node", all_devices=True)
    assert whole["kind"] == "ResourceClaim"
    assert whole["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}


def test_pods_consume_a_claim_of_their_own_or_a_shared_one() -> None:
    p = pod("w").claim(template="one-gpu").build()
    assert p["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    res = p["spec"]["containers"][0]["resources"]
    assert res["claims"] == [{"name": "gpu"}] and "nvidia.com/gpu" not in res["limits"]
    shared = pod("w").claim(claim="node", name="all").build()
    assert shared["spec"]["resourceClaims"] == [{"name": "all", "resourceClaimName": "node"}]
    with pytest.raises(ValueError, match="exactly one"):
        pod("w").claim()
    members = gang("g", 2, claim_template="one-gpu")
    assert all("nvidia.com/gpu" not in m["spec"]["containers"][0]["resources"]["limits"]
               and m["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "one-gpu"
               for m in members)
    assert gang("g", 1)[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] \
        == "1"


class Recording:
    """Records what publish() creates (no cluster)."""

    def __init__(self, conflict: bool = False) -> None:
        self.created: list[tuple[str, str]] = []
        self.conflict = conflict

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.conflict and path.endswith("deviceclasses"):
            from testbed.kube import Conflict
            raise Conflict(409, "exists", path)
        self.created.append((path, body["metadata"]["name"]))
        return body


@pytest.mark.parametrize("conflict", [False, True], ids=["new", "class-exists"])
def test_publish_creates_the_class_once_and_a_slice_per_dra_node(conflict: bool) -> None:
    kube = Recording(conflict)
    nodes = nodes_from_topology(load_topology("mixed-dp-dra"))
    assert dra.publish(kube, nodes) == 2  # type: ignore[arg-type]
    classes = [n for p, n in kube.created if p.endswith("deviceclasses")]
    assert classes == ([] if conflict else ["gpu.nvidia.com"])
    assert sorted(n for p, n in kube.created if p.endswith("resourceslices")) == [
        "dra-r0-n0-gpu.nvidia.com", "dra-r1-n0-gpu.nvidia.com"]
    assert dra.publish(Recording(), nodes_from_topology(load_topology("tiny-3x2"))) == 0  # type: ignore[arg-type]


def test_feature_gates_reach_the_api_server_with_the_upstream_gang_apis(tmp_path: Path
                                                                       ) -> None:
    from testbed.runner import TestBed
    bed = TestBed(run_dir=tmp_path, feature_gates=("DRAPartitionableDevices=true",))
    assert bed._gate_args() == ["--feature-gates=DRAPartitionableDevices=true"]
    assert TestBed(run_dir=tmp_path)._gate_args() == []
    newer = TestBed(run_dir=tmp_path, k8s="v1.37.2", feature_gates=("X=true",))
    gates, runtime = newer._gate_args()
    assert gates.startswith("--feature-gates=GenericWorkload=true,") and gates.endswith(",X=true")
    assert runtime.startswith("--runtime-config=scheduling.k8s.io/v1beta1=true")


def test_training_operator_is_built_at_a_second_version_for_dra_claims(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path))
    (other,) = bins.EXTRA_VERSIONS["training-operator"]
    assert other == "v1.9.3" != bins.version_of("training-operator")
    (tmp_path / "bin" / f"training-operator-{other}").mkdir(parents=True)
    (tmp_path / "bin" / f"training-operator-{other}" / "training-operator").touch()
    assert bins.bin_path("training-operator", other).parent.name == f"training-operator-{other}"
    with pytest.raises(ValueError, match="not built by the test bed"):
        bins.bin_path("training-operator", "v1.7.0")
    with pytest.raises(ValueError, match="not built by the test bed"):
        bins.bin_path("kube-scheduler", "v1.9.3")
    assert bins.version_of("kube-controller-manager") == bins.VERSIONS["K8S_VERSION"]


def test_the_partitionable_gpu_of_138765_is_whole_or_two_halves() -> None:
    s = dra.partitionable_slice({"metadata": {"name": "n0", "uid": "u"}})
    spec = s["spec"]
    assert spec["sharedCounters"] == [{"name": "gpu-0-counter-set",
                                       "counters": {"memory-slices": {"value": "2"}}}]
    used = {d["name"]: d["consumesCounters"][0]["counters"]["memory-slices"]["value"]
            for d in spec["devices"]}
    assert used == {"gpu-0": "2", "gpu-0-mig-0": "1", "gpu-0-mig-1": "1"}
    halves = [d for d in spec["devices"] if d["attributes"]["type"] == {"string": "mig"}]
    parent = spec["devices"][0]["attributes"]["uuid"]
    assert [h["attributes"]["parentUUID"] for h in halves] == [parent, parent]
    assert s["metadata"]["ownerReferences"][0]["uid"] == "u"
    mig = dra.device_class("mig.nvidia.com", device_type="mig")
    assert mig["spec"]["selectors"][0]["cel"]["expression"].endswith(".type == 'mig'")


DRA_POINTS = {"multiPoint", "preEnqueue", "preFilter", "filter", "postFilter", "reserve",
              "preBind"}
"""Where v1.34's DynamicResources plugin runs (its PreEnqueue, PreFilter, Filter, PostFilter,
Reserve and PreBind in pkg/scheduler/framework/plugins/dynamicresources), and multiPoint,
which enables it at all of them."""


@pytest.mark.parametrize("path", [
    "scheduler-config/lockstep.yaml", "scheduler-config/lockstep-https.yaml",
    "scheduler-config/scheduler-plugins-coscheduling.yaml", "deploy/scheduler-config.yaml",
])
def test_no_scheduler_config_turns_dynamic_resources_off(path: str) -> None:
    """kube-scheduler v1.34 runs DynamicResources by default (DynamicResourceAllocation is GA
    and on; applyDynamicResources adds it to the default plugins): a config that disabled it,
    at any extension point or with "*", would leave every claim unallocated."""
    import yaml
    doc = yaml.safe_load((REPO / path).read_text())
    for profile in doc["profiles"]:
        for name, point in (profile.get("plugins") or {}).items():
            disabled = {p["name"] for p in (point or {}).get("disabled") or ()}
            if name in DRA_POINTS:  # its extension points (queueSort is not one)
                disabled &= {"DynamicResources", "*"}
            assert "DynamicResources" not in disabled, (path, profile["schedulerName"], name)
            assert name not in DRA_POINTS or not disabled, (path, profile["schedulerName"], name)
