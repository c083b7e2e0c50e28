"""The running service: the core plus the Kubernetes side effects it asks for.

Each verb decodes, calls the core once (synchronously: decide and reserve with no ``await``
in between) and then performs what the decision needs. :class:`Lockstep` wires the pieces
and supervises their loops as named tasks; if one dies the whole service stops rather than
limp on with a stale view:

* ``cache``: list/watch of every kind the core reads (``app.kube.cache``);
* ``binder``: bindings, parked calls and the deadline timer (``app.effects.binder``);
* ``poster``: Events, requeue nudges and gate lifts (``app.effects.poster``);
* ``status``: each convention's PodGroup status (``app.effects.status_writer``);
* ``loop-lag``: how long the loop was held by work that did not yield (:class:`LoopLag`);
* ``lease`` and ``leadership`` (with a :class:`~app.kube.lease.LeaseFollower`): whether this
  replica leads. It *acts* (admits, lifts, pins, evicts, binds, writes status and Events) only
  while it leads and after it rebuilt its view from the API server for this term
  (:meth:`Lockstep.rebuild`); every write is fenced in the API client as well, as its bytes
  go out (``KubeClient.may_write``, ``fence_left``). A replica that led and lost the lead
  answers its parked binds with an error and stops, to start again as a standby with a
  cache listed afresh (``docs/failover.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, cast

from coscheduling import (
    Coscheduler,
    FilterDecision,
    NodeName,
    PodRecord,
    RecordError,
    pod_from_json,
    pod_key,
    warm_selectors,
)

from . import STARTED
from .effects.binder import Binder
from .effects.held import HeldReviews
from .effects.parked import ParkedCalls
from .effects.poster import LIFTERS, Poster
from .effects.status_writer import StatusWriter
from .kube.cache import ClusterCache
from .kube.client import KubeClient
from .kube.errors import APIError, APIUnreachable, NotFound
from .kube.lease import LeaseFollower
from .metrics import Metrics
from .render import render

__all__ = [
    "LOOP_LAG_WARN_SECONDS",
    "NOT_LEADING",
    "Lockstep",
    "LoopLag",
    "LostLease",
    "UnknownObject",
]

log = logging.getLogger("lockstep")

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""What the API server accepts as a namespace (DNS label) and a pod name (DNS subdomain)."""


LOOP_LAG_WARN_SECONDS = 1.0
"""A loop held this long is logged: every verb, the webhook and ``/healthz`` waited as long."""


class LoopLag:
    """How late the event loop wakes a sleeper: the time some work held it without yielding.

    Every verb, webhook review and probe waits behind such work, so this is the stall a
    client saw, measured inside the process (``/debug/loop``; the stall benchmark reads it).
    It costs one wake-up every ``period`` seconds."""

    def __init__(self, period: float = 0.25) -> None:
        self.period = period
        self.last = 0.0
        self.max = 0.0
        self.held_over_warn = 0
        """Times the loop was held longer than ``LOOP_LAG_WARN_SECONDS``."""

    async def run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(self.period)
            self.observe(time.monotonic() - t - self.period)

    def observe(self, lag: float) -> None:
        self.last = max(0.0, lag)
        self.max = max(self.max, self.last)
        if self.last > LOOP_LAG_WARN_SECONDS:
            self.held_over_warn += 1
            log.warning("event loop held for %.2fs: verbs, webhook and probes waited as long",
                        self.last)

    def reset(self) -> None:
        self.last = self.max = 0.0
        self.held_over_warn = 0


def freeze_synced_heap() -> None:
    """Move every object alive once the cache has synced (the cluster's records, tens of
    thousands at 5,000 nodes) out of the cyclic collector's reach (``gc.freeze``).

    Without it, every full collection walks the whole cluster: 30-100 ms with the event
    loop held, triggered by nothing more than a big request's parse (a pod with thousands
    of affinity terms) or a victim search's temporaries. Frozen objects are still freed by
    reference counting when a watch event replaces them; only a reference cycle among
    them would outlive its use, and those are at most what existed at the sync, never a
    growing amount.

    The youngest generation is then collected every :data:`GC_YOUNG` allocations, not
    Python's 700: a burst allocates a few thousand short-lived objects per pod (decoded
    JSON, records, requests), and collecting them every 700 was about 4% of the process's
    CPU (``perf``: ``gc_collect_main`` and its visitors) for no memory given back."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 20)


GC_YOUNG = 20_000
"""Allocations between collections of the youngest generation, once the cache has synced."""


NOT_LEADING = ("this Lockstep replica does not lead (or is rebuilding its view as the new "
               "leader); kube-scheduler will retry")
"""What a verb that would act answers on a replica that does not act."""


ACTING_WAIT_SECONDS = 1.0
"""How long a verb reaching a replica that does not act yet waits for it to (a fresh Lease
read and the rebuild take ~0.1 s), well inside kube-scheduler's extender timeout."""


class LostLease(RuntimeError):
    """The replica led and lost the lead: it stops, and starts again as a standby."""


class UnknownObject(LookupError):
    """A request named a pod or node Lockstep does not know; becomes a 404 at the edge."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name} is not known to Lockstep")
        self.kind = kind
        self.name = name


class Lockstep:
    def __init__(
        self,
        core: Coscheduler,
        kube: KubeClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        bind_retries: int = 3,
        verbs_later: bool = False,
        webhook_later: bool = False,
        leader: LeaseFollower | None = None,
    ) -> None:
        """``leader``: follow that Lease and act only while it says this replica leads
        (None: a single replica, which always acts). ``verbs_later``: the extender's server
        starts after the cache lists, and tells :meth:`serve_verbs`; ``webhook_later``: an
        admission webhook server starts too, and sets :attr:`webhook_listening`
        (``app.process`` starts both)."""
        self.core = core
        self.kube = kube
        self.clock = clock
        self.cache = ClusterCache(core, kube, on_change=self.after_change)
        self.metrics = Metrics(core.queries, self.cache.sync_age, self.cache.failures)
        self.parked = ParkedCalls()
        self.held = HeldReviews()
        """Admission reviews held for their gang's quorum (``app.http.pinning``)."""
        self.kick = asyncio.Event()
        """Set when the deadline timer should look again (a call was parked, state moved)."""
        self.poster = Poster(core, kube, self.metrics, clock)
        self.binder = Binder(core, kube, self.metrics, self.parked, self.poster, clock=clock,
                             after_change=self.after_change, kick=self.kick,
                             bind_retries=bind_retries)
        self.status = StatusWriter(core, kube)
        self.lag = LoopLag()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cel_warm: asyncio.Future[None] | None = None
        self.failed: BaseException | None = None
        self.verbs_served = not verbs_later
        """The extender verbs answer: until then gated gangs are not admitted (the process
        lists the cluster before its HTTP server has started)."""
        self.webhook_listening = not webhook_later
        """False while the admission webhook's own server (``--webhook-port``) is starting:
        not ready, so no pod is created through an unreachable webhook (it fails open)."""
        self._said_synced = False
        self._stopping = False
        self.api_ok = False
        self.stopped = asyncio.Event()
        self.leader = leader
        self._acting_term = 0
        """The lease term this replica rebuilt for and acts in (0: none yet)."""
        self.rebuilds = 0
        if leader is not None:
            kube.may_write = self.acting_now
            kube.fence_left = leader.remaining
            self.metrics.leading.set_function(lambda: float(self.acting_now()))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        runners: dict[str, Coroutine[Any, Any, None]] = {
            **{f"watch-{name}": self.cache.run(name) for name in self.cache.resources},
            "watch-crds": self.cache.watch_crds(),
            "deadline-timer": self.binder.expire_loop(),
            "event-poster": self.poster.post_events(),
            "requeue-nudger": self.poster.nudge(),
            "claim-deallocator": self.poster.deallocate(),
            "evictor": self.poster.evict(),
            **{f"gate-lifter-{i}": self.poster.lift() for i in range(LIFTERS)},
            "podgroup-status": self.status.run(),
            "api-probe": self._probe_api(),
            "loop-lag": self.lag.run(),
        }
        if self.leader is not None:
            runners["lease"] = self.leader.run()
            runners["leadership"] = self._follow_lead()
        # DRA's CEL parser, built once in a thread (half a second), not on the loop by the
        # first plan of a gang with claims.
        self._cel_warm = asyncio.get_running_loop().run_in_executor(None, warm_selectors)
        for name, coro in runners.items():
            task = asyncio.create_task(coro, name=name)
            task.add_done_callback(self._on_task_done)
            self._tasks[name] = task

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        log.error("task %s stopped: %r; shutting down", task.get_name(), exc)
        self.failed = exc or RuntimeError(f"task {task.get_name()} returned")
        self.stopped.set()

    async def stop(self) -> None:
        """Cancel every loop and close the API client; a second call does nothing."""
        if self._stopping:
            return
        self._stopping = True
        if self._cel_warm is not None:
            self._cel_warm.cancel()  # a no-op once built; a thread is never interrupted
        for t in self._tasks.values():
            t.cancel()
        for t in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for key in self.parked:
            self.parked.answer(key, "Lockstep is shutting down; kube-scheduler will retry")
        await self.kube.aclose()

    def answer_parked(self, text: str) -> int:
        """Answer every parked bind call now with ``text`` (shutdown); returns how many.

        The calls' slots are given back to the core, so a service that keeps running (a
        test, a drained replica) stays consistent."""
        answered = 0
        for key in self.parked:
            if self.parked.answer(key, text):
                self.core.abandon(key)
                answered += 1
        return answered

    # ------------------------------------------------------------------ leadership

    @property
    def acting(self) -> bool:
        return self.acting_now()

    def acting_now(self) -> bool:
        """Whether this replica may act now: it leads (fenced by the clock, checked at
        each call) and has rebuilt its view for this term."""
        lead = self.leader
        return lead is None or (lead.leading and self._acting_term == lead.term)

    async def await_acting(self, timeout: float = ACTING_WAIT_SECONDS) -> bool:
        """Whether this replica acts, waiting up to ``timeout`` for it when it does not yet.

        A verb comes only from a kube-scheduler that leads, so one arriving at a replica that
        does not act yet (its sidecar just took the Lease) has the Lease read at once rather
        than at the next poll: the new leader answers within a read and a rebuild, instead of
        refusing and costing the pod kube-scheduler's backoff. The fence is unchanged (the
        read only observes); a deposed sidecar's call still ends in a refusal."""
        if self.acting_now():
            return True
        assert self.leader is not None
        self.leader.wake.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if self.acting_now():
                return True
        return False

    async def _follow_lead(self) -> None:
        """Act on each gain or loss of the lead: rebuild, then act; or stop."""
        lead = self.leader
        assert lead is not None
        while True:
            await lead.changed.wait()
            lead.changed.clear()
            if lead.leading and self._acting_term != lead.term:
                term = lead.term
                await self.rebuild()
                if lead.leading and lead.term == term:
                    self._acting_term = term
                    log.warning("leading (term %d): acting on a view rebuilt from the API "
                                "server", term)
                    self.after_change()
            elif not lead.leading and self._acting_term:
                self.answer_parked(NOT_LEADING)
                raise LostLease("this replica lost the lead; it stops and starts again "
                                "as a standby")

    async def rebuild(self) -> None:
        """List every kind again, as at start-up, before a new term's first act.

        The previous leader stopped writing before the Lease could pass (``app.kube.lease``), so
        a consistent list taken now holds every pin, gate lift, nomination and eviction it
        made; the watch might still be behind them. Each watch loop is restarted: it lists
        (replacing the core's set of that kind, as after a 410) and then watches on."""
        self.rebuilds += 1
        t0 = time.monotonic()
        for name, res in self.cache.resources.items():
            old = self._tasks.get(f"watch-{name}")
            if old is not None:
                old.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await old
            res.synced = False
            task = asyncio.create_task(self.cache.run(name), name=f"watch-{name}")
            task.add_done_callback(self._on_task_done)
            self._tasks[f"watch-{name}"] = task
        while not self.cache.synced:
            await asyncio.sleep(0.02)
        log.info("view rebuilt from the API server in %.2fs", time.monotonic() - t0)

    def serve_verbs(self) -> None:
        """The HTTP server listens: admit the gated gangs the cache already holds."""
        self.verbs_served = True
        self.after_change()

    @property
    def ready(self) -> bool:
        return (self.cache.synced and self.api_ok and self.webhook_listening
                and self.failed is None)

    async def _probe_api(self) -> None:
        while True:
            self.api_ok = await self.kube.healthy()
            await asyncio.sleep(2.0 if self.api_ok else 0.5)

    # ------------------------------------------------------------------ verbs

    def filter(self, pod: PodRecord, names: Sequence[str]) -> FilterDecision:
        now = self.clock()
        decision = self.core.filter(pod, cast(list[NodeName], names), now)
        gang = self.core.queries.gang_of(pod.key)
        if gang is not None:
            self.binder.first_seen.setdefault(gang, now)
        if decision.unresolvable is not None:
            self.metrics.rejections.labels(type(decision.unresolvable).__name__).inc()
        self.after_change()
        return decision

    def prioritize(self, pod: PodRecord, names: Sequence[str]) -> list[int]:
        """Scores aligned with ``names``."""
        return self.core.prioritize(pod, cast(list[NodeName], names))

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind, or park until the gang's quorum; returns the error text ("" for success)."""
        if not await self.await_acting():
            return NOT_LEADING
        key = pod_key(namespace, name)
        q = self.core.queries
        if q.pod(key) is None:
            try:
                await self._read_pod(namespace, name, uid)
            except (APIError, APIUnreachable) as e:
                return f"pod {key} is not in Lockstep's cache yet and reading it failed: {e}"
        if node not in q.nodes:
            raise UnknownObject("node", node)
        return await self.binder.bind(key, NodeName(node), uid)

    async def _read_pod(self, namespace: str, name: str, uid: str) -> None:
        """A bind for a pod the watch has not shown yet: read it from the API server (one
        GET) and decide as usual; unknown only when it does not exist, or is not the pod
        kube-scheduler means (another UID)."""
        key = pod_key(namespace, name)
        if not (_NAMESPACE.fullmatch(namespace) and _NAME.fullmatch(name)):
            raise UnknownObject("pod", key)  # no such pod can exist: nothing to read
        try:
            obj = await self.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            raise UnknownObject("pod", key) from None
        try:
            rec = pod_from_json(obj)
        except (RecordError, ValueError, TypeError) as e:
            raise APIError(200, "BadResponse", f"unreadable pod: {e}") from None
        if uid and rec.uid != uid:
            raise UnknownObject("pod", key)
        if self.core.queries.pod(key) is None:  # the watch may have delivered it meanwhile
            self.core.upsert_pod(rec)
            self.after_change()

    # ------------------------------------------------------------------ side effects

    def after_change(self) -> None:
        """After anything changed the core (a watch event, a verb, a review): admit the gated
        gangs it made ready, then act on what the core queued."""
        self.admit_ready()
        self.send_queued()

    def admit_ready(self) -> None:
        """Admit the gated gangs that fit now, once the cache is synced and the verbs are
        served: with half a cache every gated gang would look unplaceable, and a member
        lifted before the verbs answer would find no one to filter it."""
        if not (self.cache.synced and self.verbs_served and self.acting):
            return
        if not self._said_synced:
            self._said_synced = True
            q = self.core.queries
            log.info("cache synced and verbs served %.2fs after start: %d nodes, %d pods",
                     time.monotonic() - STARTED, len(q.nodes), len(q.pods))
            freeze_synced_heap()
        self.core.admit_gated(self.clock())

    def send_queued(self) -> None:
        """Act on what the core queued: parked calls and held reviews to answer, Events,
        requeue nudges, gates to lift, victims to evict and claims to deallocate; wake the
        deadline timer.

        A replica that does not act answers the calls and reviews it holds and carries out
        nothing else: the leader does, and this replica's view is rebuilt before it ever
        acts."""
        if not self.core.queued():
            self.kick.set()
            return
        out = self.core.drain()
        for unparked in out.unparked:
            text = render(unparked.reason)
            for k in unparked.pods:
                if self.parked.answer(k, text):
                    self.metrics.bind_errors.labels(type(unparked.reason).__name__).inc()
        if out.answers:
            self.held.answer(out.answers)
        if self.acting:
            for notice in out.notices:
                for pod in notice.pods:
                    self.poster.offer(self.poster.events, (pod, notice))
            for pod in out.requeue:
                self.poster.offer(self.poster.requeue, pod)
            for lift in out.lift:
                self.poster.offer_lift(lift.pod, lift.uid, lift.node)
            self.poster.offer_evictions(out.evictions)
            for claim in out.deallocate:
                self.poster.offer(self.poster.deallocations, claim)
        self.kick.set()
