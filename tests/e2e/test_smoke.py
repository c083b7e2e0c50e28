"""The test bed itself: the stock kube-scheduler on a real API server with KWOK GPU nodes."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.bins import VERSIONS
from testbed.runner import TestBed
from testbed.workloads import pod

from .conftest import ClusterFactory, settle


def test_stock_scheduler_binds_a_gpu_pod_and_it_runs(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", lockstep=False, stock=True)
    c.create(pod("one-gpu").gpu(1).scheduler("default-scheduler").build())
    node = c.wait_bound(["one-gpu"], 30)["one-gpu"]
    assert node.startswith("gpu-")
    c.wait_running(["one-gpu"], 30)


def test_pod_larger_than_any_node_stays_pending_with_failed_scheduling(
    cluster: ClusterFactory,
) -> None:
    c = cluster("tiny-3x2", lockstep=False, stock=True)
    c.create(pod("too-big").gpu(3).scheduler("default-scheduler").build())
    event = c.wait_event("too-big", "FailedScheduling", "Insufficient nvidia.com/gpu", 30)
    assert "0/3 nodes are available" in event["message"]
    settle(1)
    assert c.bound() == {}


def test_simulated_runtime_finishes_a_pod_and_frees_its_gpus(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", lockstep=False, stock=True)
    c.create(pod("short").gpu(2).runtime(2).scheduler("default-scheduler").build(),
             *(pod(f"long-{i}").gpu(2).scheduler("default-scheduler").build() for i in range(2)))
    c.wait_running(["short", "long-0", "long-1"], 30)
    c.create(pod("next").gpu(2).scheduler("default-scheduler").build())
    c.wait_event("next", "FailedScheduling", "Insufficient nvidia.com/gpu", 30)
    c.kube.wait("short Succeeded", lambda: c.kube.pod(c.ns, "short")["status"]["phase"]
                == "Succeeded", 30)
    assert c.wait_bound(["next"], 30)["next"] == c.bound()["short"]


def test_two_test_beds_run_side_by_side(tmp_path: Path) -> None:
    with TestBed(run_dir=tmp_path / "a") as a, TestBed(run_dir=tmp_path / "b") as b:
        assert a.api_port != b.api_port and a.etcd_port != b.etcd_port
        a.kubectl("create", "namespace", "only-in-a")
        assert b.kubectl("get", "ns", "only-in-a", check=False).returncode != 0
        version = json.loads(a.kubectl("version", "-o", "json").stdout)
        assert version["serverVersion"]["gitVersion"] == VERSIONS["K8S_VERSION"]
        assert a.startup_seconds["control-plane"] < 60
    assert not a.pids() and not b.pids()
    a.stop()  # idempotent
