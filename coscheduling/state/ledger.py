"""Reservations, one per pod: capacity an admitted gang holds for a member not yet bound.

Each reservation names its pod, gang, node and the exact requests it holds, so giving one
back is exact: no "None means everything on that node" rule that could drop a sibling's share
. Per-node totals are an index over the reservations, kept in step here and
nowhere else; :func:`check_ledger` (run by the model test after every step) proves that they
and the gangs' plans agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..records import GangKey, NodeName, PodKey
from ..resources import Resources, add, sub

__all__ = ["Ledger", "LedgerDrift", "Reservation", "check_ledger"]


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: PodKey
    gang: GangKey
    node: NodeName
    requests: Resources


@dataclass(slots=True)
class Ledger:
    on_change: Callable[[NodeName], None] = lambda _: None
    """Called with the node whenever its reservations change (drops its cached scores)."""
    by_pod: dict[PodKey, Reservation] = field(default_factory=dict)
    by_node: dict[NodeName, dict[PodKey, Reservation]] = field(default_factory=dict)
    total: dict[NodeName, Resources] = field(default_factory=dict)

    def reserve(self, r: Reservation) -> None:
        if r.pod in self.by_pod:
            self.unreserve(r.pod)
        self.by_pod[r.pod] = r
        self.by_node.setdefault(r.node, {})[r.pod] = r
        self.total[r.node] = add(self.total.get(r.node, {}), r.requests)
        self.on_change(r.node)

    def unreserve(self, pod: PodKey) -> Reservation | None:
        r = self.by_pod.pop(pod, None)
        if r is None:
            return None
        per = self.by_node[r.node]
        del per[pod]
        if per:
            self.total[r.node] = sub(self.total[r.node], r.requests)
        else:
            del self.by_node[r.node]
            del self.total[r.node]
        self.on_change(r.node)
        return r

    def get(self, pod: PodKey) -> Reservation | None:
        return self.by_pod.get(pod)

    def on_node(self, node: NodeName) -> Iterable[Reservation]:
        return tuple(self.by_node.get(node, {}).values())

    def reserved_on(self, node: NodeName) -> Resources:
        return self.total.get(node, {})

    def by_gang_on(self, node: NodeName) -> dict[GangKey, Resources]:
        out: dict[GangKey, Resources] = {}
        for r in self.by_node.get(node, {}).values():
            out[r.gang] = add(out.get(r.gang, {}), r.requests)
        return out

    def gangs_on(self, node: NodeName) -> set[GangKey]:
        return {r.gang for r in self.by_node.get(node, {}).values()}

    def reserving_gangs(self, other_than: GangKey | None) -> tuple[GangKey, ...]:
        return tuple(sorted({r.gang for r in self.by_pod.values() if r.gang != other_than}))

    def nodes(self) -> Iterable[NodeName]:
        return self.by_node.keys()

    def __len__(self) -> int:
        return len(self.by_pod)


class LedgerDrift(AssertionError):
    """The reservations and the plans (or the per-node totals) disagree."""


def check_ledger(ledger: Ledger, plans: Mapping[GangKey, Mapping[PodKey, NodeName]]) -> None:
    """Reservations equal the plans, pod by pod, and every per-node total is their sum."""
    planned = {(g, p, n) for g, plan in plans.items() for p, n in plan.items()}
    held = {(r.gang, r.pod, r.node) for r in ledger.by_pod.values()}
    if planned != held:
        raise LedgerDrift(f"plans without reservation: {sorted(planned - held)}; "
                          f"reservations without plan: {sorted(held - planned)}")
    for node, per in ledger.by_node.items():
        want: Resources = {}
        for r in per.values():
            if ledger.by_pod.get(r.pod) is not r:
                raise LedgerDrift(f"node index holds stale reservation {r}")
            want = add(want, r.requests)
        have = ledger.total.get(node, {})
        if {k: v for k, v in have.items() if v} != {k: v for k, v in want.items() if v}:
            raise LedgerDrift(f"node {node}: total {have} != sum of reservations {want}")
    if set(ledger.total) != set(ledger.by_node):
        raise LedgerDrift("per-node totals and the node index list different nodes")
