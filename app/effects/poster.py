"""The API writes the core asks for outside a verb's answer: Events, requeue nudges and gate
lifts, each from its own bounded queue, by supervised loops.

A full queue drops the item and counts it (``dropped``) rather than block a verb: an Event or
a nudge lost under overload costs a person a message or a pod a backoff, never correctness.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from coscheduling import Coscheduler, Eviction, NodeName, Notice, NoticeKind, PodKey, lift_patch

from ..kube.client import KubeClient
from ..kube.errors import APIError, APIUnreachable, Conflict, NotFound
from ..metrics import Metrics
from ..render import render_notice

__all__ = ["LIFTERS", "LIFT_RETRIES", "REQUEUE_ANNOTATION", "Poster"]

log = logging.getLogger("lockstep")

REQUEUE_ANNOTATION = "lockstep.dev/requeue"
LIFTERS = 64
"""Gate lifts in flight at once. A lift waits 50-200 ms on a loaded API server, mostly in
queues rather than on a CPU, so the lifts in flight set the pace at which kube-scheduler
gets pods: 8 capped Lockstep at ~140 pods/s; from 32 to 64, four interleaved pairs of
1,000-node runs gave 147-176 pods/s against 131-153."""
LIFT_RETRIES = 5
QUEUE_SIZE = 20000
MOVE_RETRY = 0.2
"""Seconds before the first retry of a refused move (doubled each time, five tries)."""
HISTORY_PER_GANG = 20
HISTORY_GANGS = 5000
_WARNING = {NoticeKind.TIMED_OUT, NoticeKind.INVALID, NoticeKind.TIMEOUT_CAPPED,
            NoticeKind.PARTIALLY_BOUND}


class Poster:
    def __init__(self, core: Coscheduler, kube: KubeClient, metrics: Metrics,
                 clock: Callable[[], float]) -> None:
        self.core, self.kube, self.metrics, self.clock = core, kube, metrics, clock
        self.events: asyncio.Queue[tuple[PodKey, Notice]] = asyncio.Queue(QUEUE_SIZE)
        self.requeue: asyncio.Queue[PodKey] = asyncio.Queue(QUEUE_SIZE)
        self.lifts: asyncio.Queue[tuple[PodKey, int]] = asyncio.Queue(QUEUE_SIZE)
        """Gated pods to take Lockstep's gate off, with the attempt number."""
        self.evictions: asyncio.Queue[Eviction] = asyncio.Queue(QUEUE_SIZE)
        self.deallocations: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue(QUEUE_SIZE)
        """DRA claims whose allocation to clear: (namespace/name, uid, resourceVersion)."""
        self.dropped = 0
        self._posted: dict[tuple[PodKey, str, str], float] = {}
        self._lift_queued: set[PodKey] = set()
        self._lift_sent: dict[PodKey, tuple[str, NodeName | None]] = {}
        """The lift last written per pod: events on a pod still cached as gated must not
        write it again before the watch shows the gate gone."""
        self._instance = f"{socket.gethostname()}-{os.getpid()}"
        self.history: OrderedDict[str, deque[dict[str, str]]] = OrderedDict()
        """The Events Lockstep posted, newest gangs last, for the web page (app/http/ui.py)."""

    def offer(self, q: asyncio.Queue[Any], item: Any) -> bool:
        """Queue ``item`` unless ``q`` is full (counted in ``dropped``); says whether it was."""
        try:
            q.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        return True

    def offer_lift(self, pod: PodKey, uid: str, node: NodeName | None) -> None:
        """Queue a lift unless the same one is queued or was written already."""
        if (pod not in self._lift_queued and self._lift_sent.get(pod) != (uid, node)
                and self.offer(self.lifts, (pod, 0))):
            self._lift_queued.add(pod)

    async def post_events(self) -> None:
        while True:
            key, notice = await self.events.get()
            pod = self.core.queries.pod(key)
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
            self._remember(notice.gang, event)
            try:
                await self.kube.post_event(pod.namespace, event)
            except (APIError, APIUnreachable) as e:
                log.info("event for %s not posted: %s", key, e)

    def _remember(self, gang: str | None, event: dict[str, Any]) -> None:
        """Keep the last HISTORY_PER_GANG Events of the last HISTORY_GANGS gangs."""
        if gang is None:
            return
        kept = self.history.pop(gang, None) or deque(maxlen=HISTORY_PER_GANG)
        kept.append({k: event[k] for k in ("reason", "message", "type", "lastTimestamp")}
                    | {"pod": event["involvedObject"]["name"]})
        self.history[gang] = kept
        while len(self.history) > HISTORY_GANGS:
            self.history.popitem(last=False)

    async def nudge(self) -> None:
        """Touch an annotation so kube-scheduler moves the pod back to its active queue.

        Pods turned away by an extender wait in kube-scheduler's unschedulable queue until a
        cluster event; when the event that matters happens only inside Lockstep (a gang was
        admitted, a reservation released, a backoff ended), nothing would wake them.
        """
        seq = 0
        while True:
            key = await self.requeue.get()
            pod = self.core.queries.pod(key)
            if pod is None or pod.node_name is not None:
                continue
            seq += 1
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            patch = {"metadata": {"annotations": {REQUEUE_ANNOTATION: f"{time.time():.3f}-{seq}"}}}
            try:
                await self.kube.merge_patch(path, patch)
            except (APIError, APIUnreachable) as e:
                log.info("requeue of %s failed: %s", key, e)

    async def deallocate(self) -> None:
        """Clear the allocation of a DRA claim nobody will use (``coscheduling.devices.stale``:
        kube-scheduler unreserved it and keeps the allocation), as its DynamicResources
        PostFilter does. The uid and resourceVersion are preconditions: a claim reserved or
        changed meanwhile is left alone (the next change is looked at again)."""
        while True:
            key, uid, rv = await self.deallocations.get()
            namespace, name = key.split("/", 1)
            path = (f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/"
                    f"{name}/status")
            outcome = "cleared"
            try:
                await self.kube.merge_patch(path, {
                    "metadata": {"uid": uid, "resourceVersion": rv},
                    "status": {"allocation": None}})
            except (APIError, APIUnreachable) as e:
                outcome = "left"
                log.info("clearing the allocation of claim %s failed: %s", key, e)
            self.metrics.claims_deallocated.labels(outcome).inc()

    def offer_evictions(self, evictions: list[Eviction]) -> None:
        """Queue victims to evict, counting each preemption and its victim units once."""
        if not evictions:
            return
        for preemptor in {e.preemptor for e in evictions if not e.move}:
            self.metrics.preemptions.inc()
            mine = [e for e in evictions if e.preemptor == preemptor and not e.move]
            gangs = {e.gang for e in mine if e.gang is not None}
            self.metrics.preemption_victims.labels("gang").inc(len(gangs))
            self.metrics.preemption_victims.labels("pod").inc(
                sum(1 for e in mine if e.gang is None))
        for e in evictions:
            self.offer(self.evictions, e)

    async def evict(self) -> None:
        """Evict preemption victims as kube-scheduler does: the ``DisruptionTarget``
        condition (reason ``PreemptionByScheduler``) so controllers see why the pod went,
        then a delete with the pod's own grace period. Both carry the victim's UID as a
        precondition: a pod recreated under the same name (training operators do that) is
        never touched. Transient failures are retried; a victim that is already gone is
        done."""
        while True:
            ev = await self.evictions.get()
            namespace, name = ev.pod.split("/", 1)
            path = f"/api/v1/namespaces/{namespace}/pods/{name}"
            if ev.move:
                await self._move(ev, namespace, name, path)
                continue
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            condition = {
                "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                "message": f"lockstep: preempting to accommodate gang {ev.preemptor} "
                           f"(priority {ev.priority})",
                "lastTransitionTime": stamp,
            }
            outcome = "failed"
            for attempt in range(5):
                try:
                    await self.kube.strategic_patch(path + "/status", {
                        "metadata": {"uid": ev.uid}, "status": {"conditions": [condition]}})
                    await self.kube.request("DELETE", path, json={
                        "kind": "DeleteOptions", "apiVersion": "v1",
                        "preconditions": {"uid": ev.uid}})
                    outcome = "deleted"
                    break
                except APIError as e:
                    if e.status in (404, 409):
                        outcome = "gone"
                        break
                    if e.status < 500 and e.status != 429:
                        log.warning("eviction of %s for %s refused: %s", ev.pod,
                                    ev.preemptor, e)
                        break
                except APIUnreachable:
                    pass
                await asyncio.sleep(0.2 * 2 ** attempt)
            self.metrics.evictions.labels(outcome).inc()

    async def _move(self, ev: Eviction, namespace: str, name: str, path: str) -> None:
        """Evict a pod moved to make room for a gang through the Eviction API, so the API
        server refuses it when a PodDisruptionBudget would break (429, the budget named in
        its message; logged and counted ``refused``: the move's record then lapses at its
        deadline and the gang is planned again). The UID is a precondition, as for victims."""
        outcome = "failed"
        for attempt in range(5):
            try:
                await self.kube.request("POST", path + "/eviction", json={
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace},
                    "deleteOptions": {"preconditions": {"uid": ev.uid}}})
                outcome = "evicted"
                break
            except APIError as e:
                if e.status in (404, 409):
                    outcome = "gone"
                    break
                if e.status == 429:
                    outcome = "refused"
                    log.warning("move of %s for gang %s refused: %s", ev.pod, ev.preemptor,
                                e.message)
                elif e.status < 500:
                    log.warning("move of %s for gang %s failed: %s", ev.pod, ev.preemptor, e)
                    break
            except APIUnreachable:
                pass
            await asyncio.sleep(MOVE_RETRY * 2 ** attempt)
        self.metrics.defrag_moves.labels(outcome).inc()

    async def lift(self) -> None:
        """Take Lockstep's gate off a pod, pinning it to its planned node in the same write.

        The target is asked of the core when the PATCH is sent, not when it was queued, so a
        plan that moved meanwhile is honoured. A pod recreated under the same name fails the
        UID precondition and a deleted one 404s: both are dropped, since the watch brings
        the new pod back through the core. Transient failures are retried; a refusal (422:
        say, a validating webhook) leaves the pod gated and is logged."""
        while True:
            key, attempt = await self.lifts.get()
            self._lift_queued.discard(key)
            lift = self.core.queries.lift_target(key)
            pod = self.core.queries.pod(key)
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
            0.2 * 2 ** attempt, self.offer, self.lifts, (key, attempt + 1))
