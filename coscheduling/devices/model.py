"""The devices Dynamic Resource Allocation publishes and pods claim, as the core keeps them.

Plain frozen dataclasses (``coscheduling.devices.wire`` turns the API's ``resource.k8s.io/v1``
JSON into them, once, at the watch): the planner reads these on its hot path, never JSON.
A device is named as the API names it in an allocation result: ``(driver, pool, device)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "MAX_ALTERNATIVES",
    "MAX_COUNT",
    "Claim",
    "ClaimKey",
    "ClaimSpec",
    "ClaimTemplate",
    "Device",
    "DeviceClass",
    "DeviceId",
    "DeviceSlice",
    "Request",
]

DeviceId = tuple[str, str, str]
"""``(driver, pool, device)``: how ``status.allocation.devices.results`` names a device."""
ClaimKey = str
"""``namespace/name`` of a ResourceClaim."""

MAX_ALTERNATIVES = 8
"""Subrequests of one ``firstAvailable`` request (the API's
``FirstAvailableDeviceRequestMaxSize``)."""
MAX_COUNT = 32
"""The most devices one request may ask for: an allocation result holds at most 32 devices
(``AllocationResultsMaxSize`` in k8s.io/api/resource/v1), so a larger ``count`` can never be
allocated; it is refused before any work."""

AttrValue = int | bool | str


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a ResourceSlice, with its attributes and capacities qualified by
    domain (an unqualified name takes the driver's, as the API's CEL environment does)."""

    driver: str
    pool: str
    name: str
    attributes: tuple[tuple[str, str, AttrValue], ...] = ()
    """``(domain, id, value)`` per attribute."""
    capacity: tuple[tuple[str, str, int], ...] = ()
    """``(domain, id, value in milli-units)`` per capacity."""
    consumes: tuple[tuple[str, str, int], ...] = ()
    """``(counter set, counter, milli-units)`` it takes from its pool's shared counters
    (partitionable devices: a whole GPU and its halves share one set)."""
    id: DeviceId = field(init=False, repr=False, compare=False)
    """``(driver, pool, name)``, built once: planning reads it for every device it looks at."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", (self.driver, self.pool, self.name))

    def attribute(self, qualified: str) -> AttrValue | None:
        domain, _, ident = qualified.rpartition("/")
        for d, i, v in self.attributes:
            if i == ident and d == (domain or self.driver):
                return v
        return None


@dataclass(frozen=True, slots=True)
class DeviceSlice:
    """A ResourceSlice: devices of one pool, on one node or reachable from several."""

    name: str
    driver: str
    pool: str
    generation: int
    node: str | None = None
    """``spec.nodeName``: node-local devices."""
    all_nodes: bool = False
    node_selector: tuple[dict[str, Any], ...] | None = None
    """``spec.nodeSelector.nodeSelectorTerms`` (ORed): network-attached devices."""
    devices: tuple[Device, ...] = ()
    counters: tuple[tuple[str, str, int], ...] = ()
    """``spec.sharedCounters``: ``(counter set, counter, milli-units)`` of the pool."""


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()
    """CEL expressions (``spec.selectors[].cel.expression``), all of which must hold."""
    problem: str | None = None
    """Why the selectors were refused at the wire (a limit, naming the field): a claim
    asking for the class is invalid with this reason (and the class selects nothing)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One ``spec.devices.requests[]`` entry of a claim (its ``exactly`` form)."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    mode: Literal["ExactCount", "All"] = "ExactCount"
    count: int = 1
    alternatives: tuple[Request, ...] = ()
    """``firstAvailable``: subrequests in order of preference, one of which is allocated
    (``device_class`` and the rest unused then)."""


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: tuple[Request, ...] = ()
    problem: str | None = None
    """Why Lockstep cannot plan this claim (a field and its limit), or None."""


@dataclass(frozen=True, slots=True)
class Claim:
    namespace: str
    name: str
    uid: str
    spec: ClaimSpec
    allocated: tuple[DeviceId, ...] | None = None
    """``status.allocation``'s devices; None while unallocated."""
    reserved_for: tuple[str, ...] = ()
    """Pods in ``status.reservedFor``, as ``namespace/name`` (the claim's namespace)."""
    deleting: bool = False
    owner: str | None = None
    """The pod it was made for from a template (``metadata.ownerReferences``): its alone."""
    resource_version: str = ""
    """``metadata.resourceVersion``: the precondition of Lockstep's one write to it."""

    @property
    def key(self) -> ClaimKey:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    namespace: str
    name: str
    spec: ClaimSpec

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
