"""``VerbsApp``, the plain ASGI app in front of FastAPI: what it does on its own.

The verbs' wire format and bad-input answers are covered through ``extender_app`` in
``test_http_edge.py`` and ``test_fuzz_verbs.py``; here the app runs with no FastAPI behind it
(as the CLI serves it while FastAPI is still being imported) and is driven with raw ASGI
messages where a client hanging up must be simulated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from app.http.verbs import VerbsApp
from app.kube.client import KubeClient, KubeConfig
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.fakeapi import Wire


@pytest.fixture
def service() -> Lockstep:
    core = Coscheduler(Settings(backoff_seconds=5))
    for i in range(3):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(2).build()))
    kube = KubeClient(KubeConfig("http://api.test"),
                      connect=Wire(lambda _: httpx.Response(201, json={})))
    return Lockstep(core, kube)


@pytest.fixture
async def client(service: Lockstep) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=VerbsApp(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://lockstep.test") as c:
        yield c


async def test_verbs_and_probes_answer_before_fastapi_is_loaded(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/filter", json={"Pod": pod("web").gpu(1).build(),
                                           "NodeNames": ["n0", "n1"]})
    assert r.status_code == 200 and r.json()["NodeNames"] == ["n0", "n1"]
    assert r.headers["content-length"] == str(len(r.content))
    assert (await client.get("/healthz")).text == "ok"
    r = await client.get("/readyz")
    assert r.status_code == 503 and r.text.startswith("not ready: ")


async def test_other_paths_are_503_without_the_routes(client: httpx.AsyncClient) -> None:
    r = await client.get("/debug/gangs")
    assert r.status_code == 503 and r.json()["fields"] == ["path"]


async def _no_content(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_the_routes_are_loaded_once_on_first_need(service: Lockstep) -> None:
    loads: list[int] = []
    fail = [False, True]  # popped from the end: the first load fails

    async def load() -> Any:
        loads.append(1)
        await asyncio.sleep(0.05)
        if fail.pop():
            raise ImportError("no fastapi")
        return _no_content

    app = VerbsApp(service, load_rest=load)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        assert (await c.get("/healthz")).status_code == 200 and loads == []
        r = await c.get("/metrics")
        assert r.status_code == 503 and "no fastapi" in r.json()["error"]
        assert r.headers["retry-after"] == "1"
        answers = await asyncio.gather(*(c.get("/metrics") for _ in range(5)))
        assert [a.status_code for a in answers] == [204] * 5
    assert len(loads) == 2  # the failed load, then one shared by the five


async def test_rest_gets_everything_that_is_not_a_verb_or_probe(service: Lockstep) -> None:
    seen: list[str] = []

    async def rest(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await _no_content(scope, receive, send)

    transport = httpx.ASGITransport(app=VerbsApp(service, rest=rest))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.get("/metrics")).status_code == 204
        assert (await c.post("/filter/", content=b"{}")).status_code == 204
        assert (await c.get("/healthz")).status_code == 200
    assert seen == ["/metrics", "/filter/"]


async def test_wrong_method_is_a_405_naming_the_method(client: httpx.AsyncClient) -> None:
    r = await client.get("/bind")
    assert r.status_code == 405 and r.json()["fields"] == ["method"]
    assert r.headers["allow"] == "POST"
    r = await client.post("/healthz")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    r = await client.head("/healthz")
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "2"


async def test_a_bug_in_a_verb_is_a_500_and_the_app_keeps_serving(
    client: httpx.AsyncClient, service: Lockstep, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(service, "prioritize", broken)
    body = {"Pod": pod("web").gpu(1).build(), "NodeNames": ["n0"]}
    r = await client.post("/prioritize", json=body)
    assert r.status_code == 500 and "boom" in r.json()["error"]
    monkeypatch.undo()
    assert (await client.post("/prioritize", json=body)).status_code == 200


async def test_lifespan_completes_without_fastapi(service: Lockstep) -> None:
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[str] = []
    for kind in ("lifespan.startup", "lifespan.shutdown"):
        inbox.put_nowait({"type": kind})

    async def send(message: Any) -> None:
        sent.append(message["type"])

    await asyncio.wait_for(VerbsApp(service)({"type": "lifespan"}, inbox.get, send), 2)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_a_parked_bind_is_dropped_when_kube_scheduler_hangs_up(service: Lockstep) -> None:
    for i in range(2):
        service.core.upsert_pod(pod_from_json(pod(f"p{i}").gang("g", min_member=2).gpu(1).build()))
    planned = service.filter(service.core.queries.pods["default/p0"], ["n0", "n1", "n2"]).passed[0]  # type: ignore[index]
    hang_up = asyncio.Event()
    body = orjson.dumps({"PodName": "p0", "PodNamespace": "default", "Node": planned})
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await hang_up.wait()
        return {"type": "http.disconnect"}

    answer: list[bytes] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            answer.append(message["body"])

    scope = {"type": "http", "method": "POST", "path": "/bind", "headers": []}
    call = asyncio.ensure_future(VerbsApp(service)(scope, receive, send))
    await asyncio.sleep(0.05)
    assert not call.done() and service.core.queries.parked_total() == 1
    hang_up.set()
    await asyncio.wait_for(call, 2)
    assert service.core.queries.parked_total() == 0
    assert orjson.loads(answer[0]) == {"Error": "kube-scheduler hung up"}


async def test_not_ready_while_the_webhook_server_is_not_listening(
    client: httpx.AsyncClient, service: Lockstep, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(type(service.cache), "synced", property(lambda _: True))
    service.api_ok = True
    assert (await client.get("/readyz")).status_code == 200
    service.webhook_listening = False  # --webhook-port given, its server still starting
    r = await client.get("/readyz")
    assert r.status_code == 503 and "webhook server not listening" in r.text


async def test_a_filter_of_the_version_the_watch_delivered_reuses_its_record(
    service: Lockstep, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch decoded the pod already: a call carrying the same UID and resourceVersion
    is answered from that record, not decoded again; any other version is decoded."""
    import app.http.verbs as verbs

    obj = pod("web").gpu(1).build()
    obj["metadata"] |= {"uid": "u-1", "resourceVersion": "41"}
    service.core.upsert_pod(pod_from_json(obj))
    decoded: list[str] = []

    def counting(o: Any) -> Any:
        decoded.append(o["metadata"]["resourceVersion"])
        return pod_from_json(o)

    monkeypatch.setattr(verbs, "pod_from_json", counting)
    for rv, want in (("41", []), ("42", ["42"])):
        decoded.clear()
        call = {**obj, "metadata": {**obj["metadata"], "resourceVersion": rv}}
        r = await client.post("/filter", json={"Pod": call, "NodeNames": ["n0", "n1"]})
        assert r.status_code == 200 and r.json()["NodeNames"] == ["n0", "n1"]
        assert decoded == want
    # The held version with a node of its own is not the record the core holds: decoded.
    big = {**obj, "spec": {**obj["spec"], "nodeName": "n2"}}
    decoded.clear()
    r = await client.post("/filter", json={"Pod": big, "NodeNames": ["n0"]})
    assert r.status_code == 200 and decoded == ["41"]
