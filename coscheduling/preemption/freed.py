"""Capacity as it will be once some bound pods have gone: the what-if view of preemption.

A :class:`FreedView` is a :class:`~coscheduling.placement.planner.CapacityView` over another
one, with
the requests of leaving pods given back and, optionally, limited to the nodes of one
topology domain (:class:`Region`). The planner runs on it unchanged, so "the gang fits once
these victims are gone" is the planner's own answer. Built per trial and never written
back: a failed trial needs no undo.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from ..devices.room import DeviceRoom
from ..placement.planner import CapacityView
from ..records import NodeName, NodeRecord
from ..resources import Resources, add
from ..topology.domains import GPU, Level, domain_of

__all__ = ["FreedView", "Leaving", "Region", "freed_view"]


class Leaving(Protocol):
    """A bound pod on its way out: where it is and what it holds."""

    @property
    def node(self) -> NodeName: ...

    @property
    def requests(self) -> Mapping[str, int]: ...


class FreedView:
    """A :class:`CapacityView` with victims' requests given back, optionally limited to the
    nodes of one domain. Built per trial; reads the base view for everything else."""

    def __init__(self, base: CapacityView, levels: Sequence[Level],
                 victims: Iterable[Leaving], region: Region | None = None) -> None:
        self._base = base
        self._levels = levels
        self._region = region
        freed: dict[NodeName, Resources] = {}
        gone: dict[NodeName, list[int]] = {}
        leaving: list[str] = []
        for c in victims:
            if isinstance(key := getattr(c, "key", None), str):
                leaving.append(key)
            freed[c.node] = add(freed.get(c.node, {}), c.requests)
            if g := c.requests.get(GPU, 0):
                gone.setdefault(c.node, []).append(g)
        self.freed = freed
        self._gone = gone
        self._ranked: dict[int, Sequence[tuple[int, tuple[str, ...]]]] = {}
        self._leaving = leaving

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return self._region.nodes if self._region is not None else self._base.nodes

    def free_for_gang(self, node: NodeName) -> Resources:
        back = self.freed.get(node)
        base = self._base.free_for_gang(node)
        return add(base, back) if back else base

    def device_room(self) -> DeviceRoom | None:
        """The base's devices, with the victims' claims given back (their pods gone, the
        claims deallocated: only then does the preemptor bind)."""
        room = self._base.device_room()
        return room.freeing(self._leaving) if room is not None and self._leaving else room

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        gone = self._gone.get(node)
        if not gone:
            return self._base.gpu_pods_on(node)
        pods = list(self._base.gpu_pods_on(node))
        for g in gone:
            if g in pods:
                pods.remove(g)
        return pods

    def free_gpus(self, node: NodeName) -> int:
        return self._base.free_gpus(node) + self.freed.get(node, {}).get(GPU, 0)

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        if self._region is not None:
            return self._region.domains(self._levels, index)
        return self._base.domains(index)

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        got = self._ranked.get(index)
        if got is not None:
            return got
        if self._region is not None:
            ranked = sorted((sum(self.free_gpus(n) for n in ns), d)
                            for d, ns in self.domains(index).items())
        else:
            # The whole cluster: adjust the base ranking for the domains victims touch only.
            base = self._base.domains_by_free_gpus(index)
            delta: dict[tuple[str, ...], int] = {}
            nodes = self._base.nodes
            for n, back in self.freed.items():
                g = back.get(GPU, 0)
                rec = nodes.get(n)
                if g and rec is not None:
                    d = domain_of(self._levels, index, rec)
                    if d is not None:
                        delta[d] = delta.get(d, 0) + g
            ranked = sorted((t + delta.get(d, 0), d) for t, d in base) if delta else list(base)
        self._ranked[index] = ranked
        return ranked


class Region:
    """The nodes of one domain, grouped per level once and reused by every trial on it."""

    def __init__(self, nodes: Mapping[NodeName, NodeRecord]) -> None:
        self.nodes = nodes
        self._domains: dict[int, dict[tuple[str, ...], list[NodeName]]] = {}

    def domains(self, levels: Sequence[Level], index: int
                ) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        got = self._domains.get(index)
        if got is None:
            got = {}
            for n in sorted(self.nodes):
                d = domain_of(levels, index, self.nodes[n])
                if d is not None:
                    got.setdefault(d, []).append(n)
            self._domains[index] = got
        return got


def freed_view(view: CapacityView, levels: Sequence[Level], victims: Iterable[Leaving],
               within: Iterable[NodeName] | None = None) -> CapacityView:
    """``view`` with ``victims``' requests given back, limited to the nodes ``within`` when
    given: what the planner sees once they are gone (tests and the core's re-check)."""
    region = None
    if within is not None:
        nodes = view.nodes
        region = Region({n: nodes[n] for n in within if n in nodes})
    return FreedView(view, levels, victims, region)
