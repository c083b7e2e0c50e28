"""Builders for the pods tests submit: ``pod("w0").gang("train", 4).gpu(1).build()``."""

from __future__ import annotations

import copy
from typing import Any, Self

__all__ = ["PodBuilder", "gang", "pod", "podgroup"]


class PodBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {},
                         "annotations": {}},
            "spec": {
                "schedulerName": "lockstep",
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.invalid/train:latest",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                              "limits": {}}}],
            },
        }

    def _res(self, key: str, value: str) -> Self:
        r = self._obj["spec"]["containers"][0]["resources"]
        r["requests"][key] = value
        if key == "nvidia.com/gpu":
            r["limits"][key] = value  # extended resources need requests == limits
        return self

    def gang(self, name: str, min_member: int | None = None,
             timeout: float | None = None) -> Self:
        ann = self._obj["metadata"]["annotations"]
        ann["lockstep.dev/pod-group"] = name
        if min_member is not None:
            ann["lockstep.dev/min-member"] = str(min_member)
        if timeout is not None:
            ann["lockstep.dev/timeout-seconds"] = f"{timeout:g}"
        return self

    def sp_group(self, name: str) -> Self:
        self._obj["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = name
        return self

    def annotate(self, key: str, value: str) -> Self:
        self._obj["metadata"]["annotations"][key] = value
        return self

    def gpu(self, n: int) -> Self:
        return self._res("nvidia.com/gpu", str(n))

    def cpu(self, q: str) -> Self:
        return self._res("cpu", q)

    def scheduler(self, name: str) -> Self:
        self._obj["spec"]["schedulerName"] = name
        return self

    def node_selector(self, selector: dict[str, str]) -> Self:
        self._obj["spec"]["nodeSelector"] = dict(selector)
        return self

    def unplaceable(self) -> Self:
        """Required pod affinity to pods that never exist: only kube-scheduler's own
        InterPodAffinity filter rejects it, so Lockstep cannot foresee it."""
        term = {"labelSelector": {"matchLabels": {"lockstep.dev/never": "present"}},
                "topologyKey": "kubernetes.io/hostname"}
        self._obj["spec"]["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def gang(name: str, size: int, *, namespace: str = "default", gpus: int = 1,
         min_member: int | None = None, timeout: float | None = None,
         scheduler: str = "lockstep") -> list[dict[str, Any]]:
    """``size`` worker pods ``<name>-0..`` of one Lockstep gang."""
    return [
        pod(f"{name}-{i}", namespace).gang(name, min_member or size, timeout).gpu(gpus)
        .scheduler(scheduler).build()
        for i in range(size)
    ]


def podgroup(name: str, min_member: int, namespace: str = "default",
             timeout: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
