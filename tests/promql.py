"""The Grafana dashboard's PromQL, taken apart: which metric names each expression reads, and
which names a ``/metrics`` exposition exports (histogram and counter suffixes included).

Small on purpose: the dashboard's expressions use selectors, range vectors, aggregations with
``by``, ``histogram_quantile``, ``rate``/``increase`` and arithmetic; anything this does not
understand leaves an identifier that is not an exported metric, so the test fails loudly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed.bins import REPO

__all__ = ["DASHBOARD", "dashboard", "exported_names", "expressions", "metric_names"]

DASHBOARD = REPO / "deploy" / "grafana" / "lockstep.json"

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan"}


def dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query target, and of query-based template variables."""
    out = [(p["title"], t["expr"]) for p in _panels(dash["panels"])
           for t in p.get("targets", ())]
    for var in dash.get("templating", {}).get("list", ()):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", q)
            assert m, f"template variable {var['name']}: unexpected query {q!r}"
            out.append((f"variable {var['name']}", m.group(1)))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (a name followed by ``(`` is a function)."""
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word.lower() in _KEYWORDS or text[m.end():].lstrip().startswith("("):
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] in ".$"):
            continue  # 1e3's exponent, a $variable
        names.add(word)
    return names


def exported_names(exposition: str) -> set[str]:
    """Every name a query may select: each family's samples, including the suffixes of a
    histogram or counter that has no sample yet (a labelled metric before its first use
    exports only its ``# TYPE`` line)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            base = name.removesuffix("_total") if kind == "counter" else name
            names |= {
                "counter": {base + "_total", base + "_created"},
                "histogram": {name + "_bucket", name + "_sum", name + "_count",
                              name + "_created"},
                "summary": {name, name + "_sum", name + "_count", name + "_created"},
            }.get(kind, {name})
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
