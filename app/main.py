"""HTTP routes: the three extender verbs, health, metrics, debug and the admission webhook.

Each route decodes, calls the service once and encodes. Bad input is answered with a 4xx
that names the offending field; nothing a client sends can produce a 500 or change state
before it has been validated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from coscheduling import RecordError, pod_from_json, pod_key
from coscheduling.resources import QuantityError

from .admission import admission_router
from .explain import explain_pod, gang_json, node_json
from .render import render
from .service import Lockstep, UnknownObject
from .wire import BindingArgs, ExtenderArgs, PodShape

__all__ = ["DEFAULT_MAX_BODY", "create_app"]

DEFAULT_MAX_BODY = 64 * 1024 * 1024
"""A 15,000-node NodeList is ~60 MB; NodeNames requests are far smaller."""


class BadRequest(Exception):
    def __init__(self, status: int, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields or []


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


async def _body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise BadRequest(413, f"request body of {length} bytes exceeds the {limit}-byte limit",
                         ["body"])
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"request body exceeds the {limit}-byte limit", ["body"])
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        raise BadRequest(400, "empty request body: expected a JSON object", ["body"])
    return body


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


def _pod(args: ExtenderArgs) -> Any:
    try:
        PodShape.model_validate(args.Pod)
    except ValidationError as e:
        raise _invalid(e, "Pod") from None
    try:
        return pod_from_json(args.Pod)
    except RecordError as e:
        raise BadRequest(422, f"{e.field_path}: {e.reason}", [e.field_path]) from None
    except QuantityError as e:
        raise BadRequest(422, f"Pod.spec resources: {e}", ["Pod.spec"]) from None


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


async def _unless_hung_up(request: Request, call: Coroutine[Any, Any, str]) -> str:
    """Run a bind, cancelling it if kube-scheduler hangs up (it restarted, or gave up).

    A parked call whose client is gone would otherwise keep its place in the waiting map
    until the gang's deadline; cancelling it unparks the member (``core.abandon``), and
    kube-scheduler binds it again when it is back (issue 11)."""
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=HANGUP_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return "kube-scheduler hung up"
    finally:
        if not task.done():
            task.cancel()


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", "testclient")


def create_app(
    service: Lockstep,
    *,
    debug_token: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    manage_lifecycle: bool = True,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await service.stop()

    # No 307 to the slash-less path: every answer is a 2xx or a 4xx naming what was wrong.
    app = FastAPI(title="Lockstep", version="0.1.0", lifespan=lifespan, redirect_slashes=False)
    m = service.metrics

    # The admission webhook (app/admission.py) also answers here, for clients that reach
    # the extender's port; the API server calls it on --webhook-port, over TLS.
    app.include_router(admission_router(service.core.settings.scheduler_names, m.webhook))

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, exc: BadRequest) -> Response:
        return _json({"error": exc.message, "fields": exc.fields}, exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        # Routing answers (no such path, wrong method) in the same shape as every other 4xx.
        field = {404: "path", 405: "method"}.get(exc.status_code, "request")
        return _json({"error": str(exc.detail), "fields": [field]}, exc.status_code)

    @app.exception_handler(UnknownObject)
    async def unknown(_: Request, exc: UnknownObject) -> Response:
        return _json({"error": str(exc), "fields": [exc.kind]}, 404)

    def timed(verb: str) -> Callable[[], None]:
        start = time.perf_counter()
        hist = m.verb_seconds.labels(verb)
        return lambda: hist.observe(time.perf_counter() - start)

    @app.post("/filter")
    async def filter_(request: Request) -> Response:
        done = timed("filter")
        args = _decode(ExtenderArgs, await _body(request, max_body))
        pod, names = _pod(args), _names(args)
        d = service.filter(pod, names)
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
        done()
        return _json(out)

    @app.post("/prioritize")
    async def prioritize(request: Request) -> Response:
        done = timed("prioritize")
        args = _decode(ExtenderArgs, await _body(request, max_body))
        names = _names(args)
        body = _host_priorities(names, service.prioritize(_pod(args), names))
        done()
        return Response(body, media_type="application/json")

    @app.post("/bind")
    async def bind(request: Request) -> Response:
        done = timed("bind")
        args = _decode(BindingArgs, await _body(request, 1024 * 1024))
        err = await _unless_hung_up(
            request, service.bind(args.PodNamespace, args.PodName, args.PodUID, args.Node))
        done()
        return _json({"Error": err})

    @app.post("/noop")
    async def noop(request: Request) -> Response:
        """Parses a filter request and answers it unchanged: the benchmark's baseline."""
        args = _decode(ExtenderArgs, await _body(request, max_body))
        _pod(args)
        return _json({"NodeNames": _names(args), "FailedNodes": {}, "Error": ""})

    @app.get("/healthz")
    async def healthz() -> Response:
        if service.failed is not None:
            return PlainTextResponse(f"failed: {service.failed!r}", 500)
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz() -> Response:
        if service.ready:
            return PlainTextResponse("ok")
        missing = [n for n, r in service.cache.resources.items() if not r.synced]
        why = []
        if missing:
            why.append(f"cache not synced: {', '.join(missing)}")
        if not service.api_ok:
            why.append("API server not reachable")
        if service.failed is not None:
            why.append(f"failed: {service.failed!r}")
        return PlainTextResponse("not ready: " + "; ".join(why), 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    def guard(request: Request) -> Response | None:
        if _loopback(request):
            return None
        auth = request.headers.get("authorization", "")
        if debug_token and hmac.compare_digest(auth, f"Bearer {debug_token}"):
            return None
        return _json({"error": "debug endpoints answer loopback clients or a bearer token"}, 403)

    @app.get("/debug/gangs")
    async def debug_gangs(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        now = service.clock()
        return _json({"gangs": [gang_json(v, now) for v in service.core.gang_views(now)]})

    @app.get("/debug/nodes")
    async def debug_nodes(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        return _json({"nodes": [node_json(service.core, n) for n in service.core.node_names()]})

    @app.get("/debug/pods/{namespace}/{name}")
    async def debug_pod(namespace: str, name: str, request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        for field, value, limit in (("namespace", namespace, 63), ("name", name, 253)):
            if not value or len(value) > limit or not value.replace("-", "").replace(
                ".", ""
            ).isalnum() or value != value.lower():
                raise BadRequest(400, f"{field} {value!r} is not a valid Kubernetes name",
                                 [field])
        key = pod_key(namespace, name)
        if service.core.pod(key) is None:
            raise UnknownObject("pod", key)
        return _json(explain_pod(service, key))

    return app
