"""Whole-gang placement: find one node for every member, or say why there is none.

The planner reads a :class:`CapacityView` and returns a :class:`Plan` or a :class:`NoFit`; it
never changes the live state, so a failed plan needs no undo. It tries the tightest topology
level first (one node, one clique, one rack, ...), widening only when no single domain holds
the whole gang, and among fitting domains it picks the one left with the fewest free GPUs
(the least fragmentation). Inside a domain, members are placed largest first, each on the node
it fills most tightly. Members of one family (the same constraints, candidates and GPU
count, whatever else they ask) rank the nodes alike, so they share one ranking of the nodes,
kept in a heap (:class:`_Families`): a 1,000-member gang costs a pass over the nodes per
family, not per member, even when every member asks a different CPU or memory request.
Members that differ in their constraints are families of their own, each ranking only the
nodes it may use when its constraints name them (a pin) or pick them by label (in a gang of
several constraints); tolerations count only by the nodes' taints they tolerate. Others
(each its own ``NotIn`` expression, say) still cost a pass over the nodes each. Last, ranked
members that are interchangeable swap slots into rank order (``rankorder``): the same nodes
and counts.
"""

from __future__ import annotations

import functools
import heapq
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..devices.demand import ClaimNeed
from ..devices.inventory import PlannedDevices
from ..devices.room import DeviceRoom, Want, own_wants
from ..reasons import NoFit
from ..records import NodeName, NodeRecord, PodKey, PodRecord
from ..resources import PODS, Resources, fits, sub
from ..topology.domains import GPU, GpuLayout, Level, domain_of, explain_score, gpu_layout
from ..topology.eligibility import affinity_problem, eligible
from .member import Member
from .rankorder import order_by_rank

__all__ = ["CapacityView", "Member", "NoFit", "Plan", "plan_gang"]


class CapacityView(Protocol):
    """What the planner may read: nodes and the capacity a gang may use on each."""

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]: ...

    def free_for_gang(self, node: NodeName) -> Resources:
        """Free capacity on ``node`` outside every gang's reservation (a gang planned again
        has given its own slots back first)."""
        ...

    def gpu_pods_on(self, node: NodeName) -> Sequence[int]:
        """GPU counts of the pods holding GPUs on ``node`` (for island packing)."""
        ...

    def free_gpus(self, node: NodeName) -> int:
        """``free_for_gang(node)[GPU]`` without building the whole vector."""
        ...

    def domains(self, index: int) -> Mapping[tuple[str, ...], Sequence[NodeName]]:
        """Nodes grouped by their domain at ``levels[index]`` (nodes lacking it left out)."""
        ...

    def domains_by_free_gpus(self, index: int) -> Sequence[tuple[int, tuple[str, ...]]]:
        """``(free GPUs, domain)`` for each domain of ``domains(index)``, ascending, where a
        domain's free GPUs are ``free_gpus`` summed over its nodes."""
        ...

    def device_room(self) -> DeviceRoom | None:
        """The DRA devices a plan may give (``coscheduling.devices``); None: none known."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    assignments: dict[PodKey, NodeName]
    level: str | None
    """The topology level whose single domain holds the gang; None when spread."""
    domain: tuple[str, ...] | None = None
    devices: dict[PodKey, PlannedDevices] = field(default_factory=dict)
    """Each member's DRA devices, chosen for the whole gang at once (``devices.matching``)."""


def _devices_needed(needs: Sequence[tuple[ClaimNeed, ...] | None]) -> int:
    """The fewest devices the members' claims can be given: each claim once (shared ones
    too), none for an allocated one, a ``firstAvailable`` request its smallest subrequest."""
    seen: set[str] = set()
    total = 0
    for claims in needs:
        for c in claims or ():
            if c.key in seen or c.allocated is not None:
                continue
            seen.add(c.key)
            for n in c.needs:
                options = [o.request for o in n.alternatives] or [n.request]
                total += min(o.count if o.mode == "ExactCount" else 1 for o in options)
    return total


def _signature(pod: PodRecord, problem: str | None,
               taints: Sequence[Mapping[str, Any]] | None) -> tuple[object, ...]:
    """Members with equal signatures are eligible on the same nodes (eligibility never reads
    the requests: members asking different amounts share one memo). An affinity over a
    limit is never rendered (its ``repr`` alone would grow with the pod): such a member is
    eligible nowhere, whatever else it says. Given ``taints`` (every distinct blocking taint
    on the nodes, and the cordon's), tolerations count only by which of those they
    tolerate: members tolerating each their own taint that no node has are alike."""
    return (
        tuple(sorted(pod.node_selector.items())),
        repr(pod.required_affinity) if problem is None else ("over a limit",),
        pod.tolerations if taints is None else tuple(
            i for i, t in enumerate(taints) if _tolerates(pod, t)),
    )


CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
"""The taint a cordoned node stands for (:func:`~.eligibility.eligible` asks for it)."""


def _tolerates(pod: PodRecord, taint: Mapping[str, Any]) -> bool:
    """As :func:`~.eligibility.eligible` decides, taint by taint."""
    if taint is CORDON:
        return any(t.tolerates(CORDON) for t in pod.tolerations)
    return pod.tolerates_all((dict(taint),))


def _present_taints(view: CapacityView) -> list[Mapping[str, Any]]:
    """Every distinct blocking taint of the nodes, and :data:`CORDON` when a node is
    cordoned: one pass over the nodes. A taint whose fields are not strings is kept apart
    (it is tolerated only by wildcards, as ``records._tolerated`` reads it)."""
    seen: dict[object, Mapping[str, Any]] = {}
    cordoned = False
    for rec in view.nodes.values():
        cordoned = cordoned or rec.unschedulable
        for t in rec.blocking_taints():
            fields = (t.get("key"), t.get("value"), t.get("effect"))
            plain = all(v is None or isinstance(v, str) for v in fields)
            seen.setdefault(fields if plain else id(t), t)
    return [*seen.values(), *([CORDON] if cordoned else [])]


def _only_nodes(terms: Sequence[object],
                labelled: Callable[[str, str], frozenset[NodeName]] | None
                ) -> frozenset[NodeName] | None:
    """The only nodes required node-affinity ``terms`` can match, when each term narrows
    them: by ``metadata.name`` (Lockstep's pin, ``gating.pin_term``) or, given ``labelled``
    (the nodes carrying a label), by an ``In`` expression; None when some term may match any
    node. A superset of the nodes :func:`~.eligibility.eligible` passes, read as it reads the
    terms (ORed; one that is not a mapping, or whose lists are not lists, matches nothing).
    Its cost is bounded by the affinity limits, checked first."""
    if not terms:
        return None
    out: set[NodeName] = set()
    for t in terms:
        if not isinstance(t, Mapping):
            continue  # matches nothing
        exprs, fields = t.get("matchExpressions") or (), t.get("matchFields") or ()
        if not isinstance(exprs, list | tuple) or not isinstance(fields, list | tuple):
            continue  # matches nothing
        allowed: set[NodeName] | None = None
        for f in fields:
            if isinstance(f, Mapping) and f.get("key") == "metadata.name" \
                    and f.get("operator") == "In":
                allowed = _narrow(allowed, {NodeName(v) for v in _values(f)})
        if labelled is not None:
            for e in exprs:
                if isinstance(e, Mapping) and e.get("operator") == "In" \
                        and isinstance(key := e.get("key"), str):
                    allowed = _narrow(allowed, {n for v in _values(e)
                                                for n in labelled(key, v)})
        if allowed is None:
            return None
        out |= allowed
    return frozenset(out)


def _values(req: Mapping[str, object]) -> list[str]:
    """A requirement's values as :func:`~.eligibility.match_expression` reads them."""
    raw = req.get("values") or ()
    return [str(v) for v in raw] if isinstance(raw, list | tuple) else []


def _narrow(allowed: set[NodeName] | None, by: set[NodeName]) -> set[NodeName]:
    return by if allowed is None else allowed & by


def _size_key(m: Member) -> tuple[int, int, int, str]:
    r = m.pod.requests
    return (-r.get(GPU, 0), -r.get("cpu", 0), -r.get("memory", 0), m.key)


TIES_TRIED = 8
"""Equally tight domains tried before taking the best of them (bounds the work on clusters
with thousands of identical racks)."""


CONSTRAINTS_INDEXED = 3
"""Distinct constraints (selector, affinity, tolerations) in a gang from which the nodes are
indexed by label (one pass over every node's labels), so a family whose selector or affinity
picks out a few nodes by label ranks those, not every node."""


class _Context:
    """Everything one planning call reads more than once, computed at most once per node.

    Lazily: a 5,000-node cluster must not pay for eligibility or free capacity of nodes the
    plan never looks at (planning was O(levels x nodes) per admission)."""

    def __init__(self, todo: Sequence[Member], view: CapacityView,
                 levels: Sequence[Level]) -> None:
        self.view = view
        self.levels = levels
        self.todo = todo
        self.keys = [m.key for m in todo]
        self._free: dict[NodeName, Resources] = {}
        self._free_gpus: dict[NodeName, int] = {}
        self._layouts: dict[NodeName, GpuLayout] = {}
        self._sets: dict[tuple[int, int, bool], frozenset[NodeName]] = {}
        # Affinity limits are checked once per member, never per node (eligibility.py).
        self.problems: list[str | None] = [affinity_problem(m.pod.required_affinity)
                                           for m in todo]
        # DRA claims: resolved once per member; one that cannot be planned is eligible
        # nowhere, with the reason (a missing class, a selector that does not compile).
        self.room = view.device_room() if any(m.pod.claims for m in todo) else None
        self.needs: list[tuple[ClaimNeed, ...] | None] = []
        for i, m in enumerate(todo):
            got = self.room.demand(m.pod) if self.room is not None else None
            if isinstance(got, str):
                self.problems[i] = self.problems[i] or got
                got = None
            self.needs.append(got or None)
        self.devices_needed = _devices_needed(self.needs)
        self._free_devices: dict[NodeName, int | None] = {}
        # Each member's own devices by selector set: a domain with no node that could give
        # some member its own is not tried (alike members share one want).
        self._wants: list[Want] = []
        if self.room is not None:
            wants = own_wants(self.needs, self.room.budget)
            self._wants = sorted({w for w in wants if w}, key=repr)
        self._could: dict[tuple[int, NodeName], bool] = {}

        # Eligibility is the same for members with the same spec: one memo per spec.
        memo: dict[tuple[object, ...], dict[NodeName, bool]] = {}
        taints = _present_taints(view) if len(
            {m.pod.tolerations for m in todo}) >= CONSTRAINTS_INDEXED else None
        self._elig: list[dict[NodeName, bool]] = [
            memo.setdefault(_signature(m.pod, p, taints), {})
            for m, p in zip(todo, self.problems, strict=True)]
        # A member pinned by name (a restarted Lockstep re-admits a gang from its members'
        # pins) may use its pinned node alone: it is checked there, not on every node (1,000
        # pinned members were 5 million checks at 5,000 nodes, 16 s in one call). So may a
        # member whose selector or affinity labels pick out few nodes, when the gang's members
        # are constrained differently (each its own hostname: 1,000 of them were 4 to 18 s).
        self._by_label: dict[tuple[str, str], frozenset[NodeName]] | None = None
        indexed = len(memo) >= CONSTRAINTS_INDEXED
        self.only: list[frozenset[NodeName] | None] = [  # None: any node
            self._possible(m.pod, indexed) if p is None else None
            for m, p in zip(todo, self.problems, strict=True)]

    def _possible(self, pod: PodRecord, indexed: bool) -> frozenset[NodeName] | None:
        """The only nodes ``pod`` may be eligible on, when its affinity names them or (when
        ``indexed``) its selector's or affinity's labels pick them out; None: any node."""
        out = _only_nodes(pod.required_affinity, self.labelled if indexed else None)
        if indexed:
            for k, v in pod.node_selector.items():
                got = self.labelled(k, v)
                out = got if out is None else out & got
        return out

    def labelled(self, key: str, value: str) -> frozenset[NodeName]:
        """The nodes whose label ``key`` is ``value`` (an index built in one pass over every
        node's labels, at most once per planning call)."""
        if self._by_label is None:
            index: dict[tuple[str, str], set[NodeName]] = {}
            for n, rec in self.view.nodes.items():
                for kv in rec.labels.items():
                    index.setdefault(kv, set()).add(n)
            self._by_label = {kv: frozenset(ns) for kv, ns in index.items()}
        return self._by_label.get((key, value), frozenset())

    @property
    def over_budget(self) -> bool:
        """The call's device work budget is spent (``devices.budget``): no more placements
        are tried, and the answer says so."""
        return self.room is not None and self.room.budget.spent

    def free_devices(self, n: NodeName) -> int | None:
        """``DeviceRoom.free_devices``, once per node and call."""
        got = self._free_devices.get(n, -1)
        if got == -1:
            assert self.room is not None  # asked only for a gang with claims
            got = self._free_devices[n] = self.room.free_devices(n)
        return got

    def devices_could(self, nodes: Sequence[NodeName]) -> bool:
        """``nodes`` have as many free DRA devices as the gang asks for, counted without
        selectors (no CEL is evaluated for a domain that cannot hold the gang, as a 64-GPU
        gang cannot one 8-GPU node); then, for each member, some node of ``nodes`` has the
        free devices its own claims' selectors take. Necessary conditions: a domain failing
        them is not tried (a selector that matches nothing cost a trial on every node)."""
        if not self.devices_needed or self.room is None:
            return True
        have = 0
        for n in nodes:
            got = self.free_devices(n)
            if got is None:
                have = self.devices_needed
            else:
                have += got
            if have >= self.devices_needed:
                break
        else:
            return False
        return all(any(self._member_could(i, n) for n in nodes)
                   for i in range(len(self._wants)))

    def _member_could(self, i: int, n: NodeName) -> bool:
        """Node ``n`` has the free devices the ``i``-th distinct member want asks for
        (``DeviceRoom.could``: selectors evaluated once per device signature)."""
        got = self._could.get((i, n))
        if got is None:
            assert self.room is not None  # wants exist only with a room
            got = self._could[(i, n)] = self.room.could(self._wants[i], n)
        return got

    def ranked_by_devices(self, domains: Mapping[tuple[str, ...], Sequence[NodeName]]
                          ) -> list[tuple[int, tuple[str, ...]]] | None:
        """``(free DRA devices, domain)`` ascending, for a gang whose claims ask for
        devices; None when there is no such count (no claims, network-attached devices)."""
        if not self.devices_needed or self.room is None or self.room.inv.has_network():
            return None
        out = []
        for d, ns in domains.items():
            total = 0
            for n in ns:
                total += self.free_devices(n) or 0
            out.append((total, d))
        out.sort()
        return out

    def ok(self, i: int, n: NodeName) -> bool:
        """Member ``i`` may use node ``n`` (kube-scheduler's candidates, then predicates)."""
        m = self.todo[i]
        if self.problems[i] is not None or (m.candidates is not None
                                            and n not in m.candidates):
            return False
        memo = self._elig[i]
        v = memo.get(n)
        if v is None:
            v = memo[n] = eligible(m.pod, self.view.nodes[n], affinity_checked=True)
        return v

    @functools.cached_property
    def names(self) -> list[NodeName]:
        """Every node, sorted: only a spread placement or an explanation reads them all."""
        return sorted(self.view.nodes)

    def eligible_set(self, i: int) -> frozenset[NodeName]:
        """The nodes member ``i`` may use, computed once per spec and candidate set: the
        64 alike members of a gang that does not fit cost one pass over the nodes, not 64."""
        m = self.todo[i]
        key = (id(self._elig[i]), id(m.candidates) if m.candidates is not None else 0,
               self.problems[i] is not None)
        got = self._sets.get(key)
        if got is None:
            only = self.only[i]
            pool = self.names if only is None else only & self.view.nodes.keys()
            got = self._sets[key] = frozenset(n for n in pool if self.ok(i, n))
        return got

    def could_hold(self, nodes: Sequence[NodeName], gpus: int,
                   others: Sequence[tuple[str, int]]) -> bool:
        """``nodes`` have ``gpus`` free GPUs and ``others`` free in all: a necessary
        condition, checked on the store's cached free GPUs first (cheap per node) before a
        placement tries every member on every node."""
        have = 0
        for n in nodes:
            if have >= gpus:
                break
            have += max(0, self.free_gpus(n))  # an over-reserved node hides nobody's room
        return have >= gpus and self.holds(nodes, others)

    def free(self, n: NodeName) -> Resources:
        f = self._free.get(n)
        if f is None:
            f = self._free[n] = self.view.free_for_gang(n)
        return f

    def free_gpus(self, n: NodeName) -> int:
        g = self._free_gpus.get(n)
        if g is None:
            g = self._free_gpus[n] = self.view.free_gpus(n)
        return g

    def holds(self, nodes: Sequence[NodeName], need: Sequence[tuple[str, int]]) -> bool:
        """The domain's free capacity adds up to ``need`` for every resource (a necessary
        condition, checked before trying to place members node by node: without it a gang
        short of CPU was tried on every single node of a 5,000-node cluster)."""
        for k, v in need:
            have = 0
            for n in nodes:
                have += self.free(n).get(k, 0)
                if have >= v:
                    break
            else:
                return False
        return True

    def layout(self, n: NodeName) -> GpuLayout:
        lay = self._layouts.get(n)
        if lay is None:
            lay = self._layouts[n] = gpu_layout(self.view.nodes[n])
        return lay

    def domain(self, index: int, n: NodeName) -> tuple[str, ...] | None:
        return domain_of(self.levels, index, self.view.nodes[n])


_Placed = tuple[dict[PodKey, NodeName], dict[PodKey, PlannedDevices]]


def _place_any(ctx: _Context, nodes: Sequence[NodeName]) -> _Placed | None:
    """:func:`_place`, then, for a gang with ``firstAvailable`` requests whose preferred
    subrequests leave later members nothing, again from each less preferred one (at most
    ``MAX_ALTERNATIVES`` tries: #138765's gang fits as two halves, not one whole GPU)."""
    widest = max((len(n.alternatives) for needs in ctx.needs if needs
                  for c in needs for n in c.needs), default=0)
    for floor in range(max(widest, 1)):
        got = _place(ctx, nodes, floor)
        if got is not None or ctx.over_budget:
            return got
    return None


def _rank(ctx: _Context, gpus: int, n: NodeName, f: Resources,
          extra: Sequence[int]) -> tuple[float, ...]:
    """How well a member asking ``gpus`` GPUs fits node ``n`` with ``f`` free (lower is
    better): GPU members the tightest node, then the best-scored; CPU-only members (launchers)
    nodes without GPUs, then the tightest in CPU. The order of the nodes depends on the GPUs
    asked alone: a CPU-only member's own CPU request would shift every node's rank alike (the
    rank was free minus asked), so it is left out, and members asking different CPU or memory
    share one order (:class:`_Families`)."""
    view = ctx.view
    if gpus:
        used = [*view.gpu_pods_on(n), *extra]
        score = explain_score(view.nodes[n], gpus, f.get(GPU, 0), used, ctx.layout(n)).total
        return (f.get(GPU, 0) - gpus, -score)
    return (view.nodes[n].allocatable.get(GPU, 0), f.get("cpu", 0))


def _floor(requests: Sequence[Resources]) -> Resources:
    """The least of each resource that every one of ``requests`` asks for: a node short of
    it holds none of them (and never will: free capacity only shrinks while planning)."""
    out = {k: v for k, v in requests[0].items() if v > 0}
    for r in requests[1:]:
        out = {k: min(v, r.get(k, 0)) for k, v in out.items() if r.get(k, 0) > 0}
    return out


_Entry = tuple[tuple[float, ...], NodeName, int]


class _Families:
    """Members of one family (same constraints and candidates, same GPUs asked) rank the
    nodes in the same order (:func:`_rank`): each family ranks the nodes once, in a heap, and
    a member takes the first node of the heap that holds all it asks. Members alike in
    everything take the heap's top; members that differ only in CPU or memory (a gang of
    all-different members) walk past the nodes too short for them, which the members after
    them may still use. Placing a member changes one node, so only that node is ranked again
    (for each family): the work is families x nodes plus members x families, not members x
    nodes (a 1,000-member gang spread over 5,000 nodes was 5 million rankings, ~20 s on the
    event loop when alike, ~60 s when each member asked a different CPU request)."""

    def __init__(self, ctx: _Context, nodes: Sequence[NodeName]) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self.free: dict[NodeName, Resources] = {}
        self.extra: dict[NodeName, list[int]] = {}
        self.placed: dict[NodeName, int] = {}
        """Members placed on each node so far: a heap entry of an older count is stale."""
        self.heaps: dict[tuple[int, int, int], tuple[int, Resources, list[_Entry]]] = {}
        """Each family's first member, the floor of its members' requests, and its heap."""
        self._covers: dict[int, bool] = {}
        self._open: set[tuple[int, int, int]] = set()
        """Families with a heap whose members may use any node."""
        self._on: dict[NodeName, set[tuple[int, int, int]]] = {}
        """Families with a heap whose members may use some nodes only (pinned by name, or a
        selector few nodes match: ``_Context.only``), by those nodes: placing a member on a
        node ranks it again for these and the open ones alone."""
        self._node_set: frozenset[NodeName] | None = None
        self.family_of = [self._family(i) for i in range(len(ctx.todo))]
        self.left = Counter(self.family_of)
        """Members of each family still to place: a family with none left is ranked no more
        (a gang of all-different constraints costs what the scan did, not members x
        families)."""
        self._floors = self._suffix_floors()

    def _family(self, i: int) -> tuple[int, int, int]:
        """Member ``i``'s family: its eligibility memo (one per constraints), its candidates,
        which count only when they leave some of ``nodes`` out, and its GPUs."""
        gpus = self.ctx.todo[i].pod.requests.get(GPU, 0)
        cands = self.ctx.todo[i].candidates
        if cands is None:
            return (id(self.ctx._elig[i]), 0, gpus)
        covers = self._covers.get(id(cands))
        if covers is None:
            covers = self._covers[id(cands)] = cands.issuperset(self.nodes)
        return (id(self.ctx._elig[i]), 0 if covers else id(cands), gpus)

    def _suffix_floors(self) -> list[Resources]:
        """For each member, the floor (:func:`_floor`) of its family's members from it on:
        the members placed in order, a node short of it serves none of those left."""
        out: list[Resources] = [{}] * len(self.family_of)
        last: dict[tuple[int, int, int], Resources] = {}
        for i in range(len(self.family_of) - 1, -1, -1):
            fam = self.family_of[i]
            req = self.ctx.todo[i].pod.requests
            got = last.get(fam)
            out[i] = last[fam] = _floor([req] if got is None else [req, got])
        return out

    def _entry(self, i: int, n: NodeName, floor: Resources) -> _Entry | None:
        """Node ``n``'s heap entry for member ``i``'s family, None when it holds none of the
        family's members left (it does not hold ``floor``)."""
        if not self.ctx.ok(i, n):
            return None
        f = self.free.get(n)
        if f is None:
            f = self.free[n] = self.ctx.free(n)
        if not fits(floor, f):
            return None
        gpus = self.family_of[i][2]
        return (_rank(self.ctx, gpus, n, f, self.extra.get(n, ())), n, self.placed.get(n, 0))

    def best(self, i: int) -> NodeName | None:
        """The node member ``i`` fills best, as a scan of every node would find it: the
        first of its family's heap that holds its requests. Nodes too short for it but not
        for a member after it are put back; those short for every member left are dropped."""
        fam = self.family_of[i]
        floor = self._floors[i]
        got = self.heaps.get(fam)
        if got is None:
            only = self.ctx.only[i]
            pool: Iterable[NodeName] = self.nodes
            if only is None:
                self._open.add(fam)
            else:
                if self._node_set is None:
                    self._node_set = frozenset(self.nodes)
                pool = only & self._node_set
                for n in only:
                    self._on.setdefault(n, set()).add(fam)
            heap = [e for n in pool if (e := self._entry(i, n, floor)) is not None]
            heapq.heapify(heap)
            got = self.heaps[fam] = (i, floor, heap)
        heap = got[2]
        req = self.ctx.todo[i].pod.requests
        skipped: list[_Entry] = []
        found: NodeName | None = None
        while heap:
            e = heapq.heappop(heap)
            n = e[1]
            if e[2] != self.placed.get(n, 0):
                continue  # ranked before a member was placed there
            f = self.free[n]
            if fits(req, f):
                found = n
                skipped.append(e)
                break
            if fits(floor, f):
                skipped.append(e)  # too short for this member, not for all after it
        for e in skipped:
            heapq.heappush(heap, e)
        return found

    def take(self, i: int, n: NodeName) -> None:
        """Member ``i`` is placed on ``n``: ``n`` is ranked again for every family. Free
        capacity only shrinks, so a node that held no member of a family never will."""
        req = self.ctx.todo[i].pod.requests
        self.free[n] = sub(self.free[n], req)
        if req.get(GPU, 0):
            self.extra.setdefault(n, []).append(req[GPU])
        self.placed[n] = self.placed.get(n, 0) + 1
        fam = self.family_of[i]
        self.left[fam] -= 1
        if not self.left[fam] and self.heaps.pop(fam, None) is not None:
            self._open.discard(fam)
            for n_only in self.ctx.only[i] or ():
                self._on[n_only].discard(fam)
        for other in (*self._open, *self._on.get(n, ())):
            first, floor, heap = self.heaps[other]
            e = self._entry(first, n, floor)
            if e is not None:
                heapq.heappush(heap, e)


def _place(ctx: _Context, nodes: Sequence[NodeName], floor: int = 0) -> _Placed | None:
    """Each member, largest first, on the node it fills most tightly. A member without DRA
    claims takes its family's best node (:class:`_Families`); one with claims the best node
    whose devices, with every earlier member's, can still be matched (earlier members may
    move to other devices: matching.py), so it ranks every node it fits."""
    families = _Families(ctx, nodes)
    out: dict[PodKey, NodeName] = {}
    trial = ctx.room.trial() if ctx.room is not None else None
    for i, m in enumerate(ctx.todo):
        needs = ctx.needs[i]
        n: NodeName | None = None
        if needs is None:
            n = families.best(i)
        elif trial is not None:
            if ctx.over_budget:
                return None
            ranked = _ranked(ctx, i, nodes, families.free, families.extra)
            n = next((c for _, c in ranked if trial.add(m.key, needs, c, floor)), None)
        if n is None:
            return None
        families.take(i, n)
        out[ctx.keys[i]] = n
    return out, (trial.planned() if trial is not None else {})


def _ranked(ctx: _Context, i: int, nodes: Sequence[NodeName], free: dict[NodeName, Resources],
            extra_gpu: dict[NodeName, list[int]]) -> list[tuple[tuple[float, ...], NodeName]]:
    """Every node member ``i`` fits, best first (a member with DRA claims tries them in
    order until its devices can be matched)."""
    req = ctx.todo[i].pod.requests
    out: list[tuple[tuple[float, ...], NodeName]] = []
    for n in nodes:
        if not ctx.ok(i, n):
            continue
        f = free.get(n)
        if f is None:
            f = free[n] = ctx.free(n)
        if fits(req, f):
            out.append((_rank(ctx, req.get(GPU, 0), n, f, extra_gpu.get(n, ())), n))
    out.sort()
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
    if not todo:
        return Plan(dict(fixed), None)
    ctx = _Context(todo, view, levels)
    if any(problem is not None for problem in ctx.problems):
        # A member over an affinity limit is eligible nowhere, so no domain holds the gang:
        # the answer is the explanation, without one placement tried per domain.
        return _explain(ctx, required)
    stop = levels.index(required) if required is not None else 0
    fixed_nodes = {fixed[k] for k in fixed if fixed[k] in view.nodes}
    total_gpu = sum(m.pod.requests.get(GPU, 0) for m in todo)
    total: Resources = {}
    for m in todo:
        for k, v in m.pod.requests.items():
            total[k] = total.get(k, 0) + v
    others = [(k, v) for k, v in total.items() if k != GPU and v > 0]

    for index in range(len(levels) - 1, stop - 1, -1):
        domains = view.domains(index)
        if fixed_nodes:
            # Parked members already sit on their nodes: only their domain can hold the rest.
            doms = {ctx.domain(index, n) for n in fixed_nodes}
            domains = {d: ns for d, ns in domains.items() if d in doms}
        # Tightest domains first: once one fits, only domains as tight can still beat it.
        # The store keeps the domains ranked by free GPUs; the other resources are summed
        # only for the domains tried.
        ranked, need = view.domains_by_free_gpus(index), total_gpu
        if not total_gpu and (by_devices := ctx.ranked_by_devices(domains)) is not None:
            # DRA GPUs are devices, not nvidia.com/gpu: the same tightness, counted in them.
            ranked, need = by_devices, ctx.devices_needed
        best: tuple[tuple[int, int, tuple[str, ...]], _Placed] | None = None
        ties = 0
        for at in range(bisect_left(ranked, (need,)), len(ranked)):
            free_gpu, d = ranked[at]
            ns = domains.get(d)
            if ns is None:  # not the parked members' domain
                continue
            if best is not None:
                # A tie can only win on fewer nodes, and none uses fewer than one.
                if free_gpu - need > best[0][0] or best[0][1] == 1:
                    break
                ties += 1
                if ties > TIES_TRIED:
                    break
            if not ctx.holds(ns, others) or not ctx.devices_could(ns):
                continue
            placed = _place_any(ctx, ns)
            if placed is None:
                if ctx.over_budget:
                    break  # the device work budget is spent: no further domain is tried
                continue
            rank = (free_gpu - need, len(set(placed[0].values())), d)
            if best is None or rank < best[0]:
                best = (rank, placed)
        if best is not None:
            return Plan({**fixed, **_in_rank_order(ctx, best[1][0])}, levels[index].name,
                        best[0][2], best[1][1])
        if ctx.over_budget:
            return _explain(ctx, required)

    if required is None and ctx.could_hold(ctx.names, total_gpu, others) \
            and ctx.devices_could(ctx.names):
        # Spread over the whole cluster: tried only when its free capacity adds up (without
        # the check, a 64-member gang that did not fit cost 64 x every node, ~1 s at 5,000).
        placed = _place_any(ctx, ctx.names)
        if placed is not None:
            return Plan({**fixed, **_in_rank_order(ctx, placed[0])}, None, None, placed[1])
    return _explain(ctx, required)


def _in_rank_order(ctx: _Context, placed: dict[PodKey, NodeName]) -> dict[PodKey, NodeName]:
    """The members' slots as placed, interchangeable ranked members permuted into rank
    order (``rankorder``): the same nodes and counts, so the plan fits as it did."""
    return order_by_rank(placed, ctx.todo, ctx.view.nodes, ctx.levels) or placed


def _units(shape: Resources, free: Resources, cap: int) -> int:
    count = 0
    while count < cap and fits(shape, free):
        free = sub(free, shape)
        count += 1
    return count


def _explain(ctx: _Context, required: Level | None) -> NoFit:
    todo = ctx.todo
    shape = dict(todo[0].pod.requests)
    shape.pop(PODS, None)
    cap = len(todo) + 1
    sets = [ctx.eligible_set(i) for i in range(len(todo))]
    # Alike members share one set: each distinct set once (1,000 members' sets of 5,000
    # nodes were 5 million elements walked, 75 ms per turned-away filter call).
    eligible_nodes = set().union(*{id(s): s for s in sets}.values())
    units = 0
    gpus = shape.get(GPU, 0)
    for n in eligible_nodes:
        if gpus and ctx.free_gpus(n) < gpus:
            continue  # the store's cached count says no unit fits: no vector built
        units += _units(shape, ctx.free(n), cap - units)
        if units >= cap:
            break
    notes = [f"{m.key}: {problem}" if problem is not None else
             f"{m.key} matches no node (selector, affinity or taints)"
             for m, ok, problem in zip(todo, sets, ctx.problems, strict=True) if not ok]
    if ctx.room is not None and ctx.room.budget.spent:
        notes.insert(0, f"DRA device planning stopped at its work budget "
                        f"({ctx.room.budget.describe()}); planned again on the next try")
    if ctx.devices_needed and ctx.room is not None and not ctx.room.inv.has_network():
        free = sum(ctx.free_devices(n) or 0 for n in eligible_nodes)
        notes.insert(0, f"DRA claims ask for {ctx.devices_needed} devices; {free} free on the "
                     f"eligible nodes (any class), fewer matching the selectors")
    widest = 0
    if required is not None:
        for ns in ctx.view.domains(ctx.levels.index(required)).values():
            count = 0
            for n in ns:
                if gpus and ctx.free_gpus(n) < gpus:
                    continue
                count += _units(shape, ctx.free(n), len(todo) - count)
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
