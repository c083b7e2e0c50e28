"""The bounded search for a move: which pods to move off which node so a waiting gang fits,
and where each moved pod goes. Pure: a capacity view, the gang's members and the movable
pods in; :class:`Moves` or one sentence (why not) out. No clock (``now`` is handed in), no
state.

The rules, in the order they are applied:

* **One node is freed.** Nodes are screened by arithmetic: a node is a candidate when its
  free room plus what its movable pods hold covers the largest member's GPUs (and the
  other resources it asks for). Each gets an estimate, the fewest pods (largest first)
  whose room covers that; only the :data:`NODES_TRIED` best estimates are tried for real.
* **Fewest pods, then fewest GPU-seconds lost.** On a node tried, pods are taken largest
  first until the gang plans (the planner itself, on a
  :class:`~coscheduling.preemption.freed.FreedView` with their room given back: one notion of
  "fits"); then each is reprieved, dearest first (the most GPU-seconds), while the gang still
  plans. Sets are compared by (pods moved, GPU-seconds lost): a pod's GPU-seconds are its GPUs
  times how long it has run, the work a restart loses.
* **Room elsewhere, now.** Every moved pod is placed, largest first, on a node other than
  the freed one, in room that is free now and that neither the gang's plan nor an earlier
  moved pod takes (best fit: the node left with the fewest free GPUs, so moves do not
  fragment another node). A set with a pod left without room is refused.
* **PDBs.** A set whose eviction would take a PodDisruptionBudget below zero (preemption's
  count, :func:`~coscheduling.preemption.units.pdb_violating`) is refused; when every set
  found is refused so, the sentence names the budget.
* **Bounded.** At most :data:`MAX_MOVED` pods per move, :data:`NODES_TRIED` nodes tried, and
  :data:`DEFRAG_BUDGET` units of work per call (counted as the victim search counts: a plan
  costs its nodes times its members, arithmetic :data:`BOOK_COST` per node or pod read). The
  first node tried always runs to its end, so the longest call is one node's trials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..placement.planner import CapacityView, Member, Plan, plan_gang
from ..preemption.freed import FreedView
from ..preemption.units import Candidate, pdb_violating
from ..preemption.victims import BOOK_COST, SEARCH_BUDGET
from ..records import NodeName, NodeRecord, PodKey, PodRecord
from ..resources import Resources, add, fits, sub
from ..topology.domains import GPU, Level
from ..topology.eligibility import eligible

__all__ = [
    "DEFRAG_BUDGET",
    "MAX_MOVED",
    "NODES_TRIED",
    "Movable",
    "Moves",
    "Search",
    "choose_moves",
    "gpu_seconds",
]

MAX_MOVED = 8
"""Pods one move may evict: a gang that needs more waits (each pod moved costs its work)."""

NODES_TRIED = 8
"""Candidate nodes tried for real per call, best estimates first."""

DEFRAG_BUDGET = SEARCH_BUDGET
"""Work one call may do beyond its first node, in the victim search's units."""


@dataclass(frozen=True, slots=True)
class Movable:
    """A bound pod that may move: where it is, what it holds, and the budgets selecting it."""

    pod: PodRecord
    budgets: tuple[tuple[str, int], ...] = ()
    """PodDisruptionBudgets selecting it, each with its ``disruptionsAllowed`` now."""

    @property
    def key(self) -> PodKey:
        return self.pod.key

    @property
    def node(self) -> NodeName:
        assert self.pod.node_name is not None
        return self.pod.node_name

    @property
    def requests(self) -> Resources:
        return self.pod.requests

    @property
    def gpus(self) -> int:
        return self.pod.requests.get(GPU, 0)

    def candidate(self) -> Candidate:
        """As preemption's budget count reads a victim."""
        return Candidate(self.key, self.node, self.requests, self.pod.priority, None,
                         self.pod.started, self.budgets, self.pod.grace_seconds)


def gpu_seconds(m: Movable, now: float) -> float:
    """The work a restart loses: the pod's GPUs times how long it has run."""
    started = m.pod.started
    return m.gpus * max(0.0, now - started) if started else 0.0


@dataclass(frozen=True, slots=True)
class Moves:
    """Move exactly these pods, each to its node; the gang fits as ``plan`` says."""

    node: NodeName
    """The node freed."""
    moved: tuple[tuple[Movable, NodeName], ...]
    """Each moved pod and the node whose room is reserved for its replacement."""
    plan: Plan
    gpu_seconds: float

    @property
    def cost(self) -> tuple[int, float]:
        return (len(self.moved), self.gpu_seconds)


@dataclass(slots=True)
class Search:
    """What one call did: work counted, nodes tried, why sets were refused."""

    work: int = 0
    tried: int = 0
    pdb: set[str] = field(default_factory=set)
    """Budgets that refused a set otherwise good."""
    no_room: int = 0
    """Sets refused because a moved pod had no room elsewhere."""


def choose_moves(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
                 movable: Sequence[Movable], now: float, *, required: Level | None = None,
                 budget: int = DEFRAG_BUDGET) -> Moves | str:
    """The cheapest move that lets ``members`` plan, or why there is none."""
    search = Search()
    if not members:
        return "no member to place"
    if not movable:
        return "no pod may move (none is owned by a controller that recreates it, at or " \
               "below the gang's priority, of Lockstep's schedulers and not opted out)"
    biggest = max((m.pod.requests for m in members), key=lambda r: (r.get(GPU, 0), len(r)))
    by_node: dict[NodeName, list[Movable]] = {}
    for m in movable:
        by_node.setdefault(m.node, []).append(m)
    search.work += len(movable) * BOOK_COST
    ranked: list[tuple[int, float, NodeName]] = []
    for node, pods in by_node.items():
        if node not in view.nodes:
            continue
        pods.sort(key=lambda p: (-p.gpus, gpu_seconds(p, now), p.key))
        room = view.free_for_gang(node)
        n = 0
        for p in pods:
            if fits(biggest, room) or n >= MAX_MOVED:
                break
            room, n = add(room, p.requests), n + 1
        if fits(biggest, room):
            ranked.append((n, sum(gpu_seconds(p, now) for p in pods[:n]), node))
    ranked.sort()
    best: Moves | None = None
    per_plan = max(1, len(view.nodes)) * len(members)
    for _, _, node in ranked[:NODES_TRIED]:
        if search.tried and search.work >= budget:
            break
        search.tried += 1
        got = _try_node(members, view, levels, required, by_node[node], node, now, search,
                        per_plan)
        if got is not None and (best is None or got.cost < best.cost):
            best = got
    if best is not None:
        return best
    return _why_none(search, len(ranked))


def _try_node(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
              required: Level | None, pods: list[Movable], node: NodeName, now: float,
              search: Search, per_plan: int) -> Moves | None:
    """The fewest of ``pods`` (all on ``node``) whose move lets the gang plan, with room for
    each elsewhere; None when there is none."""
    taken: list[Movable] = []
    plan: Plan | None = None
    for p in pods[:MAX_MOVED]:  # largest first: the fewest pods cover the deficit
        taken.append(p)
        search.work += per_plan
        got = plan_gang(members, FreedView(view, levels, taken), levels, required=required)
        if isinstance(got, Plan):
            plan = got
            break
    if plan is None:
        return None
    # Reprieve the dearest first while the gang still plans: the least work lost.
    for p in sorted(taken, key=lambda p: (-gpu_seconds(p, now), p.key)):
        if len(taken) == 1:
            break
        rest = [q for q in taken if q.key != p.key]
        search.work += per_plan
        got = plan_gang(members, FreedView(view, levels, rest), levels, required=required)
        if isinstance(got, Plan):
            taken, plan = rest, got
    if (violating := pdb_violating(m.candidate() for m in taken)):
        search.pdb.update(k for m in taken if m.key in violating for k, _ in m.budgets)
        return None
    where = _room_elsewhere(view, taken, plan, members, node, search)
    if where is None:
        search.no_room += 1
        return None
    return Moves(node, tuple((m, where[m.key]) for m in taken), plan,
                 sum(gpu_seconds(m, now) for m in taken))


def _room_elsewhere(view: CapacityView, taken: Sequence[Movable], plan: Plan,
                    members: Sequence[Member], freed: NodeName, search: Search
                    ) -> dict[PodKey, NodeName] | None:
    """A node for each moved pod, not the freed one, in room free now beside the gang's
    plan; None when some pod has none."""
    requests = {m.key: m.pod.requests for m in members}
    used: dict[NodeName, Resources] = {}
    for k, n in plan.assignments.items():
        used[n] = add(used.get(n, {}), requests.get(k, {}))
    nodes: Mapping[NodeName, NodeRecord] = view.nodes
    out: dict[PodKey, NodeName] = {}
    for m in sorted(taken, key=lambda m: (-m.gpus, m.key)):
        search.work += len(nodes) * BOOK_COST
        best: tuple[int, NodeName] | None = None
        for name, rec in nodes.items():
            if name == freed or name == m.node:
                continue
            room = sub(view.free_for_gang(name), used.get(name, {}))
            if not fits(m.requests, room) or not eligible(m.pod, rec):
                continue
            left = room.get(GPU, 0) - m.gpus
            if best is None or (left, name) < best:
                best = (left, name)
        if best is None:
            return None
        out[m.key] = best[1]
        used[best[1]] = add(used.get(best[1], {}), m.requests)
    return out


def _why_none(search: Search, screened: int) -> str:
    if search.pdb:
        names = ", ".join(sorted(search.pdb)[:3])
        return (f"moving pods would free a node, but PodDisruptionBudget {names} allows no "
                f"more disruptions")
    if search.no_room:
        return (f"moving pods would free a node, but the pods moved would have no room "
                f"elsewhere ({search.tried} node(s) tried)")
    if not screened:
        return (f"no node can be freed by moving at most {MAX_MOVED} movable pods")
    return f"no move of at most {MAX_MOVED} pods lets the gang fit ({search.tried} tried)"

