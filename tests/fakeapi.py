"""Fake Kubernetes API servers for tests, reached through Lockstep's own HTTP client.

``Wire(handler)`` is a connector (``app.fasthttp.Connector``) to an in-memory server: the
bytes ``app.fasthttp`` writes are parsed as HTTP/1.1 requests, handed to ``handler`` as
``httpx.Request`` objects, and the ``httpx.Response`` it returns goes back as HTTP/1.1 bytes.
So every line of the client Lockstep runs in production, framing and parsing included, runs
in the tests; only the socket is replaced (httpx here is only the request and response
vocabulary of the handlers).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import httptools
import httpx

Handler = Callable[[httpx.Request], httpx.Response]


class Wire:
    """Connects ``app.fasthttp`` to ``handler`` in memory (see the module's docstring)."""

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
        content = response.read()
        head = [f"HTTP/1.1 {response.status_code} {response.reason_phrase or 'X'}"]
        head += [f"{k}: {v}" for k, v in response.headers.multi_items()
                 if k.lower() not in ("content-length", "transfer-encoding")]
        head.append(f"Content-Length: {len(content)}")
        self._loop.call_soon(self._answer, ("\r\n".join(head) + "\r\n\r\n").encode() + content)

    def _answer(self, data: bytes) -> None:
        if not self._closed:
            self._protocol.data_received(data)
