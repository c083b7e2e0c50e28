"""HTTP routes beside the verbs: metrics, debug, the admission webhook and routing errors.

The verbs and probes are answered by ``app.http.verbs.VerbsApp`` before a request reaches
FastAPI; ``app.process.extender_app`` puts the two together, and the process serves the
verbs before this module is even imported. Bad input is answered with a 4xx that names the
offending field.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from collections.abc import Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coscheduling import pod_key

from ..kube.errors import BadRequest
from ..service import Lockstep, UnknownObject
from .explain import explain_pod, gang_json, node_json
from .pinning import CreationPlacer
from .rest import add_error_handlers, json_response
from .ui import ui_router
from .webhook import admission_router
from .whatif import read_body, what_if

__all__ = ["create_rest_app"]


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", "testclient")


def create_rest_app(
    service: Lockstep,
    *,
    debug_token: str | None = None,
    ui: bool = True,
) -> FastAPI:
    """The routes that are not verbs or probes (``VerbsApp`` answers those first). The
    service's life is the process's (``app.process``), not this app's."""
    # No 307 to the slash-less path: every answer is a 2xx or a 4xx naming what was wrong.
    app = FastAPI(title="Lockstep", version="0.1.0", redirect_slashes=False)
    m = service.metrics

    # The admission webhook (app/http/webhook.py) also answers here, for clients that reach
    # the extender's port; the API server calls it on --webhook-port, over TLS.
    app.include_router(admission_router(service.core.settings.scheduler_names, m.webhook,
                                        CreationPlacer(service), service.acting_now,
                                        service.core.narrow_claim))

    add_error_handlers(app)

    @app.exception_handler(UnknownObject)
    async def unknown(_: Request, exc: UnknownObject) -> Response:
        return json_response({"error": str(exc), "fields": [exc.kind]}, 404)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    def guard(request: Request) -> Response | None:
        if _loopback(request):
            return None
        auth = request.headers.get("authorization", "")
        if debug_token and hmac.compare_digest(auth, f"Bearer {debug_token}"):
            return None
        return json_response(
            {"error": "debug endpoints answer loopback clients or a bearer token"}, 403)

    if ui:  # the read-only web page and its JSON, behind the same guard (app/http/ui.py)
        app.include_router(ui_router(service, guard))
    app.include_router(_debug_router(service, guard))
    return app


def _debug_router(service: Lockstep, guard: Callable[[Request], Response | None]
                  ) -> APIRouter:
    """``/debug/*``: what the core holds, for loopback clients or a bearer token."""
    app = APIRouter()

    @app.get("/debug/gangs")
    async def debug_gangs(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        now = service.clock()
        views = service.core.queries.gang_views()
        return json_response({"gangs": [gang_json(v, now) for v in views]})

    @app.get("/debug/loop")
    async def debug_loop(request: Request) -> Response:
        """How long work held the event loop (``app.service.LoopLag``); ``?reset=1`` starts
        the maximum afresh (a benchmark's phase)."""
        if (denied := guard(request)) is not None:
            return denied
        lag = service.lag
        out = {"lastLagSeconds": round(lag.last, 4), "maxLagSeconds": round(lag.max, 4),
               "heldOverWarnSeconds": lag.held_over_warn}
        if request.query_params.get("reset") == "1":
            lag.reset()
        return json_response(out)

    @app.get("/debug/nodes")
    async def debug_nodes(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        q = service.core.queries
        return json_response({"nodes": [node_json(q, n) for n in sorted(q.nodes)]})

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
        if service.core.queries.pod(key) is None:
            raise UnknownObject("pod", key)
        return json_response(explain_pod(service, key))

    one_at_a_time = asyncio.Lock()

    @app.post("/debug/what-if")
    async def debug_what_if(request: Request) -> Response:
        """Would this manifest fit? A dry plan against the live state (app/http/whatif.py), one
        at a time: a victim search is seconds of CPU at most, and two would share the loop
        with the verbs twice over."""
        if (denied := guard(request)) is not None:
            return denied
        body = await read_body(request)
        if one_at_a_time.locked():
            raise BadRequest(429, "a what-if is running: one at a time, ask again when it "
                                  "has answered", ["request"])
        async with one_at_a_time:
            answer = await what_if(service, body)
        return json_response(answer.model_dump())

    return app
