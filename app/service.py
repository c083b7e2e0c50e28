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
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from coscheduling import (
    BindGroup,
    BindNow,
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
    pod_key,
)
from coscheduling.podgroup import Source

from .cache import ClusterCache
from .errors import APIError, APIUnreachable, Conflict
from .kube import KubeClient
from .metrics import Metrics
from .render import render

__all__ = ["Lockstep", "UnknownObject"]

log = logging.getLogger("lockstep")

REQUEUE_ANNOTATION = "lockstep.dev/requeue"
_WARNING = {NoticeKind.TIMED_OUT, NoticeKind.INVALID, NoticeKind.TIMEOUT_CAPPED}


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
        self._out = _Outbox()
        self._kick = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failed: BaseException | None = None
        self.api_ok = False
        self.stopped = asyncio.Event()
        self._instance = f"{socket.gethostname()}-{os.getpid()}"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        runners: dict[str, Coroutine[Any, Any, None]] = {
            "watch-nodes": self.cache.run("nodes"),
            "watch-pods": self.cache.run("pods"),
            "watch-podgroups": self.cache.run("podgroups"),
            "watch-noderesourcetopologies": self.cache.run("noderesourcetopologies"),
            "deadline-timer": self._timer(),
            "event-poster": self._post_events(),
            "requeue-nudger": self._nudge(),
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

    @property
    def ready(self) -> bool:
        return self.cache.synced and self.api_ok and self.failed is None

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
        pod = self.core.pods.get(key)
        if pod is None:
            raise UnknownObject("pod", key)
        if node not in self.core.nodes:
            raise UnknownObject("node", node)
        if uid and pod.uid and uid != pod.uid:
            return f"pod {key} has uid {pod.uid}, not {uid}: it was recreated"
        now = self.clock()
        decision = self.core.bind(key, NodeName(node), now)
        self._flush()
        match decision:
            case BindNow():
                return await self._bind_one(key, NodeName(node))
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
        results = await asyncio.gather(*(self._bind_one(k, binds[k]) for k in keys))
        ok = sum(1 for err in results if not err)
        mine = ""
        for k, err in zip(keys, results, strict=True):
            if not err:
                detail = f"bound to {binds[k]} together with {ok - 1} other member(s)"
                self._offer(self._out.events,
                            (k, Notice(NoticeKind.BOUND, gang, (k,), detail=detail)))
            if k == own:
                mine = err
                continue
            fut = self._parked.get(k)
            if fut is not None and not fut.done():
                fut.set_result(err)
        return mine

    async def _bind_one(self, key: PodKey, node: NodeName) -> str:
        pod = self.core.pods.get(key)
        if pod is None:
            self.metrics.bind_errors.labels("PodGone").inc()
            return f"pod {key} was deleted before it could be bound"
        delay = 0.2
        for attempt in range(self.bind_retries + 1):
            try:
                await self.kube.bind(pod.namespace, pod.name, pod.uid, node)
                self.metrics.binds.inc()
                return ""
            except Conflict as e:
                current = self.core.pods.get(key)
                if current is not None and current.node_name == node:
                    return ""  # already bound where we wanted it (a retried call)
                self.core.bind_failed(key)
                self.metrics.bind_errors.labels("Conflict").inc()
                return f"binding {key} to {node}: {e.message}"
            except APIError as e:
                if e.status < 500 and e.status != 429:
                    self.core.bind_failed(key)
                    self.metrics.bind_errors.labels(type(e).__name__).inc()
                    return f"binding {key} to {node}: {e.status} {e.message}"
            except APIUnreachable:
                pass
            if attempt < self.bind_retries:
                await asyncio.sleep(delay)
                delay *= 2
        self.core.bind_failed(key)
        self.metrics.bind_errors.labels("Unavailable").inc()
        return f"binding {key} to {node}: API server unavailable; kube-scheduler will retry"

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
        """Move the core's notices and requeue requests to the background posters."""
        for notice in self.core.drain_notices():
            for pod in notice.pods:
                self._offer(self._out.events, (pod, notice))
        for pod in self.core.drain_requeue():
            self._offer(self._out.requeue, pod)
        self._kick.set()

    def _offer(self, q: asyncio.Queue[Any], item: Any) -> None:
        try:
            q.put_nowait(item)
        except asyncio.QueueFull:
            self._out.dropped += 1

    def notice_text(self, notice: Notice) -> str:
        gang = notice.gang or "?"
        match notice.kind:
            case NoticeKind.ADMITTED:
                return f"gang {gang} admitted, capacity reserved: {notice.detail}"
            case NoticeKind.RELEASED:
                return f"gang {gang} reached quorum ({notice.detail}); members bind together"
            case NoticeKind.BOUND:
                return f"gang {gang}: {notice.detail}"
            case NoticeKind.TIMEOUT_CAPPED:
                return f"gang {gang}: timeout {notice.detail} (kube-scheduler httpTimeout bound)"
        return render(notice.reason) if notice.reason is not None else f"gang {gang}"

    async def _post_events(self) -> None:
        while True:
            key, notice = await self._out.events.get()
            pod = self.core.pods.get(key)
            if pod is None:
                continue
            message = self.notice_text(notice)
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
            pod = self.core.pods.get(key)
            if pod is None or pod.node_name is not None:
                continue
            seq += 1
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            patch = {"metadata": {"annotations": {REQUEUE_ANNOTATION: f"{time.time():.3f}-{seq}"}}}
            try:
                await self.kube.merge_patch(path, patch)
            except (APIError, APIUnreachable) as e:
                log.info("requeue of %s failed: %s", key, e)

    async def _podgroup_status_loop(self) -> None:
        """Keep scheduler-plugins PodGroup status (phase, counts) in step with the cache."""
        while True:
            await asyncio.sleep(1.0)
            now = self.clock()
            for view in self.core.gang_views(now):
                if view.spec is None or view.spec.source is not Source.SCHEDULER_PLUGINS:
                    continue
                members = [
                    p for p in self.core.pods.values()
                    if self.core.gang_of(p.key) == view.key
                ]
                running = sum(1 for p in members if p.phase == "Running")
                succeeded = sum(1 for p in members if p.phase == "Succeeded")
                failed = sum(1 for p in members if p.phase == "Failed")
                scheduled = sum(1 for p in members if p.node_name is not None)
                if succeeded >= view.spec.min_member:
                    phase = "Finished"
                elif running >= view.spec.min_member:
                    phase = "Running"
                elif failed:
                    spare = len(members) - view.spec.min_member
                    phase = "Failed" if failed > spare else "Scheduling"
                elif view.plan or view.parked or scheduled:
                    phase = "Scheduling"
                else:
                    phase = "Pending"
                status = {"phase": phase, "scheduled": scheduled, "running": running,
                          "succeeded": succeeded, "failed": failed}
                if self._podgroup_status.get(view.key) == status:
                    continue
                ns, name = view.key.split("/", 1)
                path = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}/status"
                try:
                    await self.kube.merge_patch(path, {"status": status})
                    self._podgroup_status[view.key] = status
                except (APIError, APIUnreachable) as e:
                    log.info("PodGroup %s status not written: %s", view.key, e)
