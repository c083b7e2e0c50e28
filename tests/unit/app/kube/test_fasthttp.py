"""KubeClient's HTTP client (app.kube.fasthttp) against a real HTTP server on 127.0.0.1, plain
and TLS.

The server is a few lines of asyncio streams, written here so the tests control every byte
and every hang-up: keep-alive or not, chunked, close-delimited and empty bodies, a connection
closed while idle or reset mid-answer, an answer that never comes. It records each request
it reads (and on which connection), so the tests can tell reuse, retries and headers apart.
Every test runs on the default event loop and on uvloop (what ``lockstep serve`` runs).
What this client costs against aiohttp is measured by ``python -m benchmarks client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
import uvloop

from app.kube.client import KubeClient, KubeConfig, _ssl_context
from app.kube.errors import APIError, APIUnreachable, Conflict, Gone, NotFound, TooManyRequests
from app.kube.fasthttp import FastHTTP, Refused, Stream, TransportError
from testbed.certs import Certs, make_certs
from testbed.runner import free_port

LOOPS = ["asyncio", "uvloop"]


def run(loop: str, main: Callable[[], Awaitable[None]]) -> None:
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(asyncio.wait_for(main(), 20))


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


# The server


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    conn: int
    """Which connection (0, 1, ... in accept order)."""
    n: int
    """Which request on that connection (0 first)."""
    reader: asyncio.StreamReader = field(repr=False)

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    def query_get(self, key: str) -> list[str]:
        return parse_qs(urlsplit(self.target).query).get(key, [])


Handler = Callable[[Seen, asyncio.StreamWriter], Awaitable[bool]]
"""Writes an answer (or not); returns whether to keep reading requests on the connection."""


@dataclass
class Server:
    routes: dict[str, Handler]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    open_max: int = 0
    url: str = ""
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn, n = self.connections, 0
        self.connections += 1
        self.open_now += 1
        self.open_max = max(self.open_max, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ", 2)
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (h.partition(":") for h in rest if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                req = Seen(method, target, headers, body, conn, n, reader)
                self.seen.append(req)
                n += 1
                handler = self.routes.get(req.path, echo)
                if not await handler(req, writer):
                    return
        except (ConnectionError, ssl.SSLError):
            return
        except asyncio.CancelledError:  # shutting down (asyncio 3.11 logs a cancelled one)
            return
        finally:
            self.open_now -= 1
            self._tasks.discard(task)
            writer.close()

    def on(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]


@contextlib.asynccontextmanager
async def serving(routes: dict[str, Handler] | None = None, *,
                  tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    srv = Server(routes or {})
    server = await asyncio.start_server(srv.serve, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    srv.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        server.close()
        for t in list(srv._tasks):
            t.cancel()
        await asyncio.gather(*srv._tasks, return_exceptions=True)
        await server.wait_closed()


def answer(status: int, body: bytes, *extra: str, reason: str = "X") -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def echo(req: Seen, w: asyncio.StreamWriter) -> bool:
    """200 with what the server read: method, path, query, headers, body, connection."""
    w.write(answer(200, orjson.dumps({
        "method": req.method, "path": req.path, "query": parse_qs(urlsplit(req.target).query),
        "headers": req.headers, "body": orjson.loads(req.body) if req.body else None,
        "conn": req.conn, "n": req.n})))
    await w.drain()
    return True


async def shuffled_echo(req: Seen, w: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(random.random() * 0.02)  # answers in a different order than asked
    return await echo(req, w)


async def chunked(req: Seen, w: asyncio.StreamWriter) -> bool:
    body = orjson.dumps({"items": [{"i": i, "pad": "x" * 300} for i in range(40)]})
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    for i in range(0, len(body), 1000):  # several chunks, each in its own write
        part = body[i:i + 1000]
        w.write(b"%x\r\n%s\r\n" % (len(part), part))
        await w.drain()
        await asyncio.sleep(0.001)
    w.write(b"0\r\n\r\n")
    await w.drain()
    return True


async def no_content(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(b"HTTP/1.1 204 No Content\r\nX-Note: no body follows\r\n\r\n")
    await w.drain()
    return True


async def close_delimited(req: Seen, w: asyncio.StreamWriter) -> bool:
    """HTTP/1.1 without Content-Length or chunking: the body ends where the connection does."""
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
            b'{"delimited": "by the close",')
    await w.drain()
    await asyncio.sleep(0.01)
    w.write(b' "rest": true}')
    await w.drain()
    return False


async def answer_then_close(req: Seen, w: asyncio.StreamWriter) -> bool:
    """Says ``Connection: close`` but leaves the connection open: only the client can tell
    whether a next request would go on it."""
    w.write(answer(200, b'{"bye": true}', "Connection: close"))
    await w.drain()
    return True


async def close_when_idle(req: Seen, w: asyncio.StreamWriter) -> bool:
    """Keep-alive answer (no Connection: close), then an idle timeout of 50 ms."""
    await echo(req, w)
    await asyncio.sleep(0.05)
    return False


async def drop_second(req: Seen, w: asyncio.StreamWriter) -> bool:
    """Answer the first request on a connection, hang up on the next without a byte: a
    server whose idle timeout races the client's next request."""
    if req.n > 0:
        return False
    return await echo(req, w)


async def drop(req: Seen, w: asyncio.StreamWriter) -> bool:
    return False


async def reset_mid_answer(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            b'{"partial": ')
    await w.drain()
    await asyncio.sleep(0.01)
    w.transport.abort()
    return False


hangups: list[float] = []
"""When ``slow`` saw its client go away (monotonic time)."""


async def slow(req: Seen, w: asyncio.StreamWriter) -> bool:
    """Answers after 0.6 s: past a short client timeout, still in time to be misread by a
    later request if the client pooled the connection it gave up on. Notes a hang-up."""
    for _ in range(60):
        await asyncio.sleep(0.01)
        if req.reader.at_eof() or req.reader.exception() is not None:
            hangups.append(time.monotonic())
            return False
    w.write(answer(200, b'{"late": true}'))
    await w.drain()
    return True


async def garbage(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}")
    await w.drain()
    return True


def status(code: int, reason: str, message: str) -> Handler:
    async def handler(req: Seen, w: asyncio.StreamWriter) -> bool:
        w.write(answer(code, orjson.dumps({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code})))
        await w.drain()
        return True
    return handler


async def plain_404(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 18\r\n\r\n"
            b"404 page not found")
    await w.drain()
    return True


async def broken_json(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(answer(200, b'{"truncated'))
    await w.drain()
    return True


def client(url: str, **kw: Any) -> KubeClient:
    timeout = kw.pop("timeout", 30.0)
    return KubeClient(KubeConfig(url, **kw), timeout=timeout)


def fast(kube: KubeClient) -> FastHTTP:
    return kube._http


# The tests


def test_json_round_trip_with_body_token_and_headers(loop: str) -> None:
    async def main() -> None:
        async with serving() as srv:
            kube = client(srv.url, token="s3cret")
            got = await kube.request("POST", "/api/v1/namespaces/ns/pods/p-0/binding",
                                     json={"target": {"name": "node-1"}, "n": [1, 2]})
            await kube.strategic_patch("/api/v1/namespaces/ns/pods/p-0", {"spec": {}})
            await kube.request("POST", "/api/v1/namespaces/ns/events")  # no body
            await kube.request("GET", "/api/v1/pods/", params={"limit": "5"})
            await kube.aclose()
        assert got["method"] == "POST" and got["path"] == "/api/v1/namespaces/ns/pods/p-0/binding"
        assert got["body"] == {"target": {"name": "node-1"}, "n": [1, 2]}
        h = got["headers"]
        assert h["authorization"] == "Bearer s3cret"
        assert h["host"] == srv.url.removeprefix("http://")
        assert h["accept"] == "application/json" and h["user-agent"] == "lockstep/0.1"
        assert h["content-type"] == "application/json"
        assert h["content-length"] == str(len(orjson.dumps(got["body"])))
        patch, bodiless, get = srv.seen[1:]
        assert patch.method == "PATCH"
        assert patch.headers["content-type"] == "application/strategic-merge-patch+json"
        assert orjson.loads(patch.body) == {"spec": {}}
        assert bodiless.headers["content-length"] == "0" and bodiless.body == b""
        assert get.target == "/api/v1/pods/?limit=5" and "content-length" not in get.headers
    run(loop, main)


def test_no_token_no_authorization_header_and_a_server_path_prefix(loop: str) -> None:
    async def main() -> None:
        async with serving() as srv:
            kube = client(srv.url + "/k8s/clusters/c-1/")
            await kube.request("GET", "/api/v1/nodes")
            await kube.aclose()
        (seen,) = srv.seen
        assert seen.target == "/k8s/clusters/c-1/api/v1/nodes"
        assert "authorization" not in seen.headers
    run(loop, main)


def test_list_paginates_with_the_continue_token_encoded(loop: str) -> None:
    token = "eyJ2Ijoi a+b/c&d=e?f%"  # everything urlencoding has to get right

    async def pages(req: Seen, w: asyncio.StreamWriter) -> bool:
        q = parse_qs(urlsplit(req.target).query)
        page = ({"metadata": {"continue": token}, "items": [{"i": 0}, {"i": 1}]}
                if "continue" not in q else
                {"metadata": {"resourceVersion": "42"}, "items": [{"i": 2}], "q": q})
        w.write(answer(200, orjson.dumps(page)))
        await w.drain()
        return True

    async def main() -> None:
        async with serving({"/api/v1/pods": pages}) as srv:
            kube = client(srv.url)
            items, rv = await kube.list("/api/v1/pods", page=2)
            await kube.aclose()
        assert [i["i"] for i in items] == [0, 1, 2] and rv == "42"
        first, second = srv.seen
        assert parse_qs(urlsplit(first.target).query) == {"limit": ["2"]}
        assert parse_qs(urlsplit(second.target).query) == {"limit": ["2"], "continue": [token]}
    run(loop, main)


def test_chunked_204_and_close_delimited_bodies(loop: str) -> None:
    async def main() -> None:
        routes: dict[str, Handler] = {
            "/chunked": chunked, "/empty": no_content, "/eof": close_delimited}
        async with serving(routes) as srv:
            kube = client(srv.url)
            big = await kube.request("GET", "/chunked")
            empty = await kube.request("DELETE", "/empty")
            after = await kube.request("GET", "/json")  # 204 left the connection usable
            eof = await kube.request("GET", "/eof")
            again = await kube.request("GET", "/json")
            await kube.aclose()
        assert [i["i"] for i in big["items"]] == list(range(40))
        assert all(i["pad"] == "x" * 300 for i in big["items"])
        assert empty is None
        assert after["conn"] == 0 and after["n"] == 2  # chunked and 204 kept the connection
        assert eof == {"delimited": "by the close", "rest": True}
        assert again["conn"] == 1  # the close-delimited answer ended its connection
    run(loop, main)


def test_sequential_requests_reuse_one_connection(loop: str) -> None:
    async def main() -> None:
        async with serving() as srv:
            kube = client(srv.url)
            answers = [await kube.request("GET", f"/json?i={i}") for i in range(20)]
            assert fast(kube).connections_opened == 1 and fast(kube).idle == 1
            pair = await asyncio.gather(*(kube.request("GET", "/json") for _ in range(2)))
            lifo = [await kube.request("GET", "/json") for _ in range(4)]
            await kube.aclose()
            assert fast(kube).idle == 0
        assert [(a["conn"], a["n"]) for a in answers] == [(0, i) for i in range(20)]
        assert [a["query"]["i"] for a in answers] == [[str(i)] for i in range(20)]
        # Two idle connections: the one used last is used again, the other left to age.
        assert {a["conn"] for a in pair} == {0, 1}
        assert len({a["conn"] for a in lifo}) == 1
    run(loop, main)


def test_connection_close_is_honoured(loop: str) -> None:
    async def main() -> None:
        async with serving({"/bye": answer_then_close}) as srv:
            kube = client(srv.url)
            assert await kube.request("GET", "/bye") == {"bye": True}
            second = await kube.request("GET", "/json")
            await kube.aclose()
        assert second["conn"] == 1 and second["n"] == 0
        assert len(srv.seen) == 2  # nothing was written into the closed connection
    run(loop, main)


def test_a_hundred_concurrent_requests_each_get_their_own_answer(loop: str) -> None:
    async def main() -> None:
        async with serving({"/json": shuffled_echo}) as srv:
            kube = client(srv.url)
            answers = await asyncio.gather(*(
                kube.request("POST", "/json", json={"i": i}) for i in range(100)))
            pool = fast(kube)
            opened, idle = pool.connections_opened, pool.idle
            more = await asyncio.gather(*(
                kube.request("POST", "/json", json={"i": i}) for i in range(8)))
            await kube.aclose()
        assert [a["body"]["i"] for a in answers] == list(range(100))
        assert [a["body"]["i"] for a in more] == list(range(8))
        assert opened == 80  # KubeClient's cap: the other 20 waited for a connection
        assert idle == 80  # and every connection was kept
        assert pool.connections_opened == 80  # the second burst rode pooled connections
        assert min(a["n"] for a in more) >= 1  # each on a connection used before
    run(loop, main)


def test_connections_are_capped(loop: str) -> None:
    async def main() -> None:
        async with serving({"/json": shuffled_echo}) as srv:
            pool = FastHTTP(srv.url, headers={}, max_connections=4, max_idle=4)
            answers = await asyncio.gather(*(
                pool.request("POST", "/json", body=b'{"i": %d}' % i) for i in range(20)))
            await pool.aclose()
        assert [orjson.loads(body)["body"]["i"] for _, body in answers] == list(range(20))
        assert {code for code, _ in answers} == {200}
        assert srv.open_max == 4 and pool.connections_opened == 4  # the others waited
    run(loop, main)


def test_server_closing_an_idle_connection_is_noticed(loop: str) -> None:
    async def main() -> None:
        async with serving({"/idle": close_when_idle}) as srv:
            kube = client(srv.url)
            first = await kube.request("GET", "/idle")
            assert fast(kube).idle == 1
            await asyncio.sleep(0.2)  # the server's idle timeout passes
            assert fast(kube).idle == 0  # dropped from the pool as the server closed it
            second = await kube.request("GET", "/idle")
            await kube.aclose()
        assert (first["conn"], second["conn"]) == (0, 1)
        assert len(srv.seen) == 2  # the closed connection was not even tried
    run(loop, main)


def test_idle_close_racing_the_next_request_is_retried_once(loop: str) -> None:
    async def main() -> None:
        async with serving({"/race": drop_second}) as srv:
            kube = client(srv.url)
            first = await kube.request("POST", "/race", json={"i": 1})
            second = await kube.request("POST", "/race", json={"i": 2})
            await kube.aclose()
        assert (first["conn"], second["conn"]) == (0, 1) and second["body"] == {"i": 2}
        # Sent on the pooled connection, dropped unanswered, sent again on a fresh one.
        assert [(s.conn, s.n, orjson.loads(s.body)["i"]) for s in srv.seen] == [
            (0, 0, 1), (0, 1, 2), (1, 0, 2)]
    run(loop, main)


def test_the_gate_is_asked_as_each_copy_goes_out_and_a_no_sends_nothing(loop: str) -> None:
    """The lease fence's hook (``gate``): asked right before the bytes are written, on the
    retry of an idle-closed connection too; a no raises ``Refused`` with nothing written and
    leaves an unused connection pooled."""
    async def main() -> None:
        async with serving({"/race": drop_second}) as srv:
            pool = FastHTTP(srv.url, headers={})
            answers = iter([True, True, False])
            asked: list[int] = []

            def gate() -> bool:
                asked.append(len(srv.seen))
                return next(answers)

            await pool.request("POST", "/race", body=b'{"i": 1}', gate=gate)
            with pytest.raises(Refused):  # the pooled copy dropped, the retry refused
                await pool.request("POST", "/race", body=b'{"i": 2}', gate=gate)
            with pytest.raises(Refused):
                await pool.request("POST", "/json", body=b"{}", gate=lambda: False)
            opened, idle = pool.connections_opened, pool.idle
            await pool.aclose()
        assert [(s.conn, s.n, orjson.loads(s.body)["i"]) for s in srv.seen] == [
            (0, 0, 1), (0, 1, 2)]  # the retry's copy never went out
        assert asked == [0, 1, 2]  # each before its copy was written
        assert (opened, idle) == (2, 1)  # the refused fresh connection stayed pooled
    run(loop, main)


def test_send_within_bounds_the_wait_for_a_connection_slot(loop: str) -> None:
    """A request that cannot get a slot within ``send_within`` is ``Refused`` then, not
    after the request timeout, and is never sent once the slot frees."""
    async def main() -> None:
        async with serving({"/slow": slow}) as srv:
            pool = FastHTTP(srv.url, headers={}, max_connections=1, timeout=5.0)
            held = asyncio.create_task(pool.request("GET", "/slow"))
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            with pytest.raises(Refused):
                await pool.request("POST", "/json", body=b"{}", send_within=0.1)
            waited = time.monotonic() - t0
            assert (await held)[0] == 200
            await pool.aclose()
        assert 0.09 <= waited < 0.5
        assert [s.path for s in srv.seen] == ["/slow"]
    run(loop, main)


def test_fresh_connection_dropped_unanswered_is_unreachable_not_retried(loop: str) -> None:
    async def main() -> None:
        async with serving({"/drop": drop}) as srv:
            kube = client(srv.url)
            with pytest.raises(APIUnreachable) as e:
                await kube.request("POST", "/drop", json={"i": 1})
            await kube.aclose()
        assert e.value.path == "/drop"
        assert len(srv.seen) == 1  # a fresh connection: the server may have acted
    run(loop, main)


def test_reset_mid_answer_is_unreachable_even_on_a_pooled_connection(loop: str) -> None:
    async def main() -> None:
        async with serving({"/reset": reset_mid_answer}) as srv:
            kube = client(srv.url)
            await kube.request("GET", "/json")
            with pytest.raises(APIUnreachable):
                await kube.request("POST", "/reset", json={})
            after = await kube.request("GET", "/json")
            await kube.aclose()
        assert len(srv.on("/reset")) == 1  # part of an answer came: never sent twice
        assert srv.on("/reset")[0].conn == 0 and after["conn"] == 1
    run(loop, main)


def test_a_garbled_answer_is_unreachable_and_its_connection_dropped(loop: str) -> None:
    async def main() -> None:
        async with serving({"/garbage": garbage}) as srv:
            kube = client(srv.url)
            await kube.request("GET", "/json")
            with pytest.raises(APIUnreachable) as e:
                await kube.request("GET", "/garbage")
            after = await kube.request("GET", "/json")
            await kube.aclose()
        assert "malformed HTTP response" in str(e.value)
        assert len(srv.on("/garbage")) == 1 and after["conn"] == 1
    run(loop, main)


def test_refused_connection_is_unreachable(loop: str) -> None:
    async def main() -> None:
        async with serving() as srv:
            url = srv.url
        kube = client(url)  # the server is gone: nothing listens on its port
        with pytest.raises(APIUnreachable) as e:
            await kube.request("GET", "/api/v1/nodes")
        await kube.aclose()
        assert isinstance(e.value.cause.__cause__, ConnectionRefusedError)
    run(loop, main)


def test_timeout_is_unreachable_and_the_late_answer_is_never_read(loop: str) -> None:
    async def main() -> None:
        async with serving({"/slow": slow}) as srv:
            kube = client(srv.url, timeout=0.3)
            t0 = time.monotonic()
            with pytest.raises(APIUnreachable) as e:
                await kube.request("GET", "/slow")
            waited = time.monotonic() - t0
            hangups.clear()
            await asyncio.sleep(0.5)  # the late answer would go out meanwhile
            assert hangups and hangups[0] - t0 < waited + 0.1  # dropped at once
            after = await kube.request("GET", "/json")
            await kube.aclose()
        assert 0.29 <= waited < 0.6  # uvloop's timers have millisecond resolution
        assert "0.3s" in str(e.value)
        assert after["path"] == "/json" and after["conn"] == 1
    run(loop, main)


def test_error_statuses_map_onto_app_errors(loop: str) -> None:
    routes = {
        "/404": status(404, "NotFound", 'pods "p-0" not found'),
        "/409": status(409, "Conflict", "pod p-0 is already assigned to node n-1"),
        "/422": status(422, "Invalid", "spec.schedulingGates: Forbidden: only removal"),
        "/429": status(429, "TooManyRequests", "slow down"),
        "/503": status(503, "ServiceUnavailable", "etcd"),
        "/plain": plain_404, "/broken": broken_json,
    }

    async def main() -> None:
        async with serving(routes) as srv:
            kube = client(srv.url)
            errors: dict[str, APIError] = {}
            for path in routes:
                with pytest.raises(APIError) as e:
                    await kube.request("POST", path, json={})
                errors[path] = e.value
            await kube.aclose()
        assert type(errors["/404"]) is NotFound and errors["/404"].reason == "NotFound"
        assert errors["/404"].message == 'pods "p-0" not found'
        assert type(errors["/409"]) is Conflict and errors["/409"].status == 409
        e422 = errors["/422"]
        assert type(e422) is APIError and (e422.status, e422.reason) == (422, "Invalid")
        assert e422.message == "spec.schedulingGates: Forbidden: only removal"
        assert e422.path == "/422"
        assert type(errors["/429"]) is TooManyRequests
        assert type(errors["/503"]) is APIError and errors["/503"].status == 503
        assert type(errors["/plain"]) is NotFound
        assert errors["/plain"].message == "404 page not found"
        broken = errors["/broken"]
        assert (broken.status, broken.reason) == (200, "BadResponse")
    run(loop, main)


def tls_server(certs: Certs) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.cert, certs.key)
    return ctx


def test_insecure_context_loads_no_ca_bundle(certs: Certs) -> None:
    insecure = _ssl_context(KubeConfig("https://127.0.0.1:6443", insecure=True))
    assert isinstance(insecure, ssl.SSLContext)
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    assert insecure.cert_store_stats()["x509_ca"] == 0  # the system bundle: start-up time
    pinned = _ssl_context(KubeConfig("https://127.0.0.1:6443", ca_file=str(certs.ca)))
    assert isinstance(pinned, ssl.SSLContext) and pinned.verify_mode == ssl.CERT_REQUIRED
    assert pinned.cert_store_stats()["x509_ca"] == 1
    assert _ssl_context(KubeConfig("http://127.0.0.1:8080")) is False


def test_tls_verifies_the_server_against_the_ca_and_keeps_alive(
        loop: str, certs: Certs, tmp_path: Path) -> None:
    other = make_certs(tmp_path / "other")  # a CA that did not sign the server's certificate

    async def main() -> None:
        async with serving(tls=tls_server(certs)) as srv:
            assert srv.url.startswith("https://127.0.0.1:")
            kube = client(srv.url, ca_file=str(certs.ca), token="t")
            answers = [await kube.request("POST", "/json", json={"i": i}) for i in range(3)]
            await kube.aclose()
            insecure = client(srv.url, insecure=True)
            assert (await insecure.request("GET", "/json"))["path"] == "/json"
            await insecure.aclose()
            wrong = client(srv.url, ca_file=str(other.ca))
            with pytest.raises(APIUnreachable) as e:
                await wrong.request("GET", "/json")
            await wrong.aclose()
        assert [(a["conn"], a["n"], a["body"]["i"]) for a in answers] == [
            (0, 0, 0), (0, 1, 1), (0, 2, 2)]
        assert answers[0]["headers"]["authorization"] == "Bearer t"
        assert isinstance(e.value.cause.__cause__, ssl.SSLCertVerificationError)
    run(loop, main)


def test_tls_chunked_and_concurrent(loop: str, certs: Certs) -> None:
    async def main() -> None:
        async with serving({"/chunked": chunked, "/json": shuffled_echo},
                           tls=tls_server(certs)) as srv:
            kube = client(srv.url, ca_file=str(certs.ca))
            answers = await asyncio.gather(*(
                kube.request("POST", "/json", json={"i": i}) for i in range(20)))
            big = await kube.request("GET", "/chunked")
            await kube.aclose()
        assert [a["body"]["i"] for a in answers] == list(range(20))
        assert len(big["items"]) == 40
    run(loop, main)


async def paged(req: Seen, w: asyncio.StreamWriter) -> bool:
    """Three pages of two items; ``continue`` tokens p1, p2."""
    token = parse_qs(urlsplit(req.target).query).get("continue", [""])[0]
    page = {"": 0, "p1": 1, "p2": 2}[token]
    meta = {"resourceVersion": "7", **({"continue": f"p{page + 1}"} if page < 2 else {})}
    w.write(answer(200, orjson.dumps(
        {"metadata": meta, "items": [{"i": 2 * page + j} for j in range(2)]})))
    await w.drain()
    return True


def test_list_asks_for_the_next_page_before_parsing_this_one(loop: str) -> None:
    async def main() -> None:
        async with serving({"/api/v1/pods": paged}) as srv:
            kube = client(srv.url)
            busy: list[tuple[int, bool]] = []  # (item, a connection was busy meanwhile)

            def parse(obj: dict[str, Any]) -> int:
                pool = fast(kube)
                busy.append((obj["i"], len(pool._open) > pool.idle))
                return int(obj["i"])

            items, rv = await kube.list_parsed("/api/v1/pods", parse, page=2)
            limits = {tuple(s.query_get("limit")) for s in srv.on("/api/v1/pods")}
            await kube.aclose()
        assert (items, rv) == ([0, 1, 2, 3, 4, 5], "7")
        # pages 0 and 1 are parsed while the next one is on the wire; the last is not
        assert busy == [(0, True), (1, True), (2, True), (3, True), (4, False), (5, False)]
        assert limits == {("2",)}
    run(loop, main)


def test_a_failed_parse_leaves_no_page_request_behind(loop: str) -> None:
    async def main() -> None:
        async with serving({"/api/v1/pods": paged}) as srv:
            kube = client(srv.url)

            def parse(obj: dict[str, Any]) -> int:
                raise ValueError("bad item")

            with pytest.raises(ValueError):
                await kube.list_parsed("/api/v1/pods", parse, page=2)
            pool = fast(kube)
            assert len(pool._open) == pool.idle  # the prefetch was cancelled or finished
            again = await kube.request("GET", "/json")
            await kube.aclose()
        assert again["path"] == "/json"
    run(loop, main)


async def readyz_ok(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
    await w.drain()
    return True


async def readyz_failing(req: Seen, w: asyncio.StreamWriter) -> bool:
    body = b"[-]etcd failed"
    w.write(b"HTTP/1.1 500 X\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body))
    await w.drain()
    return True


def test_the_api_health_probe_rides_the_fast_path_and_fails_closed(loop: str) -> None:
    async def main() -> None:
        async with serving({"/readyz": readyz_ok}) as srv:
            kube = client(srv.url)
            assert await kube.healthy()
            assert fast(kube).connections_opened == 1
            await kube.aclose()
        async with serving({"/readyz": readyz_failing}) as srv:
            kube = client(srv.url)
            assert not await kube.healthy()
            await kube.aclose()
        kube = client(f"http://127.0.0.1:{free_port()}")  # nothing listens
        assert not await kube.healthy()
        await kube.aclose()
    run(loop, main)


# Watches (FastHTTP.stream)

EVENTS = [{"type": "ADDED", "object": {"metadata": {"name": f"p{i}", "pad": "x" * (i * 37)}}}
          for i in range(30)]


def watch_stream(events: list[dict[str, Any]], *, end: bool = True, hang: bool = False,
                 piece: int = 17) -> Handler:
    """A chunked watch answer, cut into ``piece``-byte writes that split lines and chunks;
    it ends with the terminal chunk, just stops (``end=False``), or hangs (``hang``)."""
    async def handler(req: Seen, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        body = b"".join(orjson.dumps(e) + b"\n" for e in events)
        for i in range(0, len(body), 100):
            chunk = body[i:i + 100]
            raw = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            for j in range(0, len(raw), piece):
                w.write(raw[j:j + piece])
                await w.drain()
        if hang:
            await asyncio.sleep(30)
        if end:
            w.write(b"0\r\n\r\n")
            await w.drain()
        return False
    return handler


def test_a_watch_streams_events_split_across_writes_and_chunks(loop: str) -> None:
    async def main() -> None:
        async with serving({"/api/v1/pods": watch_stream(EVENTS)}) as srv:
            kube = client(srv.url)
            got = [e async for e in kube.watch("/api/v1/pods", "5")]
            await kube.aclose()
        assert got == EVENTS
        assert srv.seen[0].query_get("watch") == ["1"]
        assert srv.seen[0].query_get("resourceVersion") == ["5"]
        assert srv.seen[0].query_get("allowWatchBookmarks") == ["true"]
    run(loop, main)


def test_a_watch_cut_mid_answer_is_unreachable_after_the_whole_events(loop: str) -> None:
    async def main() -> None:
        async with serving({"/api/v1/pods": watch_stream(EVENTS, end=False)}) as srv:
            kube = client(srv.url)
            got: list[dict[str, Any]] = []
            with pytest.raises(APIUnreachable):
                async for e in kube.watch("/api/v1/pods", "5"):
                    got.append(e)
            await kube.aclose()
        assert got == EVENTS  # every complete line first, then the error
    run(loop, main)


async def gone(req: Seen, w: asyncio.StreamWriter) -> bool:
    w.write(answer(410, orjson.dumps({"kind": "Status", "reason": "Expired",
                                      "message": "too old resource version: 5 (90)"})))
    await w.drain()
    return False


def test_a_watch_answered_410_raises_gone_with_the_message(loop: str) -> None:
    async def main() -> None:
        async with serving({"/api/v1/pods": gone}) as srv:
            kube = client(srv.url)
            with pytest.raises(Gone, match="too old resource version"):
                async for _ in kube.watch("/api/v1/pods", "5"):
                    pass
            await kube.aclose()
    run(loop, main)


def test_a_silent_watch_ends_after_the_read_timeout(loop: str) -> None:
    async def main() -> None:
        async with serving({"/w": watch_stream(EVENTS[:2], hang=True)}) as srv:
            pool = fast(client(srv.url))
            stream = await pool.stream("/w", read_timeout=0.3)
            got = []
            with pytest.raises(TransportError, match=r"no data for 0\.3s"):
                async for line in stream.lines():
                    got.append(orjson.loads(line))
            await pool.aclose()
        assert got == EVENTS[:2]
    run(loop, main)


def test_a_slow_consumer_pauses_reading_and_loses_nothing(
    loop: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Stream, "MAX_BUFFERED", 3)
    paused: list[int] = []
    real = Stream.on_body

    def spy(self: Stream, body: bytes) -> None:
        real(self, body)
        paused.append(self._paused)

    monkeypatch.setattr(Stream, "on_body", spy)

    async def main() -> None:
        async with serving({"/w": watch_stream(EVENTS, piece=4096)}) as srv:
            pool = fast(client(srv.url))
            stream = await pool.stream("/w", read_timeout=5)
            got = []
            async for line in stream.lines():
                got.append(orjson.loads(line))
                await asyncio.sleep(0.001)
            await pool.aclose()
        assert got == EVENTS and any(paused)
    run(loop, main)


def test_closing_the_client_ends_its_open_watches(loop: str) -> None:
    async def main() -> None:
        async with serving({"/w": watch_stream(EVENTS[:1], hang=True)}) as srv:
            pool = fast(client(srv.url))
            stream = await pool.stream("/w", read_timeout=30)
            lines = stream.lines()
            assert orjson.loads(await anext(lines)) == EVENTS[0]
            await pool.aclose()
            with pytest.raises(TransportError, match="mid-response"):
                await anext(lines)
    run(loop, main)
