"""The joint device plan of one gang: every member's claims on concrete devices at once.

Each device a request needs is a *unit*; a unit may take any free device its node reaches
that satisfies the request's selectors. Placing a member adds its units and finds a device
for each by an augmenting path (Kuhn's bipartite matching, breadth first): when the devices a
member may use are all taken by earlier members, the path moves those earlier members to
other devices they may use. That is the backtracking across the gang that upstream's
one-pod-at-a-time first fit lacks (kubernetes/kubernetes#138765): a member whose first-fit
choice took the only device another member can use is moved, not the gang refused.

The matching is exact for what it models (which devices each request may take), so a gang is
refused only when no assignment exists, or when the planning call's work budget
(``devices.budget``: devices examined, selector evaluations, units built and edges visited,
independent of any number a user writes) runs out. Before a member's units are built on a
node, the node is checked to have enough free devices, in all and for each selector set the
member's requests use (counted from the call's :class:`~coscheduling.devices.scan.DeviceScan`,
selectors evaluated once per device signature): a node that cannot hold the member costs a
few counts, not a unit per device asked for (16 claims x 32 requests are 512 units).

Preferences: a unit's devices are ordered by PCIe root (``resource.kubernetes.io/pcieRoot``),
so a member's units fill one root before the next; the node-level preference for one NVLink
clique is the planner's (its ``clique`` topology level, ``nvidia.com/gpu.clique``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..records import NodeName, NodeRecord, PodKey
from .budget import BUDGET, Budget
from .demand import ClaimNeed, Need
from .inventory import DeviceInventory, PlannedDevices
from .model import ClaimKey, Device, DeviceId
from .scan import PCIE_ROOT, DeviceScan

__all__ = ["BUDGET", "PCIE_ROOT", "Budget", "JointTrial"]


@dataclass(slots=True)
class JointTrial:
    """One tentative placement of a gang's devices; ``add`` either places a member's claims
    (moving earlier members' devices if it must) or leaves everything as it was."""

    inv: DeviceInventory
    nodes: Mapping[NodeName, NodeRecord]
    held: Mapping[DeviceId, object]
    """Devices other gangs' reservations hold (never given out here)."""
    budget: Budget
    freed: frozenset[ClaimKey] = frozenset()
    """Allocated claims of leaving pods (a preemption's victims): their devices are free."""
    edges: list[list[DeviceId]] = field(default_factory=list)
    unit_claim: list[ClaimKey] = field(default_factory=list)
    match: list[DeviceId | None] = field(default_factory=list)
    owner: dict[DeviceId, int] = field(default_factory=dict)
    claim_units: dict[ClaimKey, list[int]] = field(default_factory=dict)
    fixed: dict[ClaimKey, tuple[DeviceId, ...]] = field(default_factory=dict)
    pods: dict[PodKey, tuple[NodeName, tuple[ClaimKey, ...]]] = field(default_factory=dict)
    chosen: dict[ClaimKey, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    """The subrequest each ``firstAvailable`` request of a claim was planned on."""
    used: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """Shared counters taken (``inventory.counters``): by allocated and held devices, and by
    the devices matched here."""
    _entered: list[DeviceId] = field(default_factory=list)
    """Devices in the matching, in the order they entered it (their counters are taken)."""
    scan: DeviceScan | None = None
    _members: dict[int, tuple[Sequence[ClaimNeed], int,
                              dict[int, tuple[int, int, dict[tuple[str, ...], int]]]]] = field(
        default_factory=dict)
    """Per member's claims (by identity, the object kept): its widest request, and per
    subrequest choice what :meth:`_wants` read (with the placement count it read at)."""
    _placements: int = 0
    """The planning call's reads of the devices, shared by its trials (one made here when
    none is given: a trial on its own)."""

    def __post_init__(self) -> None:
        if self.scan is None:
            self.scan = DeviceScan(self.inv, self.nodes, self.held, self.budget, self.freed)
        if self.inv.counters():
            for d in {*self.inv.allocated(), *self.held}:
                dev = self.inv.device(d)
                if dev is not None:
                    self._take(dev, 1)

    def _take(self, dev: Device, sign: int) -> None:
        for cs, c, v in dev.consumes:
            k = (dev.driver, dev.pool, cs, c)
            self.used[k] = self.used.get(k, 0) + sign * v

    def _counters_allow(self, d: DeviceId) -> bool:
        dev = self.inv.device(d)
        if dev is None or not dev.consumes:
            return True
        have = self.inv.counters()
        return all(self.used.get(k := (dev.driver, dev.pool, cs, c), 0) + v <= have.get(k, 0)
                   for cs, c, v in dev.consumes)

    @property
    def _scan(self) -> DeviceScan:
        assert self.scan is not None  # set in __post_init__
        return self.scan

    def add(self, pod: PodKey, claims: Sequence[ClaimNeed], node: NodeName, floor: int = 0
            ) -> bool:
        """Place ``pod``'s claims on ``node``'s devices, or change nothing and say no. A
        ``firstAvailable`` request takes its first subrequest from ``floor`` on that can be
        had (the planner raises ``floor`` for the whole gang when preferred subrequests of
        early members leave later ones nothing: #138765's whole GPU and its halves). Always
        no once the budget is spent."""
        if self.budget.spent:
            return False
        widest = self._widest(claims)
        for k in range(min(floor, max(widest - 1, 0)), max(widest, 1)):
            if self._add(pod, claims, node, k):
                return True
        return False

    def _widest(self, claims: Sequence[ClaimNeed]) -> int:
        """The most subrequests any request of ``claims`` has (once per member: the planner
        passes a member's claims as one object to every node it tries)."""
        got = self._members.get(id(claims))
        if got is None or got[0] is not claims:
            self.budget.read(sum(len(c.needs) for c in claims))
            widest = max((len(n.alternatives) for c in claims for n in c.needs), default=0)
            got = self._members[id(claims)] = (claims, widest, {})
        return got[1]

    def _wants(self, claims: Sequence[ClaimNeed], k: int) -> tuple[int, dict[tuple[str, ...],
                                                                          int]]:
        """How many devices the claims no earlier member placed need, in all and by
        selector set, with subrequest ``k``: read once per member and choice, until a
        placement changes which claims are placed (not once per node tried: 16 claims x 32
        requests on 600 nodes were 300,000 requests read for one member)."""
        self._widest(claims)
        by_k = self._members[id(claims)][2]
        got = by_k.get(k)
        if got is not None and got[0] == self._placements:
            return got[1], got[2]
        want: dict[tuple[str, ...], int] = {}
        seen: set[ClaimKey] = set()
        for c in claims:
            if c.key in seen or c.key in self.claim_units or c.key in self.fixed \
                    or c.allocated is not None:
                continue
            seen.add(c.key)
            self.budget.read(len(c.needs))
            for need in c.needs:
                if need.alternatives:
                    need = need.alternatives[min(k, len(need.alternatives) - 1)]
                r = need.request
                want[need.selectors] = want.get(need.selectors, 0) + (
                    r.count if r.mode == "ExactCount" else 1)
        total = sum(want.values())
        by_k[k] = (self._placements, total, want)
        return total, want

    def _add(self, pod: PodKey, claims: Sequence[ClaimNeed], node: NodeName, k: int) -> bool:
        if not self._could(node, *self._wants(claims, k)):
            return False  # nothing built: the node cannot hold the member's new units
        start, entered = len(self.edges), len(self._entered)
        undo: list[tuple[int, DeviceId | None, DeviceId | None, int | None]] = []
        added: list[ClaimKey] = []
        ok = True
        for c in claims:
            if c.key in self.claim_units or c.key in self.fixed:
                # Shared with a member placed earlier: its devices must reach this node too.
                have = self.fixed.get(c.key) or tuple(
                    m for u in self.claim_units[c.key] if (m := self.match[u]) is not None)
                reach = self._scan.reach_ids(node)
                ok = all(d in reach for d in have)
            elif c.allocated is not None:
                reach = self._scan.reach_ids(node)
                ok = all(d in reach for d in c.allocated)
                self.fixed[c.key] = c.allocated
                added.append(c.key)
            else:
                units = self.claim_units[c.key] = []
                added.append(c.key)
                picks = []
                for need in c.needs:
                    if need.alternatives:
                        j = min(k, len(need.alternatives) - 1)
                        picks.append((need.request.name, j))
                        need = need.alternatives[j]
                    ok = self._add_units(node, c.key, need, units)
                    if not ok:
                        break
                self.chosen[c.key] = tuple(picks)
            if not ok:
                break
        if ok and not self.budget.spent:
            for u in range(start, len(self.edges)):
                if not self._augment(u, undo):
                    ok = False
                    break
        else:
            ok = False
        if not ok:
            self._rollback(start, entered, undo, added)
            return False
        self.pods[pod] = (node, tuple(c.key for c in claims))
        self._placements += 1
        return True

    def _could(self, node: NodeName, total: int, want: Mapping[tuple[str, ...], int]
               ) -> bool:
        """``node`` may hold ``total`` new units: as many free devices in all (not counting
        devices the matching already gave out: a path moves earlier members between
        devices, never frees one), and for each selector set of ``want`` as many free
        devices it takes. Necessary conditions, counted before any unit is built; the free
        count comes first, as it evaluates no selector."""
        if not total:
            return True
        free = self._scan.free(node)
        if total > len(free):
            return False
        for selectors, n in want.items():
            if len(self._scan.free_eligible(node, selectors)) < n:
                return False
        if self.owner:
            self.budget.examine(len(free))
            total += sum(1 for d in free if d in self.owner)
        return total <= len(free)

    def _add_units(self, node: NodeName, claim: ClaimKey, need: Need, units: list[int]
                   ) -> bool:
        scan = self._scan
        if need.request.mode == "All":
            # Every matching device, each taken: one unit pinned to each, and none held
            # elsewhere (upstream's allocator fails the claim then too).
            eligible = scan.eligible(node, need.selectors)
            if not eligible or len(scan.free_eligible(node, need.selectors)) < len(eligible):
                return False
            groups = [[d] for d in eligible]
        else:
            free = scan.free_eligible(node, need.selectors)
            if len(free) < need.request.count:
                return False
            groups = [free] * need.request.count  # edges are read, never changed
        self.budget.build(len(groups))
        for g in groups:
            units.append(len(self.edges))
            self.edges.append(g)
            self.unit_claim.append(claim)
            self.match.append(None)
        return True

    def _augment(self, u: int, undo: list[tuple[int, DeviceId | None, DeviceId | None,
                                                int | None]]) -> bool:
        prev: dict[DeviceId, int] = {}
        queue = deque([u])
        while queue:
            x = queue.popleft()
            for d in self.edges[x]:
                if not self.budget.visit():
                    return False
                if d in prev:
                    continue
                prev[d] = x
                o = self.owner.get(d)
                if o is not None:
                    queue.append(o)
                    continue
                if not self._counters_allow(d):
                    continue  # a partition whose shared counters are spent
                dev = self.inv.device(d)
                if dev is not None and dev.consumes:
                    self._take(dev, 1)
                self._entered.append(d)
                while True:  # flip the path back to u
                    x = prev[d]
                    old = self.match[x]
                    undo.append((x, old, d, self.owner.get(d)))
                    self.match[x] = d
                    self.owner[d] = x
                    if x == u or old is None:
                        return True
                    d = old
        return False

    def _rollback(self, start: int, entered: int,
                  undo: list[tuple[int, DeviceId | None, DeviceId | None, int | None]],
                  added: list[ClaimKey]) -> None:
        for e in self._entered[entered:]:
            dev = self.inv.device(e)
            if dev is not None and dev.consumes:
                self._take(dev, -1)
        del self._entered[entered:]
        for x, old, d, old_owner in reversed(undo):
            self.match[x] = old
            if d is not None:
                if old_owner is None:
                    self.owner.pop(d, None)
                else:
                    self.owner[d] = old_owner
        for u in range(start, len(self.edges)):
            m = self.match[u]
            if m is not None and self.owner.get(m) == u:
                del self.owner[m]
        del self.edges[start:], self.unit_claim[start:], self.match[start:]
        for k in added:
            self.claim_units.pop(k, None)
            self.fixed.pop(k, None)
            self.chosen.pop(k, None)

    def planned(self) -> dict[PodKey, PlannedDevices]:
        """Each placed member's devices, claim by claim (a shared claim under each of its
        members; an allocated one as allocated)."""
        out: dict[PodKey, PlannedDevices] = {}
        for pod, (node, claims) in self.pods.items():
            devs: list[tuple[ClaimKey, DeviceId]] = []
            for c in claims:
                if c in self.fixed:
                    devs.extend((c, d) for d in self.fixed[c])
                else:
                    devs.extend((c, m) for u in self.claim_units.get(c, ())
                                if (m := self.match[u]) is not None)
            out[pod] = PlannedDevices(node, tuple(devs), choices=tuple(
                (c, r, j) for c in claims for r, j in self.chosen.get(c, ())))
        return out
