"""The coscheduler facade: cluster events in, typed verb decisions out.

It owns one :class:`~coscheduling.corestate.CoreState` and routes each cluster event and verb to
the module that holds its rules:

* ``events.ingest``: cluster events, one table entry per resource kind;
* ``gang.membership``: which gang a pod is in, and quorum;
* ``gang.admission``: plan a gang whole and reserve it, keep its plan whole, or give it all
  back;
* ``creation.gated``: gangs behind Lockstep's gate, admitted without a filter call, and gate
  lifts; ``creation.placer``: placement at creation, the webhook's question;
* ``verbs.filtering`` and ``verbs.binding``: the verbs; ``verbs.deadlines``: time.

Its methods are commands: events and verbs in, decisions out. What may be read without
changing anything is on :attr:`Coscheduler.queries` (``coscheduling.queries``).

Everything is synchronous and takes ``now``: each verb decides and reserves in one block with
no ``await`` in between, which is what makes admission atomic under asyncio (the guarantee
HiveD gets from one lock). Deadlock freedom comes from admission: a gang is admitted only
when all of it fits in capacity no other gang holds, and an admitted gang always holds a
whole plan.

Things the app must act on outside a verb's answer are queued and taken in one
:meth:`Coscheduler.drain` (a :class:`Drained`): Events, requeue nudges, parked calls to
answer, gate lifts, evictions, DRA allocations to clear and the held reviews' answers.
:meth:`Coscheduler.queued` is the cheap check the app makes after every event and verb.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .actions import (
    Answer,
    BindDecision,
    BindOutcome,
    Eviction,
    FilterDecision,
    GangExpired,
    Lift,
    Notice,
    Placement,
    Unparked,
)
from .corestate import CoreState, Settings
from .creation import gated, placer
from .devices.narrow import narrow
from .events import ingest
from .events.ingest import Kind
from .podgroup import gang_of
from .queries import Queries
from .reasons import PartiallyBound
from .records import NodeName, PodKey, PodRecord
from .topology.domains import GPU
from .verbs import binding, deadlines, filtering
from .whatif import DryRun, expand

__all__ = ["Coscheduler", "Drained"]


@dataclass(frozen=True, slots=True)
class Drained:
    """Everything the core queued for the app since the last :meth:`Coscheduler.drain`."""

    unparked: list[Unparked]
    """Parked bind calls let go of by cluster events: answer each with its reason."""
    notices: list[Notice]
    """Events a person should see."""
    requeue: list[PodKey]
    """Pods kube-scheduler should look at again (no API event would wake them)."""
    lift: list[Lift]
    """Gated pods whose gate comes off now (decided at the drain, from the current plan)."""
    evictions: list[Eviction]
    """Victims of preemptions decided since the last drain: the app evicts them."""
    deallocate: list[tuple[str, str, str]]
    """DRA claims whose allocation nobody will use (``devices.stale``): ``(namespace/name,
    uid, resourceVersion)``; the app clears each allocation under those preconditions."""
    answers: dict[PodKey, Answer]
    """Answers for the reviews the webhook held for their gang's quorum."""


class Coscheduler:
    """Cluster state plus the gang rules; one instance per Lockstep process.

    Its methods are commands; reads go through :attr:`queries`."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._state = st = CoreState(settings or Settings())
        """Private: ``app`` reads the core through :attr:`queries` (tests reach it through
        ``tests/internals.state_of``, in one place)."""
        self.settings = st.settings
        self.queries = Queries(st)
        """The read side: nothing on it changes the core."""
        self._capacity, self._waiting, self._outbox = st.capacity, st.waiting, st.outbox

    # ------------------------------------------------------------------ cluster events

    def upsert(self, kind: Kind[Any, Any], record: Any) -> None:
        if kind is ingest.PODS:
            placer.landed(self._state, record.key)
        kind.upsert(self._state, record)

    def delete(self, kind: Kind[Any, Any], key: Any) -> None:
        kind.delete(self._state, key)

    def replace(self, kind: Kind[Any, Any], records: Iterable[Any]) -> None:
        """After a relist: exactly ``records`` of ``kind``, deletions included."""
        if kind is ingest.PODS and self._state.creation.holds:
            records = list(records)
            for r in records:
                placer.landed(self._state, r.key)
        kind.replace(self._state, records)

    def unserved(self, kind: Kind[Any, Any]) -> None:
        """``kind``'s CRD is not installed: an empty set, unless the kind says more."""
        if kind.unserved is not None:
            kind.unserved(self._state)
        else:
            kind.replace(self._state, [])

    def upsert_pod(self, pod: PodRecord) -> None:
        """A pod as the watch delivers it."""
        self.upsert(ingest.PODS, pod)

    def pods_listed(self, revision: int) -> None:
        """The pod list or a watch bookmark reached ``revision``."""
        ingest.pods_listed(self._state, revision)

    def delete_pod(self, key: PodKey, uid: str = "") -> None:
        """The pod is gone; a ``uid`` that is not the cached pod's is a stale event, ignored."""
        ingest.delete_pod(self._state, key, uid)

    # ------------------------------------------------------------------ the verbs

    def filter(self, pod: PodRecord, candidates: Sequence[NodeName], now: float
               ) -> FilterDecision:
        """Which candidates ``pod`` may use; for gang pods exactly the planned node."""
        return filtering.filter_pod(self._state, pod, candidates, now)

    def prioritize(self, pod: PodRecord, nodes: Sequence[NodeName]) -> list[int]:
        """A 0..10 score for each of ``nodes``, in the same order."""
        own = pod.key if gang_of(self._state.membership.get(pod.key)) is not None else None
        return self._capacity.scores(nodes, pod.requests.get(GPU, 0), own)

    def bind(self, key: PodKey, node: NodeName, now: float, uid: str = "") -> BindDecision:
        return binding.bind(self._state, key, node, now, uid)

    def bind_outcomes(self, outcomes: Sequence[BindOutcome]) -> PartiallyBound | None:
        """What the API said to bindings the core asked for; a partial gang is reported."""
        return binding.bind_outcomes(self._state, outcomes)

    def abandon(self, key: PodKey) -> None:
        """kube-scheduler gave up on a parked call (connection closed): unpark it."""
        self._waiting.remove(key)

    # ------------------------------------------------------------------ creation, gates, time

    def place_at_creation(self, pod: PodRecord, now: float) -> Placement:
        """The webhook's question for a member being created: pin it, hold its review for
        its gang's quorum, or gate it."""
        return placer.place_at_creation(self._state, pod, now)

    def withdraw_creation(self, key: PodKey) -> None:
        """A pin given at creation taken back by the webhook (another party's gate)."""
        placer.withdraw(self._state, key)

    def expire_holds(self, now: float) -> None:
        """Held reviews whose window closed without their quorum are gated (their answers
        come in the next :meth:`drain`)."""
        placer.expire_holds(self._state, now)

    def release_hold(self, key: PodKey) -> None:
        """The webhook gave up on a held review (it answered it itself)."""
        placer.release_hold(self._state, key)

    def admit_gated(self, now: float) -> None:
        """Admit the gangs behind Lockstep's gate that fit now (their lifts are drained)."""
        gated.admit_gated(self._state, now)

    def expire(self, now: float) -> list[GangExpired]:
        """Time out admitted gangs past their deadline and end finished backoffs."""
        return deadlines.expire(self._state, now)

    def narrow_claim(self, namespace: str, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The webhook's patch for a ResourceClaim being created: each ``firstAvailable``
        request narrowed to the subrequest its pod's plan chose (``devices.narrow``)."""
        return narrow(self._state.devices, namespace, obj)

    # ------------------------------------------------------------------ what the app acts on

    def queued(self) -> bool:
        """Whether anything waits to be drained: the app asks after every event and verb,
        and most queue nothing (one check; :meth:`drain` only when it says so)."""
        o = self._outbox
        return bool(o.notices or o.requeue or o.unparked or o.lift or o.evictions
                    or o.deallocate or self._state.creation.answers)

    def drain(self) -> Drained:
        """Everything queued since the last drain, taken at once; the queues are empty after."""
        st, o = self._state, self._outbox
        return Drained(
            unparked=o.drain_unparked(),
            notices=o.drain_notices(),
            requeue=o.drain_requeue(st.store.pods),
            lift=gated.drain_lift(st),
            evictions=o.drain_evictions(),
            deallocate=o.drain_deallocate(),
            answers=placer.drain_answers(st),
        )

    # ------------------------------------------------------------------ what-if

    def what_if(self, objects: Sequence[object], now: float) -> DryRun:
        """A dry plan for objects not created yet (``coscheduling.whatif``): call
        :meth:`~coscheduling.whatif.DryRun.advance` until it answers. Nothing in the core
        changes; bad objects raise :class:`~coscheduling.whatif.WhatIfError` here."""
        names = sorted(self.settings.scheduler_names)
        found = expand(objects, self.settings.defaults.max_gang_size, names)
        return DryRun(self._state, found, now)
