"""Lockstep's scheduling gate: gang members wait outside kube-scheduler's queue.

A pod created with the ``lockstep.dev/gang`` scheduling gate (added by Lockstep's mutating
webhook, or written into a template by hand) is invisible to kube-scheduler's scheduling
cycles until Lockstep lifts the gate. Lockstep lifts it only when the member's gang is
admitted, and in the same write pins the pod to its planned node with a required node
affinity on ``metadata.name``. kube-scheduler's NodeAffinity PreFilter then narrows the cycle
to that one node, so an admitted member costs one node's filters instead of the whole
cluster's, and members of a gang that cannot run yet never take a scheduling cycle at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..conventions import declaring_keys
from ..records import GANG_GATE

__all__ = ["GANG_GATE", "declares_gang", "lift_patch", "pin_term", "pinned_node", "pinned_terms",
           "unpinned_terms"]

def pin_term(node: str) -> dict[str, Any]:
    """The ``matchFields`` requirement that pins a pod to ``node``."""
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def pinned_node(terms: tuple[Mapping[str, Any], ...]) -> str | None:
    """The node every required term pins the pod to, if they all pin the same one."""
    nodes: set[str] = set()
    for t in terms:
        names = [v for f in t.get("matchFields") or ()
                 if f.get("key") == "metadata.name" and f.get("operator") == "In"
                 for v in [tuple(f.get("values") or ())]]
        if len(names) != 1 or len(names[0]) != 1:
            return None
        nodes.add(str(names[0][0]))
    return nodes.pop() if len(nodes) == 1 else None


def lift_patch(uid: str, terms: tuple[Mapping[str, Any], ...], node: str | None
               ) -> dict[str, Any]:
    """The strategic-merge patch that takes Lockstep's gate off a pod and pins it.

    The API server lets a gated pod's required node affinity be narrowed, never widened:
    each existing term gets the pin added to its ``matchFields`` (the terms stay ORed, all
    now on ``node``). The UID makes the patch fail on a pod recreated under the same name.
    Other gates (Kueue's, say) are left in place."""
    spec: dict[str, Any] = {"schedulingGates": [{"$patch": "delete", "name": GANG_GATE}]}
    if node is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                             {"nodeSelectorTerms": pinned_terms(terms, node)}}}
    return {"metadata": {"uid": uid}, "spec": spec}


def pinned_terms(terms: tuple[Mapping[str, Any], ...], node: str) -> list[dict[str, Any]]:
    """``terms`` each narrowed to ``node`` (still ORed, all on it now), or the pin alone."""
    return [{**t, "matchFields": [*(t.get("matchFields") or ()), pin_term(node)]}
            for t in terms] or [{"matchFields": [pin_term(node)]}]


def unpinned_terms(terms: tuple[Mapping[str, Any], ...], node: str) -> list[dict[str, Any]]:
    """What :func:`pinned_terms` added taken out again: the terms as the pod's author wrote
    them (none left when the pin was the only requirement)."""
    pin = pin_term(node)
    out = []
    for t in terms:
        fields = [f for f in t.get("matchFields") or () if f != pin]
        term = {k: v for k, v in t.items() if k != "matchFields"}
        if fields:
            term["matchFields"] = fields
        if term:
            out.append(term)
    return out


# ---------------------------------------------------------------------------- the webhook's test


def declares_gang(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod (its API JSON, as an admission request carries it) names a gang by any
    convention Lockstep reads: the keys and spec fields every registered convention
    (``coscheduling.conventions``) resolves a gang from, with a non-empty value.

    It says nothing about whether the declaration is valid or its PodGroup exists: a gated pod
    whose declaration turns out to be no gang (invalid, or an upstream ``basic`` policy) is let
    go by the core; one whose PodGroup is missing waits for it, gated."""
    annotation_keys, label_keys, paths = declaring_keys()  # every registered convention's
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    for field, keys in (("annotations", annotation_keys), ("labels", label_keys)):
        values = meta.get(field)
        if isinstance(values, Mapping) and any(values.get(k) for k in keys):
            return True
    for path in paths:
        node: Any = pod
        for step in path:
            node = node.get(step) if isinstance(node, Mapping) else None
        if node:
            return True
    return False
