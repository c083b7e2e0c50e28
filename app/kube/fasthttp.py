"""A minimal HTTP/1.1 keep-alive client for Lockstep's own API writes.

Profiling a loaded Lockstep showed ~47% of its event loop's busy time inside httpx, httpcore
and h11 (pure Python) for a handful of small requests per gang: bindings, gate-lifting
PATCHes and events. aiohttp, with a C parser too, still costs the loop three to four times
this client's CPU per request (``python -m benchmarks client``: 74-125 us against 20-45 us;
watch events cost the same). This client does only what those requests need, in as little
Python per request as it can:

* the request goes out as one ``bytes`` write: a request line, a header block assembled
  once per client (Host, Accept, User-Agent, Authorization), Content-Type/Content-Length
  and the body;
* the response is parsed by ``httptools`` (llhttp, in C) from an ``asyncio.Protocol``, no
  streams, no per-request tasks; Content-Length, chunked, body-less (204/304) and
  close-delimited answers are handled;
* a connection carries one request at a time; idle keep-alive connections wait in a small
  LIFO pool (the most recently used one is the least likely to have been closed by the
  server), and a connection is closed instead of pooled when the answer says so
  (``Connection: close``, HTTP/1.0) or the pool is full.

Failures raise ``TransportError`` (its cause chained), which ``KubeClient`` maps onto
``APIUnreachable``. One failure is not surfaced: a request written on a
*reused* connection that the server closed (or reset) before any byte of an answer is sent
again, once, on a fresh connection. That is a server dropping a connection it saw as idle
(an idle timeout racing our write), which means it did not read the request; the one
writer that could in theory see a request act twice is a binding, whose second attempt
answers 409 and is recognised as our own by ``KubeClient.bind_retrying``. Every other
failure (refused, reset or closed mid-answer, a parser error, the timeout) is raised.

A request may carry a ``gate``: called right before its bytes are written, after any wait
for a connection slot or a connection, with no ``await`` in between; when it says no, the
request raises ``Refused`` and nothing is sent (``KubeClient``'s lease fence: a write checked
before a long wait must not go out after the lead is lost). ``send_within`` bounds that wait:
a request not on its way by then is ``Refused`` too.

Watches get a connection each (``FastHTTP.stream``): the answer is split into lines as
it arrives, the connection stops reading while too many lines wait for the consumer, and
no data for ``read_timeout`` (the API server sends bookmarks) ends it with a
``TransportError``.

Connections are opened by a ``Connector``: TCP (TLS for https) to the server, or what a test
hands in (an in-memory API server), so the tests run this client's every line but the socket.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol, cast
from urllib.parse import quote, urlencode, urlsplit

import httptools

__all__ = ["Connector", "FastHTTP", "Refused", "Stream", "TransportError"]

_Result = tuple[int, bytes]


class Connector(Protocol):
    """Opens a connection for the protocol ``factory`` makes: ``loop.create_connection``."""

    def __call__(self, factory: Callable[[], asyncio.Protocol], host: str, port: int, *,
                 ssl: ssl.SSLContext | None, server_hostname: str | None,
                 ) -> Awaitable[tuple[asyncio.BaseTransport, asyncio.Protocol]]: ...


_SAFE_PATH = "/:@!$&'()*+,;=%?"
"""Left as they are by ``quote``: a path Lockstep builds is already valid; only what could
not go on the request line as is (spaces, non-ASCII) gets percent-encoded."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""Methods whose requests carry ``Content-Length: 0`` when they have no body."""


class TransportError(Exception):
    """The request got no (complete) answer: not connected, dropped, timed out, garbled."""


class Refused(Exception):
    """The request's gate said no, or it could not be sent within ``send_within``: nothing
    of it was written. Not a ``TransportError``: the server was never asked."""


class _NoResponse(ConnectionError):
    """The connection ended before any byte of the answer arrived."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection, carrying one request at a time.

    The parser calls the ``on_*`` methods from inside ``data_received``; they must not
    raise (httptools would turn that into a parser error)."""

    def __init__(self, pool: FastHTTP, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        """True once the connection cannot carry another request (EOF, lost, aborted)."""
        self.keep_alive = False
        self.lost: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._waiter: asyncio.Future[_Result] | None = None
        self._body: list[bytes] = []
        self._received = False
        self._headers_done = False
        self._framed = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.abort()  # an answer nobody asked for: this connection is out of step
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except Exception as e:  # HttpParserError, HttpParserUpgrade
            self._fail(TransportError(f"malformed HTTP response: {e!r}"))
            self.abort()

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)
        self._pool._forget(self)
        if not self.lost.done():
            self.lost.set_result(None)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self._waiter is None:  # more bytes after the answer: never reuse this connection
            self.closed = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (103 Early Hints): the real one follows
            self._reset()
            return
        self.keep_alive = self._parser.should_keep_alive()
        self._succeed(status)

    # the pool's side

    async def exchange(self, data: bytes, gate: Callable[[], bool] | None = None) -> _Result:
        """Write one request, wait for its whole answer: (status, body). ``gate`` is asked
        right before the write (nothing awaited in between): no, and ``Refused`` is raised
        with nothing written."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise _NoResponse("connection closed while idle")
        if gate is not None and not gate():
            raise Refused("the gate refused the request before it was sent")
        waiter: asyncio.Future[_Result] = self._loop.create_future()
        self._waiter = waiter
        self._reset()
        self.keep_alive = False
        self.transport.write(data)
        return await waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # internals

    def _reset(self) -> None:
        self._body = []
        self._received = False
        self._headers_done = False
        self._framed = False

    def _succeed(self, status: int) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            body = self._body
            waiter.set_result((status, body[0] if len(body) == 1 else b"".join(body)))

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _ended(self, exc: Exception | None) -> None:
        """The server closed (``exc`` None) or the connection broke."""
        self.closed = True
        self.keep_alive = False
        if self._waiter is None or self._waiter.done():
            return
        if not self._received:
            self._fail(_NoResponse("connection closed before any response")
                       if exc is None else _NoResponse(f"connection lost: {exc!r}"))
        elif exc is None and self._headers_done and not self._framed:
            self._succeed(self._parser.get_status_code())  # body delimited by the close
        else:
            self._fail(ConnectionError(f"connection lost mid-response: {exc!r}"))


class Stream(asyncio.Protocol):
    """One connection carrying one streamed answer (a watch), handed out line by line.

    ``status`` is known once ``FastHTTP.stream`` returns. The parser calls the ``on_*``
    methods from inside ``data_received``; they must not raise."""

    MAX_BUFFERED = 512
    """Lines waiting for the consumer before the connection stops reading."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._loop = loop
        self._read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: asyncio.Future[int] = loop.create_future()
        self._lines: collections.deque[bytes] = collections.deque()
        self._partial = b""
        self._wake: asyncio.Future[None] | None = None
        self._complete = False
        self._error: BaseException | None = None
        self._paused = False
        self.lost: asyncio.Future[None] = loop.create_future()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except Exception as e:  # HttpParserError, HttpParserUpgrade
            self._end(TransportError(f"malformed HTTP response: {e!r}"))
            self.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._complete:
            self._end(TransportError(f"stream ended mid-response: {exc!r}"
                                     if exc is not None else "stream closed mid-response"))
        if not self.lost.done():
            self.lost.set_result(None)

    # httptools callbacks

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if not self.headers.done():
            self.headers.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        parts = (self._partial + body).split(b"\n") if self._partial else body.split(b"\n")
        self._partial = parts.pop()
        self._lines.extend(p for p in parts if p.strip())
        if len(self._lines) > self.MAX_BUFFERED and not self._paused \
                and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        if self._partial.strip():
            self._lines.append(self._partial)
        self._partial = b""
        self._complete = True
        self._notify()
        self.close()  # one answer per connection

    # the consumer's side

    async def lines(self) -> AsyncIterator[bytes]:
        """The answer's non-empty lines until it ends; raises ``TransportError`` if the
        connection breaks first or nothing arrives for ``read_timeout``."""
        while True:
            while self._lines:
                yield self._lines.popleft()
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
            if self._complete:
                return
            if self._error is not None:
                raise self._error
            self._wake = self._loop.create_future()
            try:
                async with asyncio.timeout(self._read_timeout):
                    await self._wake
            except TimeoutError:
                self.close()
                raise TransportError(f"no data for {self._read_timeout:g}s") from None

    async def read(self) -> bytes:
        """The rest of the answer as one body (an error status's Status object)."""
        return b"\n".join([line async for line in self.lines()])

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _notify(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _end(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if not self.headers.done():
            self.headers.set_exception(exc)
        self._notify()


class FastHTTP:
    """Non-streaming requests to one server (``http://`` or ``https://``), keep-alive pooled.

    ``headers`` go on every request (Host is added); ``ssl_context`` is used for https.
    ``timeout`` bounds a whole request (waiting for a connection slot, connecting, sending,
    the answer), ``connect_timeout`` the connect and TLS handshake within it."""

    def __init__(
        self,
        server: str,
        *,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_idle: int = 16,
        max_connections: int = 100,
        connect: Connector | None = None,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) server URL: {server!r}")
        tls = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if tls else 80)
        self._ssl: ssl.SSLContext | None = (
            (ssl_context or ssl.create_default_context()) if tls else None)
        self._server_hostname = url.hostname if tls else None
        self._prefix = url.path.rstrip("/")
        self._connector = connect
        lines = [f"Host: {url.netloc.rpartition('@')[2]}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
        if any("\r" in line or "\n" in line for line in lines):
            raise ValueError("a header holds a line break")
        self._static = "".join(line + "\r\n" for line in lines).encode("latin-1")
        self._accept = next((f"{line}\r\n".encode("latin-1") for line in lines
                             if line.lower().startswith("accept:")), b"")
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._open: set[_Connection] = set()
        self._streams: set[Stream] = set()
        self._closed = False
        self.connections_opened = 0
        """Connections made so far (tests and diagnostics: keep-alive at work or not)."""

    @property
    def idle(self) -> int:
        """Connections waiting in the pool."""
        return len(self._idle)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
        gate: Callable[[], bool] | None = None,
        send_within: float | None = None,
    ) -> _Result:
        """(status, body) of ``method path?params``; raises ``TransportError``. ``accept``
        goes out as the Accept header, replacing the client's own.

        ``gate`` is asked right before the request is written, ``send_within`` seconds
        bound the wait for a slot and a connection before that; either failing raises
        ``Refused`` with nothing sent (the module docstring)."""
        if method == "HEAD":  # the parser would wait for the body a HEAD answer announces
            raise ValueError("HEAD is not supported")
        head = self._head(method, path, params)
        if accept is not None:
            head = head.replace(self._accept, b"Accept: %s\r\n" % accept.encode("latin-1"), 1) \
                if self._accept else head + b"Accept: %s\r\n" % accept.encode("latin-1")
        if body is not None:
            data = b"%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
                head, content_type.encode("latin-1"), len(body), body)
        elif method in _BODY_METHODS:
            data = head + b"Content-Length: 0\r\n\r\n"
        else:
            data = head + b"\r\n"
        if self._closed:
            raise TransportError("client closed")
        send_by = None if send_within is None else (
            asyncio.get_running_loop().time() + max(0.0, send_within))
        try:
            async with asyncio.timeout(self._timeout):
                await self._take_slot(send_by)
                try:
                    return await self._send(data, gate, send_by)
                finally:
                    self._slots.release()
        except TimeoutError as e:
            raise TransportError(f"no answer within {self._timeout:g}s") from e
        except OSError as e:  # refused, reset, TLS (ssl.SSLError), _NoResponse
            raise TransportError(str(e) or repr(e)) from e

    async def stream(self, path: str, *, params: Mapping[str, str] | None = None,
                     read_timeout: float) -> Stream:
        """GET ``path`` on a connection of its own; returns once the answer's headers are
        in (``Stream.status``), its body to be read with ``Stream.lines``. The caller
        closes it. Raises ``TransportError``."""
        if self._closed:
            raise TransportError("client closed")
        data = self._head("GET", path, params) + b"\r\n"
        loop = asyncio.get_running_loop()
        stream: Stream | None = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, opened = await self._open_connection(lambda: Stream(loop, read_timeout))
            stream = cast(Stream, opened)
            assert stream.transport is not None
            self._streams.add(stream)
            stream.lost.add_done_callback(lambda _: self._streams.discard(stream))
            stream.transport.write(data)
            async with asyncio.timeout(read_timeout):
                await stream.headers
            return stream
        except TimeoutError as e:
            if stream is not None:
                stream.close()
            raise TransportError(f"no answer from {self._host}:{self._port} in time") from e
        except OSError as e:  # refused, reset, TLS (ssl.SSLError)
            raise TransportError(str(e) or repr(e)) from e
        except BaseException:
            if stream is not None:
                stream.close()
            raise

    def _head(self, method: str, path: str, params: Mapping[str, str] | None) -> bytes:
        target = self._prefix + quote(path, safe=_SAFE_PATH)
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params, quote_via=quote)
        return f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._static

    async def aclose(self) -> None:
        """Close every connection; answers still on their way are dropped."""
        self._closed = True
        for stream in list(self._streams):
            stream.close()
        conns = list(self._open)
        for c in conns:
            c.close()
        self._idle.clear()
        if conns:  # let TLS connections say goodbye before the loop may go away
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.gather(*(c.lost for c in conns))

    async def _take_slot(self, send_by: float | None) -> None:
        """One of ``max_connections`` slots, waited for until ``send_by`` at most."""
        if send_by is None or not self._slots.locked():  # free now: no wait to bound
            await self._slots.acquire()
            return
        try:
            async with asyncio.timeout_at(send_by):
                await self._slots.acquire()
        except TimeoutError:
            raise Refused("no connection slot before the request had to be sent") from None

    async def _send(self, data: bytes, gate: Callable[[], bool] | None = None,
                    send_by: float | None = None) -> _Result:
        conn = self._idle.pop() if self._idle else None
        reused = conn is not None
        if conn is None:
            conn = await self._connect(send_by)
        try:
            try:
                result = await conn.exchange(data, gate)
            except _NoResponse:
                if not reused:
                    raise
                conn.abort()
                if self._closed:
                    raise
                # The server closed it while idle: once more, the gate asked again.
                conn = await self._connect(send_by)
                result = await conn.exchange(data, gate)
        except Refused:
            self._keep(conn)  # nothing was written on it
            raise
        except BaseException:
            conn.abort()  # cancelled or failed mid-request: never reuse it
            raise
        if conn.keep_alive:
            self._keep(conn)
        else:
            conn.close()
        return result

    def _keep(self, conn: _Connection) -> None:
        """Pool ``conn`` for the next request, or close it (closed client, pool full)."""
        if not conn.closed and not self._closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    async def _connect(self, send_by: float | None = None) -> _Connection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        fenced = send_by is not None and send_by < deadline
        try:
            async with asyncio.timeout_at(send_by if fenced else deadline):
                _, opened = await self._open_connection(lambda: _Connection(self, loop))
            conn = cast(_Connection, opened)
        except TimeoutError as e:
            if fenced:
                raise Refused("no connection before the request had to be sent") from None
            raise TransportError(
                f"no connection to {self._host}:{self._port} within "
                f"{self._connect_timeout:g}s") from e
        self.connections_opened += 1
        self._open.add(conn)
        return conn

    async def _open_connection(self, factory: Callable[[], asyncio.Protocol],
                               ) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        connect = self._connector or asyncio.get_running_loop().create_connection
        return await connect(factory, self._host, self._port, ssl=self._ssl,
                             server_hostname=self._server_hostname)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)
