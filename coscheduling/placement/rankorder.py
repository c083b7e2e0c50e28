"""Rank order: a plan's interchangeable members permuted so adjacent ranks sit side by side.

The planner chooses nodes and how many members each holds (feasibility and fragmentation are
its business). This pass then changes only who sits where: members that are interchangeable,
the same requests and the same constraints, no DRA claims, not bound, are handed the slots
their group holds in slot order, lowest rank first. Slot order is the topology order Lockstep
knows: the nodes' domain labels level by level (zone, block, rack, clique; a node lacking a
level sorts first), then the node's name in natural order (``gpu-2`` before ``gpu-10``):
ranks k..k+n fill one node, then the next node of the same clique or rack. Inside a node the
device plugin picks the GPUs (``nvidia.com/gpu`` names no island), so islands play no part.

A member without a rank keeps its slot, and so does one whose candidates (kube-scheduler's
filtered nodes, known for the pod being filtered) leave out some slot of its group. Work is
a sort of each group: O(members log members), whatever the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..records import NodeName, NodeRecord, PodKey, PodRecord
from ..topology.domains import HOSTNAME, Level
from .member import Member

__all__ = ["interchangeable", "order_by_rank", "slot_key"]


_DIGITS = re.compile(r"(\d+)")


def slot_key(levels: Sequence[Level], node: NodeRecord | None,
             name: NodeName) -> tuple[object, ...]:
    """Where ``name`` sits in the topology order: its domain labels at every level above the
    node, widest first, then its name with runs of digits compared as numbers. A node gone
    from the view sorts by its name alone, after those with labels."""
    labels = node.labels if node is not None else {}
    where = tuple(lv.value(labels) or "" for lv in levels if lv.keys != (HOSTNAME,))
    parts = _DIGITS.split(name)
    natural = tuple((1, int(p), p) if i % 2 else (0, 0, p) for i, p in enumerate(parts) if p)
    return (node is None, where, natural)


def interchangeable(pod: PodRecord) -> tuple[object, ...] | None:
    """Members with equal keys may swap slots (the planner would have placed either on
    either node); None: this member never moves (bound, claims, no rank)."""
    if pod.rank is None or pod.node_name is not None or pod.claims:
        return None
    return (tuple(sorted(pod.requests.items())), tuple(sorted(pod.node_selector.items())),
            repr(pod.required_affinity), pod.tolerations)


def order_by_rank(assignments: Mapping[PodKey, NodeName], members: Sequence[Member],
                  nodes: Mapping[NodeName, NodeRecord],
                  levels: Sequence[Level]) -> dict[PodKey, NodeName] | None:
    """``assignments`` with each group of interchangeable ranked ``members`` given its slots
    in rank order; None when no member moves (the plan is kept as it is)."""
    groups: dict[tuple[object, ...], list[Member]] = {}
    for m in members:
        if m.pod.key in assignments and (key := interchangeable(m.pod)) is not None:
            groups.setdefault(key, []).append(m)
    out: dict[PodKey, NodeName] | None = None
    keys: dict[NodeName, tuple[object, ...]] = {}

    def where(n: NodeName) -> tuple[object, ...]:
        got = keys.get(n)
        if got is None:
            got = keys[n] = slot_key(levels, nodes.get(n), n)
        return got

    for group in groups.values():
        if len(group) < 2:
            continue
        slots = {assignments[m.pod.key] for m in group}
        # A member kube-scheduler narrowed to some nodes moves only when they hold every slot.
        movable = [m for m in group if m.candidates is None or m.candidates >= slots]
        if len(movable) < 2:
            continue
        placed = sorted((assignments[m.pod.key] for m in movable), key=where)
        ranked = sorted(movable, key=lambda m: (m.pod.rank, m.pod.key))
        for m, n in zip(ranked, placed, strict=True):
            if assignments[m.pod.key] != n:
                if out is None:
                    out = dict(assignments)
                out[m.pod.key] = n
    return out
