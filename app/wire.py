"""The extender wire format of ``k8s.io/kube-scheduler/extender/v1``, as Pydantic v2 models.

kube-scheduler marshals Go structs without JSON tags: keys are capitalised and unset slices
and pointers arrive as ``null``. Extra keys are ignored (newer kube-schedulers may add some).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BindingArgs",
    "BindingResult",
    "ExtenderArgs",
    "FilterResult",
    "HostPriority",
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
