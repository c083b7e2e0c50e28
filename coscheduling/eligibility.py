"""Which nodes a pod may run on, apart from capacity.

When Lockstep plans a whole gang it must place members kube-scheduler has not looked at yet,
so it re-checks the predicates that most often exclude GPU nodes: nodeSelector, required node
affinity, NoSchedule/NoExecute taints and cordoned nodes. The pod being filtered is also
limited to the candidates kube-scheduler's own filters passed, which remain the authority.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import NodeRecord, PodRecord

__all__ = ["eligible", "match_expression"]


def match_expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expr.get("key", "")
    op = expr.get("operator", "")
    values = [str(v) for v in expr.get("values") or ()]
    present = key in labels
    value = labels.get(key)
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(value or ""), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _match_term(term: Mapping[str, Any], node: NodeRecord) -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # an empty term matches nothing, as in kube-scheduler
    if not all(match_expression(e, node.labels) for e in exprs):
        return False
    for f in fields:
        if f.get("key") != "metadata.name":
            return False
        if not match_expression({**f, "key": "n"}, {"n": node.name}):
            return False
    return True


def eligible(pod: PodRecord, node: NodeRecord) -> bool:
    """True when nothing but capacity could stop ``pod`` from running on ``node``."""
    if node.unschedulable and not any(
        t.tolerates({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        for t in pod.tolerations
    ):
        return False
    for k, v in pod.node_selector.items():
        if node.labels.get(k) != v:
            return False
    if pod.required_affinity and not any(
        _match_term(t, node) for t in pod.required_affinity if isinstance(t, Mapping)
    ):
        return False
    taints = node.blocking_taints()
    return not taints or pod.tolerates_all(taints)
