"""The app's gate lifter: one PATCH per member and target, retried when transient, dropped
when the pod is gone or recreated, and no admission before the cache has synced."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from app.kube.client import KubeClient, KubeConfig
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest
from coscheduling.gang.gating import GANG_GATE, pinned_node
from tests.builders import node, pod
from tests.fakeapi import Wire


class PatchAPI:
    """Answers PATCHes from ``script`` (pod name -> statuses, then 200); records them."""

    def __init__(self, script: dict[str, list[int]] | None = None) -> None:
        self.script = script or {}
        self.patches: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method != "PATCH":
            return httpx.Response(201, json={})
        name = request.url.path.rsplit("/", 1)[-1]
        self.patches.append((name, request.headers["content-type"],
                             json.loads(request.content)))
        todo = self.script.get(name)
        status = todo.pop(0) if todo else 200
        return httpx.Response(status, json={"reason": "Scripted", "message": str(status)})

    def names(self) -> list[str]:
        return sorted(n for n, _, _ in self.patches)


def service(api: PatchAPI, *, synced: bool = True) -> Lockstep:
    core = Coscheduler(Settings(backoff_seconds=5))
    for i in range(2):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(4).build()))
    svc = Lockstep(core, KubeClient(KubeConfig("http://api.test"),
                                    connect=Wire(api)))
    for res in svc.cache.resources.values():
        res.synced = synced
    return svc


def held(svc: Lockstep, n: int, gang: str = "g") -> None:
    for i in range(n):
        obj = pod(f"{gang}-{i}").gang(gang, n, timeout=30).gpu(1).gated().build()
        obj["metadata"]["uid"] = f"uid-{gang}-{i}"
        svc.core.upsert_pod(pod_from_json(obj))


async def run_lifters(svc: Lockstep, seconds: float) -> None:
    tasks = [asyncio.create_task(svc.poster.lift()) for _ in range(4)]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_each_member_is_lifted_once_pinned_to_its_planned_node() -> None:
    api = PatchAPI()
    svc = service(api)
    held(svc, 3)
    svc.after_change()
    svc.after_change()  # the same targets again: nothing more to write
    await run_lifters(svc, 0.1)
    # Events on the gang before the watch shows the gates gone re-queue its gated members.
    again = svc.core.queries.pod(next(iter(sorted(svc.core.queries.gangs["default/g"].members))))
    assert again is not None and again.gated
    svc.core.upsert_pod(again)
    svc.after_change()
    await run_lifters(svc, 0.1)
    assert api.names() == ["g-0", "g-1", "g-2"]
    plan = svc.core.queries.plans()[next(iter(svc.core.queries.plans()))]
    for name, ctype, body in api.patches:
        assert ctype == "application/strategic-merge-patch+json"
        assert body["metadata"] == {"uid": f"uid-{name}"}
        assert body["spec"]["schedulingGates"] == [{"$patch": "delete", "name": GANG_GATE}]
        terms = body["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert pinned_node(tuple(terms)) == plan[f"default/{name}"]


async def test_a_transient_failure_is_retried_and_a_conflict_is_dropped() -> None:
    api = PatchAPI({"g-0": [503], "g-1": [409]})
    svc = service(api)
    held(svc, 3)
    svc.after_change()
    await run_lifters(svc, 0.6)  # the retry comes 0.2 s after the 503
    assert api.names() == ["g-0", "g-0", "g-1", "g-2"]
    samples = {s.labels.get("outcome"): s.value for m in svc.metrics.registry.collect()
               if m.name == "lockstep_gate_lifts" for s in m.samples
               if s.name.endswith("_total")}
    assert samples.get("pinned") == 2.0  # g-0 after its retry, g-2; g-1's pod was replaced


async def test_nothing_is_lifted_before_the_verbs_are_served() -> None:
    """The CLI lists the cluster while FastAPI loads: a member lifted then would meet a
    closed port on its filter call."""
    api = PatchAPI()
    svc = service(api)
    svc.verbs_served = False
    held(svc, 3)
    svc.after_change()
    await run_lifters(svc, 0.1)
    assert api.patches == [] and not svc.core.queries.plans()
    svc.serve_verbs()  # admits at once, without waiting for another event
    await run_lifters(svc, 0.1)
    assert api.names() == ["g-0", "g-1", "g-2"]


async def test_nothing_is_admitted_or_lifted_before_the_cache_has_synced() -> None:
    api = PatchAPI()
    svc = service(api, synced=False)
    held(svc, 3)
    svc.after_change()
    await run_lifters(svc, 0.1)
    assert api.patches == [] and not svc.core.queries.plans()
    for res in svc.cache.resources.values():
        res.synced = True
    svc.after_change()
    await run_lifters(svc, 0.1)
    assert api.names() == ["g-0", "g-1", "g-2"]


async def test_a_lift_dropped_by_a_full_queue_is_offered_again_on_the_pods_next_event() -> None:
    """A dropped lift must not stay marked as queued: the member would stay gated for good."""
    api = PatchAPI()
    svc = service(api)
    svc.poster.lifts = asyncio.Queue(1)
    svc.poster.lifts.put_nowait(("default/other", 0))  # full: every offer is dropped
    held(svc, 2)
    svc.after_change()
    assert svc.poster.dropped >= 2 and api.patches == []
    svc.poster.lifts = asyncio.Queue()
    for key in sorted(svc.core.queries.gangs["default/g"].members):  # the next watch event on each
        again = svc.core.queries.pod(key)
        assert again is not None
        svc.core.upsert_pod(again)
    svc.after_change()
    await run_lifters(svc, 0.1)
    assert api.names() == ["g-0", "g-1"]
