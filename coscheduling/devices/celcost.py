"""What a CEL selector may cost, measured before it runs: on its tokens before the parse, on
its parse tree after, never on its characters (a comment or a space costs nothing, a literal
list of 5,000 items costs 5,000).

Two limits, in the units cel-python spends:

* **Tokens**, counted by one regular expression before the parse (:data:`MAX_TOKENS`).
  cel-python's parser (lark, LALR) takes about 0.1 ms and 0.7 KiB per token and builds ten
  tree nodes per list item, so a 10 KiB literal list took 0.4-2.7 s to parse and kept 34 MiB;
  512 tokens parse in tens of milliseconds.
* **Steps**, estimated on the parse tree (:func:`estimate`) the way Kubernetes' CEL cost model
  estimates cel-go's (``checker.CostEstimator``: a comprehension costs its range's size times
  its body, so nesting multiplies): one step per tree node the evaluator visits, plus the size
  of every list, map or string a node builds, plus :data:`ITERATION_STEPS` per macro
  iteration (a new activation each). A range is as large as it is written (a literal list of N
  items iterates N times) or, when it comes from the device, :data:`DEVICE_SIZE` (the API
  bounds a device to 32 attributes and capacities and a string attribute to 64 characters).
  The evaluator counts the same steps at run time (``selectors._Meter``), so an estimate
  that undercounts is still cut off at :data:`MAX_STEPS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lark import Token, Tree

AST = Tree[Token]
"""A parse tree as cel-python's parser builds it."""

__all__ = [
    "BUILDERS",
    "DEVICE_SIZE",
    "ITERATION_STEPS",
    "MACROS",
    "MAX_DEPTH",
    "MAX_MACROS",
    "MAX_STEPS",
    "MAX_TOKENS",
    "Estimate",
    "count_tokens",
    "estimate",
    "reads",
]

MAX_TOKENS = 512
"""Tokens of one expression (comments and white space are not tokens)."""
MAX_DEPTH = 200
"""Levels of the parse tree: the evaluator recurses about three Python frames per level, and
the interpreter's own limit is 1,000."""
MAX_MACROS = 4
"""Comprehension macros in one expression, counted on the parse tree."""
MAX_STEPS = 10_000
"""Evaluation steps for one device (estimated before, counted during): about 10-40 ms of
cel-python on a loaded 2-core machine."""
ITERATION_STEPS = 20
"""What one macro iteration costs over its body: cel-python clones the activation for it
(measured about 20 times a plain node visit)."""
DEVICE_SIZE = 32
"""The largest value a device gives a selector: a map of at most 32 attributes and
capacities, a string of at most 64 characters (the API's ``DeviceAttribute`` limits)."""
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter", "reduce", "min"})
"""What cel-python evaluates as a macro over its receiver (``reduce`` and ``min`` are its own
extensions): each iterates the receiver."""
BUILDERS = frozenset({"list_lit", "map_lit", "addition", "member_dot_arg", "ident_arg",
                      "dot_ident_arg", "literal"})
"""Nodes whose value may be new (a list, map or string of its own size): the rest pass a
child's value up, which costs one step, not its size again."""

_TOKEN = re.compile(r"""
    (?P<skip>[\t\n\f\r ]+|//[^\n]*)
  | [bB]?[rR]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''
              |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | [_a-zA-Z][_a-zA-Z0-9]*|[0-9][0-9a-zA-Z.]*|&&|\|\||[=!<>]=|.
""", re.VERBOSE | re.DOTALL)


def count_tokens(text: str, limit: int = MAX_TOKENS) -> int:
    """Tokens of ``text`` as CEL's lexer splits it, counting stops past ``limit`` (one regular
    expression over at most 10 KiB: well under a millisecond). Where this scan and lark's
    lexer differ (text lark refuses anyway) this one counts more, never fewer."""
    n = 0
    for m in _TOKEN.finditer(text):
        if m.lastgroup != "skip":
            n += 1
            if n > limit:
                break
    return n


@dataclass(frozen=True, slots=True)
class Estimate:
    steps: int
    """Worst-case evaluation steps for one device."""
    macros: int
    nodes: int
    """Tree nodes: what the compiled program keeps (its memory is about this times 0.3 KiB)."""


def _shape(tree: AST) -> tuple[int, int]:
    """Depth and nodes, without recursion (the walk that follows recurses once per level)."""
    deepest, nodes, stack = 0, 0, [(tree, 1)]
    while stack:
        t, d = stack.pop()
        deepest, nodes = max(deepest, d), nodes + 1
        stack.extend((c, d + 1) for c in t.children if isinstance(c, Tree))
    return deepest, nodes


def estimate(tree: AST) -> Estimate | str:
    """The worst case of evaluating ``tree`` for one device, or why it cannot be estimated
    (nested past :data:`MAX_DEPTH`)."""
    depth, nodes = _shape(tree)
    if depth > MAX_DEPTH:
        return f"nested too deeply: {depth} levels, at most {MAX_DEPTH}"
    w = _Walk()
    steps, _, _ = w.walk(tree, {})
    return Estimate(steps, w.macros, nodes)


def _exprs(t: AST | Token | None) -> list[AST]:
    """The expressions of an ``exprlist`` (or none)."""
    if not isinstance(t, Tree):
        return []
    return [c for c in t.children if isinstance(c, Tree)]


def _ident(t: AST) -> str | None:
    """The macro variable's name: the first ``ident`` in its argument."""
    stack = [t]
    while stack:
        sub = stack.pop()
        if sub.data == "ident" and sub.children and isinstance(sub.children[0], Token):
            return str(sub.children[0])
        stack.extend(reversed([c for c in sub.children if isinstance(c, Tree)]))
    return None


class _Walk:
    """One walk of the tree, bottom up: per node its worst-case steps, the largest size of its
    value, and the largest size of anything inside that value (an item of a literal list of
    lists is as large as the largest inner list; a macro's variable is such an item)."""

    def __init__(self) -> None:
        self.macros = 0

    def walk(self, t: AST, scope: dict[str, int]) -> tuple[int, int, int]:
        kind = t.data
        kids = [c for c in t.children if isinstance(c, Tree)]
        if kind == "literal":
            tok = t.children[0]
            size = len(tok) if isinstance(tok, Token) and tok.type.endswith("STRING_LIT") \
                else 0
            return 1 + size, size, 0
        if kind == "ident":
            item = scope.get(str(t.children[0]), DEVICE_SIZE)
            return 1, item, item
        if kind == "member_dot_arg" and len(t.children) >= 2 \
                and str(t.children[1]) in MACROS:
            return self._macro(t, scope)
        steps, parts = 1, []
        for k in kids:
            st, size, inner = self.walk(k, scope)
            steps += st
            parts.append((size, inner))
        largest = max((max(p) for p in parts), default=0)
        if kind in ("list_lit", "map_lit"):
            items = len(_exprs(kids[0] if kids else None))
            size, inner = (items // 2 if kind == "map_lit" else items), largest
        elif kind in ("member_dot", "member_index", "dot_ident"):
            size = inner = max(p[1] for p in parts[:1]) if parts else DEVICE_SIZE
        elif kind in ("ident_arg", "dot_ident_arg", "member_dot_arg"):
            size = inner = largest  # a function's value is no larger than what it is given
        elif kind == "addition" and len(kids) > 1:  # a concatenation at most
            size, inner = sum(p[0] for p in parts), max(p[1] for p in parts)
        elif len(kids) > 1 and kind != "expr":  # comparisons, logic, arithmetic: scalars
            size = inner = 0
        else:  # one child passed up, or a ternary's larger branch
            size, inner = max((p[0] for p in parts), default=0), \
                max((p[1] for p in parts), default=0)
        if kind in BUILDERS:
            steps += size
        return steps, size, inner

    def _macro(self, t: AST, scope: dict[str, int]) -> tuple[int, int, int]:
        self.macros += 1
        member = t.children[0]
        name = str(t.children[1])
        args = _exprs(t.children[2] if len(t.children) > 2 else None)
        steps, items, item = self.walk(member, scope) if isinstance(member, Tree) else (1, 0, 0)
        steps += 1 + len(args)
        body_steps, body_size = 0, 0
        if len(args) >= 2:
            var = _ident(args[0])
            inner = dict(scope)
            if var is not None:
                inner[var] = item
            for a in args[1:]:
                st, size, deep = self.walk(a, inner)
                body_steps += st
                body_size = max(body_size, size, deep)
        steps += items * (ITERATION_STEPS + body_steps)
        if name in ("all", "exists", "exists_one"):
            return steps, 0, 0
        if name in ("map", "filter"):
            return steps + items, items, max(item, body_size)
        return steps, max(item, body_size), max(item, body_size)  # reduce, min: one item


Read = tuple[str, ...]
"""What a selector reads of the device: ``("driver",)``, or ``("attributes" | "capacity",
domain, id)``."""

_PASS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition",
                   "multiplication", "unary", "member", "primary"})
_PLAIN_STRING = re.compile(r"""^(["'])([^"'\\\n]*)\1$""")


def _strip(t: AST) -> AST:
    """Down a chain of single-child nodes (a sub-expression that is one member or literal)."""
    while t.data in _PASS and len(t.children) == 1 and isinstance(t.children[0], Tree):
        t = t.children[0]
    return t


def _device_root(t: AST) -> AST | None:
    t = _strip(t)
    ok = t.data == "ident" and t.children and str(t.children[0]) == "device"
    return t if ok else None


def _string(t: Tree[Token] | Token) -> str | None:
    if not isinstance(t, Tree):
        return None
    t = _strip(t)
    if t.data != "literal" or not isinstance(t.children[0], Token) \
            or t.children[0].type != "STRING_LIT":
        return None
    m = _PLAIN_STRING.match(str(t.children[0]))
    return m.group(2) if m else None


def _name(t: AST) -> str | None:
    """The field a ``member_dot`` names or the plain string a ``member_index`` gives."""
    if t.data == "member_dot" and isinstance(t.children[1], Token):
        return str(t.children[1])
    if t.data == "member_index":
        return _string(t.children[1])
    return None


def _read(t: AST) -> tuple[Read, AST] | None:
    """``t`` as one read of the device and the ``device`` node it starts from:
    ``device.driver`` or ``device.attributes["domain"].id`` (or ``["id"]``; capacity too)."""
    if t.data not in ("member_dot", "member_index"):
        return None
    outer = _name(t)
    base = t.children[0]
    if outer is None or not isinstance(base, Tree):
        return None
    if t.data == "member_dot" and outer == "driver" and (root := _device_root(base)):
        return ("driver",), root
    mid = _strip(base)
    domain = _name(mid) if mid.data == "member_index" else None
    inner = mid.children[0] if domain is not None else None
    if not isinstance(inner, Tree):
        return None
    kind_node = _strip(inner)
    if kind_node.data != "member_dot" or not isinstance(kind_node.children[0], Tree):
        return None
    kind = _name(kind_node)
    root = _device_root(kind_node.children[0])
    if kind not in ("attributes", "capacity") or root is None or domain is None:
        return None
    return (kind, domain, outer), root


def reads(tree: AST) -> tuple[Read, ...] | None:
    """Everything ``tree`` reads of the device, when every use of ``device`` is one of the
    reads :func:`_read` knows; None when it reads more (a whole map, a domain's presence, a
    macro over attributes): its result then depends on the whole device."""
    found: set[Read] = set()
    covered: set[int] = set()
    roots: list[AST] = []
    stack = [tree]
    while stack:
        t = stack.pop()
        if t.data == "ident" and t.children and str(t.children[0]) == "device":
            roots.append(t)
        got = _read(t)
        if got is not None:
            found.add(got[0])
            covered.add(id(got[1]))
        stack.extend(c for c in t.children if isinstance(c, Tree))
    if any(id(r) not in covered for r in roots):
        return None
    return tuple(sorted(found))
