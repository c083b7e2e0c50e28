"""Whole-gang placement: find one node for every member, or say why there is none.

The planner reads a :class:`CapacityView` and returns a :class:`Plan` or a :class:`NoFit`; it
never changes the live state, so a failed plan needs no undo. It tries the tightest topology
level first (one node, one clique, one rack, ...), widening only when no single domain holds
the whole gang, and among fitting domains it picks the one left with the fewest free GPUs
(the least fragmentation). Inside a domain, members are placed largest first, each on the node
it fills most tightly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .eligibility import eligible
from .records import NodeName, NodeRecord, PodKey, PodRecord
from .resources import PODS, Resources, fits, sub
from .topology import GPU, Level, domain_of, score_node

__all__ = ["CapacityView", "Member", "NoFit", "Plan", "plan_gang"]


@dataclass(frozen=True, slots=True)
class Member:
    pod: PodRecord
    candidates: frozenset[NodeName] | None = None
    """Nodes kube-scheduler's own filters passed (known only for the pod being filtered)."""

    @property
    def key(self) -> PodKey:
        return self.pod.key


class CapacityView(Protocol):
    """What the planner may read: nodes and the capacity a gang may use on each."""

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]: ...

    def free_for_gang(self, node: NodeName) -> Resources:
        """Free capacity on ``node`` outside every other admitted gang's reservation."""
        ...

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        """GPU counts of the pods holding GPUs on ``node`` (for island packing)."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    assignments: dict[PodKey, NodeName]
    level: str | None
    """The topology level whose single domain holds the gang; None when spread."""
    domain: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class NoFit:
    members: int
    shape: Resources
    """The largest member's request (all members when they are alike)."""
    free_units: int
    """How many members of that shape fit in the free capacity, ignoring topology."""
    eligible_nodes: int
    required_level: str | None = None
    widest_domain_fit: int = 0
    """With a required level: the most members any single domain could hold."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def _signature(pod: PodRecord) -> tuple[object, ...]:
    return (
        tuple(sorted(pod.requests.items())),
        tuple(sorted(pod.node_selector.items())),
        repr(pod.required_affinity),
        pod.tolerations,
    )


def _size_key(m: Member) -> tuple[int, int, int, str]:
    r = m.pod.requests
    return (-r.get(GPU, 0), -r.get("cpu", 0), -r.get("memory", 0), m.key)


def _place(
    members: Sequence[Member],
    nodes: Sequence[NodeName],
    view: CapacityView,
    ok: Mapping[tuple[PodKey, NodeName], bool],
) -> dict[PodKey, NodeName] | None:
    free: dict[NodeName, Resources] = {}
    extra_gpu: dict[NodeName, list[int]] = {}
    out: dict[PodKey, NodeName] = {}
    for m in members:
        req = m.pod.requests
        gpus = req.get(GPU, 0)
        best: tuple[tuple[float, ...], NodeName] | None = None
        for n in nodes:
            if not ok.get((m.key, n), False):
                continue
            f = free.get(n)
            if f is None:
                f = free[n] = view.free_for_gang(n)
            if not fits(req, f):
                continue
            node = view.nodes[n]
            if gpus:
                used = [*view.gpu_pods_on(n), *extra_gpu.get(n, ())]
                score = score_node(node, gpus, f.get(GPU, 0), used)
                rank: tuple[float, ...] = (f.get(GPU, 0) - gpus, -score)
            else:
                # CPU-only members (launchers) prefer nodes without GPUs, then the tightest.
                rank = (node.allocatable.get(GPU, 0), f.get("cpu", 0) - req.get("cpu", 0))
            if best is None or (rank, n) < (best[0], best[1]):
                best = (rank, n)
        if best is None:
            return None
        n = best[1]
        free[n] = sub(free[n], req)
        if gpus:
            extra_gpu.setdefault(n, []).append(gpus)
        out[m.key] = n
    return out


def plan_gang(
    members: Sequence[Member],
    view: CapacityView,
    levels: Sequence[Level],
    *,
    required: Level | None = None,
    fixed: Mapping[PodKey, NodeName] | None = None,
) -> Plan | NoFit:
    """Place ``members``; ``fixed`` members already hold their node (parked bind calls)."""
    fixed = dict(fixed or {})
    todo = sorted((m for m in members if m.key not in fixed), key=_size_key)
    names = sorted(view.nodes)
    ok: dict[tuple[PodKey, NodeName], bool] = {}
    by_sig: dict[tuple[object, ...], list[NodeName]] = {}
    for m in todo:
        sig = _signature(m.pod)
        if sig not in by_sig:
            by_sig[sig] = [n for n in names if eligible(m.pod, view.nodes[n])]
        cands = by_sig[sig]
        for n in cands:
            if m.candidates is None or n in m.candidates:
                ok[(m.key, n)] = True
    if not todo:
        return Plan(dict(fixed), None)

    start = len(levels) - 1
    stop = 0
    if required is not None:
        stop = levels.index(required)
    fixed_nodes = {fixed[k] for k in fixed}
    total_gpu = sum(m.pod.requests.get(GPU, 0) for m in todo)

    for index in range(start, stop - 1, -1):
        domains: dict[tuple[str, ...], list[NodeName]] = {}
        for n in names:
            d = domain_of(levels, index, view.nodes[n])
            if d is not None:
                domains.setdefault(d, []).append(n)
        if fixed_nodes:
            # Parked members already sit on their nodes: only their domain can hold the rest.
            doms = {domain_of(levels, index, view.nodes[n]) for n in fixed_nodes if n in view.nodes}
            domains = {d: ns for d, ns in domains.items() if d in doms}
        best: tuple[tuple[int, int, tuple[str, ...]], dict[PodKey, NodeName]] | None = None
        sized = []
        for d, ns in domains.items():
            free_gpu = sum(view.free_for_gang(n).get(GPU, 0) for n in ns)
            if free_gpu >= total_gpu:
                sized.append((free_gpu, d, ns))
        # Tightest domains first: once one fits, only domains as tight can still beat it.
        for free_gpu, d, ns in sorted(sized, key=lambda t: (t[0], t[1])):
            if best is not None and free_gpu - total_gpu > best[0][0]:
                break
            placed = _place(todo, ns, view, ok)
            if placed is None:
                continue
            rank = (free_gpu - total_gpu, len(set(placed.values())), d)
            if best is None or rank < best[0]:
                best = (rank, placed)
        if best is not None:
            return Plan({**fixed, **best[1]}, levels[index].name, best[0][2])

    if required is None:
        placed = _place(todo, names, view, ok)
        if placed is not None:
            return Plan({**fixed, **placed}, None)
    return _explain(todo, view, names, ok, required, levels)


def _explain(
    todo: Sequence[Member],
    view: CapacityView,
    names: Sequence[NodeName],
    ok: Mapping[tuple[PodKey, NodeName], bool],
    required: Level | None,
    levels: Sequence[Level],
) -> NoFit:
    shape = dict(todo[0].pod.requests)
    shape.pop(PODS, None)
    units = 0
    eligible_nodes = {n for (_, n) in ok}
    for n in eligible_nodes:
        f = view.free_for_gang(n)
        while fits(shape, f) and units < len(todo) + 1:
            f = sub(f, shape)
            units += 1
    notes: list[str] = []
    for m in todo:
        if not any(ok.get((m.key, n)) for n in names):
            notes.append(f"{m.key} matches no node (selector, affinity or taints)")
    widest = 0
    if required is not None:
        index = levels.index(required)
        domains: dict[tuple[str, ...], list[NodeName]] = {}
        for n in names:
            d = domain_of(levels, index, view.nodes[n])
            if d is not None:
                domains.setdefault(d, []).append(n)
        for ns in domains.values():
            count = 0
            for n in ns:
                f = view.free_for_gang(n)
                while fits(shape, f) and count < len(todo):
                    f = sub(f, shape)
                    count += 1
            widest = max(widest, count)
    return NoFit(
        members=len(todo),
        shape=shape,
        free_units=units,
        eligible_nodes=len(eligible_nodes),
        required_level=required.name if required else None,
        widest_domain_fit=widest,
        notes=tuple(notes[:5]),
    )
