"""Synthetic clusters for benchmarks: racks of 8-GPU nodes, some GPUs already in use."""

from __future__ import annotations

from typing import Any

from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest


def cluster_nodes(n: int, gpus: int = 8, per_rack: int = 16) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "name": f"node-{i:05d}",
                "labels": {
                    "kubernetes.io/hostname": f"node-{i:05d}",
                    "lockstep.dev/rack": f"rack-{i // per_rack:04d}",
                    "lockstep.dev/block": f"block-{i // (per_rack * 8):03d}",
                    "lockstep.dev/gpu-interconnect": "nvswitch",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                },
            },
            "status": {"allocatable": {"cpu": "190", "memory": "1900Gi", "pods": "110",
                                       "nvidia.com/gpu": str(gpus)}},
        }
        for i in range(n)
    ]


def running_pods(n_nodes: int, every: int = 2) -> list[dict[str, Any]]:
    """One 4-GPU pod on every ``every``-th node: a half-busy cluster."""
    return [
        {
            "metadata": {"name": f"busy-{i}", "namespace": "bench", "uid": f"busy-{i}"},
            "spec": {"nodeName": f"node-{i:05d}", "schedulerName": "default-scheduler",
                     "containers": [{"name": "c", "resources": {"requests": {
                         "nvidia.com/gpu": "4", "cpu": "16", "memory": "64Gi"}}}]},
            "status": {"phase": "Running"},
        }
        for i in range(0, n_nodes, every)
    ]


def waiting_gang(name: str, size: int, gpus: int = 8) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "name": f"{name}-{i}", "namespace": "bench", "uid": f"{name}-{i}",
                "annotations": {"lockstep.dev/pod-group": name,
                                "lockstep.dev/min-member": str(size)},
            },
            "spec": {"schedulerName": "lockstep", "containers": [{"name": "c", "resources": {
                "requests": {"nvidia.com/gpu": str(gpus), "cpu": "32", "memory": "256Gi"}}}]},
            "status": {"phase": "Pending"},
        }
        for i in range(size)
    ]


def plain_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": name},
        "spec": {"schedulerName": "lockstep", "containers": [{"name": "c", "resources": {
            "requests": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi"}}}]},
        "status": {"phase": "Pending"},
    }


def loaded_core(n_nodes: int) -> Coscheduler:
    """A core whose cache holds ``n_nodes`` half-busy 8-GPU nodes."""
    core = Coscheduler(Settings())
    for n in cluster_nodes(n_nodes):
        core.upsert(ingest.NODES, node_from_json(n))
    for p in running_pods(n_nodes):
        core.upsert_pod(pod_from_json(p))
    return core
