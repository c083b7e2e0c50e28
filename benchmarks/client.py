"""``python -m benchmarks client``: the event loop's CPU per API request, two HTTP clients.

Lockstep's own requests to the API server (a Binding POST per pod, a GET when a 409 must be
told apart from our own earlier success, a strategic-merge PATCH per gate lift and per
requeue nudge) and the decoding of its watches run on the same event loop that answers
kube-scheduler's verbs. Under load that loop is the bottleneck, so what a client costs is
measured as CPU time of the client's process per request (per event for a watch), not
latency. The clients compared are ``app.kube.fasthttp`` (hand-written: asyncio Protocols and
httptools' C parser) and aiohttp's ``ClientSession`` (its C parser too), each set up as
Lockstep would use it: one keep-alive pool of 80 connections, the same headers (a 900-byte
bearer token, as a service account's), the body read whole and decoded with orjson.

The API server is a small uvloop server in another process on 127.0.0.1 (its CPU is not
counted), answering like kube-apiserver: 201 with a Status to a Binding, a 4 KB pod to a GET
or PATCH, a chunked stream of pod events to a watch. Every case runs ``rounds`` times with
the two clients alternating, over plain HTTP and TLS; the figures are medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

CLIENTS = ("fasthttp", "aiohttp")
OPS = ("bind", "get", "patch", "watch")
TOKEN = "x" * 900
POD_BYTES = 4000
EVENT_BYTES = 3000

TABLE_COLUMNS = (("op", "op"), ("scheme", "scheme"), ("unit", "per"),
                 ("fasthttp_us", "fasthttp CPU us"), ("aiohttp_us", "aiohttp CPU us"),
                 ("ratio", "aiohttp/fasthttp"))

_SERVER = r"""
import asyncio, ssl, sys, uvloop
port, cert, key, pod_bytes, event_bytes = (int(sys.argv[1]), sys.argv[2], sys.argv[3],
                                           int(sys.argv[4]), int(sys.argv[5]))
def answer(status, body):
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (status, len(body))) + body
STATUS = answer(201, b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",'
                     b'"code":201}')
POD = answer(200, b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"w-0","pad":"%s"}}'
             % (b"x" * pod_bytes))
EVENT = (b'{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"w-0","pad":"%s"}}}\n'
         % (b"x" * event_bytes))
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
tls = None
if cert:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
async def serve(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            i = head.lower().find(b"content-length:")
            if i >= 0:
                await r.readexactly(int(head[i + 15:head.index(b"\r\n", i)]))
            if head.startswith(b"POST"):
                w.write(STATUS)
            elif b"watch=1" in head:
                n = int(head.split(b"events=", 1)[1].split(b" ", 1)[0].split(b"&", 1)[0])
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
                for start in range(0, n, 16):  # events come in bursts of a few per write
                    w.write(CHUNK * min(16, n - start))
                    await w.drain()
                w.write(b"0\r\n\r\n")
                await w.drain()
                w.close()
                return
            else:
                w.write(POD)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        w.close()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", port, ssl=tls, backlog=512)
    print("ready", flush=True)
    await s.serve_forever()
uvloop.run(main())
"""


@dataclass(frozen=True, slots=True)
class Server:
    url: str
    ssl: ssl.SSLContext | None


class Client:
    """The three calls measured, on one of the two HTTP clients."""

    def __init__(self, which: str, server: Server) -> None:
        self.which = which
        self.server = server
        self.headers = {"Accept": "application/json", "User-Agent": "lockstep/0.1",
                        "Authorization": f"Bearer {TOKEN}"}
        self._fast: Any = None
        self._session: Any = None

    async def __aenter__(self) -> Client:
        if self.which == "fasthttp":
            from app.kube.fasthttp import FastHTTP

            self._fast = FastHTTP(self.server.url, headers=self.headers,
                                  ssl_context=self.server.ssl, max_connections=80, max_idle=80)
        else:
            import aiohttp

            self._session = aiohttp.ClientSession(
                base_url=self.server.url, headers=self.headers,
                connector=aiohttp.TCPConnector(limit=80, ssl=self.server.ssl or False),
                timeout=aiohttp.ClientTimeout(total=30.0, connect=5.0),
                cookie_jar=aiohttp.DummyCookieJar(), read_bufsize=2**20)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._fast is not None:
            await self._fast.aclose()
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, path: str, body: bytes | None = None,
                      content_type: str = "application/json") -> Any:
        if self._fast is not None:
            status, content = await self._fast.request(method, path, body=body,
                                                       content_type=content_type)
        else:
            headers = {"Content-Type": content_type} if body is not None else None
            async with self._session.request(method, path, data=body, headers=headers) as r:
                status, content = r.status, await r.read()
        assert status < 400, status
        return orjson.loads(content)

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Any]:
        if self._fast is not None:
            stream = await self._fast.stream(path, params=params, read_timeout=60.0)
            try:
                async for line in stream.lines():
                    yield orjson.loads(line)
            finally:
                stream.close()
            return
        async with self._session.get(path, params=params,
                                     timeout=self._watch_timeout()) as r:
            async for line in r.content:
                if line.strip():
                    yield orjson.loads(line)

    @staticmethod
    def _watch_timeout() -> Any:
        import aiohttp

        return aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=60.0)


BIND = orjson.dumps({"apiVersion": "v1", "kind": "Binding",
                     "metadata": {"name": "w-0", "namespace": "bench", "uid": "0" * 36},
                     "target": {"apiVersion": "v1", "kind": "Node", "name": "node-000"}})
LIFT = orjson.dumps({"metadata": {"uid": "0" * 36}, "spec": {
    "schedulingGates": [{"$patch": "delete", "name": "lockstep.dev/gang"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                 "values": ["node-000"]}]}]}}}}})


async def _measure(client: Client, op: str, n: int, concurrency: int) -> float:
    """Microseconds of this process's CPU per request (per event for ``watch``)."""
    pod = "/api/v1/namespaces/bench/pods/w-0"
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "bind": lambda: client.request("POST", pod + "/binding", BIND),
        "get": lambda: client.request("GET", pod),
        "patch": lambda: client.request("PATCH", pod, LIFT,
                                        "application/strategic-merge-patch+json"),
    }

    async def requests(count: int) -> None:
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await calls[op]()

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def watch(count: int) -> None:
        got = 0
        params = {"watch": "1", "resourceVersion": "1", "events": str(count)}
        async for event in client.watch("/api/v1/pods", params):
            assert event["type"] == "MODIFIED"
            got += 1
        assert got == count, got

    run = watch if op == "watch" else requests
    await run(max(n // 10, concurrency))  # warm: connections, code paths
    t0 = time.process_time()
    await run(n)
    return (time.process_time() - t0) * 1e6 / n


async def _case(which: str, server: Server, op: str, n: int, concurrency: int) -> float:
    async with Client(which, server) as client:
        return await _measure(client, op, n, concurrency)


@contextlib.contextmanager
def _server(tls: bool, certs: Any) -> Iterator[Server]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    files = (str(certs.cert), str(certs.key)) if tls else ("", "")
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port), *files,
                             str(POD_BYTES), str(EVENT_BYTES)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        ctx = None
        if tls:
            ctx = ssl.create_default_context(cafile=str(certs.ca))
        yield Server(f"{'https' if tls else 'http'}://127.0.0.1:{port}", ctx)
    finally:
        proc.terminate()
        proc.wait()


def run(*, requests: int = 3000, events: int = 20000, concurrency: int = 8, rounds: int = 5,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every op on both clients, ``rounds`` times alternating; rows of median figures."""
    from testbed.certs import make_certs

    certs = make_certs(Path(tempfile.mkdtemp()))
    samples: dict[tuple[str, str, str], list[float]] = {}
    for tls in (False, True):
        scheme = "https" if tls else "http"
        with _server(tls, certs) as server:
            for op in OPS:
                n = events if op == "watch" else requests
                for r in range(rounds):
                    order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
                    for which in order:
                        us = uvloop.run(_case(which, server, op, n, concurrency))
                        samples.setdefault((op, scheme, which), []).append(us)
                log(f"  {op:5} {scheme:5} " + "  ".join(
                    f"{w} {statistics.median(samples[(op, scheme, w)]):7.1f} us"
                    for w in CLIENTS))
    rows = []
    for op in OPS:
        for scheme in ("http", "https"):
            fast = statistics.median(samples[(op, scheme, "fasthttp")])
            aio = statistics.median(samples[(op, scheme, "aiohttp")])
            rows.append({
                "op": op, "scheme": scheme, "unit": "event" if op == "watch" else "request",
                "fasthttp_us": round(fast, 1), "aiohttp_us": round(aio, 1),
                "ratio": round(aio / fast, 2),
                "fasthttp_samples_us": [round(x, 1) for x in samples[(op, scheme, "fasthttp")]],
                "aiohttp_samples_us": [round(x, 1) for x in samples[(op, scheme, "aiohttp")]]})
    import aiohttp

    return {"requests": requests, "events": events, "concurrency": concurrency,
            "rounds": rounds, "pod_bytes": POD_BYTES, "event_bytes": EVENT_BYTES,
            "aiohttp": aiohttp.__version__, "loop": "uvloop", "rows": rows}
