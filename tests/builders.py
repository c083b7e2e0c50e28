"""Fluent builders for test pods, nodes and PodGroups (raw Kubernetes JSON).

``pod("p1").gang("g", min_member=4).gpu(1).build()`` and ``node("n1").gpus(8).build()``
keep each test's table rows short and make what differs between rows stand out.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from testbed import workloads

_uid = itertools.count(1)


def reset_uids() -> None:
    """Start pod UIDs again at 1, so a model run's UIDs (which order ties in the core) do
    not depend on which tests ran before it in the process."""
    global _uid
    _uid = itertools.count(1)


class PodBuilder(workloads.PodBuilder):
    """The test bed's pod builder plus what unit tests need: a uid, a status, a binding."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        super().__init__(name, namespace)
        self._obj["metadata"]["uid"] = f"uid-{next(_uid)}"
        self._obj["status"] = {"phase": "Pending"}

    def label(self, key: str, value: str) -> PodBuilder:
        self._obj["metadata"]["labels"][key] = value
        return self

    def node_selector(self, selector: dict[str, str] | None = None, **labels: str) -> PodBuilder:
        super().node_selector({**(selector or {}), **labels})
        return self

    def on(self, node: str, phase: str = "Running") -> PodBuilder:
        self._obj["spec"]["nodeName"] = node
        self._obj["status"]["phase"] = phase
        return self


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
        }

    def gpus(self, n: int) -> NodeBuilder:
        self._obj["status"]["allocatable"]["nvidia.com/gpu"] = str(n)
        return self

    def cpu(self, q: str) -> NodeBuilder:
        self._obj["status"]["allocatable"]["cpu"] = q
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._obj["metadata"]["labels"][key] = value
        return self

    def rack(self, rack: str, block: str = "b0") -> NodeBuilder:
        return self.label("lockstep.dev/rack", rack).label("lockstep.dev/block", block)

    def interconnect(self, kind: str, island: int | None = None) -> NodeBuilder:
        self.label("lockstep.dev/gpu-interconnect", kind)
        if island is not None:
            self.label("lockstep.dev/nvlink-island-size", str(island))
        return self

    def taint(self, key: str, effect: str = "NoSchedule") -> NodeBuilder:
        self._obj["spec"].setdefault("taints", []).append({"key": key, "effect": effect})
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def podgroup(
    name: str, min_member: Any, namespace: str = "default", timeout: Any = None,
    min_resources: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    if min_resources:
        spec["minResources"] = min_resources
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
