"""Capacity as the planner and the scorer see it: bound usage and reservations together.

One read-only window over the cluster store and the ledger. It is the planner's
:class:`~coscheduling.placement.planner.CapacityView`: free capacity means *outside every
reservation*,
the planned gang's own included (a re-placed member gives its own slot back
first, so nothing is ever counted free twice). Plain-pod scores are cached per GPU count in the
store, which drops a node's entries whenever its usage, labels or reservations change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..devices.inventory import DeviceInventory
from ..devices.room import DeviceRoom
from ..records import NodeName, NodeRecord, PodKey
from ..resources import Resources, add, sub
from ..state.cluster import ClusterStore
from ..state.ledger import Ledger
from ..state.nominations import Nominations
from ..topology.domains import GPU, Score, explain_score

__all__ = ["Capacity"]


class Capacity:
    def __init__(self, store: ClusterStore, ledger: Ledger,
                 nominations: Nominations | None = None,
                 devices: DeviceInventory | None = None) -> None:
        self._store = store
        self._ledger = ledger
        self.devices = devices if devices is not None else DeviceInventory()
        self._nominations = nominations if nominations is not None else Nominations()

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return self._store.nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        """Free capacity on ``node`` that no gang holds and no preempting pod was nominated
        to: what a gang may be planned on, and all a plain pod may use there (but see
        :meth:`free_for_plain`)."""
        free = sub(self._store.free(node), self._ledger.reserved_on(node))
        held = self._nominations.held_on(node)
        return sub(free, held) if held else free

    def free_for_plain(self, node: NodeName, pod: PodKey, priority: int) -> Resources:
        """:meth:`free_for_gang` plus the room nominated to ``pod`` itself and to pods of
        lower priority (a nomination gives way to a higher-priority pod)."""
        free = self.free_for_gang(node)
        for n in self._nominations.on(node):
            if n.pod == pod or n.priority < priority:
                free = add(free, n.requests)
        return free

    def device_room(self) -> DeviceRoom:
        """DRA devices outside every admitted gang's hold (``coscheduling.devices.room``)."""
        return DeviceRoom(self.devices, self._store.nodes, self._ledger.get)

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        return list(self._store.gpu_pods.get(node, {}).values())

    def free_gpus(self, node: NodeName, own: PodKey | None = None) -> int:
        """Free GPUs on ``node`` outside every reservation but ``own``'s."""
        cache = self._store.free_gpu
        free = cache.get(node)
        if free is None:
            n = self._store.nodes[node]
            free = n.allocatable.get(GPU, 0) - self._store.used.get(node, {}).get(GPU, 0)
            free -= self._ledger.reserved_on(node).get(GPU, 0)
            free -= self._nominations.held_on(node).get(GPU, 0)
            cache[node] = free
        mine = self._ledger.get(own) if own is not None else None
        if mine is not None and mine.node == node:
            free += mine.requests.get(GPU, 0)
        return free

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self._store.domains(index)

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        return self._store.domains_by_free_gpus(index, self.free_gpus)

    def explain_score(self, node: NodeName, gpus: int, own: PodKey | None = None) -> Score:
        n = self._store.nodes[node]
        numa = self._store.numa.get(node)
        return explain_score(
            n, gpus, self.free_gpus(node, own), self._store.gpu_pods.get(node, {}).values(),
            self._store.layout(node), numa.gpus_available if numa is not None else None,
        )

    def score(self, node: NodeName, gpus: int, own: PodKey | None = None) -> int:
        if node not in self._store.nodes:
            return 0
        return self.explain_score(node, gpus, own).total

    def scores(self, nodes: Sequence[NodeName], gpus: int, own: PodKey | None) -> list[int]:
        """0..10 per node, in order; plain pods' scores (``own`` None) come from the cache."""
        if own is not None:
            return [self.score(n, gpus, own) for n in nodes]
        cache = self._store.scores.setdefault(gpus, {})
        get = cache.get
        out = [get(n, -1) for n in nodes]
        if -1 in out:
            for i, n in enumerate(nodes):
                if out[i] < 0:
                    out[i] = cache[n] = self.score(n, gpus)
        return out
