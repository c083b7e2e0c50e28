"""List/watch into the core with canned API responses: resume, 410 Gone, deletions in the gap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from app.kube.cache import ClusterCache
from app.kube.client import KubeClient, KubeConfig
from coscheduling import Coscheduler, node_from_json
from coscheduling.events import ingest
from coscheduling.topology.domains import nrt_from_json
from tests.builders import node, pod
from tests.fakeapi import Wire
from tests.internals import state_of


def pod_json(name: str, rv: str) -> dict[str, Any]:
    p = pod(name).gpu(1).on("n0").build()
    p["metadata"]["resourceVersion"] = rv
    p["metadata"]["uid"] = f"uid-{name}"  # the same pod across events
    return p


class CannedAPI:
    """Answers lists from ``lists`` (consumed in order) and watches from ``watches``."""

    def __init__(self, lists: list[dict[str, Any]], watches: list[list[dict[str, Any]]]) -> None:
        self.lists, self.watches = lists, watches
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url.params))
        if request.url.params.get("watch"):
            if not self.watches:
                return httpx.Response(200, content=b"")  # an idle watch that just ends
            lines = b"".join(json.dumps(e).encode() + b"\n" for e in self.watches.pop(0))
            return httpx.Response(200, content=lines)
        return httpx.Response(200, json=self.lists.pop(0))


async def run_until(cache: ClusterCache, kind: str, done: Any) -> None:
    task = asyncio.create_task(cache.run(kind))
    try:
        for _ in range(500):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")
    finally:
        task.cancel()


async def test_relist_after_410_replaces_the_cache_including_deletions() -> None:
    api = CannedAPI(
        lists=[
            {"metadata": {"resourceVersion": "10"},
             "items": [pod_json("a", "9"), pod_json("b", "10")]},
            # After the 410, "a" is gone (deleted while we were not watching) and "c" is new.
            {"metadata": {"resourceVersion": "30"},
             "items": [pod_json("b", "10"), pod_json("c", "29")]},
        ],
        watches=[
            [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
             {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
        ],
    )
    core = Coscheduler()
    core.upsert(ingest.NODES, node_from_json(node("n0").gpus(8).build()))
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"),
                                          connect=Wire(api)))
    await run_until(cache, "pods", lambda: "default/c" in core.queries.pods)
    assert sorted(core.queries.pods) == ["default/b", "default/c"]
    assert core.queries.free("n0")["nvidia.com/gpu"] == 6  # usage of "a" was released
    assert cache.resources["pods"].relists == 2
    # The first watch resumed from the list's resourceVersion.
    assert any("resourceVersion=10" in r and "watch=1" in r for r in api.requests)


async def test_first_node_list_from_the_watch_cache_relists_consistent() -> None:
    n0 = node("n0").gpus(8).build()
    api = CannedAPI(
        lists=[{"metadata": {"resourceVersion": "10"}, "items": [n0]},
               {"metadata": {"resourceVersion": "30"}, "items": [n0]}],
        watches=[[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]],
    )
    core = Coscheduler()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"),
                                          connect=Wire(api)))
    await run_until(cache, "nodes", lambda: cache.resources["nodes"].relists == 2)
    lists = [r for r in api.requests if "watch" not in r]
    assert lists[0] == "limit=500&resourceVersion=0"
    assert lists[1] == "limit=500"  # after the 410: a consistent read, as client-go does
    assert ("n0" in core.queries.nodes)


async def test_pods_are_always_listed_page_by_page_consistent() -> None:
    api = CannedAPI(lists=[{"metadata": {"resourceVersion": "5"}, "items": []}], watches=[])
    cache = ClusterCache(Coscheduler(), KubeClient(KubeConfig("http://api.test"),
                                                   connect=Wire(api)))
    await run_until(cache, "pods", lambda: cache.resources["pods"].synced)
    assert api.requests[0] == "limit=500"


async def test_watch_events_apply_and_resume_from_the_last_version() -> None:
    api = CannedAPI(
        lists=[{"metadata": {"resourceVersion": "5"}, "items": []}],
        watches=[
            [{"type": "ADDED", "object": pod_json("x", "6")},
             {"type": "MODIFIED", "object": pod_json("x", "7")}],
            [{"type": "DELETED", "object": pod_json("x", "8")}],
        ],
    )
    core = Coscheduler()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"),
                                          connect=Wire(api)))
    seen: list[bool] = []
    cache.on_change = lambda: seen.append("default/x" in core.queries.pods)
    await run_until(cache, "pods", lambda: len(seen) >= 4)
    assert seen[1:4] == [True, True, False]
    assert any("resourceVersion=7" in r for r in api.requests)


async def test_missing_crd_counts_as_synced_empty() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"reason": "NotFound", "message": "no such resource"})

    core = Coscheduler()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"),
                                          connect=Wire(api)))
    await run_until(cache, "podgroups", lambda: cache.resources["podgroups"].synced)


def test_node_resource_topology_zones() -> None:
    z = nrt_from_json({
        "metadata": {"name": "n0"},
        "zones": [
            {"name": "node-0", "type": "Node",
             "resources": [{"name": "nvidia.com/gpu", "capacity": "4", "available": "1"}]},
            {"name": "node-1", "type": "Node",
             "resources": [{"name": "nvidia.com/gpu", "capacity": "4", "available": "3"}]},
        ],
    })
    assert z is not None and z.gpus_available == (1, 3)
    assert z.best_fit(2) == 1 and z.best_fit(1) == 0 and z.best_fit(4) is None
    assert nrt_from_json({"metadata": {"name": "n1"}, "zones": [{"type": "Node"}]}) is None


async def test_unknown_api_group_plain_text_404_is_synced_empty() -> None:
    """kube-apiserver answers an unserved group with text, not a Status object."""
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, content=b"404 page not found\n")

    cache = ClusterCache(Coscheduler(), KubeClient(KubeConfig("http://api.test"),
                                                   connect=Wire(api)))
    await run_until(cache, "noderesourcetopologies",
                    lambda: cache.resources["noderesourcetopologies"].synced)


def _crd(name: str, established: bool) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "7"},
            "status": {"conditions": [{"type": "Established",
                                       "status": "True" if established else "False"}]}}


async def test_a_crd_established_after_start_wakes_its_resource_at_once() -> None:
    """Volcano's PodGroup CRD is installed while Lockstep waits: the CRD watch wakes the
    PodGroup loop, which lists well before its 30 s poll would."""
    crd_events: asyncio.Queue[bytes] = asyncio.Queue()
    installed = False
    lists: list[float] = []
    loop = asyncio.get_running_loop()
    vpg = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
           "metadata": {"name": "pg", "namespace": "default", "resourceVersion": "3"},
           "spec": {"minMember": 2}}

    def api(request: httpx.Request) -> httpx.Response:
        path, watch = request.url.path, request.url.params.get("watch")
        if path.endswith("/customresourcedefinitions"):
            if not watch:
                return httpx.Response(200, json={"metadata": {"resourceVersion": "5"},
                                                 "items": [_crd("other.example.com", True)]})
            try:
                line = crd_events.get_nowait()
            except asyncio.QueueEmpty:
                return httpx.Response(200, content=b"")
            return httpx.Response(200, content=line)
        if path == "/apis/scheduling.volcano.sh/v1beta1/podgroups":
            if not installed:
                return httpx.Response(404, content=b"404 page not found\n")
            if watch:
                return httpx.Response(200, content=b"")
            lists.append(loop.time())
            return httpx.Response(200, json={"metadata": {"resourceVersion": "4"},
                                             "items": [vpg]})
        return httpx.Response(404, content=b"404 page not found\n")

    core = Coscheduler()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"), connect=Wire(api)))
    assert set(cache.crd_names()) == {
        "podgroups.scheduling.x-k8s.io", "podgroups.scheduling.volcano.sh",
        "noderesourcetopologies.topology.node.k8s.io", "queues.scheduling.volcano.sh",
        "jobsets.jobset.x-k8s.io", "leaderworkersets.leaderworkerset.x-k8s.io"}
    crds = asyncio.create_task(cache.watch_crds())
    res = cache.resources["volcano-podgroups"]
    try:
        await run_until(cache, "volcano-podgroups", lambda: res.synced)
        loop_task = asyncio.create_task(cache.run("volcano-podgroups"))
        await asyncio.sleep(0.1)  # asleep on the missing CRD now
        installed = True
        t0 = loop.time()
        # Created, not yet Established: nothing to list; then Established.
        for ev in (_crd("podgroups.scheduling.volcano.sh", False),
                   _crd("podgroups.scheduling.volcano.sh", True)):
            crd_events.put_nowait(json.dumps({"type": "MODIFIED", "object": ev}).encode()
                                  + b"\n")
        for _ in range(300):
            if "default/pg" in state_of(core).store.volcano:
                break
            await asyncio.sleep(0.01)
        assert "default/pg" in state_of(core).store.volcano
        assert lists and lists[0] - t0 < 2.0
        loop_task.cancel()
    finally:
        crds.cancel()


async def test_crd_watch_refused_falls_back_to_the_poll_and_says_so_once(
        caplog: Any) -> None:
    calls: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(403, json={"reason": "Forbidden", "message": "no"})

    cache = ClusterCache(Coscheduler(), KubeClient(KubeConfig("http://api.test"),
                                                   connect=Wire(api)))
    task = asyncio.create_task(cache.watch_crds())
    await asyncio.sleep(0.2)
    assert not task.done()  # it keeps the service up: the poll stands
    task.cancel()
    assert len(calls) == 1
    assert sum("every 30s" in r.getMessage() for r in caplog.records) == 1


async def test_volcano_queues_are_read_and_their_absence_means_no_gating() -> None:
    served = False

    def api(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") or not served:
            return httpx.Response(404 if not served else 200,
                                  content=b"404 page not found\n" if not served else b"")
        return httpx.Response(200, json={"metadata": {"resourceVersion": "3"}, "items": [
            {"metadata": {"name": "team"}, "spec": {"capability": {"nvidia.com/gpu": "4"}},
             "status": {"state": "Closed"}}]})

    core = Coscheduler()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"), connect=Wire(api)))
    res = cache.resources["volcano-queues"]
    await run_until(cache, "volcano-queues", lambda: res.synced)
    assert state_of(core).store.queues is None  # no CRD: nothing is gated
    served = True  # the CRD is installed; the loop lists again
    await run_until(cache, "volcano-queues", lambda: res.relists >= 1)
    assert state_of(core).store.queues is not None
    q = state_of(core).store.queues["team"]
    assert (q.capability, q.state) == ({"nvidia.com/gpu": 4}, "Closed")
