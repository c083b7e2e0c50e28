"""CEL device selectors, evaluated with cel-python (a maintained CEL implementation), in the
environment Kubernetes gives them (k8s.io/dynamic-resource-allocation/cel, ``compile.go``):

* ``device.driver``: the driver's name;
* ``device.attributes["<domain>"].<id>``: an attribute (an unqualified attribute's domain is
  the driver); an unknown domain is an empty map, as upstream's ``mapper`` default makes it;
* ``device.capacity["<domain>"].<id>``: a quantity, compared with ``compareTo``,
  ``isGreaterThan``, ``isLessThan`` and built with ``quantity("40Gi")`` (the Kubernetes CEL
  quantity library).

Bounds, before any work: an expression is at most :data:`MAX_EXPRESSION_CHARS` (the API's
``CELSelectorExpressionMaxLength``) and at most :data:`MAX_MACROS` comprehension macros (the
only constructs whose cost grows faster than the expression: each iterates a map of at most
32 entries, so nesting multiplies). Compiled programs are cached per expression, results per
(expression, device): a cluster's devices are matched once, not once per plan.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import celpy
from celpy import celtypes

from ..resources import QuantityError, parse_quantity
from .model import Device

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_MACROS", "Selectors", "warm"]

MAX_EXPRESSION_CHARS = 10 * 1024
MAX_MACROS = 4
PROGRAMS_CACHED = 1024
RESULTS_CACHED = 200_000
_MACRO = re.compile(r"\.\s*(all|exists|exists_one|map|filter)\s*\(")


class Quantity(celtypes.IntType):
    """A capacity in milli-units; compared exactly, as ``resource.Quantity`` is."""


def _milli(v: Any) -> int:
    return int(v)


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text), milli=True))
    except QuantityError as e:
        raise ValueError(f"quantity({text!r}): {e}") from None


def _cmp(a: Any, b: Any) -> celtypes.IntType:
    x, y = _milli(a), _milli(b)
    return celtypes.IntType((x > y) - (x < y))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": lambda s: celtypes.BoolType(_is_quantity(s)),
    "compareTo": _cmp,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_milli(a) > _milli(b)),
    "isLessThan": lambda a, b: celtypes.BoolType(_milli(a) < _milli(b)),
    "asInteger": lambda a: celtypes.IntType(_milli(a) // 1000),
    "asApproximateFloat": lambda a: celtypes.DoubleType(_milli(a) / 1000),
    "isInteger": lambda a: celtypes.BoolType(_milli(a) % 1000 == 0),
    "sign": lambda a: celtypes.IntType((_milli(a) > 0) - (_milli(a) < 0)),
    "add": lambda a, b: Quantity(_milli(a) + _milli(b)),
    "sub": lambda a, b: Quantity(_milli(a) - _milli(b)),
}


def _is_quantity(s: Any) -> bool:
    try:
        parse_quantity(str(s), milli=True)
    except QuantityError:
        return False
    return True


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map
    (upstream's ``newStringInterfaceMapWithDefault``), so ``device.attributes["x"].y`` is an
    error only for the attribute, and ``has(...)`` guards work as they do upstream."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def _activation(d: Device) -> dict[str, Any]:
    attrs: dict[str, dict[Any, Any]] = {}
    for domain, ident, value in d.attributes:
        v: Any = (celtypes.BoolType(value) if isinstance(value, bool) else
                  celtypes.IntType(value) if isinstance(value, int) else
                  celtypes.StringType(value))
        attrs.setdefault(domain, {})[celtypes.StringType(ident)] = v
    caps: dict[str, dict[Any, Any]] = {}
    for domain, ident, milli in d.capacity:
        caps.setdefault(domain, {})[celtypes.StringType(ident)] = Quantity(milli)
    return {"device": celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(d.driver),
        celtypes.StringType("attributes"): _Domains(
            {celtypes.StringType(k): celtypes.MapType(v) for k, v in attrs.items()}),
        celtypes.StringType("capacity"): _Domains(
            {celtypes.StringType(k): celtypes.MapType(v) for k, v in caps.items()}),
    })}


def warm() -> None:
    """Build the CEL environment now (about half a second: cel-python builds its parser),
    so the first DRA plan does not pay for it on the event loop (the app calls this in a
    thread at start)."""
    _environment()


@functools.cache
def _environment() -> celpy.Environment:
    """One CEL environment per process, built on first use (its parser takes a while).
    cel-python raises the interpreter's recursion limit for every program's sake when it
    builds one; the process's own limit is put back (an expression nested past it is
    refused as nested too deeply)."""
    limit = sys.getrecursionlimit()
    try:
        return celpy.Environment()
    finally:
        sys.setrecursionlimit(limit)


class Selectors:
    """Compiled programs and results, cached; one per core."""

    def __init__(self) -> None:
        self._programs: OrderedDict[str, Any] = OrderedDict()
        self._results: dict[tuple[str, Device], bool] = {}

    def program(self, expression: str) -> Any:
        """The compiled program, or why it does not compile (a string)."""
        got = self._programs.get(expression)
        if got is not None:
            self._programs.move_to_end(expression)
            return got
        got = self._compile(expression)
        self._programs[expression] = got
        while len(self._programs) > PROGRAMS_CACHED:
            self._programs.popitem(last=False)
        return got

    def _compile(self, expression: str) -> Any:
        if len(expression) > MAX_EXPRESSION_CHARS:
            return f"{len(expression)} characters, at most {MAX_EXPRESSION_CHARS}"
        if len(_MACRO.findall(expression)) > MAX_MACROS:
            return f"more than {MAX_MACROS} comprehension macros"
        try:
            env = _environment()
            return env.program(env.compile(expression), functions=_FUNCTIONS)
        except RecursionError:
            return "nested too deeply"
        except Exception as e:  # cel-python's parse errors carry no common base
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return f"does not compile: {first[:200]}"

    def matches(self, expression: str, device: Device) -> bool:
        """Whether ``device`` satisfies ``expression``. An expression that does not compile,
        fails at run time or is not a boolean selects nothing (upstream's allocator fails
        the claim then; Lockstep reports the compile errors on the gang)."""
        key = (expression, device)
        got = self._results.get(key)
        if got is None:
            got = self._results[key] = self._evaluate(expression, device)
            if len(self._results) > RESULTS_CACHED:
                self._results.clear()
        return got

    def _evaluate(self, expression: str, device: Device) -> bool:
        prog = self.program(expression)
        if isinstance(prog, str):
            return False
        try:
            out = prog.evaluate(_activation(device))
        except (Exception, RecursionError):  # CELEvalError and anything a function raised
            return False
        return isinstance(out, celtypes.BoolType) and bool(out)
