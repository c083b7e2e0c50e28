"""Fake Kubernetes API servers for tests, reached through Lockstep's own HTTP client.

``Wire(handler)`` is a connector (``app.kube.fasthttp.Connector``) to an in-memory server: the
bytes ``app.kube.fasthttp`` writes are parsed as HTTP/1.1 requests, handed to ``handler`` as
``httpx.Request`` objects, and the ``httpx.Response`` it returns goes back as HTTP/1.1 bytes.
So every line of the client Lockstep runs in production, framing and parsing included, runs
in the tests; only the socket is replaced (httpx here is only the request and response
vocabulary of the handlers).

A handler may answer later: it returns a future and sets its response when the test wants
(a slow API server holding connections), so the request holds its connection until then.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import httptools
import httpx

Handler = Callable[[httpx.Request], "httpx.Response | asyncio.Future[httpx.Response]"]


class SlowAPI:
    """An API server too slow to answer reads: every GET is held, its connection with it,
    until :meth:`answer_all` (a slow API server both costs the Lease and fills the client's
    connection slots). Every write is answered at once and recorded with ``clock()`` at
    its arrival: the moment its bytes were sent."""

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.clock = clock
        self.held: list[asyncio.Future[httpx.Response]] = []
        self.writes: list[str] = []
        self.sent_at: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response | asyncio.Future[httpx.Response]:
        if request.method == "GET":
            self.held.append(asyncio.get_running_loop().create_future())
            return self.held[-1]
        self.writes.append(f"{request.method} {request.url.path}")
        self.sent_at.append(self.clock())
        return httpx.Response(201, json={})

    def answer_all(self) -> None:
        for f in self.held:
            if not f.done():
                f.set_result(httpx.Response(200, json={}))

    async def fill(self, kube: Any, slots: int = 80) -> list[asyncio.Task[Any]]:
        """Every connection slot of ``kube`` (an ``app.kube.client.KubeClient``: 80) taken by a
        read this server holds."""
        reads = [asyncio.create_task(kube.request("GET", f"/api/v1/namespaces/d/pods/p{i}"))
                 for i in range(slots)]
        for _ in range(100):
            await asyncio.sleep(0)
            if len(self.held) == slots:
                return reads
        raise AssertionError(f"only {len(self.held)} of {slots} reads reached the server")


class Wire:
    """Connects ``app.kube.fasthttp`` to ``handler`` in memory (see the module's docstring)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0

    async def __call__(self, factory: Callable[[], asyncio.Protocol], host: str, port: int, *,
                       ssl: ssl.SSLContext | None, server_hostname: str | None,
                       ) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        scheme = "https" if ssl is not None else "http"
        protocol = factory()
        transport = _ServerSide(self.handler, protocol, scheme)
        self.connections += 1
        protocol.connection_made(transport)
        return transport, protocol


class _ServerSide(asyncio.Transport):
    """The client's transport: what it writes is served, the answers are fed back to it on
    the next turn of the loop (as from a socket)."""

    def __init__(self, handler: Handler, protocol: asyncio.Protocol, scheme: str) -> None:
        super().__init__()
        self._handler = handler
        self._protocol = protocol
        self._scheme = scheme
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._closed = False
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._body = b""

    # the client's side

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closed:
            self._parser.feed_data(bytes(data))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self._closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", [], b""

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        host = next(v for k, v in self._headers if k.lower() == "host")
        request = httpx.Request(
            self._parser.get_method().decode(),
            f"{self._scheme}://{host}{self._url.decode('latin-1')}",
            headers=self._headers, content=self._body)
        response = self._handler(request)
        if isinstance(response, asyncio.Future):  # answered when the test sets it
            response.add_done_callback(lambda done: self._respond(done.result()))
        else:
            self._respond(response)

    def _respond(self, response: httpx.Response) -> None:
        content = response.read()
        head = [f"HTTP/1.1 {response.status_code} {response.reason_phrase or 'X'}"]
        head += [f"{k}: {v}" for k, v in response.headers.multi_items()
                 if k.lower() not in ("content-length", "transfer-encoding")]
        head.append(f"Content-Length: {len(content)}")
        self._loop.call_soon(self._answer, ("\r\n".join(head) + "\r\n\r\n").encode() + content)

    def _answer(self, data: bytes) -> None:
        if not self._closed:
            self._protocol.data_received(data)
