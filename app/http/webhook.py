"""The mutating admission webhook: gang members are pinned at creation, or gated.

``POST /mutate/pods`` takes an ``admission.k8s.io/v1`` AdmissionReview. A Pod being created
whose ``spec.schedulerName`` is one of Lockstep's, that declares a gang by any convention
Lockstep reads (:func:`coscheduling.gang.gating.declares_gang`) and that is not bound already
(``spec.nodeName``: the API server rejects a pod with both a node and a gate) gets one of two
JSONPatches:

* **pinned**: its gang's quorum exists (members that exist, reviews in hand and this one)
  and the gang fits now: the whole plan is reserved before the answer and the pod gets the
  required node affinity the gate's lift would have written, and no gate. kube-scheduler
  filters one node for it and there is no lift to write (``app.http.pinning``,
  ``coscheduling.creation.placer``). A review whose gang has no quorum yet is **held** (its answer
  waits, at most about a second) for the sibling reviews that complete it: members created
  together are all pinned; one created alone is gated when the wait ends;
* **gated**: anything else (the gang does not fit yet, another party's gate such as Kueue's,
  a dry run, a Lockstep whose cache is not synced): ``lockstep.dev/gang`` is added to
  ``spec.schedulingGates``, as Kueue's pod webhook adds ``kueue.x-k8s.io/admission``, and the
  member waits outside kube-scheduler's queue until Lockstep admits its gang and lifts it.

A pod pinned here that the API server sends again (``reinvocationPolicy: IfNeeded``: a later
webhook changed it) keeps its pin if it is still the pod its slot was reserved for; with
another party's gate, other requests, or constraints its pinned node does not meet (a
``nodeSelector`` added, an affinity narrowed, a toleration taken away), the pin comes off,
the gate goes on and the slot is given back. A pin whose pod never reaches the watch is
given back within seconds.

Everything else is allowed unchanged: the webhook never denies a pod. A body that is no
AdmissionReview is answered 400 naming the field, like every other route; with the
``failurePolicy: Ignore`` of ``deploy/webhook/`` the API server then creates the pod ungated,
which Lockstep schedules through its extender verbs as before. It is served on the extender's
port and, with ``lockstep serve --webhook-port``, on a port of its own with TLS
(``create_webhook_app``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Protocol, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coscheduling import GANG_GATE, declares_gang, unpinned_terms

from ..kube.errors import BadRequest, error_body
from ..service import Lockstep
from .asgi import JSON, TEXT, Receive, Scope, Send, answer, lifespan, read_body
from .pinning import CreationPlacer
from .rest import JSON as MEDIA_JSON

__all__ = [
    "API_VERSION",
    "CLAIMS_PATH",
    "MAX_BODY",
    "WEBHOOK_PATH",
    "Admission",
    "AdmissionReview",
    "Decision",
    "Held",
    "Placer",
    "PodPart",
    "WebhookApp",
    "admission_router",
    "create_webhook_app",
    "decide",
    "review_response",
    "settle",
]

API_VERSION = "admission.k8s.io/v1"
WEBHOOK_PATH = "/mutate/pods"
CLAIMS_PATH = "/mutate/resourceclaims"
"""ResourceClaims being created: a claim made for a gang member from a template is narrowed
to the ``firstAvailable`` subrequests its gang's plan chose (``coscheduling.devices.narrow``,
docs/dra.md)."""
"""Where the API server sends pod reviews (``clientConfig`` in ``deploy/webhook/``)."""
MAX_BODY = 8 * 1024 * 1024
"""The API server sends at most its own 3 MiB request limit plus the review's envelope."""

log = logging.getLogger("lockstep.webhook")


class Decision(Enum):
    """What the webhook did with one review (the ``decision`` label of the metric)."""

    PINNED = "pinned"
    ALREADY_PINNED = "already-pinned"
    UNPINNED = "unpinned"
    GATED = "gated"
    ALREADY_GATED = "already-gated"
    NODE_NAME_SET = "node-name-set"
    NO_GANG = "no-gang"
    OTHER_SCHEDULER = "other-scheduler"
    NOT_POD_CREATE = "not-pod-create"
    MALFORMED = "malformed"


# ---------------------------------------------------------------------------- the wire


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str = Field(min_length=1)


class AdmissionRequest(_Wire):
    """The parts of ``AdmissionRequest`` the webhook reads."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str = ""
    dry_run: bool = Field(False, alias="dryRun")
    sub_resource: str = Field("", alias="subResource")
    obj: dict[str, Any] | None = Field(None, alias="object")


class AdmissionReview(_Wire):
    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class PodMetadata(_Wire):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class SchedulingGate(_Wire):
    name: str = Field(min_length=1)


class PodSpecPart(_Wire):
    scheduler_name: str = Field("", alias="schedulerName")
    node_name: str | None = Field(None, alias="nodeName")
    scheduling_gates: list[SchedulingGate] | None = Field(None, alias="schedulingGates")
    scheduling_group: dict[str, Any] | None = Field(None, alias="schedulingGroup")
    workload_ref: dict[str, Any] | None = Field(None, alias="workloadRef")


class PodPart(_Wire):
    """The parts of a Pod the webhook reads, so each is checked before it is used."""

    metadata: PodMetadata = Field(default_factory=PodMetadata)
    spec: PodSpecPart


M = TypeVar("M", bound=BaseModel)


def _validate(model: type[M], data: bytes | dict[str, Any], prefix: str = "") -> M:
    try:
        if isinstance(data, bytes):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as e:
        fields, parts = [], []
        for err in e.errors()[:5]:
            loc = ".".join(str(x) for x in (prefix, *err["loc"]) if x != "") or "body"
            fields.append(loc)
            parts.append(f"malformed JSON: {err['msg']}" if err["type"] == "json_invalid"
                         else f"{loc}: {err['msg']}")
        raise BadRequest(400, "; ".join(parts), fields) from None


# ---------------------------------------------------------------------------- the decision


class Placer(Protocol):
    """Placement at creation (``app.http.pinning.CreationPlacer``): the webhook's side effect."""

    def place(self, obj: dict[str, Any], namespace: str
              ) -> list[dict[str, Any]] | asyncio.Future[list[dict[str, Any]] | None] | None: ...

    def give_up(self, obj: dict[str, Any], namespace: str) -> None: ...

    def pinned(self, obj: dict[str, Any], namespace: str) -> str | None: ...

    def still_fits(self, obj: dict[str, Any], namespace: str, node: str) -> bool: ...

    def withdraw(self, obj: dict[str, Any], namespace: str) -> None: ...


HOLD_CAP_SECONDS = 1.5
"""The longest the route waits for a held review's answer (the core answers within
``coscheduling.creation.placer.HOLD_MAX_SECONDS``); then it gates, under the webhook's 2 s
timeout."""


@dataclass(frozen=True, slots=True)
class Held:
    """A review held for its gang's quorum: ``finish`` turns the answer into the patch."""

    answer: asyncio.Future[list[dict[str, Any]] | None]
    finish: Callable[[list[dict[str, Any]] | None], tuple[Decision, list[dict[str, Any]]]]
    give_up: Callable[[], None]


Outcome = tuple[Decision, list[dict[str, Any]]]


async def settle(out: Outcome | Held) -> Outcome:
    """``out``, or a held review's answer once it comes (gated if it does not in time)."""
    if not isinstance(out, Held):
        return out
    try:
        terms = await asyncio.wait_for(asyncio.shield(out.answer), HOLD_CAP_SECONDS)
    except TimeoutError:
        out.give_up()
        terms = None
    return out.finish(terms)


def decide(review: AdmissionReview, scheduler_names: frozenset[str],
           placer: Placer | None = None) -> Outcome | Held:
    """What to do with ``review``: the decision and the JSONPatch (empty: no change).

    With a ``placer``, a member whose gang fits is pinned instead of gated (its slot is
    reserved here, before the answer); a member pinned on an earlier call that comes back
    (reinvocation) with another party's gate, or no longer the pod its slot was reserved
    for, has the pin taken back and gets the gate. A dry run reserves nothing."""
    req = review.request
    if req.operation != "CREATE" or req.sub_resource or req.kind.group != "" \
            or req.kind.kind != "Pod":
        return Decision.NOT_POD_CREATE, []
    if req.obj is None:
        raise BadRequest(400, "request.object: missing (a CREATE carries the Pod)",
                        ["request.object"])
    pod = _validate(PodPart, req.obj, "request.object")
    spec = pod.spec
    if (spec.scheduler_name or "default-scheduler") not in scheduler_names:
        return Decision.OTHER_SCHEDULER, []
    if not declares_gang(req.obj):
        return Decision.NO_GANG, []
    if spec.node_name:
        return Decision.NODE_NAME_SET, []
    gates = spec.scheduling_gates or []
    if any(g.name == GANG_GATE for g in gates):
        return Decision.ALREADY_GATED, []
    gate = ([{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GANG_GATE}}]
            if gates else
            [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GANG_GATE}]}])
    if placer is None or req.dry_run:
        return Decision.GATED, gate
    ns = req.namespace
    node = placer.pinned(req.obj, ns)
    if node is not None:
        if not gates and placer.still_fits(req.obj, ns, node):
            return Decision.ALREADY_PINNED, []
        placer.withdraw(req.obj, ns)
        return Decision.UNPINNED, [*_unpin(req.obj, node), *gate]
    if not gates and (terms := placer.place(req.obj, ns)) is not None:
        if isinstance(terms, asyncio.Future):
            obj = req.obj

            def finish(got: list[dict[str, Any]] | None) -> Outcome:
                return (Decision.PINNED, _pin(obj, got)) if got is not None \
                    else (Decision.GATED, gate)

            def give_up() -> None:
                placer.give_up(obj, ns)

            return Held(terms, finish, give_up)
        return Decision.PINNED, _pin(req.obj, terms)
    return Decision.GATED, gate


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _pin(obj: dict[str, Any], terms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set the pod's required node affinity to ``terms`` (its own terms, each narrowed to
    the planned node): JSONPatch ``add`` replaces a member that exists."""
    required = {"nodeSelectorTerms": terms}
    affinity = obj["spec"].get("affinity")
    if not isinstance(affinity, dict):
        return [{"op": "add", "path": "/spec/affinity",
                 "value": {"nodeAffinity": {_REQUIRED: required}}}]
    if not isinstance(affinity.get("nodeAffinity"), dict):
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity",
                 "value": {_REQUIRED: required}}]
    return [{"op": "add", "path": f"/spec/affinity/nodeAffinity/{_REQUIRED}",
             "value": required}]


def _unpin(obj: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """Take the pin :func:`_pin` added out again, leaving the author's own terms."""
    affinity = obj["spec"].get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_affinity.get(_REQUIRED) if isinstance(node_affinity, dict) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not all(isinstance(t, dict) for t in terms):
        return []
    path = f"/spec/affinity/nodeAffinity/{_REQUIRED}"
    left = unpinned_terms(tuple(terms), node)
    if left == terms:
        return []
    if not left:
        return [{"op": "remove", "path": path}]
    return [{"op": "add", "path": path, "value": {"nodeSelectorTerms": left}}]


def review_response(uid: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The AdmissionReview answering request ``uid``: allowed, with ``patch`` if any."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode("ascii")
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


# ---------------------------------------------------------------------------- HTTP

def _too_big(length: str | None) -> BadRequest | None:
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        return BadRequest(413, f"request body of {length} bytes exceeds the {MAX_BODY}-byte "
                          "limit", ["body"])
    return None


async def _body(request: Request) -> bytes:
    """A FastAPI request's body, read as :func:`_read` reads the webhook port's."""
    if (big := _too_big(request.headers.get("content-length"))) is not None:
        raise big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(413, f"request body exceeds the {MAX_BODY}-byte limit", ["body"])
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        raise BadRequest(400, f"empty request body: expected {_EXPECTED}", ["body"])
    return body


_EXPECTED = "an AdmissionReview"


async def _read(scope: Scope, receive: Receive) -> bytes:
    return await read_body(receive, scope, MAX_BODY, _EXPECTED)


class Admission:
    """The two admission routes as plain functions of the request body: the status and the
    JSON answer. The webhook's own app (:class:`WebhookApp`) and the extender's FastAPI app
    (:func:`admission_router`) both call them.

    ``acting`` false (a standby, or a leader still rebuilding its view): every member is
    gated, never pinned, since a pin reserves from a ledger that may be stale; the leader
    admits and lifts it (``docs/failover.md``)."""

    def __init__(self, scheduler_names: frozenset[str], decisions: Counter,
                 placer: Placer | None = None,
                 acting: Callable[[], bool] = lambda: True,
                 narrow: Callable[[str, dict[str, Any]], list[dict[str, Any]]] | None = None
                 ) -> None:
        self.scheduler_names = scheduler_names
        self.placer = placer
        self.acting = acting
        self.narrow = narrow
        self._counted = {d: decisions.labels(d.value) for d in Decision}

    async def pods(self, body: bytes) -> tuple[int, bytes]:
        """``POST /mutate/pods``: the AdmissionReview answering ``body``, or a 4xx."""
        try:
            review = _validate(AdmissionReview, body)
            decision, patch = await settle(decide(review, self.scheduler_names,
                                                  self.placer if self.acting() else None))
        except BadRequest as e:
            self._counted[Decision.MALFORMED].inc()
            return e.status, error_body(e.message, e.fields)
        self._counted[decision].inc()
        return 200, orjson.dumps(review_response(review.request.uid, patch))

    def malformed(self, e: BadRequest) -> tuple[int, bytes]:
        """A pod review whose body could not be read (empty, too big): counted, answered."""
        self._counted[Decision.MALFORMED].inc()
        return e.status, error_body(e.message, e.fields)

    async def claims(self, body: bytes) -> tuple[int, bytes]:
        """``POST /mutate/resourceclaims``: the claim narrowed to its gang's plan, or not."""
        try:
            review = _validate(AdmissionReview, body)
        except BadRequest as e:
            return e.status, error_body(e.message, e.fields)
        req = review.request
        patch: list[dict[str, Any]] = []
        # A standby's plans may be stale: it narrows nothing (the leader's bind check and
        # first fit handle an unnarrowed claim).
        if self.narrow is not None and req.operation == "CREATE" and not req.dry_run \
                and req.kind.kind == "ResourceClaim" and req.obj is not None and self.acting():
            patch = self.narrow(req.namespace, req.obj)
        return 200, orjson.dumps(review_response(req.uid, patch))


def admission_router(scheduler_names: frozenset[str], decisions: Counter,
                     placer: Placer | None = None,
                     acting: Callable[[], bool] = lambda: True,
                     narrow: Callable[[str, dict[str, Any]], list[dict[str, Any]]] | None = None
                     ) -> APIRouter:
    """``POST /mutate/pods`` and ``POST /mutate/resourceclaims`` on a FastAPI app (the
    extender's port): :class:`Admission` behind FastAPI's routing."""
    router = APIRouter()
    admission = Admission(scheduler_names, decisions, placer, acting, narrow)

    @router.post(CLAIMS_PATH)
    async def mutate_claims(request: Request) -> Response:
        try:
            body = await _body(request)
        except BadRequest as e:
            return Response(error_body(e.message, e.fields), e.status, media_type=MEDIA_JSON)
        status, answer = await admission.claims(body)
        return Response(answer, status, media_type=MEDIA_JSON)

    @router.post(WEBHOOK_PATH)
    async def mutate_pods(request: Request) -> Response:
        try:
            body = await _body(request)
        except BadRequest as e:
            status, answer = admission.malformed(e)
        else:
            status, answer = await admission.pods(body)
        return Response(answer, status, media_type=MEDIA_JSON)

    return router


class WebhookApp:
    """The app of the webhook's own (TLS) port, a plain ASGI app as :class:`app.http.verbs.VerbsApp`
    is: the admission routes and ``/healthz`` only, so the extender verbs and debug endpoints
    stay on the extender's loopback port. FastAPI's middleware, routing and response objects
    cost about as much per review as the answer itself.

    Every other path is a 404 naming ``path``, another method a 405 naming ``method``, in the
    shape of every 4xx (``app.kube.errors.error_body``)."""

    def __init__(self, service: Lockstep) -> None:
        self.service = service
        self.admission = Admission(service.core.settings.scheduler_names,
                                   service.metrics.webhook, CreationPlacer(service),
                                   service.acting_now, service.core.narrow_claim)
        self._routes: dict[str, tuple[tuple[str, ...],
                                      Callable[[Scope, Receive], Awaitable[_Answer]]]] = {
            WEBHOOK_PATH: (("POST",), self._pods),
            CLAIMS_PATH: (("POST",), self._claims),
            "/healthz": (("GET", "HEAD"), self._healthz),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await lifespan(receive, send)
            return
        if kind != "http":
            return
        route = self._routes.get(scope["path"])
        method = scope["method"]
        if route is None:
            await answer(send, 404, error_body("Not Found", ["path"]), JSON)
            return
        methods, handler = route
        if method not in methods:
            await answer(send, 405, error_body("Method Not Allowed", ["method"]), JSON,
                         extra=((b"allow", ", ".join(methods).encode()),))
            return
        try:
            status, body, content_type = await handler(scope, receive)
        except ConnectionAbortedError:  # the client left before its body arrived
            return
        except Exception as e:  # a bug: answer it, log it, keep serving
            log.exception("%s %s", method, scope["path"])
            status, body, content_type = 500, error_body(f"internal error: {e!r}", []), JSON
        await answer(send, status, body, content_type, head=method == "HEAD")

    async def _pods(self, scope: Scope, receive: Receive) -> _Answer:
        try:
            body = await _read(scope, receive)
        except BadRequest as e:
            return (*self.admission.malformed(e), JSON)
        return (*await self.admission.pods(body), JSON)

    async def _claims(self, scope: Scope, receive: Receive) -> _Answer:
        try:
            body = await _read(scope, receive)
        except BadRequest as e:
            return e.status, error_body(e.message, e.fields), JSON
        return (*await self.admission.claims(body), JSON)

    async def _healthz(self, scope: Scope, receive: Receive) -> _Answer:
        if self.service.failed is not None:
            return 500, f"failed: {self.service.failed!r}".encode(), TEXT
        return 200, b"ok", TEXT


_Answer = tuple[int, bytes, bytes]


def create_webhook_app(service: Lockstep) -> WebhookApp:
    """The app of the webhook's own (TLS) port (:class:`WebhookApp`)."""
    return WebhookApp(service)
