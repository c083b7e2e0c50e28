"""The HTTP edge: wire format, bad input, parked binds, debug endpoints.

The Kubernetes API is faked beneath Lockstep's own HTTP client (``tests.fakeapi.Wire``);
the core is real.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json, pod_key
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.fakeapi import Wire


class FakeAPI:
    """Records every call; bindings succeed unless the pod name is in ``fail``; a pod is read
    from ``pods`` (404 otherwise)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail: set[str] = set()
        self.forbid: set[str] = set()
        self.pods: dict[str, dict[str, Any]] = {}
        """Pods the API server has that the watch may not have shown yet (by name)."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        if request.method == "GET" and "/pods/" in request.url.path:
            name = request.url.path.rsplit("/", 1)[1]
            if name in self.pods:
                return httpx.Response(200, json=self.pods[name])
            return httpx.Response(404, json={"reason": "NotFound", "message": "not found"})
        if request.url.path.endswith("/binding"):
            name = request.url.path.split("/")[-2]
            if name in self.fail:
                return httpx.Response(409, json={"reason": "Conflict", "message": "taken"})
            if name in self.forbid:
                return httpx.Response(403, json={"reason": "Forbidden", "message": "denied"})
        return httpx.Response(201, json={})

    def bindings(self) -> list[tuple[str, str]]:
        return [(p.split("/")[-2], b["target"]["name"]) for m, p, b in self.calls
                if p.endswith("/binding")]


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI()


@pytest.fixture
def service(api: FakeAPI) -> Lockstep:
    core = Coscheduler(Settings(backoff_seconds=5))
    for i in range(3):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(2).build()))
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    return Lockstep(core, kube)


@pytest.fixture
async def client(service: Lockstep) -> AsyncIterator[httpx.AsyncClient]:
    app = extender_app(service, max_body=200_000)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://lockstep.test") as c:
        yield c


def filter_body(p: dict[str, Any], names: list[str] | None = None) -> dict[str, Any]:
    listed = names if names is not None else ["n0", "n1", "n2"]
    return {"Pod": p, "Nodes": None, "NodeNames": listed}


async def test_plain_pod_passes_every_candidate_in_wire_format(client: httpx.AsyncClient) -> None:
    r = await client.post("/filter", json=filter_body(pod("web").gpu(1).build()))
    assert r.status_code == 200
    assert r.json() == {"Nodes": None, "NodeNames": ["n0", "n1", "n2"], "FailedNodes": {},
                        "FailedAndUnresolvableNodes": {}, "Error": ""}


async def test_gang_short_of_members_is_unresolvable_with_reason(client: httpx.AsyncClient,
                                                           service: Lockstep) -> None:
    p = pod("a0").gang("a", min_member=4).gpu(1).build()
    service.core.upsert_pod(pod_from_json(p))  # what the pod watch delivers first
    r = await client.post("/filter", json=filter_body(p))
    body = r.json()
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"] == dict.fromkeys(
        ["n0", "n1", "n2"], "gang default/a: 1/4 members exist, waiting for 3 more")


async def test_prioritize_scores_every_node_in_range(client: httpx.AsyncClient) -> None:
    r = await client.post("/prioritize", json=filter_body(pod("w").gpu(1).build()))
    assert r.status_code == 200
    scores = r.json()
    assert [s["Host"] for s in scores] == ["n0", "n1", "n2"]
    assert all(0 <= s["Score"] <= 10 for s in scores)


@pytest.mark.parametrize(
    ("path", "raw", "want_status", "want_in_error"),
    [
        pytest.param("/filter", b"{not json", 400, "malformed JSON", id="filter-malformed"),
        pytest.param("/filter", b"", 400, "empty request body", id="filter-empty"),
        pytest.param("/filter", b"[]", 422, "body", id="filter-not-object"),
        pytest.param("/filter", b'{"NodeNames": []}', 422, "Pod", id="filter-missing-pod"),
        pytest.param("/filter", b'{"Pod": {}, "NodeNames": []}', 422, "Pod.metadata",
                     id="filter-pod-without-metadata"),
        pytest.param("/filter", b'{"Pod": {"metadata": {"name": "p"}, "spec": {}}, '
                     b'"NodeNames": "n0"}', 422, "NodeNames", id="filter-names-not-list"),
        pytest.param("/filter", b'{"Pod": {"metadata": {"name": "p"}, "spec": {}}, '
                     b'"NodeNames": null, "Nodes": null}', 422, "NodeNames",
                     id="filter-no-nodes-at-all"),
        pytest.param("/filter", b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": '
                     b'[{"resources": {"requests": {"cpu": "lots"}}}]}}, "NodeNames": []}',
                     422, "lots", id="filter-bad-quantity"),
        pytest.param("/prioritize", b'{"Pod": 7, "NodeNames": []}', 422, "Pod",
                     id="prioritize-pod-not-object"),
        pytest.param("/bind", b'{"PodName": "x"}', 422, "PodNamespace", id="bind-missing-fields"),
        pytest.param("/bind", b'{"PodName": 3, "PodNamespace": "d", "Node": "n0"}', 422,
                     "PodName", id="bind-mistyped"),
        pytest.param("/bind", b'{"PodName": "ghost", "PodNamespace": "d", "Node": "n0"}', 404,
                     "pod d/ghost", id="bind-unknown-pod"),
        pytest.param("/filter", b'{"Pod": {}, "NodeNames": ["' + b"x" * 300_000 + b'"]}', 413,
                     "limit", id="filter-huge"),
    ],
)
async def test_bad_input_is_a_4xx_naming_the_problem(
    client: httpx.AsyncClient, service: Lockstep, path: str, raw: bytes, want_status: int,
    want_in_error: str,
) -> None:
    before = (dict(service.core.queries.pods), dict(service.core.queries.nodes))
    r = await client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == want_status, r.text
    assert want_in_error in r.json()["error"] + " ".join(r.json()["fields"])
    assert (dict(service.core.queries.pods), dict(service.core.queries.nodes)) == before


async def test_bind_unknown_node_is_404(client: httpx.AsyncClient, service: Lockstep) -> None:
    service.core.upsert_pod(pod_from_json(pod("p").build()))
    r = await client.post("/bind", json={"PodName": "p", "PodNamespace": "default", "Node": "nope"})
    assert r.status_code == 404 and "node nope" in r.json()["error"]


async def test_parked_binds_wait_for_the_quorum_then_all_bind(
    service: Lockstep, api: FakeAPI
) -> None:
    for i in range(3):
        service.core.upsert_pod(pod_from_json(pod(f"p{i}").gang("g", min_member=3).gpu(1).build()))
    pods = service.core.queries.pods
    nodes = {i: service.filter(pods[f"default/p{i}"], ["n0", "n1", "n2"]).passed[0]  # type: ignore[index]
             for i in range(3)}
    first = asyncio.ensure_future(service.bind("default", "p0", "", nodes[0]))
    second = asyncio.ensure_future(service.bind("default", "p1", "", nodes[1]))
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()
    assert api.bindings() == []
    third = await service.bind("default", "p2", "", nodes[2])
    assert third == "" and await first == "" and await second == ""
    assert sorted(api.bindings()) == sorted((f"p{i}", nodes[i]) for i in range(3))


async def test_deadline_answers_parked_binds_with_the_reason(
    service: Lockstep, api: FakeAPI
) -> None:
    clock = [100.0]
    service.clock = lambda: clock[0]
    for i in range(2):
        service.core.upsert_pod(pod_from_json(
            pod(f"p{i}").gang("g", min_member=2, timeout=10).gpu(1).build()))
    n0 = service.filter(service.core.queries.pods["default/p0"], ["n0", "n1", "n2"]).passed[0]  # type: ignore[index]
    timer = asyncio.ensure_future(service.binder.expire_loop())
    parked = asyncio.ensure_future(service.bind("default", "p0", "", n0))
    await asyncio.sleep(0.05)
    clock[0] = 111.0
    service.kick.set()
    err = await asyncio.wait_for(parked, 5)
    timer.cancel()
    assert err.startswith("gang default/g timed out after 10s with 1/2 members ready to bind")
    assert api.bindings() == []


async def test_kicks_in_a_burst_coalesce_into_sweeps_at_least_a_gap_apart(
    service: Lockstep, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every event and verb kicks the deadline timer; a sweep reads every gang, so a burst
    of kicks must not become a sweep each (it was one per loop turn)."""
    from app.effects.binder import SWEEP_GAP

    sweeps: list[float] = []
    expire = service.core.expire

    def counting(now: float) -> Any:
        sweeps.append(now)
        return expire(now)

    monkeypatch.setattr(service.core, "expire", counting)
    timer = asyncio.ensure_future(service.binder.expire_loop())
    kicks, start = 0, asyncio.get_running_loop().time()
    window = 0.2
    while asyncio.get_running_loop().time() - start < window:
        service.kick.set()
        kicks += 1
        await asyncio.sleep(0)
    timer.cancel()
    assert kicks > 100
    assert 2 <= len(sweeps) <= window / SWEEP_GAP + 2, (len(sweeps), kicks)


async def test_debug_endpoints(client: httpx.AsyncClient, service: Lockstep) -> None:
    a0 = pod("a0").gang("a", min_member=2).gpu(1).build()
    service.core.upsert_pod(pod_from_json(a0))
    await client.post("/filter", json=filter_body(a0))
    gangs = (await client.get("/debug/gangs")).json()["gangs"]
    assert gangs[0]["gang"] == "default/a" and gangs[0]["phase"] == "Waiting"
    assert "1/2 members exist" in gangs[0]["reason"]
    nodes = (await client.get("/debug/nodes")).json()["nodes"]
    assert [n["node"] for n in nodes] == ["n0", "n1", "n2"]
    why = (await client.get("/debug/pods/default/a0")).json()
    assert "1/2 members exist" in why["explanation"]
    best = why["bestNodes"]
    assert [b["node"] for b in best] == ["n0", "n1", "n2"]
    assert all(b["score"] == 8 and b["why"] == "no interconnect labels" for b in best)
    assert (await client.get("/debug/pods/default/ghost")).status_code == 404
    bad = await client.get("/debug/pods/default/Bad_Name")
    assert bad.status_code == 400 and "name" in bad.json()["fields"]


async def test_metrics_are_prometheus_text(client: httpx.AsyncClient) -> None:
    await client.post("/filter", json=filter_body(pod("web").gpu(1).build()))
    text = (await client.get("/metrics")).text
    assert 'lockstep_verb_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'lockstep_gangs{phase="Waiting"} 0.0' in text
    assert "lockstep_parked_binds 0.0" in text


async def test_readyz_is_503_until_synced(client: httpx.AsyncClient) -> None:
    r = await client.get("/readyz")
    assert r.status_code == 503 and "cache not synced" in r.text
    assert (await client.get("/healthz")).text == "ok"


async def test_a_failing_bind_is_reported_and_the_member_retries_into_its_slot(
    service: Lockstep, api: FakeAPI
) -> None:
    for i in range(2):
        service.core.upsert_pod(pod_from_json(pod(f"p{i}").gang("g", min_member=2).gpu(1).build()))
    names = ["n0", "n1", "n2"]
    nodes = {i: service.filter(service.core.queries.pods[f"default/p{i}"], names).passed[0]  # type: ignore[index]
             for i in range(2)}
    api.fail.add("p1")
    first = asyncio.ensure_future(service.bind("default", "p0", "", nodes[0]))
    await asyncio.sleep(0.01)
    err = await service.bind("default", "p1", "", nodes[1])
    assert await first == ""
    assert err.startswith("binding default/p1 to") and "taken" in err
    # kube-scheduler retries p1: the gang is released, so it gets its slot and binds at once.
    api.fail.clear()
    again = service.filter(service.core.queries.pods["default/p1"], names)  # type: ignore[index]
    assert again.passed == [nodes[1]]
    assert await service.bind("default", "p1", "", nodes[1]) == ""
    assert ("p1", nodes[1]) in api.bindings()


async def test_debug_endpoints_need_loopback_or_the_bearer_token(service: Lockstep) -> None:
    app = extender_app(service, debug_token="s3cret")
    remote = httpx.ASGITransport(app=app, client=("10.1.2.3", 4321))
    async with httpx.AsyncClient(transport=remote, base_url="http://lockstep.test") as c:
        denied = await c.get("/debug/gangs")
        assert denied.status_code == 403 and "bearer token" in denied.json()["error"]
        wrong = await c.get("/debug/nodes", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        ok = await c.get("/debug/nodes", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and len(ok.json()["nodes"]) == 3
        # The verbs and health endpoints stay open: kube-scheduler and kubelet call them.
        assert (await c.get("/healthz")).status_code == 200


async def test_a_gang_left_partly_bound_is_reported_everywhere(
    client: httpx.AsyncClient, service: Lockstep, api: FakeAPI
) -> None:
    for i in range(2):
        service.core.upsert_pod(pod_from_json(pod(f"p{i}").gang("g", min_member=2).gpu(1).build()))
    names = ["n0", "n1", "n2"]
    nodes = {i: service.filter(service.core.queries.pods[f"default/p{i}"], names).passed[0]  # type: ignore[index]
             for i in range(2)}
    api.forbid.add("p1")
    first = asyncio.ensure_future(service.bind("default", "p0", "", nodes[0]))
    await asyncio.sleep(0.01)
    err = await service.bind("default", "p1", "", nodes[1])
    assert await first == "" and "403" in err
    assert ("p0", nodes[0]) in api.bindings()
    events = []
    while not service.poster.events.empty():
        events.append(service.poster.events.get_nowait()[1])
    partial = [e for e in events if e.kind.value == "GangPartiallyBound"]
    assert {k for e in partial for k in e.pods} == {"default/p0", "default/p1"}
    assert "lockstep_partial_gangs_total 1.0" in (await client.get("/metrics")).text
    why = (await client.get("/debug/pods/default/p1")).json()
    assert "partially bound (1/2)" in why["partiallyBound"] and "403" in why["partiallyBound"]
    gangs = (await client.get("/debug/gangs")).json()["gangs"]
    assert "partially bound" in gangs[0]["partiallyBound"]


async def test_shutdown_answers_every_parked_call_at_once(service: Lockstep) -> None:
    for i in range(3):
        service.core.upsert_pod(pod_from_json(pod(f"p{i}").gang("g", min_member=3).gpu(1).build()))
    names = ["n0", "n1", "n2"]
    nodes = {i: service.filter(service.core.queries.pods[f"default/p{i}"], names).passed[0]  # type: ignore[index]
             for i in range(2)}
    parked = [asyncio.ensure_future(service.bind("default", f"p{i}", "", nodes[i]))
              for i in range(2)]
    await asyncio.sleep(0.01)
    assert service.core.queries.parked_total() == 2
    assert service.answer_parked("shutting down") == 2
    answers = await asyncio.wait_for(asyncio.gather(*parked), 1)
    assert answers == ["shutting down", "shutting down"]
    assert service.core.queries.parked_total() == 0


async def test_a_409_for_our_own_earlier_binding_counts_as_bound() -> None:
    """The answer to a binding was lost and the retry got 409: the API server says the pod
    is on our node with our UID, so it is bound, not a partial gang."""
    from app.kube.client import KubeClient, KubeConfig
    from coscheduling import Bound, NodeName, PodKey

    def api(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/binding"):
            return httpx.Response(409, json={"reason": "Conflict", "message": "already assigned"})
        return httpx.Response(200, json={"metadata": {"uid": "u1"}, "spec": {"nodeName": "n1"}})

    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    key = PodKey("default/p")
    assert await kube.bind_retrying(key, "default", "p", "u1", NodeName("n1")) == Bound(
        key, NodeName("n1"))
    other = await kube.bind_retrying(key, "default", "p", "u1", NodeName("n2"))
    assert not isinstance(other, Bound) and other.permanent
    await kube.aclose()


async def test_bind_for_a_pod_the_watch_has_not_shown_reads_it_and_binds(
    client: httpx.AsyncClient, service: Lockstep, api: FakeAPI,
) -> None:
    p = pod("early").gpu(1).build()
    api.pods["early"] = p
    r = await client.post("/bind", json={"PodName": "early", "PodNamespace": "default",
                                         "PodUID": p["metadata"]["uid"], "Node": "n1"})
    assert r.status_code == 200 and r.json() == {"Error": ""}
    assert ("GET", "/api/v1/namespaces/default/pods/early", None) in api.calls
    assert api.bindings() == [("early", "n1")]
    # Assumed on n1 at once, before any watch event says so.
    assert service.core.queries.pod(pod_key("default", "early")).node_name == "n1"  # type: ignore[union-attr]


@pytest.mark.parametrize(("exists", "uid"), [
    pytest.param(False, "", id="gone-from-the-api-server"),
    pytest.param(True, "another-uid", id="recreated-under-the-same-name"),
])
async def test_bind_for_a_pod_that_is_not_there_is_a_404(
    client: httpx.AsyncClient, api: FakeAPI, exists: bool, uid: str,
) -> None:
    if exists:
        api.pods["ghost"] = pod("ghost").gpu(1).build()
    r = await client.post("/bind", json={"PodName": "ghost", "PodNamespace": "default",
                                         "PodUID": uid or "u-1", "Node": "n1"})
    assert r.status_code == 404, r.text
    assert "pod default/ghost is not known" in r.text
    assert api.bindings() == []
