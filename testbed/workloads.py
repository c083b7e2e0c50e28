"""Builders for the pods tests submit: ``pod("w0").gang("train", 4).gpu(1).build()``.

Bare pods (the test bed's controller-manager, when it runs, runs DRA's resourceclaim
controller and the garbage collector, and the Job and Deployment controllers only when a test
asks: ``runner.KCM_WORKLOAD_CONTROLLERS``), one container with
requests equal to limits, image ``registry.invalid/train:latest`` (KWOK never pulls it).
Gangs are declared the Lockstep way (annotations ``lockstep.dev/pod-group``,
``lockstep.dev/min-member``, ``lockstep.dev/timeout-seconds``) or the scheduler-plugins way
(label ``scheduling.x-k8s.io/pod-group`` plus a ``PodGroup`` object from ``podgroup()``).
"""

from __future__ import annotations

import copy
from typing import Any, Self

from coscheduling.gang.gating import GANG_GATE

__all__ = ["RUNTIME_ANNOTATION", "PodBuilder", "gang", "pod", "podgroup"]

RUNTIME_ANNOTATION = "lockstep.dev/simulated-runtime-seconds"
"""KWOK turns a running pod with this annotation Succeeded that many seconds later."""


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
                                              "limits": {"cpu": "1", "memory": "1Gi"}}}],
            },
        }

    def _res(self, key: str, value: str) -> Self:
        r = self._obj["spec"]["containers"][0]["resources"]
        r["requests"][key] = value
        r["limits"][key] = value  # requests == limits (extended resources require it)
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

    def claim(self, *, template: str | None = None, claim: str | None = None,
              name: str = "gpu") -> Self:
        """Use a DRA ResourceClaim: one of its own from ``template`` (a ResourceClaimTemplate)
        or the shared ``claim``; the container consumes it (``resources.claims``)."""
        if (template is None) == (claim is None):
            raise ValueError("give exactly one of template= or claim=")
        ref = {"name": name, **({"resourceClaimTemplateName": template} if template
                                else {"resourceClaimName": claim})}
        self._obj["spec"].setdefault("resourceClaims", []).append(ref)
        r = self._obj["spec"]["containers"][0]["resources"]
        r.setdefault("claims", []).append({"name": name})
        return self

    def cpu(self, q: str) -> Self:
        return self._res("cpu", q)

    def memory(self, q: str) -> Self:
        return self._res("memory", q)

    def runtime(self, seconds: float) -> Self:
        """Finish (phase Succeeded) ``seconds`` after it starts running on a KWOK node."""
        return self.annotate(RUNTIME_ANNOTATION, f"{seconds:g}")

    def scheduler(self, name: str) -> Self:
        self._obj["spec"]["schedulerName"] = name
        return self

    def node_selector(self, selector: dict[str, str]) -> Self:
        self._obj["spec"]["nodeSelector"] = dict(selector)
        return self

    def priority(self, value: int, class_name: str | None = None) -> Self:
        """``spec.priority`` as admission resolves it from ``class_name`` (which a real API
        server requires: it rejects a priority that its class does not give)."""
        self._obj["spec"]["priority"] = value
        if class_name is not None:
            self._obj["spec"]["priorityClassName"] = class_name
        return self

    def gated(self) -> Self:
        """Created behind Lockstep's scheduling gate, as its webhook would do."""
        self._obj["spec"].setdefault("schedulingGates", []).append({"name": GANG_GATE})
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
         scheduler: str = "lockstep", node_selector: dict[str, str] | None = None,
         runtime: float | None = None, claim_template: str | None = None
         ) -> list[dict[str, Any]]:
    """``size`` worker pods ``<name>-0..`` of one Lockstep gang, each asking for ``gpus``
    ``nvidia.com/gpu`` or, given ``claim_template``, for a DRA claim of its own made from
    that ResourceClaimTemplate (and no ``nvidia.com/gpu``)."""
    out = []
    for i in range(size):
        b = pod(f"{name}-{i}", namespace).gang(name, min_member or size, timeout)
        if claim_template is not None:
            b.claim(template=claim_template)
        else:
            b.gpu(gpus)
        b.scheduler(scheduler)
        if node_selector:
            b.node_selector(node_selector)
        if runtime is not None:
            b.runtime(runtime)
        out.append(b.build())
    return out


def podgroup(name: str, min_member: int, namespace: str = "default",
             timeout: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
