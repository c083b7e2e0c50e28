"""What one planning call reads of the devices, each read at most once and all of it
charged to the call's one :class:`~coscheduling.devices.budget.Budget`.

A plan tries a member on many nodes, and the same node again in each wider topology
domain; the devices a node reaches, which of them a selector set takes and which are free
do not change within the call, so every trial of the call (``DeviceRoom.trial``) shares
one scan. Selectors are evaluated once per expression and what it reads of a device
(``DeviceInventory.select`` over ``Selectors``' cache): 300 nodes of one GPU model cost one
evaluation per expression, not 2,400, whatever each GPU's ``uuid``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..records import NodeName, NodeRecord
from .budget import Budget
from .inventory import DeviceInventory
from .model import ClaimKey, Device, DeviceId

__all__ = ["PCIE_ROOT", "DeviceScan"]

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def _root(d: Device) -> str:
    v = d.attribute(PCIE_ROOT)
    return str(v) if v is not None else ""


@dataclass(slots=True)
class DeviceScan:
    inv: DeviceInventory
    nodes: Mapping[NodeName, NodeRecord]
    held: Mapping[DeviceId, object]
    """Devices other gangs' reservations hold (never given out)."""
    budget: Budget
    freed: frozenset[ClaimKey] = frozenset()
    """Allocated claims of leaving pods (a preemption's victims): their devices are free."""
    _reach: dict[NodeName, Sequence[Device]] = field(default_factory=dict)
    _reach_ids: dict[NodeName, frozenset[DeviceId]] = field(default_factory=dict)
    _free: dict[NodeName, list[DeviceId]] = field(default_factory=dict)
    _eligible: dict[tuple[NodeName, tuple[str, ...]], list[DeviceId]] = field(
        default_factory=dict)
    _free_eligible: dict[tuple[NodeName, tuple[str, ...]], list[DeviceId]] = field(
        default_factory=dict)

    def reachable(self, node: NodeName) -> Sequence[Device]:
        """The devices a pod on ``node`` could be given (``DeviceInventory.reachable``)."""
        got = self._reach.get(node)
        if got is None:
            n = self.nodes.get(node)
            got = self._reach[node] = self.inv.reachable(node, n.labels if n else {})
            self.budget.examine(len(got))
        return got

    def reach_ids(self, node: NodeName) -> frozenset[DeviceId]:
        got = self._reach_ids.get(node)
        if got is None:
            got = self._reach_ids[node] = frozenset(d.id for d in self.reachable(node))
        return got

    def _only_free(self, ids: Iterable[DeviceId]) -> list[DeviceId]:
        """Those of ``ids`` no claim holds (or only a leaving pod's) and no other gang's
        plan holds. A claim being planned holds no device yet (an allocated one is planned
        as it is), so this does not depend on the claim asking."""
        allocated, held, freed = self.inv.allocated(), self.held, self.freed
        return [d for d in ids if d not in held
                and ((owner := allocated.get(d)) is None or owner in freed)]

    def free(self, node: NodeName) -> list[DeviceId]:
        """``node``'s free reachable devices, whatever they are (no selector evaluated)."""
        got = self._free.get(node)
        if got is None:
            # Charged with the listing (``reachable``): one pass more over the same devices.
            got = self._free[node] = self._only_free(d.id for d in self.reachable(node))
        return got

    def eligible(self, node: NodeName, selectors: tuple[str, ...]) -> list[DeviceId]:
        """``node``'s devices every one of ``selectors`` takes, free or not, one PCIe root
        after another (stable: a member's units fill one root first). A device whose
        verdict the spent budget left unknown is left out (the plan is over budget then)."""
        k = (node, selectors)
        got = self._eligible.get(k)
        if got is None:
            devs = self.reachable(node)
            self.budget.examine(len(devs))
            picked = self.inv.select(devs, selectors, self.budget)
            picked.sort(key=_root)
            got = self._eligible[k] = [d.id for d in picked]
        return got

    def free_eligible(self, node: NodeName, selectors: tuple[str, ...]) -> list[DeviceId]:
        """:meth:`eligible`, free ones only, in the same order."""
        k = (node, selectors)
        got = self._free_eligible.get(k)
        if got is None:
            # Charged with ``eligible``: one pass more over fewer devices.
            got = self._free_eligible[k] = self._only_free(self.eligible(node, selectors))
        return got
