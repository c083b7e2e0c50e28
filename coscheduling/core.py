"""The coscheduler facade: cluster events in, typed verb decisions out.

It owns one :class:`~coscheduling.corestate.CoreState` and routes each cluster event and verb to
the module that holds its rules:

* ``ingest``: cluster events, one table entry per resource kind;
* ``membership``: which gang a pod is in, and quorum;
* ``gang_admission``: plan a gang whole and reserve it, keep its plan whole, or give it all back;
* ``creation.held``: gangs behind Lockstep's gate, admitted without a filter call, and gate
  lifts; ``creation.placer``: placement at creation, the webhook's question;
* ``filtering`` and ``binding``: the verbs; ``deadlines``: time; ``views``: read models.

Everything is synchronous and takes ``now``: each verb decides and reserves in one block with
no ``await`` in between, which is what makes admission atomic under asyncio (the guarantee
HiveD gets from one lock). Deadlock freedom comes from admission: a gang is admitted only
when all of it fits in capacity no other gang holds, and an admitted gang always holds a
whole plan.

Things the app must act on outside a verb's answer are queued and drained: Events
(:meth:`Coscheduler.drain_notices`), requeue nudges (:meth:`Coscheduler.drain_requeue`),
parked calls to answer (:meth:`Coscheduler.drain_unparked`) and gate lifts
(:meth:`Coscheduler.drain_lift`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from . import readmodel
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
from .conventions.base import StatusModel
from .corestate import CoreState, PlainVerdict, Settings
from .creation import gated, placer
from .devices.narrow import narrow
from .events import ingest
from .events.ingest import Kind
from .gang.membership import meets_quorum
from .podgroup import GangKey, GangSpec, Membership, gang_of
from .preemption.inflight import InFlight
from .readmodel import GangView
from .reasons import PartiallyBound
from .records import NodeName, NodeRecord, PodKey, PodRecord
from .resources import Resources
from .state.gang import Gang
from .topology.domains import GPU, GpuLayout, Score
from .verbs import binding, deadlines, filtering
from .whatif import DryRun, expand

__all__ = ["Coscheduler"]


class Coscheduler:
    """Cluster state plus the gang rules; one instance per Lockstep process."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._state = st = CoreState(settings or Settings())
        """Private: ``app`` reads the core through the methods here (tests reach it through
        ``tests/internals.state_of``, in one place)."""
        self.settings = st.settings
        self._store, self._ledger = st.store, st.ledger
        self._capacity, self._waiting, self._outbox = st.capacity, st.waiting, st.outbox

    @property
    def partial_gangs(self) -> int:
        """Gangs left partly bound by a permanently failed binding (for metrics)."""
        return self._state.partial_gangs

    # ------------------------------------------------------------------ read-only views

    @property
    def pods(self) -> Mapping[PodKey, PodRecord]:
        return MappingProxyType(self._store.pods)

    @property
    def nodes(self) -> Mapping[NodeName, NodeRecord]:
        return MappingProxyType(self._store.nodes)

    def pod(self, key: PodKey) -> PodRecord | None:
        return self._store.pods.get(key)

    def node(self, name: NodeName) -> NodeRecord | None:
        return self._store.nodes.get(name)

    def has_node(self, name: str) -> bool:
        return name in self._store.nodes

    def node_names(self) -> list[NodeName]:
        return sorted(self._store.nodes)

    def node_count(self) -> int:
        return len(self._store.nodes)

    def pod_count(self) -> int:
        return len(self._store.pods)

    def free(self, node: NodeName) -> Resources:
        return self._store.free(node)

    def used(self, node: NodeName) -> Resources:
        """What the pods bound to ``node`` request (empty when none is)."""
        return self._store.used.get(node, {})

    def gpu_totals(self) -> tuple[int, int]:
        """(allocatable, used) GPUs over the cached nodes: one pass, ~1 ms at 5,000 nodes."""
        used_by_node = self._store.used
        allocatable = used = 0
        for name, node in self._store.nodes.items():
            allocatable += node.allocatable.get(GPU, 0)
            used += used_by_node.get(name, {}).get(GPU, 0)
        return allocatable, used

    def domains(self, level: int) -> Mapping[tuple[str, ...], list[NodeName]]:
        """The nodes of each domain of topology level ``level`` (its index in the levels)."""
        return self._store.domains(level)

    def layout(self, node: NodeName) -> GpuLayout:
        """``node``'s GPUs: their NVLink islands and NUMA zones."""
        return self._store.layout(node)

    def free_unreserved(self, node: NodeName) -> Resources:
        """Free capacity on ``node`` that no gang holds."""
        return self._capacity.free_for_gang(node)

    def reserved_on(self, node: NodeName) -> dict[GangKey, Resources]:
        return self._ledger.by_gang_on(node)

    def reserved_gpus(self) -> int:
        return sum(r.get(GPU, 0) for r in self._ledger.total.values())

    def reserved_total(self) -> dict[NodeName, dict[GangKey, Resources]]:
        return {n: self._ledger.by_gang_on(n) for n in self._ledger.nodes()}

    def is_parked(self, pod: PodKey) -> bool:
        return self._waiting.is_parked(pod)

    def parked_total(self) -> int:
        return self._waiting.total()

    def members_of(self, gang: GangKey) -> list[PodRecord]:
        return readmodel.members_of(self._state, gang)

    def membership(self, pod: PodKey) -> Membership:
        return self._state.membership.get(pod)

    def plain_verdict(self, pod: PodKey) -> PlainVerdict | None:
        """The last filter and bind answers for a pod outside any gang."""
        return self._state.plain.verdicts.get(pod)

    def gang_of(self, pod: PodKey) -> GangKey | None:
        return gang_of(self._state.membership.get(pod))

    def meets_quorum(self, spec: GangSpec, keys: Iterable[PodKey]) -> bool:
        return meets_quorum(self._state, spec, keys)

    def gangs(self) -> Mapping[GangKey, Gang]:
        return MappingProxyType(self._state.gangs)

    def plans(self) -> dict[GangKey, dict[PodKey, NodeName]]:
        return {k: dict(g.plan) for k, g in self._state.gangs.items() if g.plan}

    def explain_score(self, n: NodeName, gpus: int, own: PodKey | None = None) -> Score:
        return self._capacity.explain_score(n, gpus, own)

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
        own = pod.key if self.gang_of(pod.key) is not None else None
        return self._capacity.scores(nodes, pod.requests.get(GPU, 0), own)

    def bind(self, key: PodKey, node: NodeName, now: float, uid: str = "") -> BindDecision:
        return binding.bind(self._state, key, node, now, uid)

    def bind_outcomes(self, outcomes: Sequence[BindOutcome]) -> PartiallyBound | None:
        """What the API said to bindings the core asked for; a partial gang is reported."""
        return binding.bind_outcomes(self._state, outcomes)

    def abandon(self, key: PodKey) -> None:
        """kube-scheduler gave up on a parked call (connection closed): unpark it."""
        self._waiting.remove(key)

    # ------------------------------------------------------------------ held gangs, time

    def place_at_creation(self, pod: PodRecord, now: float) -> Placement:
        """The webhook's question for a member being created: pin it, or gate it."""
        return placer.place_at_creation(self._state, pod, now)

    def pinned_at_creation(self, key: PodKey) -> NodeName | None:
        """The node a pod being created was pinned to, until the watch shows it."""
        return placer.pinned_at_creation(self._state, key)

    def withdraw_creation(self, key: PodKey) -> None:
        """A pin given at creation taken back by the webhook (another party's gate)."""
        placer.withdraw(self._state, key)

    def drain_creation_answers(self) -> dict[PodKey, Answer]:
        """Answers for reviews the webhook held, decided since the last drain."""
        return placer.drain_answers(self._state)

    def next_hold_deadline(self) -> float | None:
        """When the earliest held review's window closes."""
        return placer.next_hold_deadline(self._state)

    def expire_holds(self, now: float) -> None:
        """Held reviews whose window closed without their quorum are gated."""
        placer.expire_holds(self._state, now)

    def release_hold(self, key: PodKey) -> None:
        """The webhook gave up on a held review (it answered it itself)."""
        placer.release_hold(self._state, key)

    def admit_held(self, now: float) -> None:
        gated.admit_held(self._state, now)

    def lift_target(self, key: PodKey) -> Lift | None:
        return gated.lift_target(self._state, key)

    def next_deadline(self) -> float | None:
        return deadlines.next_deadline(self._state)

    def expire(self, now: float) -> list[GangExpired]:
        """Time out admitted gangs past their deadline and end finished backoffs."""
        return deadlines.expire(self._state, now)

    # ------------------------------------------------------------------ what the app acts on

    def queued(self) -> bool:
        """Whether anything waits to be drained: the app asks after every event and verb,
        and most queue nothing (one check, not six drains)."""
        o = self._outbox
        return bool(o.notices or o.requeue or o.unparked or o.lift or o.evictions
                    or o.deallocate)

    def drain_notices(self) -> list[Notice]:
        return self._outbox.drain_notices()

    def drain_requeue(self) -> list[PodKey]:
        """Pods kube-scheduler should look at again (no API event would wake them)."""
        return self._outbox.drain_requeue(self._store.pods)

    def drain_unparked(self) -> list[Unparked]:
        """Parked calls let go of by cluster events; the app answers each with its reason."""
        return self._outbox.drain_unparked()

    def narrow_claim(self, namespace: str, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The webhook's patch for a ResourceClaim being created: each ``firstAvailable``
        request narrowed to the subrequest its pod's plan chose (``devices.narrow``)."""
        return narrow(self._state.devices, namespace, obj)

    def drain_deallocate(self) -> list[tuple[str, str, str]]:
        """DRA claims whose allocation nobody will use (``devices.stale``): ``(namespace/name,
        uid, resourceVersion)``; the app clears each allocation under those preconditions."""
        return self._state.outbox.drain_deallocate()

    def drain_evictions(self) -> list[Eviction]:
        """Victims of preemptions decided since the last drain: the app evicts them."""
        return self._state.outbox.drain_evictions()

    def drain_lift(self) -> list[Lift]:
        """Held pods whose gate comes off now (decided now, from the current plan)."""
        return gated.drain_lift(self._state)

    # ------------------------------------------------------------------ read models

    def gang_view(self, key: GangKey) -> GangView | None:
        return readmodel.gang_view(self._state, key)

    def gang_state(self, key: GangKey) -> str | None:
        """What a person calls the gang's state (one of ``readmodel.STATES``), or None."""
        g = self._state.gangs.get(key)
        return readmodel.gang_state(self._state, g) if g is not None else None

    def preemptions_in_flight(self) -> list[InFlight]:
        """Each preemption whose victims are still going, oldest first."""
        return sorted(self._state.preemption.inflight.by_preemptor.values(),
                      key=lambda r: r.started)

    def gang_views(self) -> list[GangView]:
        found = (readmodel.gang_view(self._state, k) for k in sorted(self._state.gangs))
        return [v for v in found if v is not None]

    def status_model(self) -> StatusModel:
        """What every convention's status is made from, one snapshot
        (``readmodel.status_model``): each convention computes its own patches from it."""
        return readmodel.status_model(self._state)

    # ------------------------------------------------------------------ what-if

    def what_if(self, objects: Sequence[object], now: float) -> DryRun:
        """A dry plan for objects not created yet (``coscheduling.whatif``): call
        :meth:`~coscheduling.whatif.DryRun.advance` until it answers. Nothing in the core
        changes; bad objects raise :class:`~coscheduling.whatif.WhatIfError` here."""
        names = sorted(self.settings.scheduler_names)
        found = expand(objects, self.settings.defaults.max_gang_size, names)
        return DryRun(self._state, found, now)
