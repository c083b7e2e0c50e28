"""The extender wire format of ``k8s.io/kube-scheduler/extender/v1``, as Pydantic v2 models.

kube-scheduler marshals Go structs without JSON tags: keys are capitalised and unset slices
and pointers arrive as ``null``. Extra keys are ignored (newer kube-schedulers may add some).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coscheduling import affinity_problem

__all__ = [
    "BindingArgs",
    "BindingResult",
    "ExtenderArgs",
    "FilterResult",
    "HostPriority",
    "PodShape",
    "validate_shape",
]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ExtenderArgs(_Wire):
    """Body of filter and prioritize calls."""

    Pod: dict[str, Any]
    Nodes: dict[str, Any] | None = None
    NodeNames: list[str] | None = None


class FilterResult(_Wire):
    Nodes: dict[str, Any] | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int


class BindingArgs(_Wire):
    PodName: str = Field(min_length=1, max_length=253)
    PodNamespace: str = Field(min_length=1, max_length=63)
    PodUID: str = ""
    Node: str = Field(min_length=1, max_length=253)


class BindingResult(_Wire):
    Error: str = ""


# ---------------------------------------------------------------------------- the Pod's shape
# ExtenderArgs.Pod stays a dict (it is parsed once into a slim record), but a request could
# put any JSON anywhere in it. These models check the types of exactly the fields Lockstep
# reads, so a malformed pod is a 422 naming the field (``Pod.spec.containers.0``) instead of
# an exception deep in parsing or planning. Everything else passes through unchecked.


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class _Requirement(_Loose):
    key: str = ""
    operator: str = ""
    values: list[str | int | float | bool] | None = None


class _Term(_Loose):
    matchExpressions: list[_Requirement] | None = None
    matchFields: list[_Requirement] | None = None


class _NodeSelector(_Loose):
    nodeSelectorTerms: list[_Term] | None = None


class _NodeAffinity(_Loose):
    requiredDuringSchedulingIgnoredDuringExecution: _NodeSelector | None = None


class _Affinity(_Loose):
    nodeAffinity: _NodeAffinity | None = None


class _Resources(_Loose):
    requests: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None


class _Container(_Loose):
    resources: _Resources | None = None


class _Toleration(_Loose):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class _PodSpec(_Loose):
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    overhead: dict[str, Any] | None = None
    affinity: _Affinity | None = None
    tolerations: list[_Toleration] | None = None
    nodeSelector: dict[str, Any] | None = None
    nodeName: str | None = None
    schedulerName: str | None = None
    priority: int | None = None


class _PodMeta(_Loose):
    name: str = Field(min_length=1)
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None


class _PodStatus(_Loose):
    phase: str | None = None


class PodShape(_Loose):
    """The fields of a ``v1.Pod`` Lockstep reads, with their types (validated, then dropped)."""

    metadata: _PodMeta
    spec: _PodSpec
    status: _PodStatus | None = None


def validate_shape(pod: Any) -> None:
    """``PodShape.model_validate(pod)``, leaving out a required node affinity over the
    planner's limits (``coscheduling.topology.eligibility``): no gang member with it is ever placed
    (the reason names the field and the limit), and a plain pod's is kube-scheduler's to
    evaluate, so checking its thousands of terms one model each (0.5 s for 4,000) would be
    work that grows with the pod for nothing. Raises ``ValidationError`` as the model does."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    affinity = spec.get("affinity") if isinstance(spec, dict) else None
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node, dict) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if isinstance(terms, list) and affinity_problem(terms) is not None:
        assert isinstance(spec, dict) and isinstance(affinity, dict)
        pod = {**pod, "spec": {**spec, "affinity": {
            k: v for k, v in affinity.items() if k != "nodeAffinity"}}}
    PodShape.model_validate(pod)
