"""What a bind decision needs done: bind through the API, park the call, or answer it.

The core decides (``Coscheduler.bind``); this module performs: one binding at once for a pod
outside a gang or of a released gang, a whole gang's bindings concurrently when its quorum is
parked (answering every parked call with its own outcome), or a parked call held open until
then. How the API answered goes back to the core, which counts a partial gang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from coscheduling import (
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    Coscheduler,
    GangKey,
    NodeName,
    Notice,
    NoticeKind,
    Park,
    PodKey,
    Reject,
)

from ..kube.client import KubeClient
from ..metrics import Metrics
from ..render import render
from .parked import ParkedCalls
from .poster import Poster

__all__ = ["SWEEP_GAP", "Binder", "error_text"]

SWEEP_GAP = 0.01
"""The deadline timer's sweeps are at least this far apart (seconds): a gang times out, a
backoff ends, a parked call is answered at most this late."""

log = logging.getLogger("lockstep")


def _created(stamp: str) -> float | None:
    """``metadata.creationTimestamp`` (RFC 3339) as epoch seconds; None when missing or bad."""
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def error_text(outcome: BindOutcome) -> str:
    return "" if isinstance(outcome, Bound) else outcome.message


class Binder:
    def __init__(self, core: Coscheduler, kube: KubeClient, metrics: Metrics,
                 parked: ParkedCalls, poster: Poster, *, clock: Callable[[], float],
                 after_change: Callable[[], None], kick: asyncio.Event, bind_retries: int) -> None:
        self.core, self.kube, self.metrics = core, kube, metrics
        self.parked, self.poster, self.clock = parked, poster, clock
        self.after_change, self.kick, self.bind_retries = after_change, kick, bind_retries
        self.first_seen: dict[GangKey, float] = {}
        """When each gang's first member was filtered: the admission-wait metric's start."""

    async def bind(self, key: PodKey, node: NodeName, uid: str) -> str:
        """Bind, or park until the gang's quorum; returns the error text ("" for success)."""
        now = self.clock()
        decision = self.core.bind(key, node, now, uid)
        if isinstance(decision, Park):
            # Opened before the change is acted on: acting may let this very call go (a gang
            # giving its room back to higher priorities), and that answer must find it open.
            opened = self.parked.open(key)
            self.after_change()
            return await self._park(key, opened, decision.deadline)
        self.after_change()
        match decision:
            case BindNow():
                outcome = await self._bind_one(key, node)
                self.settle([outcome])
                return error_text(outcome)
            case Reject(reason):
                self.metrics.bind_errors.labels(type(reason).__name__).inc()
                return render(reason)
            case BindGroup(gang, binds):
                first = self.first_seen.pop(gang, None)
                if first is not None:
                    self.metrics.admission_wait.observe(now - first)
                return await self._bind_group(key, gang, binds)
        raise AssertionError(decision)

    async def _park(self, key: PodKey, opened: asyncio.Future[str], deadline: float) -> str:
        self.kick.set()
        try:
            # The timer answers at the deadline; the margin only guards against a lost wakeup.
            answer = await self.parked.wait(key, opened,
                                            max(0.0, deadline - self.clock()) + 5.0)
        except asyncio.CancelledError:
            self.core.abandon(key)
            raise
        if answer is None:
            self.core.abandon(key)
            return "parked bind call outlived its gang's deadline"
        return answer

    async def _bind_group(self, own: PodKey, gang: GangKey, binds: dict[PodKey, NodeName]
                          ) -> str:
        keys = list(binds)
        outcomes = await asyncio.gather(*(self._bind_one(k, binds[k]) for k in keys))
        self.settle(outcomes)
        placed = Counter(binds[o.pod] for o in outcomes if isinstance(o, Bound))
        if placed:
            self._observe_arrival_to_bound(gang)
            # One Event for the group, on the member whose call released it: per member it
            # was 8 writes per 8-pod gang competing with the bindings, and each
            # member gets kube-scheduler's own Scheduled Event anyway.
            where = ", ".join(f"{n} x{c}" for n, c in sorted(placed.items()))
            detail = f"{placed.total()} of {len(keys)} member(s) bound together ({where})"
            self.poster.offer(self.poster.events,
                              (own, Notice(NoticeKind.BOUND, gang, (own,), detail=detail)))
        mine = ""
        for k, outcome in zip(keys, outcomes, strict=True):
            err = error_text(outcome)
            if k == own:
                mine = err
            else:
                self.parked.answer(k, err)
        return mine

    def _observe_arrival_to_bound(self, gang: GangKey) -> None:
        """Creation of the gang's first member to now, on the wall clock: the API server
        stamps creation in whole seconds, so this is what a user waited, give or take one."""
        created = [c for m in self.core.queries.members_of(gang) if (c := _created(m.created))]
        if created:
            self.metrics.arrival_to_bound.observe(max(0.0, time.time() - min(created)))

    async def _bind_one(self, key: PodKey, node: NodeName) -> BindOutcome:
        pod = self.core.queries.pod(key)
        if pod is None:
            self.metrics.bind_errors.labels("PodGone").inc()
            return BindFailed(key, node, f"pod {key} was deleted before it could be bound",
                              permanent=True)

        def already_bound() -> bool:
            current = self.core.queries.pod(key)
            return current is not None and current.node_name == node

        outcome = await self.kube.bind_retrying(
            key, pod.namespace, pod.name, pod.uid, node, retries=self.bind_retries,
            already_bound=already_bound)
        outcome = replace(outcome, uid=pod.uid)  # the outcomes come back together, later
        if isinstance(outcome, Bound):
            self.metrics.binds.inc()
        else:
            self.metrics.bind_errors.labels(
                "Permanent" if outcome.permanent else "Unavailable").inc()
        return outcome

    def settle(self, outcomes: Sequence[BindOutcome]) -> None:
        """Tell the core how the bindings went; a partial gang is counted and announced."""
        if self.core.bind_outcomes(outcomes) is not None:
            log.error("gang left partially bound: %s",
                      [o.message for o in outcomes if isinstance(o, BindFailed)])
        self.after_change()

    async def expire_loop(self) -> None:
        """The deadline timer: time out gangs at their deadline (answering their parked
        calls), end backoffs; woken early by ``kick`` when something new is parked.

        A sweep reads every gang (its next deadline, then what expired), and every event
        and verb kicks it: in a burst that was a sweep per loop turn, hundreds a second,
        each growing with the gangs the cluster holds. Sweeps are at least
        :data:`SWEEP_GAP` apart: a kick during the gap is not lost (the next deadline is
        read after it), and nothing falls due more than the gap late."""
        while True:
            now = self.clock()
            nxt = self.core.queries.next_deadline()
            wait = 1.0 if nxt is None else min(1.0, max(0.0, nxt - now))
            self.kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), wait)
            for exp in self.core.expire(self.clock()):
                self.metrics.timeouts.inc()
                text = render(exp.reason)
                for k in exp.parked:
                    self.parked.answer(k, text)
                    self.metrics.bind_errors.labels("TimedOut").inc()
                self.first_seen.pop(exp.gang, None)
            self.after_change()
            await asyncio.sleep(SWEEP_GAP)
