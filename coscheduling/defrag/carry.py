"""Defragmentation carried out in the core: a waiting gang that fits the free capacity overall,
but not where it needs, has one node freed by moving pods off it.

Asked by admission (``gang.admission``) where preemption is tried, when preemption found
nothing (no lower-priority victims, or it is off). The move is carried out through the
preemption wing's own book, so everything preemption proves about held room holds for it:

* the gang is admitted at once into its plan on the freed node; the ledger holds that room
  while the moved pods terminate (they still count as usage: counted twice, never lent), and
  the gang's members bind only once they are gone (``preemption.carry.victims_gone`` wakes
  them; a move whose pods outlive their grace is given back as a preemption is);
* every moved pod has room reserved for its replacement now, on another node, as a
  nomination under a key no pod can have (``namespace/name~moved``); the replacement (same
  controller, new name) takes it over in the filter (:func:`steer`), which answers exactly
  that node;
* the evictions go out through the Eviction API (``Eviction.move``), so PodDisruptionBudgets
  are honoured by the API server too, not only by the search (``defrag.search``).

Limits: a gang waits ``--defrag-after`` seconds first; at most ``--defrag-rate`` pods move per
minute in the cluster; a pod moved once (its replacement) is never moved again while
remembered (``DefragState.moved``), so no chain of moves returns.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..actions import Eviction, NoticeKind
from ..corestate import CoreState
from ..placement.member import Member
from ..placement.planner import Plan
from ..podgroup import gang_of
from ..preemption.budgets import Budget, selecting
from ..preemption.inflight import InFlight, PreemptorId
from ..preemption.units import Cost, Victims, VictimUnit
from ..records import GangKey, NodeName, PodKey, PodRecord
from ..resources import Resources, add, fits
from ..state.gang import Gang, GangPhase
from ..state.nominations import BIND_WITHIN, Nomination
from ..topology.domains import Level
from .movable import why_not_movable
from .search import Movable, Moves, choose_moves
from .state import MoveSlot

__all__ = ["due", "hold_key", "movable_pods", "next_deadline", "steer", "try_defrag"]


def hold_key(pod: PodRecord) -> PodKey:
    """The key room for ``pod``'s replacement is nominated under: ``~`` is in no pod name."""
    return PodKey(f"{pod.key}~moved")


def try_defrag(st: CoreState, g: Gang, members: Sequence[PodRecord], required: Level | None,
               now: float, preemption: str | None) -> Plan | str | None:
    """Move pods so ``members`` fit, and return the plan to admit them into; else
    ``preemption``'s sentence (why preemption could not help) with why no move helps
    either, or None when defragmentation is off or has nothing to add."""
    if not st.settings.defrag or not members:
        return preemption
    why = _try(st, g, members, required, now)
    if why is None or isinstance(why, Plan):
        return why if why is not None else preemption
    return f"{preemption}; {why}" if preemption else why


def _try(st: CoreState, g: Gang, members: Sequence[PodRecord], required: Level | None,
         now: float) -> Plan | str | None:
    want: Resources = {}
    for p in members:
        want = add(want, p.requests)
    free: Resources = {}
    for n in st.store.nodes:
        free = add(free, {k: max(0, v) for k, v in st.capacity.free_for_gang(n).items()})
    if not fits(want, free):
        st.defrag.waiting_since.pop(g.key, None)
        return None  # room is short overall: only preemption (or waiting) helps
    epoch = st.store.epoch
    tried = st.defrag.tried.get(g.key)
    if tried is not None and tried[0] == epoch:
        return tried[1]
    priority = st.gang_priority(g)
    movable = movable_pods(st, priority)
    if not movable:
        return None  # nothing could move: nothing to add to preemption's word
    since = st.defrag.waiting_since.setdefault(g.key, now)
    if now - since < st.settings.defrag_after:
        return (f"the free capacity would hold it if pods moved; defragmentation waits "
                f"{st.settings.defrag_after - (now - since):.0f} s more (--defrag-after)")
    left = st.settings.defrag_rate - st.defrag.moved_in_last_minute(now)
    if left <= 0:
        return (f"defragmentation moved {st.settings.defrag_rate} pod(s) in the last minute "
                f"(--defrag-rate); it moves more for this gang after that")
    found = choose_moves([Member(p) for p in members], st.capacity, st.settings.levels,
                         movable, now, required=required)
    if isinstance(found, str):
        st.defrag.tried[g.key] = (epoch, found)
        return found
    if len(found.moved) > left:
        return (f"a move of {len(found.moved)} pod(s) would free {found.node}; the rate "
                f"limit (--defrag-rate {st.settings.defrag_rate}/min) leaves {left} now")
    return _carry(st, g, members, found, priority, now)


def movable_pods(st: CoreState, priority: int) -> list[Movable]:
    """Every bound plain pod that may move for a gang of ``priority``: one pass over the
    pods, the budgets selecting each read once."""
    terminating = st.preemption.inflight.terminating()
    budgets: dict[str, list[Budget]] = {}
    for b in st.preemption.budgets.values():
        budgets.setdefault(b.namespace, []).append(b)
    names = st.settings.scheduler_names
    out = []
    for k, p in st.store.pods.items():
        if not p.holds_capacity or k in terminating or k in st.defrag.moved \
                or gang_of(st.membership.get(k)) is not None \
                or why_not_movable(p, priority, names) is not None:
            continue
        out.append(Movable(p, selecting(p, budgets.get(p.namespace, ()))))
    return out


def _carry(st: CoreState, g: Gang, members: Sequence[PodRecord], found: Moves,
           priority: int, now: float) -> Plan | None:
    evict = tuple(sorted((m.candidate() for m, _ in found.moved), key=lambda c: c.key))
    freed: dict[NodeName, Resources] = {}
    for c in evict:
        freed[c.node] = add(freed.get(c.node, {}), c.requests)
    units = tuple(VictimUnit(str(c.key), None, (c,)) for c in evict)
    victims = Victims((), tuple(c.key for c in evict), evict, found.plan, freed,
                      Cost.of(units), units=units)
    started = st.preemption.inflight.start(
        preemptor=PreemptorId.of_gang(g.key), gang=g.key, priority=priority,
        victims=victims, requests={p.key: p.requests for p in members}, now=now, moves=True)
    if not isinstance(started, InFlight):
        return None
    until = started.deadline + BIND_WITHIN
    for m, to in found.moved:
        hold = hold_key(m.pod)
        owner = m.pod.owner
        assert owner is not None  # movable: a controller owns it
        st.preemption.nominations.add(Nomination(hold, to, dict(m.requests), m.pod.priority,
                                                 until))
        st.defrag.slots[hold] = _slot(hold, owner.uid, m, to, g.key)
        st.outbox.evictions.append(Eviction(m.key, m.pod.uid, m.node, str(g.key), priority,
                                            None, move=True))
        st.notice(NoticeKind.MOVED, g.key, (m.key,),
                  detail=f"off {m.node} to make room for gang {g.key}; its replacement "
                         f"has room reserved on {to}")
    st.defrag.recent.append((now, len(found.moved)))
    st.defrag.moves += len(found.moved)
    st.defrag.tried.pop(g.key, None)
    st.defrag.waiting_since.pop(g.key, None)
    st.defrag.woken.discard(g.key)
    st.notice(NoticeKind.MOVING, g.key, (members[0].key,),
              detail=f"moving {len(found.moved)} pod(s) off {found.node} "
                     f"({found.gpu_seconds:.0f} GPU-seconds of work lost): "
                     + ", ".join(f"{m.key} to {to}" for m, to in found.moved[:4]))
    return found.plan


def _slot(hold: PodKey, owner_uid: str, m: Movable, to: NodeName, gang: GangKey
          ) -> MoveSlot:
    return MoveSlot(hold, owner_uid, m.pod.namespace, to, dict(m.requests), gang, m.key)


def steer(st: CoreState, pod: PodRecord) -> NodeName | None:
    """The node reserved for ``pod`` when it replaces a moved pod (same controller, fits the
    room): it takes the reservation over as its own nomination (so the room is its own in
    the filter, and ends when it binds), and is remembered as moved. None otherwise."""
    if pod.owner is None or pod.node_name is not None:
        return None
    if pod.key in st.defrag.moved:
        own = st.preemption.nominations.get(pod.key)
        return own.node if own is not None else None
    if not st.defrag.slots:
        return None
    slot = next((s for s in st.defrag.slots.values()
                 if s.owner_uid == pod.owner.uid and s.namespace == pod.namespace
                 and fits(pod.requests, s.requests)), None)
    if slot is None:
        return None
    del st.defrag.slots[slot.hold]
    held = st.preemption.nominations.remove(slot.hold)
    if held is None:
        return None  # the reservation lapsed
    st.preemption.nominations.add(Nomination(pod.key, slot.node, dict(pod.requests),
                                             pod.priority, held.until))
    st.defrag.remember_moved(pod.key, slot.gang)
    return slot.node


def next_deadline(st: CoreState) -> float | None:
    """When the next waiting gang's ``--defrag-after`` ends (it is woken then)."""
    after = st.settings.defrag_after
    return min((t + after for k, t in st.defrag.waiting_since.items()
                if k not in st.defrag.woken), default=None)


def due(st: CoreState, now: float) -> None:
    """The deadline timer: gangs whose wait before a move ended are tried again (woken, and
    put into the next sweep); entries of gangs no longer waiting, and reservations whose
    nomination lapsed, are dropped."""
    d = st.defrag
    for key in list(d.waiting_since):
        g = st.gangs.get(key)
        if g is None or g.phase is not GangPhase.WAITING:
            del d.waiting_since[key]
            d.woken.discard(key)
            d.tried.pop(key, None)
        elif key not in d.woken and d.waiting_since[key] + st.settings.defrag_after <= now:
            d.woken.add(key)
            st.creation.gated.touched.add(key)
            st.outbox.requeue.update(g.wake())
    for hold in [h for h in d.slots if st.preemption.nominations.get(h) is None]:
        del d.slots[hold]
    for key in [k for k in d.tried if k not in st.gangs]:
        del d.tried[key]

