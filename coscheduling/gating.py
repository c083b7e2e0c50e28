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

__all__ = ["GANG_GATE", "pin_term", "pinned_node"]

GANG_GATE = "lockstep.dev/gang"


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
