"""``resource.k8s.io/v1`` objects as the API server serves them, read with Pydantic once at
the watch and turned into the core's dataclasses (``coscheduling.devices.model``).

Only the fields the planner reads are declared; others are ignored (a newer API server may
add some). Every number and list a user writes is bounded here, before any work: a claim over
a limit is kept, with its ``problem`` naming the field, so its gang gets a clear invalid-gang
reason instead of a silent "does not fit". A malformed object raises ``RecordError`` (the
cache skips it and logs why), never another exception.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..records import RecordError
from ..resources import MAX_QUANTITY, QuantityError, parse_quantity
from .celcost import count_tokens
from .model import (
    MAX_ALTERNATIVES,
    MAX_COUNT,
    Claim,
    ClaimSpec,
    ClaimTemplate,
    Device,
    DeviceClass,
    DeviceSlice,
    Request,
)
from .selectors import MAX_EXPRESSION_CHARS

__all__ = [
    "MAX_REQUESTS",
    "MAX_SELECTORS",
    "MAX_SELECTOR_TOKENS",
    "claim_from_json",
    "class_from_json",
    "slice_from_json",
    "template_from_json",
]

MAX_REQUESTS = 32
"""``spec.devices.requests`` per claim (the API's ``DeviceRequestsMaxSize``)."""
MAX_SELECTORS = 32
"""Selectors per class or request (the API's ``DeviceSelectorsMaxSize``)."""
MAX_SELECTOR_TOKENS = 2048
"""CEL tokens of all the selectors of one claim (every request and subrequest) or one class:
each expression is bounded on its own (``celcost.MAX_TOKENS``), but a claim may hold 32
requests of 8 subrequests of 32 selectors, and the parse costs about 0.1 ms a token, paid
on the event loop when the claim is first planned. 2,048 is four expressions at their limit
and dozens of ordinary ones."""
MAX_DEVICES_PER_SLICE = 128
"""Devices per ResourceSlice (the API's ``ResourceSliceMaxDevices``)."""
MAX_ATTRIBUTES = 32
"""Attributes plus capacities per device (``ResourceSliceMaxAttributesAndCapacitiesPerDevice``)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Owner(_Wire):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class _Meta(_Wire):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    deletionTimestamp: str | None = None
    ownerReferences: list[_Owner] = Field(default_factory=list)


class _Cel(_Wire):
    expression: str = ""


class _Selector(_Wire):
    cel: _Cel | None = None


class _ClassSpec(_Wire):
    selectors: list[_Selector] = Field(default_factory=list)


class _DeviceClass(_Wire):
    metadata: _Meta
    spec: _ClassSpec = _ClassSpec()


class _Attribute(_Wire):
    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = None
    version: str | None = None


class _Capacity(_Wire):
    value: str | int


class _Consumption(_Wire):
    counterSet: str = ""
    counters: dict[str, _Capacity] = Field(default_factory=dict, max_length=MAX_ATTRIBUTES)


class _CounterSet(_Wire):
    name: str = ""
    counters: dict[str, _Capacity] = Field(default_factory=dict, max_length=MAX_ATTRIBUTES)


class _Device(_Wire):
    name: str = Field(min_length=1, max_length=128)
    attributes: dict[str, _Attribute] = Field(default_factory=dict)
    capacity: dict[str, _Capacity] = Field(default_factory=dict)
    consumesCounters: list[_Consumption] = Field(default_factory=list, max_length=8)


class _Pool(_Wire):
    name: str = Field(min_length=1)
    generation: int = 0


class _SliceSpec(_Wire):
    driver: str = Field(min_length=1, max_length=63)
    pool: _Pool
    nodeName: str | None = None
    allNodes: bool | None = None
    nodeSelector: dict[str, Any] | None = None
    devices: list[_Device] = Field(default_factory=list, max_length=MAX_DEVICES_PER_SLICE)
    sharedCounters: list[_CounterSet] = Field(default_factory=list, max_length=8)


class _Slice(_Wire):
    metadata: _Meta
    spec: _SliceSpec


class _Exactly(_Wire):
    deviceClassName: str = ""
    selectors: list[_Selector] = Field(default_factory=list)
    allocationMode: str = "ExactCount"
    count: int | None = None


class _Subrequest(_Exactly):
    name: str = ""


class _Request(_Wire):
    name: str = ""
    exactly: _Exactly | None = None
    firstAvailable: list[_Subrequest] | None = None


class _Devices(_Wire):
    requests: list[_Request] = Field(default_factory=list)
    """Over :data:`MAX_REQUESTS` is kept as the claim's problem, not refused here."""


class _ClaimSpec(_Wire):
    devices: _Devices = _Devices()


class _Result(_Wire):
    driver: str
    pool: str
    device: str


class _AllocDevices(_Wire):
    results: list[_Result] = Field(default_factory=list, max_length=MAX_COUNT * MAX_REQUESTS)


class _Allocation(_Wire):
    devices: _AllocDevices = _AllocDevices()


class _Consumer(_Wire):
    resource: str = ""
    name: str = ""


class _ClaimStatus(_Wire):
    allocation: _Allocation | None = None
    reservedFor: list[_Consumer] = Field(default_factory=list, max_length=256)
    """At most 256 consumers (the API's ``ResourceClaimReservedForMaxSize``)."""


class _Claim(_Wire):
    metadata: _Meta
    spec: _ClaimSpec = _ClaimSpec()
    status: _ClaimStatus = _ClaimStatus()


class _TemplateSpec(_Wire):
    spec: _ClaimSpec = _ClaimSpec()


class _Template(_Wire):
    metadata: _Meta
    spec: _TemplateSpec = _TemplateSpec()


def _read(model: type[_Wire], obj: Mapping[str, Any], kind: str) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid"}
        where = ".".join(str(p) for p in first["loc"])
        raise RecordError(f"{kind}.{where}" if where else kind, str(first["msg"])) from None
    except RecursionError:
        raise RecordError(kind, "nested too deeply") from None


def _expressions(selectors: list[_Selector], path: str) -> tuple[tuple[str, ...], str | None]:
    if len(selectors) > MAX_SELECTORS:
        return (), f"{path}: {len(selectors)} selectors, at most {MAX_SELECTORS}"
    out = []
    for i, s in enumerate(selectors):
        expr = s.cel.expression if s.cel is not None else ""
        if not expr:
            return (), f"{path}[{i}].cel.expression: missing"
        if len(expr) > MAX_EXPRESSION_CHARS:
            return (), (f"{path}[{i}].cel.expression: {len(expr)} characters, "
                        f"at most {MAX_EXPRESSION_CHARS}")
        out.append(expr)
    return tuple(out), None


def _too_many_tokens(exprs: Iterable[str], path: str) -> str | None:
    n = 0
    for e in exprs:
        n += count_tokens(e)
        if n > MAX_SELECTOR_TOKENS:
            return (f"{path}: more than {MAX_SELECTOR_TOKENS} CEL tokens in all selectors, "
                    f"at most {MAX_SELECTOR_TOKENS}")
    return None


def class_from_json(obj: Mapping[str, Any]) -> DeviceClass:
    c: _DeviceClass = _read(_DeviceClass, obj, "DeviceClass")
    exprs, problem = _expressions(c.spec.selectors, "spec.selectors")
    problem = problem or _too_many_tokens(exprs, "spec.selectors")
    # A class over a limit selects nothing (an impossible selector), never everything, and
    # says why: a claim asking for it is invalid with ``problem`` (``demand``).
    return DeviceClass(c.metadata.name, exprs if problem is None else ("false",), problem)


def _attr_value(a: _Attribute) -> int | bool | str | None:
    for v in (a.bool_, a.int_, a.string, a.version):
        if v is not None:
            return v
    return None


def _qualify(name: str, driver: str) -> tuple[str, str]:
    domain, _, ident = name.rpartition("/")
    return (domain or driver, ident)


def _device(d: _Device, driver: str, pool: str) -> Device:
    if len(d.attributes) + len(d.capacity) > MAX_ATTRIBUTES:
        raise RecordError("ResourceSlice.spec.devices", f"device {d.name}: more than "
                          f"{MAX_ATTRIBUTES} attributes and capacities")
    attrs = []
    for name, a in sorted(d.attributes.items()):
        v = _attr_value(a)
        if v is not None:
            attrs.append((*_qualify(name, driver), v))
    caps = []
    for name, c in sorted(d.capacity.items()):
        try:
            caps.append((*_qualify(name, driver), _capacity(c.value)))
        except QuantityError as e:
            raise RecordError(f"ResourceSlice.spec.devices.capacity.{name}", str(e)) from None
    consumes = tuple((c.counterSet, name, _milli(v.value, "consumesCounters"))
                     for c in d.consumesCounters for name, v in sorted(c.counters.items()))
    return Device(driver, pool, d.name, tuple(attrs), tuple(caps), consumes)


def _capacity(value: str | int) -> int:
    """A device capacity in millis. The API server accepts a capacity beyond int64 millis
    (``8Ei``, int64's maximum) and a negative one (``-1``); refusing them dropped the
    whole slice, so kube-scheduler saw devices Lockstep never planned. A capacity is only
    compared (CEL's ``compareTo`` and friends), never added up, so one beyond the limit
    saturates at :data:`MAX_QUANTITY` with its sign; text that is no quantity still raises."""
    neg = value < 0 if isinstance(value, int) else value.strip().startswith("-")
    if neg:
        value = -value if isinstance(value, int) else value.strip()[1:]
    try:
        milli = parse_quantity(value, milli=True)
    except QuantityError as e:
        if not e.reason.startswith("above the limit"):
            raise
        milli = MAX_QUANTITY
    return -milli if neg else milli


def _milli(value: str | int, where: str) -> int:
    try:
        return parse_quantity(value, milli=True)
    except QuantityError as e:
        raise RecordError(f"ResourceSlice.spec.{where}", str(e)) from None


def slice_from_json(obj: Mapping[str, Any]) -> DeviceSlice:
    s: _Slice = _read(_Slice, obj, "ResourceSlice")
    spec = s.spec
    terms = None
    if spec.nodeSelector is not None:
        raw = spec.nodeSelector.get("nodeSelectorTerms")
        terms = tuple(t for t in raw if isinstance(t, dict)) if isinstance(raw, list) else ()
    return DeviceSlice(
        name=s.metadata.name, driver=spec.driver, pool=spec.pool.name,
        generation=spec.pool.generation, node=spec.nodeName or None,
        all_nodes=bool(spec.allNodes), node_selector=terms,
        devices=tuple(_device(d, spec.driver, spec.pool.name) for d in spec.devices),
        counters=tuple((c.name, name, _milli(v.value, "sharedCounters"))
                       for c in spec.sharedCounters for name, v in sorted(c.counters.items())))


def _request(i: int, r: _Request) -> Request | str:
    path = f"spec.devices.requests[{i}]"
    if r.firstAvailable:
        if len(r.firstAvailable) > MAX_ALTERNATIVES:
            return (f"{path}.firstAvailable: {len(r.firstAvailable)} subrequests, at most "
                    f"{MAX_ALTERNATIVES}")
        subs = []
        for j, sub in enumerate(r.firstAvailable):
            got = _exactly(f"{r.name}/{sub.name}", sub, f"{path}.firstAvailable[{j}]")
            if isinstance(got, str):
                return got
            subs.append(got)
        return Request(r.name, "", alternatives=tuple(subs))
    if r.exactly is None:
        return f"{path}: neither exactly nor firstAvailable"
    return _exactly(r.name, r.exactly, f"{path}.exactly")


def _exactly(name: str, e: _Exactly, path: str) -> Request | str:
    if not e.deviceClassName:
        return f"{path}.deviceClassName: missing"
    exprs, problem = _expressions(e.selectors, f"{path}.selectors")
    if problem is not None:
        return problem
    if e.allocationMode == "All":
        return Request(name, e.deviceClassName, exprs, "All", 0)
    if e.allocationMode not in ("", "ExactCount"):
        return f"{path}.allocationMode: {e.allocationMode!r} is not ExactCount or All"
    count = 1 if e.count is None else e.count
    if not 1 <= count <= MAX_COUNT:
        return f"{path}.count: {count}, must be 1..{MAX_COUNT}"
    return Request(name, e.deviceClassName, exprs, "ExactCount", count)


def _spec(spec: _ClaimSpec) -> ClaimSpec:
    reqs = spec.devices.requests
    if len(reqs) > MAX_REQUESTS:
        return ClaimSpec((), f"spec.devices.requests: {len(reqs)}, at most {MAX_REQUESTS}")
    out = []
    for i, r in enumerate(reqs):
        got = _request(i, r)
        if isinstance(got, str):
            return ClaimSpec((), got)
        out.append(got)
    every = [e for r in out for x in (r, *r.alternatives) for e in x.selectors]
    if (problem := _too_many_tokens(every, "spec.devices.requests")) is not None:
        return ClaimSpec((), problem)
    return ClaimSpec(tuple(out))


def claim_from_json(obj: Mapping[str, Any]) -> Claim:
    c: _Claim = _read(_Claim, obj, "ResourceClaim")
    alloc = c.status.allocation
    return Claim(
        namespace=c.metadata.namespace or "default", name=c.metadata.name,
        uid=c.metadata.uid, spec=_spec(c.spec),
        allocated=tuple((r.driver, r.pool, r.device) for r in alloc.devices.results)
        if alloc is not None else None,
        reserved_for=tuple(f"{c.metadata.namespace or 'default'}/{x.name}"
                           for x in c.status.reservedFor if x.resource == "pods" and x.name),
        deleting=c.metadata.deletionTimestamp is not None,
        owner=next((o.name for o in c.metadata.ownerReferences
                    if o.kind == "Pod" and o.controller and o.name), None),
        resource_version=c.metadata.resourceVersion)


def template_from_json(obj: Mapping[str, Any]) -> ClaimTemplate:
    t: _Template = _read(_Template, obj, "ResourceClaimTemplate")
    return ClaimTemplate(t.metadata.namespace or "default", t.metadata.name, _spec(t.spec.spec))
