"""Resource arithmetic on plain integer vectors.

Kubernetes quantities ("500m", "4Gi", "1e3") are parsed once, at the edge, into integers:
CPU in millicores, everything else in base units rounded up. The hot path then only adds,
subtracts and compares small dicts, which keeps filter O(1) per node.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "CPU",
    "PODS",
    "QuantityError",
    "Resources",
    "add",
    "fits",
    "format_resources",
    "parse_quantity",
    "pod_requests",
    "resource_list",
    "shortfall",
    "sub",
]

Resources = dict[str, int]
"""Resource name -> integer amount (cpu in millicores)."""

CPU = "cpu"
PODS = "pods"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would not accept either."""

    def __init__(self, value: object, reason: str) -> None:
        super().__init__(f"invalid quantity {value!r}: {reason}")
        self.value = value
        self.reason = reason


MAX_QUANTITY = 2**63 - 1
"""The largest amount a quantity may come to (in millis for cpu): Kubernetes keeps a
quantity's value in an int64 (``resource.Quantity.Value``/``MilliValue``). Beyond it, or
written in more than :data:`MAX_QUANTITY_CHARS` characters, a quantity is refused before
any arithmetic: ``Decimal("1e999999999")`` parses, and turning it into an int would not
finish."""
MAX_QUANTITY_CHARS = 64
MAX_RESOURCES = 128
"""The most resource names one ResourceList may carry."""
MAX_NAME_CHARS = 317
"""A resource name is a qualified name: a 253-character prefix, a slash, 63 characters."""


def _ceil(d: Decimal) -> int:
    i = int(d)
    return i + 1 if d > i else i


def _bounded(number: Decimal, original: object) -> Decimal:
    """``number`` if its magnitude is within :data:`MAX_QUANTITY`; checked by exponent
    first, so no digits are expanded for a huge one."""
    if not number.is_finite():
        raise QuantityError(original, "not finite")
    if number.adjusted() > 19 or number > MAX_QUANTITY:
        raise QuantityError(original, f"above the limit of {MAX_QUANTITY} (int64)")
    return number


def parse_quantity(value: object, *, milli: bool = False) -> int:
    """Parse a Kubernetes quantity into an integer (millis when ``milli``), rounding up."""
    if type(value) is str:
        return _parse_str(value, milli)
    return _parse_any(value, milli)


@functools.lru_cache(maxsize=4096)
def _parse_str(value: str, milli: bool) -> int:
    """Memoised: a cluster's nodes and pods repeat a handful of quantities ("8", "500m",
    "2Ti"), and a relist of 5,000 nodes parsed each with Decimal."""
    return _parse_any(value, milli)


def _parse_any(value: object, milli: bool) -> int:
    if isinstance(value, bool):
        raise QuantityError(value, "not a number")
    if isinstance(value, int):
        if value.bit_length() > 64:
            raise QuantityError(f"a {value.bit_length()}-bit number",
                                f"above the limit of {MAX_QUANTITY} (int64)")
        number = Decimal(value)
    elif isinstance(value, float):
        number = Decimal(repr(value))
    elif isinstance(value, str):
        s = value.strip()
        if not s:
            raise QuantityError(value, "empty")
        if len(s) > MAX_QUANTITY_CHARS:
            raise QuantityError(f"{s[:24]}... ({len(s)} characters)",
                                f"longer than {MAX_QUANTITY_CHARS} characters")
        number = _parse_text(s, value)
    else:
        raise QuantityError(type(value).__name__, "not a string or number")
    if _bounded(number, value) < 0:
        raise QuantityError(value, "negative")
    return _ceil(_bounded(number * 1000 if milli else number, value))


def _parse_text(s: str, original: str) -> Decimal:
    suffix = ""
    if s[-2:] in _BINARY:
        suffix = s[-2:]
    elif s[-1:] in _DECIMAL and s[-1:].isalpha():
        suffix = s[-1:]
    digits = s[: len(s) - len(suffix)]
    if not digits.isascii():  # Decimal, like int(), reads other scripts' digits
        raise QuantityError(original, "not a number")
    try:
        number = _bounded(Decimal(digits), original)
    except InvalidOperation:
        raise QuantityError(original, "not a number") from None
    if suffix in _BINARY:
        return _bounded(number * _BINARY[suffix], original)
    return _bounded(number * _DECIMAL[suffix], original)


def resource_list(raw: Mapping[str, Any] | None) -> Resources:
    """Turn a Kubernetes ResourceList (``{"cpu": "500m"}``) into integers."""
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise QuantityError("a list" if isinstance(raw, list) else type(raw).__name__,
                            "not a resource list (an object of quantities)")
    if len(raw) > MAX_RESOURCES:
        raise QuantityError(f"{len(raw)} resources", f"more than {MAX_RESOURCES} resources")
    for name in raw:
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
            raise QuantityError(f"{str(name)[:24]}...", "not a resource name")
    return {name: _parse_str(q, name == CPU) if type(q) is str else _parse_any(q, name == CPU)
            for name, q in raw.items()}


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """True when every requested amount is available; unrequested resources do not matter."""
    for k, v in request.items():
        if v > 0 and free.get(k, 0) < v:
            return False
    return True


def shortfall(request: Mapping[str, int], free: Mapping[str, int]) -> Resources:
    """What is missing for ``request`` to fit in ``free`` (empty when it fits)."""
    return {k: v - free.get(k, 0) for k, v in request.items() if v > 0 and free.get(k, 0) < v}


def _max_into(acc: Resources, other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > acc.get(k, 0):
            acc[k] = v


def _container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    requests = resource_list(resources.get("requests"))
    # The API server defaults requests to limits for resources that only set limits.
    for name, amount in resource_list(resources.get("limits")).items():
        requests.setdefault(name, amount)
    return requests


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """Effective requests of a pod spec, as kube-scheduler's NodeResourcesFit computes them.

    Sum of app containers plus restartable (sidecar) init containers, at least the largest
    plain init container, plus pod overhead, plus one ``pods`` slot.
    """
    total: Resources = {}
    for c in spec.get("containers") or ():
        for name, amount in _container_requests(c).items():
            total[name] = total.get(name, 0) + amount
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in spec.get("initContainers") or ():
        req = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            sidecars = add(sidecars, req)
            total = add(total, req)
        else:
            _max_into(init_peak, add(sidecars, req))
    _max_into(total, init_peak)
    total = add(total, resource_list(spec.get("overhead")))
    total[PODS] = total.get(PODS, 0) + 1
    if len(total) > MAX_RESOURCES:  # checked on every node: bounded, whatever the containers
        raise QuantityError(f"{len(total)} resources", f"more than {MAX_RESOURCES} resources")
    return {k: v for k, v in total.items() if v}


def format_resources(r: Mapping[str, int], keys: Iterable[str] | None = None) -> str:
    """Human form for reasons: ``{nvidia.com/gpu: 1, cpu: 500m}``, pods slot omitted."""
    names = sorted(keys if keys is not None else r)
    parts = []
    for k in names:
        if k == PODS:
            continue
        v = r.get(k, 0)
        if k == CPU:
            parts.append(f"cpu: {v // 1000}" if v % 1000 == 0 else f"cpu: {v}m")
        elif k == "memory" and v and v % 2**30 == 0:
            parts.append(f"memory: {v // 2**30}Gi")
        elif k == "memory" and v and v % 2**20 == 0:
            parts.append(f"memory: {v // 2**20}Mi")
        else:
            parts.append(f"{k}: {v}")
    return "{" + ", ".join(parts) + "}"
