"""Which nodes a pod may run on, apart from capacity.

When Lockstep plans a whole gang it must place members kube-scheduler has not looked at yet,
so it re-checks the predicates that most often exclude GPU nodes: nodeSelector, required node
affinity, NoSchedule/NoExecute taints and cordoned nodes. The pod being filtered is also
limited to the candidates kube-scheduler's own filters passed, which remain the authority.

Required node affinity is the one predicate whose cost a pod's author sets: the API server
takes any number of terms, requirements and values (up to the object's size), and the planner
may check a gang's members against every node. :func:`affinity_problem` bounds it, once per
member, before any matching: a pod over a limit matches no node and its gang's reason names
the field and the limit (never an exception, never work that grows with the list).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..records import NodeRecord, PodRecord

__all__ = ["AFFINITY_FIELD", "MAX_AFFINITY_ITEMS", "MAX_AFFINITY_TERMS",
           "MAX_REQUIREMENT_VALUES", "MAX_TERM_REQUIREMENTS", "affinity_problem", "eligible",
           "match_expression"]

AFFINITY_FIELD = ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                  ".nodeSelectorTerms")
MAX_AFFINITY_TERMS = 32
"""nodeSelectorTerms per pod (ORed; Lockstep's pin adds none, it narrows each term)."""
MAX_TERM_REQUIREMENTS = 32
"""matchExpressions plus matchFields in one term (Lockstep's pin adds one field)."""
MAX_REQUIREMENT_VALUES = 256
"""values of one requirement (an ``In`` list of hostnames for a 256-node job fits)."""
MAX_AFFINITY_ITEMS = 1024
"""Requirements and values over all terms together: a bound on what checking one node may
cost, where the per-level limits alone would allow 32 x 32 x 256 = 262,144."""


_INT64_DIGITS = 20
"""Characters of the longest int64 with its sign: longer Gt/Lt operands are never parsed."""


def match_expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expr.get("key", "")
    op = expr.get("operator", "")
    if not isinstance(key, str):
        return False  # not what the API server accepts (and unhashable for the lookup)
    raw = expr.get("values") or ()
    values = [str(v) for v in raw] if isinstance(raw, list | tuple) else []
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
        if len(values[0]) > _INT64_DIGITS or len(value or "") > _INT64_DIGITS:
            return False  # kube-scheduler reads both as int64: no longer number is one
        if not (value or "").isascii() or not values[0].isascii():
            return False  # int() reads other scripts' digits; Go's ParseInt does not
        try:
            have, want = int(value or ""), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def affinity_problem(terms: Sequence[object]) -> str | None:
    """Why ``terms`` (a pod's required nodeSelectorTerms) are too large to evaluate, naming
    the field and its limit; None when within every limit. Stops counting at the first limit
    passed, so its own cost is bounded by the limits, not by the pod."""
    if len(terms) > MAX_AFFINITY_TERMS:
        return (f"{AFFINITY_FIELD} has {len(terms)} terms; at most {MAX_AFFINITY_TERMS} are "
                "evaluated")
    items = 0
    for i, term in enumerate(terms):
        reqs = _requirements(term)
        if len(reqs) > MAX_TERM_REQUIREMENTS:
            return (f"{AFFINITY_FIELD}[{i}] has {len(reqs)} matchExpressions and matchFields; "
                    f"at most {MAX_TERM_REQUIREMENTS} per term are evaluated")
        items += len(reqs)
        for j, req in enumerate(reqs):
            values = req.get("values") if isinstance(req, Mapping) else None
            n = len(values) if isinstance(values, list | tuple) else 0
            if n > MAX_REQUIREMENT_VALUES:
                return (f"{AFFINITY_FIELD}[{i}] requirement {j} has {n} values; at most "
                        f"{MAX_REQUIREMENT_VALUES} are evaluated")
            items += n
            if items > MAX_AFFINITY_ITEMS:
                return (f"{AFFINITY_FIELD} has more than {MAX_AFFINITY_ITEMS} requirements "
                        f"and values in all; at most {MAX_AFFINITY_ITEMS} are evaluated")
    return None


def _requirements(term: object) -> list[object]:
    """A term's matchExpressions then matchFields in one list (a field that is not a list
    counts as none, as it matches nothing)."""
    if not isinstance(term, Mapping):
        return []
    out: list[object] = []
    for k in ("matchExpressions", "matchFields"):
        got = term.get(k)
        if isinstance(got, list | tuple):
            out.extend(got)
    return out


def _match_term(term: Mapping[str, Any], node: NodeRecord) -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not isinstance(exprs, list | tuple) or not isinstance(fields, list | tuple) or not all(
            isinstance(e, Mapping) for e in (*exprs, *fields)):
        return False  # not what the API server accepts: matches nothing, never raises
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


def eligible(pod: PodRecord, node: NodeRecord, *, affinity_checked: bool = False) -> bool:
    """True when nothing but capacity could stop ``pod`` from running on ``node``.

    A pod whose required affinity is over a limit (:func:`affinity_problem`) is eligible
    nowhere; ``affinity_checked`` says the caller has already asked, once for the pod, and
    spares the count on every node."""
    if not affinity_checked and affinity_problem(pod.required_affinity) is not None:
        return False
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
