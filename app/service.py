"""The running service: the core plus the Kubernetes side effects it asks for.

Each verb decodes, calls the core once (synchronously: decide and reserve with no ``await``
in between) and then performs what the decision needs: binding through the API, parking a
future in the waiting map, answering parked futures. Background work runs as named,
supervised tasks (watchers, deadline timer, event poster, requeue nudger, PodGroup status);
if one dies the whole service stops rather than limp on with a stale view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from coscheduling import (
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    Coscheduler,
    FilterDecision,
    GangKey,
    NodeName,
    Notice,
    NoticeKind,
    Park,
    PodKey,
    PodRecord,
    Reject,
    Unparked,
    pod_key,
)
from coscheduling.gating import lift_patch
from coscheduling.podgroup import InvalidGang
from coscheduling.reasons import InvalidDeclaration
from coscheduling.upstream import GROUP, GangProgress, condition_updates

from . import STARTED
from .cache import ClusterCache
from .errors import APIError, APIUnreachable, Conflict, NotFound
from .kube import KubeClient
from .metrics import Metrics
from .render import render, render_notice

__all__ = ["Lockstep", "UnknownObject"]

log = logging.getLogger("lockstep")

REQUEUE_ANNOTATION = "lockstep.dev/requeue"
LIFTERS = 64
"""Gate lifts in flight at once. A lift waits 50-200 ms on a loaded API server, mostly in
queues rather than on a CPU, so the lifts in flight set the pace at which kube-scheduler
gets pods: 8 capped Lockstep at ~140 pods/s; from 32 to 64, four interleaved pairs of
1,000-node runs gave 147-176 pods/s against 131-153."""
LIFT_RETRIES = 5
_WARNING = {NoticeKind.TIMED_OUT, NoticeKind.INVALID, NoticeKind.TIMEOUT_CAPPED,
            NoticeKind.PARTIALLY_BOUND}


class UnknownObject(LookupError):
    """A request named a pod or node Lockstep does not know; becomes a 404 at the edge."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name} is not known to Lockstep")
        self.kind = kind
        self.name = name


@dataclass(slots=True)
class _Outbox:
    events: asyncio.Queue[tuple[PodKey, Notice]] = field(
        default_factory=lambda: asyncio.Queue(maxsize=20000)
    )
    requeue: asyncio.Queue[PodKey] = field(default_factory=lambda: asyncio.Queue(maxsize=20000))
    lift: asyncio.Queue[tuple[PodKey, int]] = field(
        default_factory=lambda: asyncio.Queue(maxsize=20000))
    """Held pods to take Lockstep's gate off, with the attempt number."""
    dropped: int = 0


class Lockstep:
    def __init__(
        self,
        core: Coscheduler,
        kube: KubeClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        bind_retries: int = 3,
    ) -> None:
        self.core = core
        self.kube = kube
        self.clock = clock
        self.cache = ClusterCache(core, kube, on_change=self._flush)
        self.metrics = Metrics(core, self.cache.sync_age)
        self.bind_retries = bind_retries
        self._parked: dict[PodKey, asyncio.Future[str]] = {}
        self._first_seen: dict[GangKey, float] = {}
        self._posted: dict[tuple[PodKey, str, str], float] = {}
        self._podgroup_status: dict[GangKey, dict[str, Any]] = {}
        self._lift_queued: set[PodKey] = set()
        self._lift_sent: dict[PodKey, tuple[str, NodeName | None]] = {}
        """The lift last written per pod: events on a pod still cached as held must not
        write it again before the watch shows the gate gone."""
        self._out = _Outbox()
        self._kick = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failed: BaseException | None = None
        self.verbs_served = True
        """The extender verbs answer: until then held gangs are not admitted (the CLI lists
        the cluster before its HTTP server has started)."""
        self.webhook_listening = True
        """False while the admission webhook's own server (``--webhook-port``) is starting:
        not ready, so no pod is created through an unreachable webhook (it fails open)."""
        self._said_synced = False
        self._stopping = False
        self.api_ok = False
        self.stopped = asyncio.Event()
        self._instance = f"{socket.gethostname()}-{os.getpid()}"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        runners: dict[str, Coroutine[Any, Any, None]] = {
            "watch-nodes": self.cache.run("nodes"),
            "watch-pods": self.cache.run("pods"),
            "watch-podgroups": self.cache.run("podgroups"),
            "watch-volcano-podgroups": self.cache.run("volcano-podgroups"),
            "watch-upstream-podgroups": self.cache.run("upstream-podgroups"),
            "watch-upstream-workloads": self.cache.run("upstream-workloads"),
            "watch-noderesourcetopologies": self.cache.run("noderesourcetopologies"),
            "deadline-timer": self._timer(),
            "event-poster": self._post_events(),
            "requeue-nudger": self._nudge(),
            **{f"gate-lifter-{i}": self._lift() for i in range(LIFTERS)},
            "podgroup-status": self._podgroup_status_loop(),
            "api-probe": self._probe_api(),
        }
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
        for t in self._tasks.values():
            t.cancel()
        for t in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for fut in self._parked.values():
            if not fut.done():
                fut.set_result("Lockstep is shutting down; kube-scheduler will retry")
        await self.kube.aclose()

    def answer_parked(self, text: str) -> int:
        """Answer every parked bind call now with ``text`` (shutdown); returns how many.

        The calls' slots are given back to the core, so a service that keeps running (a
        test, a drained replica) stays consistent."""
        answered = 0
        for key, fut in list(self._parked.items()):
            if not fut.done():
                fut.set_result(text)
                self.core.abandon(key)
                answered += 1
        return answered

    def serve_verbs(self) -> None:
        """The HTTP server listens: admit the held gangs the cache already holds."""
        self.verbs_served = True
        self._flush()

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
        gang = self.core.gang_of(pod.key)
        if gang is not None:
            self._first_seen.setdefault(gang, now)
        if decision.unresolvable is not None:
            self.metrics.rejections.labels(type(decision.unresolvable).__name__).inc()
        self._flush()
        return decision

    def prioritize(self, pod: PodRecord, names: Sequence[str]) -> list[int]:
        """Scores aligned with ``names``."""
        return self.core.prioritize(pod, cast(list[NodeName], names))

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind, or park until the gang's quorum; returns the error text ("" for success)."""
        key = pod_key(namespace, name)
        if self.core.pod(key) is None:
            raise UnknownObject("pod", key)
        if not self.core.has_node(node):
            raise UnknownObject("node", node)
        now = self.clock()
        decision = self.core.bind(key, NodeName(node), now, uid)
        self._flush()
        match decision:
            case BindNow():
                outcome = await self._bind_one(key, NodeName(node))
                self._settle([outcome])
                return _error_text(outcome)
            case Reject(reason):
                self.metrics.bind_errors.labels(type(reason).__name__).inc()
                return render(reason)
            case BindGroup(gang, binds):
                first = self._first_seen.pop(gang, None)
                if first is not None:
                    self.metrics.admission_wait.observe(now - first)
                return await self._bind_group(key, gang, binds)
            case Park(_, deadline):
                return await self._park(key, deadline)
        raise AssertionError(decision)

    async def _park(self, key: PodKey, deadline: float) -> str:
        old = self._parked.pop(key, None)
        if old is not None and not old.done():
            old.set_result("superseded by a newer bind call for the same pod")
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._parked[key] = fut
        self._kick.set()
        try:
            # The timer answers at the deadline; the margin only guards against a lost wakeup.
            wait = max(0.0, deadline - self.clock()) + 5.0
            result: str = await asyncio.wait_for(asyncio.shield(fut), wait)
            return result
        except TimeoutError:
            self.core.abandon(key)
            return "parked bind call outlived its gang's deadline"
        except asyncio.CancelledError:
            self.core.abandon(key)
            raise
        finally:
            if self._parked.get(key) is fut:
                del self._parked[key]

    async def _bind_group(
        self, own: PodKey, gang: GangKey, binds: dict[PodKey, NodeName]
    ) -> str:
        keys = list(binds)
        outcomes = await asyncio.gather(*(self._bind_one(k, binds[k]) for k in keys))
        self._settle(outcomes)
        placed = Counter(binds[o.pod] for o in outcomes if isinstance(o, Bound))
        if placed:
            # One Event for the group, on the member whose call released it: per member it
            # was 8 writes per 8-pod gang competing with the bindings, and each
            # member gets kube-scheduler's own Scheduled Event anyway.
            where = ", ".join(f"{n} x{c}" for n, c in sorted(placed.items()))
            detail = f"{placed.total()} of {len(keys)} member(s) bound together ({where})"
            self._offer(self._out.events,
                        (own, Notice(NoticeKind.BOUND, gang, (own,), detail=detail)))
        mine = ""
        for k, outcome in zip(keys, outcomes, strict=True):
            err = _error_text(outcome)
            if k == own:
                mine = err
                continue
            fut = self._parked.get(k)
            if fut is not None and not fut.done():
                fut.set_result(err)
        return mine

    async def _bind_one(self, key: PodKey, node: NodeName) -> BindOutcome:
        pod = self.core.pod(key)
        if pod is None:
            self.metrics.bind_errors.labels("PodGone").inc()
            return BindFailed(key, node, f"pod {key} was deleted before it could be bound",
                              permanent=True)

        def already_bound() -> bool:
            current = self.core.pod(key)
            return current is not None and current.node_name == node

        outcome = await self.kube.bind_retrying(
            key, pod.namespace, pod.name, pod.uid, node, retries=self.bind_retries,
            already_bound=already_bound)
        if isinstance(outcome, Bound):
            self.metrics.binds.inc()
        else:
            self.metrics.bind_errors.labels(
                "Permanent" if outcome.permanent else "Unavailable").inc()
        return outcome

    def _settle(self, outcomes: Sequence[BindOutcome]) -> None:
        """Tell the core how the bindings went; a partial gang is counted and announced."""
        if self.core.bind_outcomes(outcomes) is not None:
            log.error("gang left partially bound: %s",
                      [o.message for o in outcomes if isinstance(o, BindFailed)])
        self._flush()

    # ------------------------------------------------------------------ time

    async def _timer(self) -> None:
        while True:
            now = self.clock()
            nxt = self.core.next_deadline()
            wait = 1.0 if nxt is None else min(1.0, max(0.0, nxt - now))
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), wait)
            for exp in self.core.expire(self.clock()):
                self.metrics.timeouts.inc()
                text = render(exp.reason)
                for k in exp.parked:
                    fut = self._parked.get(k)
                    if fut is not None and not fut.done():
                        fut.set_result(text)
                    self.metrics.bind_errors.labels("TimedOut").inc()
                self._first_seen.pop(exp.gang, None)
            self._flush()

    # ------------------------------------------------------------------ side effects

    def _flush(self) -> None:
        """Act on what the core queued: parked calls to answer, Events, requeue nudges,
        gates to lift (after admitting the held gangs these events made ready)."""
        # With half a cache every held gang would look unplaceable.
        if self.cache.synced and self.verbs_served:
            if not self._said_synced:
                self._said_synced = True
                log.info("cache synced and verbs served %.2fs after start: %d nodes, %d pods",
                         time.monotonic() - STARTED, len(self.core.nodes), len(self.core.pods))
            self.core.admit_held(self.clock())
        for unparked in self.core.drain_unparked():
            self._answer(unparked)
        for notice in self.core.drain_notices():
            for pod in notice.pods:
                self._offer(self._out.events, (pod, notice))
        for pod in self.core.drain_requeue():
            self._offer(self._out.requeue, pod)
        for lift in self.core.drain_lift():
            if lift.pod not in self._lift_queued \
                    and self._lift_sent.get(lift.pod) != (lift.uid, lift.node):
                self._lift_queued.add(lift.pod)
                self._offer(self._out.lift, (lift.pod, 0))
        self._kick.set()

    def _answer(self, unparked: Unparked) -> None:
        text = render(unparked.reason)
        for k in unparked.pods:
            fut = self._parked.get(k)
            if fut is not None and not fut.done():
                fut.set_result(text)
                self.metrics.bind_errors.labels(type(unparked.reason).__name__).inc()

    def _offer(self, q: asyncio.Queue[Any], item: Any) -> None:
        try:
            q.put_nowait(item)
        except asyncio.QueueFull:
            self._out.dropped += 1

    async def _post_events(self) -> None:
        while True:
            key, notice = await self._out.events.get()
            pod = self.core.pod(key)
            if pod is None:
                continue
            message = render_notice(notice)
            dedupe = (key, notice.kind.value, message)
            now = self.clock()
            if now - self._posted.get(dedupe, -1e9) < 60.0:
                continue
            self._posted[dedupe] = now
            if len(self._posted) > 50000:
                self._posted.clear()
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            event = {
                "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
                "involvedObject": {
                    "apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                    "name": pod.name, "uid": pod.uid,
                },
                "reason": notice.kind.value,
                "message": message[:1024],
                "type": "Warning" if notice.kind in _WARNING else "Normal",
                "source": {"component": "lockstep"},
                "reportingComponent": "lockstep",
                "reportingInstance": self._instance,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            try:
                await self.kube.post_event(pod.namespace, event)
            except (APIError, APIUnreachable) as e:
                log.info("event for %s not posted: %s", key, e)

    async def _nudge(self) -> None:
        """Touch an annotation so kube-scheduler moves the pod back to its active queue.

        Pods turned away by an extender wait in kube-scheduler's unschedulable queue until a
        cluster event; when the event that matters happens only inside Lockstep (a gang was
        admitted, a reservation released, a backoff ended), nothing would wake them.
        """
        seq = 0
        while True:
            key = await self._out.requeue.get()
            pod = self.core.pod(key)
            if pod is None or pod.node_name is not None:
                continue
            seq += 1
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            patch = {"metadata": {"annotations": {REQUEUE_ANNOTATION: f"{time.time():.3f}-{seq}"}}}
            try:
                await self.kube.merge_patch(path, patch)
            except (APIError, APIUnreachable) as e:
                log.info("requeue of %s failed: %s", key, e)

    async def _lift(self) -> None:
        """Take Lockstep's gate off a pod, pinning it to its planned node in the same write.

        The target is asked of the core when the PATCH is sent, not when it was queued, so a
        plan that moved meanwhile is honoured. A pod recreated under the same name fails the
        UID precondition and a deleted one 404s: both are dropped, since the watch brings
        the new pod back through the core. Transient failures are retried; a refusal (422:
        say, a validating webhook) leaves the pod held and is logged."""
        while True:
            key, attempt = await self._out.lift.get()
            self._lift_queued.discard(key)
            lift = self.core.lift_target(key)
            pod = self.core.pod(key)
            if lift is None or pod is None or self._lift_sent.get(key) == (lift.uid, lift.node):
                continue
            if len(self._lift_sent) > 50000:
                self._lift_sent.clear()
            self._lift_sent[key] = (lift.uid, lift.node)  # before the await: one write each
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            try:
                await self.kube.strategic_patch(
                    path, lift_patch(lift.uid, pod.required_affinity, lift.node))
                self.metrics.lifts.labels("pinned" if lift.node else "unpinned").inc()
                continue
            except (NotFound, Conflict):
                continue
            except APIUnreachable as e:
                self._lift_later(key, attempt, e)
            except APIError as e:
                if e.status == 429 or e.status >= 500:
                    self._lift_later(key, attempt, e)
                else:
                    self.metrics.lifts.labels("failed").inc()
                    log.warning("gate of %s not lifted: %s", key, e)
            self._lift_sent.pop(key, None)

    def _lift_later(self, key: PodKey, attempt: int, err: Exception) -> None:
        if attempt + 1 >= LIFT_RETRIES:
            self.metrics.lifts.labels("failed").inc()
            log.warning("gate of %s not lifted after %d tries: %s", key, attempt + 1, err)
            return
        asyncio.get_running_loop().call_later(
            0.2 * 2 ** attempt, self._offer, self._out.lift, (key, attempt + 1))

    async def _write_volcano_status(self) -> None:
        for key, st in self.core.volcano_statuses().items():
            status: dict[str, Any] = {"phase": st.phase, "running": st.running,
                                      "succeeded": st.succeeded, "failed": st.failed}
            if st.waiting is not None:
                status["conditions"] = [{
                    "type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                    "message": render(st.waiting)[:1024],
                    "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}]
            elif st.phase != "Pending":
                status["conditions"] = []
            if _same(self._podgroup_status.get(key), status):
                continue
            ns, name = key.split("/", 1)
            try:
                await self.kube.merge_patch(VOLCANO_PODGROUPS.format(ns=ns, name=name),
                                            {"status": status})
                self._podgroup_status[key] = status
            except (APIError, APIUnreachable) as e:
                log.info("Volcano PodGroup %s status not written: %s", key, e)

    async def _write_upstream_status(self) -> None:
        """The scheduling condition on upstream (scheduling.k8s.io) PodGroups whose pods are
        Lockstep's, in the native gang plugin's vocabulary (rules in coscheduling.upstream).
        A strategic merge patch touches only that condition; the watch brings it back."""
        groups = self.core.store.upstream
        if not groups:
            return
        gangs: dict[GangKey, GangProgress] = {}
        for view in self.core.gang_views():
            if view.key not in groups:
                continue
            why = view.reason
            if view.spec is None:  # an invalid declaration: say which field
                bad = [m for p in self.core.members_of(view.key)
                       if isinstance(m := self.core.membership(p.key), InvalidGang)]
                why = InvalidDeclaration(bad[0]) if bad else why
            gangs[view.key] = GangProgress(view.bound, view.spec.min_member if view.spec
                                           else None, why)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for upd in condition_updates(groups, gangs, manager=FIELD_MANAGER):
            status = "True" if upd.scheduled else "False"
            message = (upd.detail or (render(upd.why) if upd.why else ""))[:1024]
            cur = groups[upd.key].condition
            if cur is not None and (cur.status, cur.reason, cur.message) == (
                    status, upd.reason, message):
                continue
            cond = {"type": upd.type, "status": status, "reason": upd.reason,
                    "message": message, "observedGeneration": upd.generation,
                    "lastTransitionTime": cur.last_transition
                    if cur is not None and cur.status == status and cur.last_transition
                    else now}
            ns, name = upd.key.split("/", 1)
            path = f"/apis/{GROUP}/{upd.version}/namespaces/{ns}/podgroups/{name}/status"
            try:
                await self.kube.request(
                    "PATCH", path, json={"status": {"conditions": [cond]}},
                    params={"fieldManager": FIELD_MANAGER},
                    content_type="application/strategic-merge-patch+json")
            except (APIError, APIUnreachable) as e:
                log.info("PodGroup %s (%s) status not written: %s", upd.key, GROUP, e)

    async def _podgroup_status_loop(self) -> None:
        """Write scheduler-plugins PodGroup status as the core decides it (phase, counts,
        and a GangPartiallyBound condition that is never hidden), and Volcano PodGroups'
        phase (Lockstep plays Volcano's enqueue step)."""
        while True:
            await asyncio.sleep(1.0)
            await self._write_volcano_status()
            await self._write_upstream_status()
            for key, st in self.core.podgroup_statuses().items():
                status: dict[str, Any] = {
                    "phase": st.phase, "scheduled": st.scheduled, "running": st.running,
                    "succeeded": st.succeeded, "failed": st.failed}
                if st.partial is not None:
                    status["conditions"] = [{
                        "type": "GangPartiallyBound", "status": "True",
                        "reason": "BindingFailed", "message": render(st.partial)[:1024],
                        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }]
                if self._podgroup_status.get(key, {}).get("phase") == st.phase and \
                        _same(self._podgroup_status.get(key), status):
                    continue
                ns, name = key.split("/", 1)
                path = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}/status"
                try:
                    await self.kube.merge_patch(path, {"status": status})
                    self._podgroup_status[key] = status
                except (APIError, APIUnreachable) as e:
                    log.info("PodGroup %s status not written: %s", key, e)


VOLCANO_PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups/{name}/status"
FIELD_MANAGER = "lockstep"
"""Lockstep's name in managedFields: a PodGroup condition another manager wrote (the native
gang plugin) is not Lockstep's to change."""


def _same(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Equal but for condition timestamps (which would otherwise make every write new)."""
    if old is None:
        return False

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                 for c in d.get("conditions", ())]
        return {**d, "conditions": conds}

    return strip(old) == strip(new)


def _error_text(outcome: BindOutcome) -> str:
    return "" if isinstance(outcome, Bound) else outcome.message
