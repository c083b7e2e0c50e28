"""The devices admitted gangs hold, and the planner's read of what is free.

A member's devices are held exactly as long as its slot is: :class:`PlannedDevices` is
written when its gang is admitted (:func:`record`) and counts only while the ledger still
holds that member's reservation on the same node (:func:`held_devices`). Every path that
gives a slot back (bound, timed out, fallen back, preempted, node lost) therefore gives its
devices back too, with no second book to keep in step; stale entries are pruned lazily.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ..records import NodeName, NodeRecord, PodKey, PodRecord
from ..state.ledger import Reservation
from .budget import Budget
from .demand import DEFERRED, DEFERRED_REASON, ClaimNeed, Need, pod_demand
from .inventory import DeviceInventory, PlannedDevices
from .matching import JointTrial
from .model import ClaimKey, DeviceId
from .scan import DeviceScan

__all__ = ["DeviceRoom", "Want", "held_devices", "own_wants", "record"]

Want = tuple[tuple[tuple[str, ...] | None, int], ...]
"""Devices a member needs for claims only it has, by selector set (None: any device, for a
``firstAvailable`` request, whose subrequest is not chosen yet), in a fixed order."""


def held_devices(inv: DeviceInventory, reservation: Callable[[PodKey], Reservation | None]
                 ) -> dict[DeviceId, PodKey]:
    """Devices held by admitted members' slots, with the member (stale entries dropped)."""
    out: dict[DeviceId, PodKey] = {}
    for pod in list(inv.planned):
        pd = inv.planned[pod]
        r = reservation(pod)
        if r is None or r.node != pd.node:
            del inv.planned[pod]
            continue
        for _, d in pd.devices:
            out[d] = pod
    return out


def record(inv: DeviceInventory, planned: Mapping[PodKey, PlannedDevices]) -> None:
    """A gang was admitted: its members' devices are held from now."""
    for pod, pd in planned.items():
        if pd.devices:
            inv.planned[pod] = pd
        else:
            inv.planned.pop(pod, None)
    inv.epoch += 1


def own_wants(needs: Sequence[tuple[ClaimNeed, ...] | None], budget: Budget
              ) -> list[Want | None]:
    """Each member's :data:`Want`: what its node must have free, whatever the others do.
    A claim shared with another member (placed by whichever comes first) and an allocated
    one are left out, so this is a necessary condition on a member's node."""
    members = Counter(c.key for claims in needs for c in claims or ())
    out: list[Want | None] = []
    for claims in needs:
        if not claims:
            out.append(None)
            continue
        want: dict[tuple[str, ...] | None, int] = {}
        for c in claims:
            if c.allocated is not None or members[c.key] > 1:
                continue
            budget.read(len(c.needs))
            for need in c.needs:
                key = None if need.alternatives else need.selectors
                n = min(_least(o) for o in need.alternatives) if need.alternatives \
                    else _least(need)
                want[key] = want.get(key, 0) + n
        out.append(tuple(sorted(want.items(), key=lambda kv: (kv[0] is not None,
                                                              kv[0] or ()))))
    return out


def _least(need: Need) -> int:
    return need.request.count if need.request.mode == "ExactCount" else 1


@dataclass(slots=True)
class DeviceRoom:
    """What one planning call reads of the devices: each pod's claims resolved, and free
    devices outside every admitted gang's hold (and, in a preemption's what-if, with the
    victims' claims given back). One per planning call: its trials share one
    :class:`DeviceScan` and one :class:`Budget`."""

    inv: DeviceInventory
    nodes: Mapping[NodeName, NodeRecord]
    reservation: Callable[[PodKey], Reservation | None]
    freed_claims: Collection[ClaimKey] = ()
    budget: Budget = field(default_factory=Budget)
    proposed: Mapping[DeviceId, PodKey] = field(default_factory=dict)
    """Devices held besides the admitted gangs': those a what-if planned for members of
    earlier units of its manifest (``coscheduling.whatif``), held as :func:`record` holds an
    admitted gang's. Their pods do not exist, so no slot prunes them: the what-if's own."""
    _held: dict[DeviceId, PodKey] | None = None
    _scan: DeviceScan | None = None

    def demand(self, pod: PodRecord) -> tuple[ClaimNeed, ...] | str | None:
        """None for a pod without claims; else its claims, or why they cannot be planned
        (:data:`~coscheduling.devices.demand.DEFERRED_REASON` when compiling their selectors
        spent the call's budget: the plan is over budget and says so)."""
        if not pod.claims:
            return None
        got = pod_demand(self.inv, pod, self.budget)
        return DEFERRED_REASON if got is DEFERRED else got

    def held(self) -> Mapping[DeviceId, PodKey]:
        if self._held is None:
            self._held = held_devices(self.inv, self.reservation)
            self._held.update(self.proposed)
        return self._held

    def free_devices(self, node: NodeName) -> int | None:
        """Devices of ``node``'s own slices that no claim holds and no plan holds (selectors
        not looked at: an upper bound, without CEL); None when network-attached devices
        exist (they are counted on no one node, so no bound is given)."""
        if self.inv.has_network():
            return None
        held, allocated = self.held(), self.inv.allocated()
        free = 0
        for d in self.inv.local(node):
            owner = allocated.get(d.id)
            if d.id not in held and (owner is None or owner in self.freed_claims):
                free += 1
        return free

    def scan(self) -> DeviceScan:
        """The call's reads of the devices, shared by its trials and pre-checks."""
        if self._scan is None:
            self._scan = DeviceScan(self.inv, self.nodes, self.held(), self.budget,
                                    frozenset(self.freed_claims))
        return self._scan

    def could(self, want: Want, node: NodeName) -> bool:
        """``node`` has the free devices ``want`` asks for: in all, and for each selector
        set (evaluated once per what the selectors read of a device). Cheap next to a
        trial, which builds a unit per device asked for."""
        scan = self.scan()
        free = scan.free(node)
        if sum(n for _, n in want) > len(free):
            return False
        return all(len(scan.free_eligible(node, s)) >= n for s, n in want if s is not None)

    def trial(self) -> JointTrial:
        scan = self.scan()
        return JointTrial(self.inv, self.nodes, scan.held, self.budget, freed=scan.freed,
                          scan=scan)

    def freeing(self, pods: Collection[str]) -> DeviceRoom:
        """The same room once ``pods`` (keys) are gone and their claims deallocated: a claim
        reserved only for leaving pods counts as free (preemption's what-if)."""
        leaving = set(pods)
        freed = {c.key for c in self.inv.claims.values()
                 if c.allocated is not None and c.reserved_for
                 and leaving.issuperset(c.reserved_for)}
        return DeviceRoom(self.inv, self.nodes, self.reservation,
                          frozenset(freed) | frozenset(self.freed_claims), self.budget,
                          self.proposed)
