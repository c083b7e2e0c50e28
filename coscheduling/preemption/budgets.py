"""PodDisruptionBudgets as preemption reads them: which pods evicting would violate one.

kube-scheduler's preemption prefers victims whose eviction keeps every PodDisruptionBudget
within ``status.disruptionsAllowed``; Lockstep's (``coscheduling.preemption.victims``) orders victim
sets by the same count first. Each candidate carries the budgets selecting it with what they
allow now (:func:`selecting`), and a victim set spends them: every victim takes one from
each of its budgets, and the victims that take one below zero are the set's violations
(``victims.pdb_violations``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..records import PodRecord, RecordError
from ..topology.eligibility import match_expression

__all__ = ["Budget", "budget_from_json", "selecting"]


@dataclass(frozen=True, slots=True)
class Budget:
    namespace: str
    name: str
    match_labels: tuple[tuple[str, str], ...]
    match_expressions: tuple[Mapping[str, Any], ...]
    selects_all: bool
    """``selector: {}``: every pod of the namespace (policy/v1)."""
    selects_none: bool
    """No selector: no pod."""
    disruptions_allowed: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: PodRecord) -> bool:
        if self.selects_none or pod.namespace != self.namespace:
            return False
        if self.selects_all:
            return True
        return (all(pod.labels.get(k) == v for k, v in self.match_labels)
                and all(match_expression(e, pod.labels) for e in self.match_expressions))


def budget_from_json(obj: Mapping[str, Any]) -> Budget:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise RecordError("PodDisruptionBudget.metadata.name", "missing")
    spec = obj.get("spec") or {}
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    labels: Mapping[str, Any] = {}
    exprs: tuple[Mapping[str, Any], ...] = ()
    if isinstance(selector, Mapping):
        labels = selector.get("matchLabels") or {}
        exprs = tuple(e for e in selector.get("matchExpressions") or ()
                      if isinstance(e, Mapping))
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed") if isinstance(status, Mapping) else None
    return Budget(
        namespace=str(meta.get("namespace") or "default"), name=str(meta["name"]),
        match_labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        match_expressions=exprs,
        selects_all=isinstance(selector, Mapping) and not labels and not exprs,
        selects_none=not isinstance(selector, Mapping),
        disruptions_allowed=allowed if isinstance(allowed, int) else 0,
    )


def selecting(pod: PodRecord, budgets: Iterable[Budget]) -> tuple[tuple[str, int], ...]:
    """The budgets selecting ``pod``, each with the disruptions it allows now, by key."""
    return tuple(sorted((b.key, b.disruptions_allowed) for b in budgets if b.selects(pod)))
