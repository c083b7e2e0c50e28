"""A fault-injecting HTTP proxy between one client (Lockstep) and kube-apiserver.

It listens on plain HTTP on 127.0.0.1 and forwards each request to the API server over TLS
(certificate not verified: the test bed's API server certificate is self-signed). Lockstep is
pointed at it with a kubeconfig whose server is ``http://127.0.0.1:<port>`` (``kubeconfig``);
kube-scheduler, kwok and the tests keep talking to the API server directly, so only
Lockstep's link is faulted. Plain HTTP on the listener is what makes HTTP-level faults
possible (5xx, 429, a 410 inside a watch stream) without teaching Lockstep a new CA; the
bearer token crosses loopback only.

Every client connection carries exactly one request: the proxy forwards it upstream with
``Connection: close`` and relays the answer until the API server closes, so request
boundaries never need parsing on the response side (watch streams included).

Faults are rules matched in order against each request (method, path regex, watch or not);
the first rule with uses left applies one action:

* ``delay``  — wait ``seconds``, then forward;
* ``status`` — answer ``status`` (a ``metav1.Status`` body; 429s carry ``Retry-After: 1``);
* ``drop``   — close the client connection without an answer (request not forwarded);
* ``lose``   — forward, let the API server act, then close without relaying the answer;
* ``gone``   — answer a watch with a 200 stream holding one ``ERROR`` event, code 410;
* ``hold``   — keep the request until ``release()``, then forward (to whatever upstream is
  there by then: a stopped API server means the connection is dropped).

``kill_streams()`` hangs up every open watch stream at once. The proxy runs on its own event
loop in a daemon thread; every method is safe to call from the test's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

__all__ = ["FaultProxy", "Rule"]

_REASONS = {404: "Not Found", 409: "Conflict", 410: "Gone", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}


@dataclass
class Rule:
    action: str
    """``delay``, ``status``, ``drop``, ``lose``, ``gone`` or ``hold``."""
    path: str = ""
    """Regular expression searched in the request path (query excluded)."""
    method: str | None = None
    watch: bool | None = None
    """True: only watch requests; False: only non-watch requests; None: both."""
    times: int | None = None
    """Uses left; None is unlimited."""
    skip: int = 0
    """Let this many matching requests through untouched before the rule applies."""
    seconds: float = 0.0
    status: int = 503
    hits: int = 0
    name: str = ""

    def matches(self, method: str, path: str, watch: bool) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.method is not None and method != self.method:
            return False
        if self.watch is not None and watch != self.watch:
            return False
        return re.search(self.path, path) is not None


@dataclass
class _Request:
    method: str
    target: str
    path: str
    watch: bool
    head: list[tuple[str, str]]
    body: bytes


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    host: str = "127.0.0.1"
    port: int = 0
    rules: list[Rule] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    """Requests seen (``requests``, ``watches``, ``bindings``, and per ``METHOD path`` with
    ``WATCH`` for watches) and faults applied, by action."""
    log: list[tuple[float, str]] = field(default_factory=list)
    """(monotonic time, "action METHOD path") for every fault applied."""

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                        daemon=True)
        self._lock = threading.Lock()
        self._server: asyncio.base_events.Server | None = None
        self._streams: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None, str]] = set()
        self._held: list[asyncio.Future[None]] = []
        self._ssl = ssl.create_default_context()
        self._ssl.check_hostname = False
        self._ssl.verify_mode = ssl.CERT_NONE

    # ------------------------------------------------------------------ control (any thread)

    def start(self) -> FaultProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        fut.result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._release_all()
            for client, upstream, _ in list(self._streams):
                _abort(client)
                if upstream is not None:
                    _abort(upstream)
            # Every connection task ends here, on this loop: a task or transport left for
            # the garbage collector would surface as an unraisable warning in a later test.
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._server is not None:
                await self._server.wait_closed()
            await asyncio.sleep(0)  # let aborted transports run their connection_lost

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig for Lockstep that reaches the API server through this proxy."""
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "proxied",
            "clusters": [{"name": "proxied", "cluster": {"server": self.url}}],
            "users": [{"name": "proxied", "user": {"token": token}}],
            "contexts": [{"name": "proxied", "context": {"cluster": "proxied",
                                                         "user": "proxied"}}],
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule and release every held request."""
        with self._lock:
            self.rules.clear()
        self.release()

    def release(self) -> int:
        """Let every held request go on (forwarded to the upstream as it is now)."""
        async def go() -> int:
            return self._release_all()
        return asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)

    def held(self) -> int:
        with self._lock:
            return sum(1 for f in self._held if not f.done())

    def kill_streams(self, path: str = "") -> int:
        """Hang up every open watch stream whose path matches ``path``; returns how many."""
        async def go() -> int:
            n = 0
            for client, upstream, p in list(self._streams):
                if re.search(path, p):
                    _abort(client)
                    if upstream is not None:
                        _abort(upstream)
                    n += 1
            return n
        n = asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)
        with self._lock:
            self.counts["streams killed"] += n
        return n

    # ------------------------------------------------------------------ the proxy (its loop)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def _release_all(self) -> int:
        with self._lock:
            held, self._held = self._held, []
        n = 0
        for f in held:
            if not f.done():
                f.set_result(None)
                n += 1
        return n

    def _pick(self, req: _Request) -> Rule | None:
        with self._lock:
            self.counts["requests"] += 1
            if req.watch:
                self.counts["watches"] += 1
            if req.path.endswith("/binding"):
                self.counts["bindings"] += 1
            kind = "WATCH" if req.watch else req.method
            self.counts[f"{kind} {req.path}"] += 1
            for rule in self.rules:
                if not rule.matches(req.method, req.path, req.watch):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    return None
                if rule.times is not None:
                    rule.times -= 1
                rule.hits += 1
                self.counts[rule.action] += 1
                self.log.append((time.monotonic(), f"{rule.action} {req.method} {req.path}"))
                return rule
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = await _read_request(reader)
            if req is None:
                return
            rule = self._pick(req)
            action = rule.action if rule is not None else "forward"
            if rule is not None and action == "delay":
                await asyncio.sleep(rule.seconds)
            elif rule is not None and action == "hold":
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                with self._lock:
                    self._held.append(fut)
                await fut
            elif rule is not None and action == "status":
                await _answer(writer, rule.status, req.path)
                return
            elif action == "drop":
                return
            elif action == "gone":
                await _gone(writer)
                return
            await self._forward(req, reader, writer, lose=(action == "lose"))
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError):
            pass
        finally:
            await _closed(writer)

    async def _forward(self, req: _Request, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, *, lose: bool) -> None:
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(
                self.upstream_host, self.upstream_port, ssl=self._ssl,
                server_hostname="127.0.0.1"), 5)
        except (OSError, TimeoutError, ssl.SSLError):
            with self._lock:
                self.counts["upstream unreachable"] += 1
            return  # the client sees its connection closed without an answer
        entry = (writer, up_w, req.path) if req.watch else None
        if entry is not None:
            self._streams.add(entry)
        try:
            head = [f"{req.method} {req.target} HTTP/1.1",
                    f"Host: {self.upstream_host}:{self.upstream_port}"]
            head += [f"{k}: {v}" for k, v in req.head
                     if k.lower() not in ("host", "connection", "keep-alive")]
            head.append("Connection: close")
            up_w.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + req.body)
            await up_w.drain()
            if lose:
                await up_r.read(1)  # the API server has acted once it starts answering
                return
            hangup = asyncio.ensure_future(reader.read(1))  # the client going away
            try:
                while True:
                    chunk = asyncio.ensure_future(up_r.read(65536))
                    done, _ = await asyncio.wait({chunk, hangup},
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if chunk not in done:
                        chunk.cancel()
                        return
                    data = chunk.result()
                    if not data:
                        return
                    writer.write(data)
                    await writer.drain()
            finally:
                hangup.cancel()
        finally:
            if entry is not None:
                self._streams.discard(entry)
            await _closed(up_w)


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    lines = raw.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    head = []
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            head.append((k.strip(), v.strip()))
    length = next((int(v) for k, v in head if k.lower() == "content-length"), 0)
    body = await reader.readexactly(length) if length else b""
    path, _, query = target.partition("?")
    watch = bool(re.search(r"(^|&)watch=(1|true)(&|$)", query))
    return _Request(method, target, path, watch, head, body)


async def _answer(writer: asyncio.StreamWriter, status: int, path: str) -> None:
    reason = _REASONS.get(status, "Error")
    body = orjson.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"injected by the fault proxy: {status} {reason} for {path}",
        "reason": reason.replace(" ", ""), "code": status})
    extra = "Retry-After: 1\r\n" if status == 429 else ""
    writer.write((f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
                  ).encode() + body)
    await writer.drain()


async def _gone(writer: asyncio.StreamWriter) -> None:
    """A watch whose resourceVersion expired, as the API server reports it mid-stream."""
    event = orjson.dumps({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version (injected by the fault proxy)",
        "reason": "Expired", "code": 410}}) + b"\n"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\n\r\n" + event)
    await writer.drain()


def _abort(writer: Any) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Abort ``writer``'s connection and wait until its socket is closed, even when the task
    is being cancelled (the proxy stopping): a socket left for the garbage collector
    surfaces as an unraisable ResourceWarning in whichever test runs next."""
    _abort(writer)
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)
