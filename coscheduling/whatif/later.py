"""For a unit that does not fit now: does it ever, what would make it fit, and the earliest
known moment it could start.

*Never* is proven on the cluster as if empty (:class:`~.views.EmptyView`): a unit the
planner cannot place there fits after no finish and no eviction. *Earliest* replays the
known events that give room back, in time order (an admitted gang's deadline: its
reservation is given back if it has not bound; a preemption in flight: its victims are gone
by the end of their grace, and what its preemptor does not take is free), and plans again
after each, on the live view with that room freed
(:class:`~coscheduling.preemption.freed.FreedView`). Nothing else is assumed to change, so
it is a bound, not a promise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..corestate import CoreState
from ..placement.planner import CapacityView, Member, Plan, plan_gang
from ..preemption.freed import FreedView
from ..reasons import NoFit
from ..records import NodeName
from ..resources import Resources, fits, format_resources, sub
from ..state.gang import GangPhase
from ..topology.domains import GPU, Level
from ..topology.eligibility import affinity_problem, eligible
from .answer import Earliest
from .capacity import EmptyView

__all__ = ["EVENTS_TRIED", "earliest_of", "hints", "known_events", "never"]

EVENTS_TRIED = 16
"""Known events replayed at most (each costs one plan)."""


def never(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
          required: Level | None) -> NoFit | None:
    """Why the members fit nowhere even on the empty cluster, or None when they would.

    First a cheap proof that they do fit there (first fit, largest first, within one domain
    of the required level or over the whole cluster); only without one is the planner asked,
    for its reason. Planning a 17 x 8-GPU gang on an empty 5,000-node cluster cost 80-200 ms
    of one slice; the proof costs a pass over the nodes it tries."""
    if _fits_empty(members, view, levels, required):
        return None
    got = plan_gang(members, EmptyView(view, levels), levels, required=required)
    return got if isinstance(got, NoFit) else None


def _fits_empty(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
                required: Level | None) -> bool:
    """The members fit on the nodes as if empty, first fit, largest first: a sufficient
    proof (a heuristic failing proves nothing; the planner then decides)."""
    if any(affinity_problem(m.pod.required_affinity) is not None for m in members):
        return False  # eligible nowhere: the planner says why, without a pass per node
    if any(m.pod.claims for m in members):
        return False  # DRA devices are not counted here: the planner decides
    nodes = view.nodes
    groups = (list(view.domains(levels.index(required)).values()) if required is not None
              else [sorted(nodes)])
    todo = sorted(members, key=lambda m: (-m.pod.requests.get(GPU, 0), m.key))
    memo: dict[tuple[int, NodeName], bool] = {}
    for ns in groups:
        left: dict[NodeName, Resources] = {}
        for m in todo:
            for n in ns:
                free = left.get(n)
                if free is None:
                    free = left[n] = dict(nodes[n].allocatable)
                ok = memo.get((id(m.pod), n))
                if ok is None:
                    ok = memo[(id(m.pod), n)] = eligible(m.pod, nodes[n],
                                                         affinity_checked=True)
                if ok and fits(m.pod.requests, free):
                    left[n] = sub(free, m.pod.requests)
                    break
            else:
                break
        else:
            return True
    return False


@dataclass(frozen=True, slots=True)
class _Going:
    """Room that comes back at an event: where, and how much."""

    node: NodeName
    requests: Resources


def known_events(st: CoreState, now: float) -> list[tuple[float, str, list[_Going]]]:
    """``(when, what, room back)``: room that comes back by a known time, soonest first
    (read from the state, on the event loop; :func:`earliest_of` replays them)."""
    out: list[tuple[float, str, list[_Going]]] = []
    for g in st.gangs.values():
        if g.phase is GangPhase.ADMITTED and g.plan and g.deadline is not None:
            room = [_Going(r.node, r.requests) for k in sorted(g.plan)
                    if (r := st.ledger.get(k)) is not None]
            out.append((g.deadline, f"gang {g.key} gives its reservation back if it has not "
                        "bound by its deadline", room))
    for rec in st.preemption.inflight.by_preemptor.values():
        going = [_Going(p.node_name, p.requests) for k in sorted(rec.waiting_for)
                 if (p := st.store.pods.get(k)) is not None and p.node_name is not None
                 and p.holds_capacity]
        if going:  # what the preemptor does not take is free once they are gone
            out.append((rec.deadline, f"the victims of {rec.preemptor}'s preemption are "
                        "gone (at the latest: their grace period ends)", going))
    out.sort(key=lambda t: (t[0], t[1]))
    return [t for t in out if t[0] >= now][:EVENTS_TRIED]


def earliest_of(events: Sequence[tuple[float, str, Sequence[_Going]]],
                members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
                required: Level | None, now: float) -> Earliest | None:
    """:func:`earliest` over events already read: pure, so it may run off the loop on a
    snapshot view."""
    back: list[_Going] = []
    for when, what, room in events:
        back += room
        got = plan_gang(members, FreedView(view, levels, back), levels, required=required)
        if isinstance(got, Plan):
            return Earliest(round(max(0.0, when - now), 1), what)
    return None


def hints(members: Sequence[Member], view: CapacityView, levels: Sequence[Level],
          required: Level | None, nofit: NoFit) -> list[str]:
    """What would make the members fit, in numbers a person can act on."""
    gpus = sum(m.pod.requests.get(GPU, 0) for m in members)
    out: list[str] = []
    if required is not None and gpus:
        ranked = view.domains_by_free_gpus(levels.index(required))
        best = max((f for f, _ in ranked), default=0)
        out.append(f"{gpus} GPUs free in one {required.name} (outside reservations): the "
                   f"{required.name} with the most has {max(0, best)}; {gpus - max(0, best)} "
                   "more there would do")
    elif gpus:
        out.append(f"{gpus} GPUs free outside reservations, on nodes its members may use: "
                   f"{nofit.free_units} of its {nofit.members} member(s) of "
                   f"{format_resources(nofit.shape)} fit now")
    else:
        out.append(f"room for {nofit.members} x {format_resources(nofit.shape)} outside "
                   f"reservations: {nofit.free_units} fit now")
    return out
