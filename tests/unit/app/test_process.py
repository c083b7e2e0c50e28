"""The production wiring of ``lockstep serve`` (``app.process``), run in-process.

The process is the one ``lockstep serve`` runs: its servers on real sockets, its service with
every background task, against an in-memory API server (``tests.fakeapi.Wire``): ready once
the cache synced and the verbs are served, stopped as SIGTERM stops it, and exit code 1 when
a part cannot serve.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import httpx

from app.kube.client import KubeClient, KubeConfig
from app.process import LockstepProcess, ProcessOptions, WebhookOptions
from coscheduling import Settings
from tests.fakeapi import Wire


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _empty_cluster(request: httpx.Request) -> httpx.Response:
    """Every list empty, every watch idle and ending; /readyz ok."""
    if request.url.path == "/readyz":
        return httpx.Response(200, content=b"ok")
    if request.url.params.get("watch"):
        return httpx.Response(200, content=b"")
    return httpx.Response(200, json={"metadata": {"resourceVersion": "1"}, "items": []})


def _process(api: Callable[[httpx.Request], httpx.Response], port: int,
             webhook: WebhookOptions | None = None) -> LockstepProcess:
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    return LockstepProcess(ProcessOptions(settings=Settings(), host="127.0.0.1", port=port,
                                          log_level="warning", webhook=webhook), kube=kube)


async def _until(pred: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await pred()
        if got or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.05)


async def test_serve_is_ready_once_synced_and_a_stop_exits_cleanly() -> None:
    port = _port()
    process = _process(_empty_cluster, port)
    running = asyncio.create_task(process.run())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        async def ready() -> bool:
            try:
                return (await client.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        assert await _until(ready), "the process never became ready"
        assert process.service is not None and process.service.verbs_served
        assert (await client.post("/filter", content=b"{")).status_code == 400
    process.stop()
    assert await asyncio.wait_for(running, 20) == 0
    assert process.service.failed is None


async def test_a_webhook_that_cannot_get_its_certificate_stops_the_process_with_1() -> None:
    """The Secret cannot be written (403): Lockstep stops, saying why, rather than serve
    without the webhook users expect."""
    def api(request: httpx.Request) -> httpx.Response:
        if "/secrets" in request.url.path:
            return httpx.Response(403, json={"kind": "Status", "code": 403,
                                             "reason": "Forbidden", "message": "no"})
        return _empty_cluster(request)

    webhook = WebhookOptions(port=_port(), host="127.0.0.1",
                             cert_secret="lockstep-system/lockstep-webhook-cert",
                             hosts=("127.0.0.1",))
    process = _process(api, _port(), webhook)
    assert await asyncio.wait_for(process.run(), 60) == 1
    assert process.service is not None and not process.service.webhook_listening


async def test_the_extender_port_taken_exits_with_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = _process(_empty_cluster, taken.getsockname()[1])
        assert await asyncio.wait_for(process.run(), 30) == 1
        assert process.service is not None and not process.service.verbs_served
