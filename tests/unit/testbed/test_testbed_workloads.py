"""Pod builders produce the bare pods and gang declarations the test bed submits."""

from __future__ import annotations

from testbed.workloads import RUNTIME_ANNOTATION, gang, pod, podgroup


def test_fluent_pod() -> None:
    p = (pod("w0", "ns1").gang("g", min_member=4, timeout=60).gpu(1).scheduler("lockstep")
         .node_selector({"lockstep.dev/rack": "r0"}).build())
    assert p["metadata"]["namespace"] == "ns1"
    assert p["metadata"]["annotations"] == {
        "lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "4",
        "lockstep.dev/timeout-seconds": "60"}
    assert p["spec"]["schedulerName"] == "lockstep"
    assert p["spec"]["nodeSelector"] == {"lockstep.dev/rack": "r0"}
    res = p["spec"]["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "1", "memory": "1Gi",
                                                "nvidia.com/gpu": "1"}
    assert p["spec"]["containers"][0]["image"] == "registry.invalid/train:latest"
    assert "ownerReferences" not in p["metadata"]  # bare pod


def test_builders_do_not_share_state() -> None:
    b = pod("w0").gpu(1)
    first = b.build()
    b.gpu(2)
    assert first["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_gang_helper() -> None:
    pods = gang("train", 3, gpus=2, min_member=2, timeout=30, namespace="x",
                node_selector={"a": "b"}, runtime=5)
    assert [p["metadata"]["name"] for p in pods] == ["train-0", "train-1", "train-2"]
    for p in pods:
        ann = p["metadata"]["annotations"]
        assert ann["lockstep.dev/min-member"] == "2"
        assert ann["lockstep.dev/timeout-seconds"] == "30"
        assert ann[RUNTIME_ANNOTATION] == "5"
        assert p["spec"]["nodeSelector"] == {"a": "b"}
        assert p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert gang("t", 2)[0]["metadata"]["annotations"]["lockstep.dev/min-member"] == "2"


def test_scheduler_plugins_convention() -> None:
    p = pod("w0").sp_group("pg").gpu(1).scheduler("scheduler-plugins-scheduler").build()
    assert p["metadata"]["labels"] == {"scheduling.x-k8s.io/pod-group": "pg"}
    assert podgroup("pg", 3, "ns1", timeout=60) == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "ns1"},
        "spec": {"minMember": 3, "scheduleTimeoutSeconds": 60}}
