"""The extender verbs and the health probes as a plain ASGI app, in front of FastAPI.

Why not FastAPI routes: kube-scheduler's single scheduling thread waits on ``/filter`` for
every pod, and FastAPI's middleware stack and router cost more per call than Lockstep's own
answer. Importing FastAPI (about 0.25 s of CPU, seconds of GIL contention on a
busy node) also delayed the first verbs at start-up, when kube-scheduler sends the most.
This app answers ``/filter``, ``/prioritize``, ``/bind``, ``/noop``, ``/healthz`` and
``/readyz`` itself and hands every other request (metrics, debug, the webhook) to ``rest``,
the FastAPI app, which the CLI loads when the first such request arrives.

Each verb decodes, calls the service once and encodes. Bad input is answered with a 4xx that
names the offending field; nothing a client sends can produce a 500 or change state before
it has been validated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from coscheduling import PodKey, PodRecord, QuantityError, RecordError, pod_from_json, pod_key

from ..kube.errors import BadRequest, error_body
from ..render import render
from ..service import NOT_LEADING, Lockstep, UnknownObject
from .asgi import JSON, TEXT, ASGIApp, Receive, Scope, Send, answer, lifespan, read_body
from .wire import BindingArgs, ExtenderArgs, validate_shape

__all__ = ["DEFAULT_MAX_BODY", "VerbsApp"]

log = logging.getLogger("lockstep")

DEFAULT_MAX_BODY = 64 * 1024 * 1024
"""A 15,000-node NodeList is ~60 MB; NodeNames requests are far smaller."""
BIND_MAX_BODY = 1024 * 1024



M = TypeVar("M", bound=BaseModel)


def _decode(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise _invalid(e) from None


def _invalid(e: ValidationError, prefix: str = "") -> BadRequest:
    fields = []
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in (prefix, *err["loc"]) if x != "") or "body"
        fields.append(loc)
        if err["type"] == "json_invalid":
            parts.append(f"malformed JSON: {err['msg']}")
        else:
            parts.append(f"{loc}: {err['msg']}")
    status = 400 if any("malformed JSON" in p for p in parts) else 422
    return BadRequest(status, "; ".join(parts), fields)


def _pod(args: ExtenderArgs,
         cached: Callable[[PodKey], PodRecord | None] | None = None) -> Any:
    """The call's pod as a record. When the core holds the very version the call carries
    (same UID and resourceVersion, and no node of its own: the watch delivered it before
    kube-scheduler asked), that record is the answer, decoded once by the watch: the
    API server serves one object per resourceVersion, so it is the pod the call describes."""
    if cached is not None and (rec := _held_version(args.Pod, cached)) is not None:
        return rec
    try:
        validate_shape(args.Pod)
    except ValidationError as e:
        raise _invalid(e, "Pod") from None
    try:
        return pod_from_json(args.Pod)
    except RecordError as e:
        raise BadRequest(422, f"{e.field_path}: {e.reason}", [e.field_path]) from None
    except QuantityError as e:
        raise BadRequest(422, f"Pod.spec resources: {e}", ["Pod.spec"]) from None


def _held_version(obj: dict[str, Any], cached: Callable[[PodKey], PodRecord | None]
                  ) -> PodRecord | None:
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    name, ns = meta.get("name"), meta.get("namespace") or "default"
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if not (isinstance(name, str) and isinstance(ns, str) and isinstance(uid, str) and uid
            and isinstance(rv, str) and rv.isascii() and rv.isdigit() and len(rv) < 20):
        return None
    rec = cached(pod_key(ns, name))
    if rec is None or rec.uid != uid or rec.resource_version != int(rv) \
            or rec.node_name is not None or spec.get("nodeName"):
        return None
    return rec


def _names(args: ExtenderArgs) -> list[str]:
    if args.NodeNames is not None:
        return list(args.NodeNames)
    if args.Nodes is not None:
        items = args.Nodes.get("items")
        if not isinstance(items, list):
            raise BadRequest(422, "Nodes.items: expected a list of Node objects", ["Nodes.items"])
        names = []
        for i, n in enumerate(items):
            meta = n.get("metadata") if isinstance(n, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str):
                field = f"Nodes.items.{i}.metadata.name"
                raise BadRequest(422, f"{field}: missing", [field])
            names.append(name)
        return names
    raise BadRequest(422, "NodeNames and Nodes are both null: nothing to filter",
                     ["NodeNames", "Nodes"])


_FRAGMENTS: dict[str, tuple[int, bytes]] = {}


def _host_priorities(names: list[str], scores: list[int]) -> bytes:
    """``[{"Host": ..., "Score": ...}, ...]`` from a per-node cache of JSON fragments.

    Several times faster than building a dict per node and serialising the list, on a verb
    kube-scheduler waits for; one fragment per node is kept and rebuilt when its score moves.
    """
    if len(_FRAGMENTS) > 200_000:
        _FRAGMENTS.clear()
    get = _FRAGMENTS.get
    parts = [
        cached[1] if (cached := get(name)) is not None and cached[0] == score
        else _fragment(name, score)
        for name, score in zip(names, scores, strict=True)
    ]
    return b"[" + b",".join(parts) + b"]"


def _fragment(name: str, score: int) -> bytes:
    frag = b'{"Host":%s,"Score":%d}' % (orjson.dumps(name), score)
    _FRAGMENTS[name] = (score, frag)
    return frag


HANGUP_POLL_SECONDS = 0.5


async def _read_body(receive: Receive, scope: Scope, limit: int) -> bytes:
    return await read_body(receive, scope, limit, "a JSON object")


async def _hang_up(receive: Receive) -> None:
    """Returns when the client has gone (its request body was read in full before)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(HANGUP_POLL_SECONDS)  # a server that answers with no event


async def _unless_hung_up(receive: Receive, call: Coroutine[Any, Any, str]) -> str:
    """Run a bind, cancelling it if kube-scheduler hangs up (it restarted, or gave up).

    A parked call whose client is gone would otherwise keep its place in the waiting map
    until the gang's deadline; cancelling it unparks the member (``core.abandon``), and
    kube-scheduler binds it again when it is back."""
    task = asyncio.ensure_future(call)
    gone = asyncio.ensure_future(_hang_up(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return "kube-scheduler hung up"
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()




class VerbsApp:
    """The ASGI app uvicorn serves: the verbs and probes here, everything else in ``rest``."""

    def __init__(self, service: Lockstep, *, max_body: int = DEFAULT_MAX_BODY,
                 rest: ASGIApp | None = None,
                 load_rest: Callable[[], Awaitable[ASGIApp]] | None = None) -> None:
        self.service = service
        self.max_body = max_body
        self.rest = rest
        """The app for every other path; ``load_rest`` makes it on first need."""
        self._load_rest = load_rest
        self._loading: asyncio.Future[ASGIApp] | None = None
        m = service.metrics
        self._hist = {v: m.verb_seconds.labels(v) for v in ("filter", "prioritize", "bind")}
        posts: dict[str, Callable[[Scope, Receive], Awaitable[tuple[int, bytes, bytes]]]] = {
            "/filter": self._filter, "/prioritize": self._prioritize, "/bind": self._bind,
            "/noop": self._noop}
        gets = {"/healthz": self._healthz, "/readyz": self._readyz}
        self._routes: dict[str, tuple[tuple[str, ...], Any]] = {
            **{p: (("POST",), h) for p, h in posts.items()},
            **{p: (("GET", "HEAD"), h) for p, h in gets.items()}}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is not None:
            await self._serve(route, scope, receive, send)
        elif self.rest is not None:
            await self.rest(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] != "http":
            return
        elif self._load_rest is None:
            await answer(send, 503, error_body(
                "only the extender verbs and probes answer here", ["path"]), JSON)
        else:
            try:
                rest = await self.load_rest()
            except Exception as e:
                log.exception("loading the HTTP routes beside the verbs failed")
                await answer(send, 503, error_body(
                    f"the routes beside the verbs could not be loaded: {e!r}", ["path"]),
                    JSON, extra=((b"retry-after", b"1"),))
                return
            await rest(scope, receive, send)

    async def load_rest(self) -> ASGIApp:
        """The app for the other paths, made once; callers arriving meanwhile share it."""
        if self.rest is not None:
            return self.rest
        assert self._load_rest is not None
        failed = self._loading is not None and self._loading.done() and (
            self._loading.cancelled() or self._loading.exception() is not None)
        if self._loading is None or failed:
            self._loading = asyncio.ensure_future(self._load_rest())
        self.rest = await asyncio.shield(self._loading)
        return self.rest

    async def _serve(self, route: tuple[tuple[str, ...], Any], scope: Scope, receive: Receive,
                     send: Send) -> None:
        methods, handler = route
        method = scope["method"]
        if method not in methods:
            await answer(send, 405, error_body("Method Not Allowed", ["method"]), JSON,
                          extra=((b"allow", ", ".join(methods).encode()),))
            return
        try:
            status, body, content_type = await handler(scope, receive)
        except BadRequest as e:
            status, body, content_type = e.status, error_body(e.message, e.fields), JSON
        except UnknownObject as e:
            status, body, content_type = 404, error_body(str(e), [e.kind]), JSON
        except ConnectionAbortedError:  # the client left before its body arrived
            return
        except Exception as e:  # a bug: answer it, log it, keep serving
            log.exception("%s %s", method, scope["path"])
            status, body, content_type = 500, error_body(f"internal error: {e!r}", []), JSON
        await answer(send, status, body, content_type, head=method == "HEAD")

    def _timed(self, verb: str) -> Callable[[], None]:
        start = time.perf_counter()
        hist = self._hist[verb]
        return lambda: hist.observe(time.perf_counter() - start)

    async def _filter(self, scope: Scope, receive: Receive) -> tuple[int, bytes, bytes]:
        done = self._timed("filter")
        args = _decode(ExtenderArgs, await _read_body(receive, scope, self.max_body))
        pod, names = _pod(args, self.service.core.queries.pod), _names(args)
        if not self.service.acting and not await self.service.await_acting():
            # A replica that does not act decides nothing (a filter may reserve, nominate
            # or preempt): kube-scheduler retries the pod, by then calling the leader.
            done()
            return 200, orjson.dumps({"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                      "FailedAndUnresolvableNodes": {},
                                      "Error": NOT_LEADING}), JSON
        d = self.service.filter(pod, names)
        out: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                               "FailedAndUnresolvableNodes": {}, "Error": ""}
        if d.unresolvable is not None:
            text = render(d.unresolvable)
            out["FailedAndUnresolvableNodes"] = dict.fromkeys(names, text)
            passed: list[str] = []
        else:
            passed = list(d.passed)
            out["FailedNodes"] = {n: render(r) for n, r in d.failed.items()}
        if args.NodeNames is not None:
            out["NodeNames"] = passed
        else:
            keep = set(passed)
            items = [n for n in (args.Nodes or {}).get("items", []) if
                     n["metadata"]["name"] in keep]
            out["Nodes"] = {**(args.Nodes or {}), "items": items}
        body = orjson.dumps(out)
        done()
        return 200, body, JSON

    async def _prioritize(self, scope: Scope, receive: Receive) -> tuple[int, bytes, bytes]:
        done = self._timed("prioritize")
        args = _decode(ExtenderArgs, await _read_body(receive, scope, self.max_body))
        names = _names(args)
        pod = _pod(args, self.service.core.queries.pod)
        body = _host_priorities(names, self.service.prioritize(pod, names))
        done()
        return 200, body, JSON

    async def _bind(self, scope: Scope, receive: Receive) -> tuple[int, bytes, bytes]:
        done = self._timed("bind")
        args = _decode(BindingArgs, await _read_body(receive, scope, BIND_MAX_BODY))
        err = await _unless_hung_up(receive, self.service.bind(
            args.PodNamespace, args.PodName, args.PodUID, args.Node))
        done()
        return 200, orjson.dumps({"Error": err}), JSON

    async def _noop(self, scope: Scope, receive: Receive) -> tuple[int, bytes, bytes]:
        """Parses a filter request and answers it unchanged: the verbs benchmark's baseline."""
        args = _decode(ExtenderArgs, await _read_body(receive, scope, self.max_body))
        _pod(args)
        return 200, orjson.dumps({"NodeNames": _names(args), "FailedNodes": {},
                                  "Error": ""}), JSON

    async def _healthz(self, scope: Scope, receive: Receive) -> tuple[int, bytes, bytes]:
        if self.service.failed is not None:
            return 500, f"failed: {self.service.failed!r}".encode(), TEXT
        return 200, b"ok", TEXT

    async def _readyz(self, scope: Scope, receive: Receive) -> tuple[int, bytes, bytes]:
        service = self.service
        if service.ready:
            return 200, b"ok", TEXT
        missing = [n for n, r in service.cache.resources.items() if not r.synced]
        why = []
        if missing:
            why.append(f"cache not synced: {', '.join(missing)}")
        if not service.api_ok:
            why.append("API server not reachable")
        if not service.webhook_listening:
            why.append("admission webhook server not listening yet")
        if service.failed is not None:
            why.append(f"failed: {service.failed!r}")
        return 503, ("not ready: " + "; ".join(why)).encode(), TEXT
