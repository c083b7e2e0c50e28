"""Capacity bookkeeping: what each node has, what bound pods use, what gangs have reserved.

Free capacity per node is kept up to date incrementally as pods bind and leave, so filter and
prioritize never scan pods. A reservation is capacity an admitted gang holds for members that
are not bound yet; when the watch shows a member bound, its reservation turns into usage.
Any change to a node drops that node's cached scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .podgroup import GangKey
from .records import NodeName, NodeRecord, PodKey, PodRecord
from .resources import Resources, add, sub
from .topology import GPU

__all__ = ["Ledger"]


@dataclass(slots=True)
class Ledger:
    nodes: dict[NodeName, NodeRecord] = field(default_factory=dict)
    used: dict[NodeName, Resources] = field(default_factory=dict)
    gpu_pods: dict[NodeName, dict[PodKey, int]] = field(default_factory=dict)
    """GPU counts of the pods holding GPUs on each node (for NVLink island packing)."""
    reserved: dict[NodeName, dict[GangKey, Resources]] = field(default_factory=dict)
    scores: dict[int, dict[NodeName, int]] = field(default_factory=dict)
    """Cached plain-pod scores by GPU count, then node; a node's are dropped when it changes."""

    def drop_scores(self, node: NodeName) -> None:
        for per_node in self.scores.values():
            per_node.pop(node, None)

    def put_node(self, node: NodeRecord) -> None:
        self.nodes[node.name] = node
        self.drop_scores(node.name)

    def drop_node(self, name: NodeName) -> None:
        self.nodes.pop(name, None)
        self.drop_scores(name)

    def add_usage(self, pod: PodRecord) -> None:
        assert pod.node_name is not None
        self.drop_scores(pod.node_name)
        self.used[pod.node_name] = add(self.used.get(pod.node_name, {}), pod.requests)
        if gpus := pod.requests.get(GPU, 0):
            self.gpu_pods.setdefault(pod.node_name, {})[pod.key] = gpus

    def release_usage(self, pod: PodRecord) -> None:
        assert pod.node_name is not None
        self.drop_scores(pod.node_name)
        self.used[pod.node_name] = sub(self.used.get(pod.node_name, {}), pod.requests)
        self.gpu_pods.get(pod.node_name, {}).pop(pod.key, None)

    def reserve(self, gang: GangKey, node: NodeName, requests: Resources) -> None:
        self.drop_scores(node)
        per = self.reserved.setdefault(node, {})
        per[gang] = add(per.get(gang, {}), requests)

    def unreserve(self, gang: GangKey, node: NodeName, requests: Resources | None) -> None:
        """Give back ``requests`` (everything the gang holds there when None)."""
        self.drop_scores(node)
        per = self.reserved.get(node, {})
        if gang in per:
            left = sub(per[gang], requests) if requests is not None else {}
            if any(v > 0 for v in left.values()):
                per[gang] = left
            else:
                per.pop(gang)
        if not per:
            self.reserved.pop(node, None)

    def free(self, node: NodeName) -> Resources:
        n = self.nodes.get(node)
        if n is None:
            return {}
        return sub(n.allocatable, self.used.get(node, {}))

    def free_outside(self, node: NodeName, gang: GangKey | None) -> Resources:
        """Free capacity on ``node`` not held by any admitted gang other than ``gang``."""
        free = self.free(node)
        for g, r in self.reserved.get(node, {}).items():
            if g != gang:
                free = sub(free, r)
        return free

    def free_gpus(self, node: NodeName, own: GangKey | None) -> int:
        free = self.nodes[node].allocatable.get(GPU, 0) - self.used.get(node, {}).get(GPU, 0)
        for g, r in self.reserved.get(node, {}).items():
            if g != own:
                free -= r.get(GPU, 0)
        return free

    def reserving_gangs(self, other_than: GangKey | None) -> tuple[GangKey, ...]:
        out = {g for per in self.reserved.values() for g in per if g != other_than}
        return tuple(sorted(out))
