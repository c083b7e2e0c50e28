"""CEL device selectors, evaluated with cel-python (a maintained CEL implementation), in the
environment Kubernetes gives them (k8s.io/dynamic-resource-allocation/cel, ``compile.go``):

* ``device.driver``: the driver's name;
* ``device.attributes["<domain>"].<id>``: an attribute (an unqualified attribute's domain is
  the driver); an unknown domain is an empty map, as upstream's ``mapper`` default makes it;
* ``device.capacity["<domain>"].<id>``: a quantity, compared with ``compareTo``,
  ``isGreaterThan``, ``isLessThan`` and built with ``quantity("40Gi")`` (the Kubernetes CEL
  quantity library).

Bounds, before any work, on what the expression costs rather than on its text
(``celcost``): at most :data:`MAX_EXPRESSION_CHARS` characters (the API's
``CELSelectorExpressionMaxLength``), then at most ``celcost.MAX_TOKENS`` tokens before the parse,
then on the parse tree at most ``celcost.MAX_MACROS`` comprehension macros and an estimated
worst case of ``celcost.MAX_STEPS`` evaluation steps per device. An expression over a limit
does not compile: the claim is invalid with a reason naming the field and the limit. The
evaluation counts the same steps and stops at the limit (the device does not match, the
expression is refused from then on, and :attr:`Selectors.overruns` counts it); a caller may
pass a :class:`Budget` shared by a whole plan.

Compiled programs are cached per expression within :data:`PROGRAM_BYTES` (estimated from
their trees), results per (expression, device signature) in a least-recently-used table: a
device's signature is what a selector can read of it (driver, attributes, capacity), so
identical devices (the 8 GPUs of a node, one GPU model on many nodes) are evaluated once.
"""

from __future__ import annotations

import functools
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import Evaluator
from lark.tree import Meta

from ..resources import QuantityError, parse_quantity
from .celcost import (
    AST,
    BUILDERS,
    ITERATION_STEPS,
    MAX_MACROS,
    MAX_STEPS,
    MAX_TOKENS,
    Estimate,
    Read,
    count_tokens,
    estimate,
    reads,
)
from .model import Device

__all__ = ["MAX_EXPRESSION_CHARS", "Budget", "Program", "Selectors", "projected", "signature",
           "warm"]

MAX_EXPRESSION_CHARS = 10 * 1024
PROGRAM_BYTES = 64 * 2**20
"""What the compiled programs of one core may keep, estimated (:data:`NODE_BYTES` a node)."""
NODE_BYTES = 320
PROGRAM_BASE_BYTES = 40 * 1024
"""A program's own objects whatever its size (its runner and the cache's entry)."""
RESULTS_CACHED = 100_000
"""(expression, device signature) results kept, least recently used first out: about 20 MiB."""

Signature = tuple[Hashable, ...]


def signature(d: Device) -> Signature:
    """All a selector can read of ``d`` (``device.driver``, ``.attributes``, ``.capacity``,
    with each attribute's type: ``true`` and ``1`` are equal in Python, not in CEL): two
    devices with one signature match the same selectors."""
    return (d.driver, d.attributes, tuple(type(v) for _, _, v in d.attributes), d.capacity)


_ABSENT = ("absent",)


def _lookup(entries: tuple[tuple[str, str, Any], ...], domain: str, ident: str) -> Hashable:
    for dom, i, v in entries:
        if i == ident and dom == domain:
            return (type(v), v)
    return _ABSENT


def projected(d: Device, reads: tuple[Read, ...]) -> Signature:
    """What of ``d`` a selector that reads only ``reads`` (``celcost.reads``) depends on: the
    GPUs of one model on many nodes share it even when each has its own ``uuid``."""
    out: list[Hashable] = []
    for r in reads:
        if r[0] == "driver":
            out.append(d.driver)
        else:
            out.append(_lookup(d.attributes if r[0] == "attributes" else d.capacity, r[1], r[2]))
    return tuple(out)


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


class _OverBudget(Exception):
    """The meter ran out: raised through the evaluator (none of its handlers catch it)."""


class _Meter:
    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, steps: int) -> None:
        self.used += steps
        if self.used > self.limit:
            raise _OverBudget


class _MeteredEvaluator(Evaluator):
    """cel-python's evaluator, counting ``celcost``'s steps as it goes: one per node visited
    (every descent goes through ``_visit_tree``), the size of each list, map or string a node
    builds, and ``ITERATION_STEPS`` per macro iteration (each runs a sub-evaluator)."""

    meter: _Meter
    per_call = 0

    def sub_evaluator(self, ast: AST) -> Evaluator:
        sub = _MeteredEvaluator(ast, activation=self.activation)
        sub.meter, sub.per_call = self.meter, ITERATION_STEPS
        return sub

    def evaluate(self, context: Any = None) -> Any:
        self.meter.charge(self.per_call)
        return super().evaluate(context)

    def _visit_tree(self, tree: AST) -> Any:
        out = super()._visit_tree(tree)
        steps = 1
        if tree.data in BUILDERS and isinstance(out, (list, dict, str, bytes)):
            steps += len(out)
        self.meter.charge(steps)
        return out


_META = Meta()  # type: ignore[no-untyped-call]
_META.line = _META.column = 0
"""One position shared by every node of a cached tree: lark's per-node positions are 70% of
a tree's memory, and cel-python reads them only to name an error's line."""


@dataclass(frozen=True, slots=True)
class Program:
    """A selector compiled and measured."""

    ast: AST = field(repr=False)
    runner: celpy.Runner = field(repr=False)
    cost: Estimate
    bytes: int
    """Estimated memory it keeps."""
    reads: tuple[Read, ...] | None = None
    """All it reads of a device, when that is known (``celcost.reads``): results are cached
    by that projection of the device, else by its whole :func:`signature`."""

    def key(self, d: Device) -> Signature:
        return signature(d) if self.reads is None else projected(d, self.reads)

    def evaluate(self, activation: dict[str, Any], limit: int) -> tuple[Any, int]:
        """The value and the steps it took; raises ``_OverBudget`` past ``limit``."""
        ev = _MeteredEvaluator(self.ast, self.runner.new_activation())
        ev.meter = _Meter(limit)
        try:
            return ev.evaluate(activation), ev.meter.used
        except _OverBudget:
            raise _OverBudget(ev.meter.used) from None


@dataclass(slots=True)
class Budget:
    """Steps one caller (a plan) lets all of its selector evaluations take together: each
    evaluation it pays for takes at most what is left; once spent, a device not yet evaluated
    does not match and :attr:`exhausted` says so (results already cached cost nothing)."""

    steps: int
    exhausted: bool = False


def _entry_bytes(expression: str, got: Program | str) -> int:
    return len(expression) + (got.bytes if isinstance(got, Program) else len(got) + 200)


class Selectors:
    """Compiled programs and results, cached; one per core."""

    def __init__(self) -> None:
        self._programs: OrderedDict[str, Program | str] = OrderedDict()
        self._program_bytes = 0
        self._results: OrderedDict[tuple[str, Signature], bool] = OrderedDict()
        self.evaluations = 0
        """Evaluations run (cache misses), for tests and metrics."""
        self.steps = 0
        """Steps they took."""
        self.overruns = 0
        """Evaluations stopped at ``MAX_STEPS`` (each refuses its expression from then on)."""
        self.compiles = 0
        """Expressions parsed (cache misses within ``MAX_TOKENS``), for a caller's budget."""
        self.tokens = 0
        """Their tokens: a parse takes about 0.1 ms a token on the event loop."""

    @property
    def program_bytes(self) -> int:
        return self._program_bytes

    def compiled(self, expression: str) -> Program | str | None:
        """The program or refusal kept for ``expression``; None when it is not compiled yet
        (nothing is parsed here: a caller with a budget decides whether to pay for it)."""
        got = self._programs.get(expression)
        if got is not None:
            self._programs.move_to_end(expression)
        return got

    def program(self, expression: str) -> Program | str:
        """The compiled program, or why it does not compile (a string naming the limit)."""
        got = self._programs.get(expression)
        if got is not None:
            self._programs.move_to_end(expression)
            return got
        got = self._compile(expression)
        self._remember(expression, got)
        return got

    def _remember(self, expression: str, got: Program | str) -> None:
        old = self._programs.pop(expression, None)
        if old is not None:
            self._program_bytes -= _entry_bytes(expression, old)
        self._programs[expression] = got
        self._program_bytes += _entry_bytes(expression, got)
        while self._program_bytes > PROGRAM_BYTES and len(self._programs) > 1:
            e, p = self._programs.popitem(last=False)
            self._program_bytes -= _entry_bytes(e, p)

    def _compile(self, expression: str) -> Program | str:
        if len(expression) > MAX_EXPRESSION_CHARS:
            return f"{len(expression)} characters, at most {MAX_EXPRESSION_CHARS}"
        tokens = count_tokens(expression)
        if tokens > MAX_TOKENS:
            return f"more than {MAX_TOKENS} tokens, at most {MAX_TOKENS}"
        self.compiles += 1
        self.tokens += tokens
        try:
            env = _environment()
            ast = env.compile(expression)
        except RecursionError:
            return "nested too deeply"
        except Exception as e:  # cel-python's parse errors carry no common base
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return f"does not compile: {first[:200]}"
        cost = estimate(ast)
        if isinstance(cost, str):
            return cost
        if cost.macros > MAX_MACROS:
            return f"{cost.macros} comprehension macros, at most {MAX_MACROS}"
        if cost.steps > MAX_STEPS:
            return (f"estimated cost {cost.steps} steps per device, at most {MAX_STEPS} "
                    "(a macro costs its range's size times its body; nested macros multiply)")
        for t in ast.iter_subtrees():
            t._meta = _META
        runner = env.program(ast, functions=_FUNCTIONS)
        return Program(ast, runner, cost, PROGRAM_BASE_BYTES + cost.nodes * NODE_BYTES,
                       reads(ast))

    def known(self, expression: str, prog: Program, device: Device) -> bool | None:
        """The result kept for ``device`` under ``expression`` (compiled as ``prog``), or
        None when it is not known: a look-up, nothing is evaluated."""
        key = (expression, prog.key(device))
        got = self._results.get(key)
        if got is not None:
            self._results.move_to_end(key)
        return got

    def matches(self, expression: str, device: Device, *, budget: Budget | None = None) -> bool:
        """Whether ``device`` satisfies ``expression``. An expression that does not compile,
        fails at run time, is not a boolean or runs past its steps selects nothing (upstream's
        allocator fails the claim then; Lockstep reports the compile errors on the gang)."""
        prog = self.program(expression)
        if isinstance(prog, str):
            return False
        key = (expression, prog.key(device))
        got = self._results.get(key)
        if got is not None:
            self._results.move_to_end(key)
            return got
        limit = MAX_STEPS
        if budget is not None:
            if budget.steps <= 0:
                budget.exhausted = True
                return False
            limit = min(limit, budget.steps)
        ok, used = self._evaluate(expression, prog, device, limit)
        self.evaluations += 1
        self.steps += used
        if budget is not None:
            budget.steps -= used
            if ok is None and limit < MAX_STEPS:
                budget.exhausted = True
                return False  # the plan's steps ran out, not the selector's: not a result
        got = bool(ok)
        self._results[key] = got
        if len(self._results) > RESULTS_CACHED:
            self._results.popitem(last=False)
        return got

    def _evaluate(self, expression: str, prog: Program, device: Device,
                  limit: int) -> tuple[bool | None, int]:
        """The result (None: over ``limit``) and the steps it took."""
        try:
            out, used = prog.evaluate(_activation(device), limit)
        except _OverBudget as e:
            used = int(e.args[0]) if e.args else limit
            if limit >= MAX_STEPS:
                self.overruns += 1
                self._remember(expression, (
                    f"evaluation took more than {MAX_STEPS} steps for device "
                    f"{device.driver}/{device.pool}/{device.name}, at most {MAX_STEPS}"))
            return None, used
        except (Exception, RecursionError):  # CELEvalError and anything a function raised
            return False, 0
        return isinstance(out, celtypes.BoolType) and bool(out), used
