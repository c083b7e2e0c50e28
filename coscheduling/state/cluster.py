"""The cluster as the API server showed it (:class:`ClusterStore`), and every cache derived
from it, with the watch's own bookkeeping (the newest pod revision delivered, the pods it
showed deleted).

Nodes, pods, PodGroups and NUMA zones arrive by watch event or by relist; both paths go
through the same ``put_*`` / ``drop_*`` methods here, so each derived cache (bound usage per
node, the topology-domain index, GPU layouts, plain-pod scores) is invalidated in exactly one
place: a relist that replaced nodes without dropping the domain index would have gangs
planned against yesterday's racks.

The store holds only what the API server sent. Nothing else writes a pod here: a filter
request for a pod the watch has not delivered (or already deleted) is answered from the
request alone.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..conventions.base import PodGroupRecord
from ..conventions.upstream import UpstreamComposite, UpstreamPodGroup, UpstreamWorkload
from ..conventions.volcano_queues import QueueRecord
from ..podgroup import Source
from ..records import GangKey, NodeName, NodeRecord, PodKey, PodRecord, PriorityClass
from ..resources import Resources, add, sub
from ..topology.domains import GPU, GpuLayout, Level, NumaZones, domain_of, gpu_layout

__all__ = ["GONE_REMEMBERED", "ClusterStore", "PodChange"]

GONE_REMEMBERED = 10000


@dataclass(frozen=True, slots=True)
class PodChange:
    """What a pod update replaced: ``old`` is None for a new pod (or a new UID)."""

    old: PodRecord | None
    new: PodRecord
    replaced: PodRecord | None = None
    """A pod of the same name with another UID that this one superseded."""


@dataclass(slots=True)
class ClusterStore:
    levels: tuple[Level, ...]
    nodes: dict[NodeName, NodeRecord] = field(default_factory=dict)
    pods: dict[PodKey, PodRecord] = field(default_factory=dict)
    groups: dict[Source, dict[GangKey, PodGroupRecord]] = field(default_factory=dict)
    """Each convention's PodGroup objects (``Watch.into == "groups"``), by the convention
    whose API they belong to: what the resolver reads (``conventions.resolve``)."""
    queues: dict[str, QueueRecord] | None = None
    """Volcano Queues by name; None while their CRD is not served (then nothing is gated)."""
    upstream: dict[GangKey, UpstreamPodGroup] = field(default_factory=dict)
    """Kubernetes' own PodGroups (scheduling.k8s.io, whichever version the server serves)."""
    composites: dict[GangKey, UpstreamComposite] = field(default_factory=dict)
    """Kubernetes 1.37 CompositePodGroups (scheduling.k8s.io/v1alpha3)."""
    children: dict[GangKey, set[GangKey]] = field(default_factory=dict)
    """The upstream PodGroups naming each composite as their parent (by the composite's
    own key), kept with ``upstream``."""
    workloads: dict[GangKey, UpstreamWorkload] = field(default_factory=dict)
    """Kubernetes 1.35 Workloads (scheduling.k8s.io/v1alpha1), which 1.35 pods point at."""
    priority_classes: dict[str, PriorityClass] = field(default_factory=dict)
    """PriorityClass values by name, for groups that name a class themselves (Volcano
    and upstream PodGroups): pods carry their resolved priority, groups do not."""
    numa: dict[NodeName, NumaZones] = field(default_factory=dict)
    used: dict[NodeName, Resources] = field(default_factory=dict)
    """Requests of bound, unfinished pods per node: what kube-scheduler counts as used."""
    gpu_pods: dict[NodeName, dict[PodKey, int]] = field(default_factory=dict)
    """GPU counts of the pods holding GPUs on each node (for NVLink island packing)."""
    scores: dict[int, dict[NodeName, int]] = field(default_factory=dict)
    """Plain-pod scores by GPU count, then node; a node's entries drop when it changes."""
    free_gpu: dict[NodeName, int] = field(default_factory=dict)
    """Free GPUs per node outside every reservation (``Capacity.free_gpus``); an entry drops
    when the node is touched. Planning a gang reads every node's."""
    epoch: int = 0
    """Bumped whenever a node's free capacity or reservations may have changed."""
    pods_revision: int = 0
    """The newest pod resourceVersion the watch (or a list) has delivered: a pod in a verb
    call that is newer is one the watch has not reached yet; an older one absent from the
    store is gone."""
    gone: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """UIDs of pods the watch showed deleted (the latest :data:`GONE_REMEMBERED`): a filter
    call for one is kube-scheduler's stale view, never a pod to learn from the call."""
    _domains: dict[int, dict[tuple[str, ...], list[NodeName]]] = field(default_factory=dict)
    _node_domain: dict[int, dict[NodeName, tuple[str, ...]]] = field(default_factory=dict)
    _dom_free: dict[int, dict[tuple[str, ...], int]] = field(default_factory=dict)
    """Free GPUs per topology domain, per level: the sum of what ``_dom_counted`` says of
    its nodes. Nodes touched since they were counted wait in ``_dom_stale``."""
    _dom_ranked: dict[int, list[tuple[int, tuple[str, ...]]]] = field(default_factory=dict)
    """``_dom_free`` as sorted ``(free GPUs, domain)`` pairs, per level."""
    _dom_counted: dict[NodeName, int] = field(default_factory=dict)
    _dom_stale: set[NodeName] = field(default_factory=set)
    _layouts: dict[NodeName, tuple[NodeRecord, GpuLayout]] = field(default_factory=dict)

    # ------------------------------------------------------------------ PodGroups

    def groups_of(self, source: Source) -> dict[GangKey, PodGroupRecord]:
        """The PodGroup objects of one convention (empty until one comes)."""
        return self.groups.setdefault(source, {})

    @property
    def podgroups(self) -> dict[GangKey, PodGroupRecord]:
        """scheduler-plugins PodGroups (scheduling.x-k8s.io)."""
        return self.groups_of(Source.SCHEDULER_PLUGINS)

    @property
    def volcano(self) -> dict[GangKey, PodGroupRecord]:
        """Volcano PodGroups (scheduling.volcano.sh/v1beta1), a separate API of the same
        name."""
        return self.groups_of(Source.VOLCANO)

    # ------------------------------------------------------------------ nodes

    def put_node(self, node: NodeRecord) -> NodeRecord | None:
        old = self.nodes.get(node.name)
        if old == node:
            return old  # a heartbeat: nothing a plan or a score reads has changed
        if old is None or old.labels != node.labels:
            self._drop_domains()
        self._layouts.pop(node.name, None)
        self.nodes[node.name] = node
        self.touch(node.name)
        return old

    def drop_node(self, name: NodeName) -> NodeRecord | None:
        old = self.nodes.pop(name, None)
        if old is not None:
            self._drop_domains()
        self._layouts.pop(name, None)
        self.touch(name)
        return old

    def replace_nodes(self, nodes: Iterable[NodeRecord]) -> list[NodeName]:
        """Make the node set exactly ``nodes``; returns the names that went away."""
        fresh = {n.name: n for n in nodes}
        gone = [name for name in self.nodes if name not in fresh]
        for name in gone:
            self.drop_node(name)
        for n in fresh.values():
            self.put_node(n)
        return gone

    # ------------------------------------------------------------------ pods

    def put_pod(self, pod: PodRecord) -> PodChange:
        old = self.pods.get(pod.key)
        replaced = None
        if old is not None and old.uid and pod.uid and old.uid != pod.uid:
            replaced = self.drop_pod(pod.key)
            old = None
        if old is not None and old.holds_capacity:
            self._release_usage(old)
        self.pods[pod.key] = pod
        if pod.holds_capacity:
            self._add_usage(pod)
        return PodChange(old, pod, replaced)

    def drop_pod(self, key: PodKey) -> PodRecord | None:
        pod = self.pods.pop(key, None)
        if pod is not None and pod.holds_capacity:
            self._release_usage(pod)
        return pod

    def forget_gone(self, uid: str) -> None:
        """Remember that the pod with ``uid`` was deleted (the oldest such UID is forgotten
        past :data:`GONE_REMEMBERED`)."""
        if uid:
            self.gone[uid] = None
            while len(self.gone) > GONE_REMEMBERED:
                self.gone.popitem(last=False)

    def _add_usage(self, pod: PodRecord) -> None:
        assert pod.node_name is not None
        self.touch(pod.node_name)
        self.used[pod.node_name] = add(self.used.get(pod.node_name, {}), pod.requests)
        if gpus := pod.requests.get(GPU, 0):
            self.gpu_pods.setdefault(pod.node_name, {})[pod.key] = gpus

    def _release_usage(self, pod: PodRecord) -> None:
        assert pod.node_name is not None
        self.touch(pod.node_name)
        left = sub(self.used.get(pod.node_name, {}), pod.requests)
        if any(left.values()):
            self.used[pod.node_name] = left
        else:
            self.used.pop(pod.node_name, None)
        per = self.gpu_pods.get(pod.node_name)
        if per is not None:
            per.pop(pod.key, None)
            if not per:
                del self.gpu_pods[pod.node_name]

    # ------------------------------------------------------------------ other objects

    def put_numa(self, zones: NumaZones) -> None:
        self.numa[zones.node] = zones
        self.touch(zones.node)

    def drop_numa(self, node: NodeName) -> None:
        if self.numa.pop(node, None) is not None:
            self.touch(node)

    def replace_numa(self, items: Iterable[NumaZones]) -> None:
        fresh = {z.node: z for z in items}
        for name in [n for n in self.numa if n not in fresh]:
            self.drop_numa(name)
        for z in fresh.values():
            self.put_numa(z)

    # ------------------------------------------------------------------ derived

    def touch(self, node: NodeName) -> None:
        """Something that a node's scores depend on changed (usage, reservations, labels)."""
        self.epoch += 1
        self.free_gpu.pop(node, None)
        if self._dom_free:
            self._dom_stale.add(node)
        for per_node in self.scores.values():
            per_node.pop(node, None)

    def free(self, node: NodeName) -> Resources:
        n = self.nodes.get(node)
        if n is None:
            return {}
        return sub(n.allocatable, self.used.get(node, {}))

    def domains(self, index: int) -> Mapping[tuple[str, ...], list[NodeName]]:
        """Nodes by topology domain at ``levels[index]``; rebuilt only after node changes."""
        cached = self._domains.get(index)
        if cached is None:
            cached = {}
            where = self._node_domain[index] = {}
            for n in sorted(self.nodes):
                d = domain_of(self.levels, index, self.nodes[n])
                if d is not None:
                    cached.setdefault(d, []).append(n)
                    where[n] = d
            self._domains[index] = cached
        return cached

    def domains_by_free_gpus(self, index: int, free_gpus: Callable[[NodeName], int]
                             ) -> Sequence[tuple[int, tuple[str, ...]]]:
        """``(free GPUs, domain)`` for every domain at ``levels[index]``, ascending, where a
        domain's free GPUs are ``free_gpus`` summed over its nodes.

        Kept up to date node by node rather than summed and sorted per plan: planning a gang
        used to add up every node of a 5,000-node cluster and sort them all, 10 ms per gang
       . Only the nodes touched since the last call are asked again.
        """
        counted = self._dom_counted
        if self._dom_stale:
            for n in self._dom_stale:
                old = counted.get(n)
                if old is None or n not in self.nodes:
                    continue
                new = free_gpus(n)
                if new != old:
                    counted[n] = new
                    for idx, totals in self._dom_free.items():
                        d = self._node_domain[idx].get(n)
                        if d is not None:
                            was = totals[d]
                            totals[d] = was + new - old
                            order = self._dom_ranked[idx]
                            del order[bisect_left(order, (was, d))]
                            insort(order, (was + new - old, d))
            self._dom_stale.clear()
        ranked = self._dom_ranked.get(index)
        if ranked is None:
            totals = {}
            for d, ns in self.domains(index).items():
                total = 0
                for n in ns:
                    v = counted.get(n)
                    if v is None:
                        v = counted[n] = free_gpus(n)
                    total += v
                totals[d] = total
            self._dom_free[index] = totals
            ranked = self._dom_ranked[index] = sorted((t, d) for d, t in totals.items())
        return ranked

    def _drop_domains(self) -> None:
        self._domains.clear()
        self._node_domain.clear()
        self._dom_free.clear()
        self._dom_ranked.clear()
        self._dom_counted.clear()
        self._dom_stale.clear()

    def layout(self, name: NodeName) -> GpuLayout:
        node = self.nodes[name]
        cached = self._layouts.get(name)
        if cached is None or cached[0] is not node:
            cached = (node, gpu_layout(node))
            self._layouts[name] = cached
        return cached[1]
