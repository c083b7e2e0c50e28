"""Capacity views for the dry plan: the live one with what earlier units of the proposal
took, and the cluster as if empty (the proof that a unit never fits).

Both are :class:`~coscheduling.placement.planner.CapacityView` over the live core, read-only: the
planner runs on them unchanged, so the what-if's plan is the planner's own answer, and
nothing is copied but the few nodes a unit takes.

DRA devices (``device_room``): the live view's room, with the devices planned for members
of earlier units of the same proposal held (``DeviceRoom.proposed``), as the core holds an
admitted gang's planned devices for its slots (``devices.book``): a second gang sees the
first's devices as taken. The empty cluster frees every device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..devices.inventory import PlannedDevices
from ..devices.model import DeviceId
from ..devices.room import DeviceRoom
from ..placement.planner import CapacityView
from ..records import NodeName, NodeRecord, PodKey
from ..resources import Resources, add, sub
from ..topology.domains import GPU, Level, domain_of

__all__ = ["EmptyView", "SnapshotView", "TakenView"]


class TakenView:
    """``base`` with the requests of members placed earlier in the proposal taken (their
    reservations, as the ledger would hold them once their gang is admitted), and the DRA
    devices planned for them held (as ``devices.book.record`` holds them then)."""

    def __init__(self, base: CapacityView, levels: Sequence[Level]) -> None:
        self._base = base
        self._levels = levels
        self.taken: dict[NodeName, Resources] = {}
        self._gpus: dict[NodeName, list[int]] = {}
        self.held: dict[DeviceId, PodKey] = {}

    def take(self, node: NodeName, requests: Resources) -> None:
        self.taken[node] = add(self.taken.get(node, {}), requests)
        if g := requests.get(GPU, 0):
            self._gpus.setdefault(node, []).append(g)

    def hold(self, pod: PodKey, planned: PlannedDevices) -> None:
        """``pod``'s planned devices are taken for the rest of the proposal."""
        for _, d in planned.devices:
            self.held[d] = pod

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return self._base.nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        t = self.taken.get(node)
        base = self._base.free_for_gang(node)
        return sub(base, t) if t else base

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        more = self._gpus.get(node)
        base = self._base.gpu_pods_on(node)
        return [*base, *more] if more else base

    def free_gpus(self, node: NodeName) -> int:
        return self._base.free_gpus(node) - self.taken.get(node, {}).get(GPU, 0)

    def device_room(self) -> DeviceRoom | None:
        room = self._base.device_room()
        if room is None or not self.held:
            return room
        return DeviceRoom(room.inv, room.nodes, room.reservation, room.freed_claims,
                          room.budget, {**room.proposed, **self.held})

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self._base.domains(index)

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        base = self._base.domains_by_free_gpus(index)
        if not self.taken:
            return base
        delta: dict[tuple[str, ...], int] = {}
        nodes = self._base.nodes
        for n, t in self.taken.items():
            rec = nodes.get(n)
            if (g := t.get(GPU, 0)) and rec is not None \
                    and (d := domain_of(self._levels, index, rec)) is not None:
                delta[d] = delta.get(d, 0) - g
        return sorted((f + delta.get(d, 0), d) for f, d in base) if delta else base


class EmptyView:
    """The cluster with nothing on it: every node's allocatable free. A unit that does not
    fit here never fits, whatever finishes or is evicted. Built once per what-if that needs
    it; its domain rankings cost one pass over the nodes per level asked."""

    def __init__(self, base: CapacityView, levels: Sequence[Level]) -> None:
        self._base = base
        self._levels = levels
        self._ranked: dict[int, list[tuple[int, tuple[str, ...]]]] = {}

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return self._base.nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        return dict(self._base.nodes[node].allocatable)

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        return ()

    def free_gpus(self, node: NodeName) -> int:
        return self._base.nodes[node].allocatable.get(GPU, 0)

    def device_room(self) -> DeviceRoom | None:
        """Every device free: no gang holds one (nothing is held, so the core's holds are
        not read, let alone pruned) and every claim's allocation given back."""
        room = self._base.device_room()
        if room is None:
            return None
        return DeviceRoom(room.inv, room.nodes, room.reservation,
                          frozenset(room.inv.claims), _held={})

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self._base.domains(index)

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        got = self._ranked.get(index)
        if got is None:
            got = self._ranked[index] = sorted(
                (sum(self.free_gpus(n) for n in ns), d) for d, ns in self.domains(index).items())
        return got


class SnapshotView:
    """A copy of what the planner reads, taken at once on the event loop, so that planning
    a big unit can run in a thread while the loop goes on changing the live state (the
    planner over 1,000 members spread on 5,000 nodes is seconds of one piece). Copied:
    every node's free room, GPU pods and free GPUs, the domains and their ranking; the
    node records themselves are replaced, never changed, by the store."""

    def __init__(self, base: CapacityView, levels: Sequence[Level]) -> None:
        self._nodes = dict(base.nodes)
        self._free = {n: base.free_for_gang(n) for n in self._nodes}
        self._pods = {n: tuple(base.gpu_pods_on(n)) for n in self._nodes}
        self._gpus = {n: base.free_gpus(n) for n in self._nodes}
        self._domains = [{d: list(ns) for d, ns in base.domains(i).items()}
                         for i in range(len(levels))]
        self._ranked = [list(base.domains_by_free_gpus(i)) for i in range(len(levels))]

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return self._nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        return self._free[node]

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        return self._pods[node]

    def free_gpus(self, node: NodeName) -> int:
        return self._gpus[node]

    def device_room(self) -> DeviceRoom | None:
        """None: the device inventory is not copied, so a unit with DRA claims is never
        planned on a snapshot (``dryrun`` plans it on the loop, on the live view)."""
        return None

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        return self._domains[index]

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        return self._ranked[index]
