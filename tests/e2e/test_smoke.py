"""The test bed itself: the stock kube-scheduler on a real API server with KWOK GPU nodes."""

from __future__ import annotations

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


def test_two_test_beds_run_side_by_side(tmp_path: object) -> None:
    with TestBed() as a, TestBed() as b:
        assert a.api_port != b.api_port and a.etcd_port != b.etcd_port
        assert a.kubectl("get", "ns", "default").returncode == 0
        assert b.kubectl("get", "ns", "default").returncode == 0
        assert a.startup_seconds["control-plane"] < 60
