"""A small async Kubernetes client: list, watch, bind, patch, post events.

Lockstep needs a handful of calls on its hot path and wants raw JSON (parsed once into slim
records), so it talks to the API server directly instead of through the generated client.
Configuration comes from a kubeconfig (token, client certificate or insecure) or from the
in-cluster service account. Requests and watches go through ``app.kube.fasthttp``, a client on
httptools that costs the event loop a third to a quarter of aiohttp's CPU per request
(``python -m benchmarks client``); the tests fake the API server below it, at the connection.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml

from coscheduling import BindFailed, BindOutcome, Bound, NodeName, PodKey

from . import nodeproto
from .errors import APIError, APIUnreachable, Conflict, NotLeading
from .fasthttp import Connector, FastHTTP, Refused, TransportError

__all__ = ["UPKEEP", "KubeClient", "KubeConfig", "load_config"]

T = TypeVar("T")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class KubeConfig:
    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False


def _materialise(data: str | None, suffix: str) -> str | None:
    if not data:
        return None
    f = tempfile.NamedTemporaryFile(delete=False, suffix=suffix)  # noqa: SIM115
    f.write(base64.b64decode(data))
    f.close()
    return f.name


def load_config(kubeconfig: str | None = None, token_override: str | None = None) -> KubeConfig:
    """From ``kubeconfig`` (its current context), else the in-cluster service account."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if not path:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ValueError("no --kubeconfig, no KUBECONFIG and not running in a cluster")
        sa_token = token_override or (SA_DIR / "token").read_text().strip()
        return KubeConfig(f"https://{host}:{port}", sa_token, str(SA_DIR / "ca.crt"))
    doc = yaml.safe_load(Path(path).read_text())
    ctx_name = doc.get("current-context")
    contexts = {c["name"]: c["context"] for c in doc.get("contexts") or ()}
    ctx = contexts.get(ctx_name) or next(iter(contexts.values()))
    cluster = {c["name"]: c["cluster"] for c in doc["clusters"]}[ctx["cluster"]]
    user = {u["name"]: u.get("user") or {} for u in doc.get("users") or ()}.get(ctx.get("user"), {})
    token = token_override or user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(str(user["tokenFile"])).read_text().strip()
    return KubeConfig(
        server=cluster["server"].rstrip("/"),
        token=token,
        ca_file=cluster.get("certificate-authority")
        or _materialise(cluster.get("certificate-authority-data"), ".crt"),
        cert_file=user.get("client-certificate")
        or _materialise(user.get("client-certificate-data"), ".crt"),
        key_file=user.get("client-key") or _materialise(user.get("client-key-data"), ".key"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def _decode(content: bytes) -> Any:
    """JSON, or the text itself: a 404 for an unknown API group is plain "404 page not found"."""
    if not content:
        return None
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode(errors="replace")[:500] if content[:1] not in b"{[" else None


def _ssl_context(cfg: KubeConfig) -> ssl.SSLContext | bool:
    """The TLS context for an https server; False for plain http."""
    if not cfg.server.startswith("https"):
        return False
    if cfg.insecure:
        # Not create_default_context(): it loads the system's CA bundle, which verifies
        # nothing here and took 70-130 ms of a start-up on two busy cores.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=cfg.ca_file)
    if cfg.cert_file and cfg.key_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


UPKEEP = re.compile(r"/api/v1/namespaces/[^/]+/secrets(/[^/]+)?"
                    r"|/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/[^/]+")
"""Writes every replica makes, leading or not: its webhook's certificate and caBundle
(``app.kube.certs``). Nothing that schedules is among them."""


class KubeClient:
    """The calls Lockstep makes, each mapping HTTP failures onto ``app.kube.errors``."""

    def __init__(
        self, cfg: KubeConfig, *, connect: Connector | None = None, timeout: float = 30.0,
    ) -> None:
        """``timeout`` bounds each request but a watch (connecting: 5 s at most);
        ``connect`` opens connections instead of TCP (tests: an in-memory API server)."""
        headers = {"Accept": "application/json", "User-Agent": "lockstep/0.1"}
        if cfg.token:
            headers["Authorization"] = f"Bearer {cfg.token}"
        tls = _ssl_context(cfg)
        self._http = FastHTTP(
            cfg.server, headers=headers, connect=connect,
            ssl_context=tls if isinstance(tls, ssl.SSLContext) else None,
            timeout=timeout, connect_timeout=min(5.0, timeout),
            # 64 gate lifts in flight (poster.LIFTERS) leave 16 connections to bindings and
            # Events. Each connection is a TLS handshake that costs both sides more CPU than
            # a write, and they are all made in the run's busiest second.
            max_connections=80,
            # Keep every connection: an idle one costs nothing, a new one a handshake.
            max_idle=80)
        self.may_write: Callable[[], bool] | None = None
        """The fence (``app.kube.lease``): when set and false, every write but the replica's
        own upkeep (:data:`UPKEEP`) is refused with :class:`NotLeading`, nothing sent. It is
        asked before the request and again right before its bytes go out, after any wait
        for a connection: a write that passed it while leading is not sent once the lead
        is lost."""
        self.fence_left: Callable[[], float] | None = None
        """Seconds the fence has left (``LeaseFollower.remaining``): a fenced write waits
        for a connection no longer than that, then is refused (:class:`NotLeading`)."""

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        protobuf: Callable[[bytes], Any] | None = None,
    ) -> Any:
        """The answer's JSON; with ``protobuf``, the API server is asked for its protobuf
        encoding (JSON still accepted) and a protobuf answer is decoded with it."""
        gate = self.may_write if method != "GET" and not UPKEEP.fullmatch(path) else None
        within = None
        if gate is not None:
            if not gate():
                raise NotLeading(path)
            within = self.fence_left() if self.fence_left is not None else None
        body = orjson.dumps(json) if json is not None else None
        accept = nodeproto.ACCEPT if protobuf is not None else None
        try:
            status, content = await self._http.request(
                method, path, params=params, body=body, content_type=content_type,
                accept=accept, gate=gate, send_within=within)
        except Refused:
            raise NotLeading(path) from None  # the lead ended while it waited: not sent
        except TransportError as e:
            raise APIUnreachable(path, e) from e
        if protobuf is not None and content.startswith(nodeproto.PREFIX):
            try:
                data = protobuf(content) if status < 400 else nodeproto.decode_status(content)
            except ValueError as e:
                raise APIError(status, "BadResponse", str(e), path=path) from None
        else:
            data = _decode(content)
        if status >= 400:
            raise APIError.from_status(status, data, path)
        if content and data is None:
            raise APIError(status, "BadResponse", "response is not JSON", path=path)
        return data

    async def list(
        self, path: str, *, page: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """All items (paginated) and the list's resourceVersion to watch from."""
        items: list[dict[str, Any]] = []
        params = {"limit": str(page)}
        while True:
            data = await self.request("GET", path, params=params)
            items.extend(data.get("items") or ())
            meta = data.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion") or "")
            params = {"limit": str(page), "continue": cont}

    async def list_parsed(
        self, path: str, parse: Callable[[dict[str, Any]], T | None], *, page: int = 500,
        protobuf: Callable[[bytes], dict[str, Any]] | None = None, from_cache: bool = False,
    ) -> tuple[builtins.list[T], str]:
        """``list``, with every page parsed into records (None dropped) as it arrives.

        The raw pages are dropped one by one, so a relist of 50,000 pods never holds them
        all at once: holding the whole raw list first cost 1 GB of RSS. The next
        page is asked for before this one is parsed, so the API server encodes it meanwhile
        (at start-up, listing 5,000 nodes page after page took 0.8 s on two busy cores).

        ``from_cache`` asks for ``resourceVersion=0``: the API server's watch cache answers,
        possibly a moment behind etcd, and (v1.34) ignores the limit, so the whole list comes
        in one answer. That is client-go's first list; a watch from its resourceVersion brings
        what it missed."""
        out: builtins.list[T] = []
        params = {"limit": str(page)}
        if from_cache:
            params["resourceVersion"] = "0"
        pending: asyncio.Task[Any] | None = None
        try:
            data = await self.request("GET", path, params=params, protobuf=protobuf)
            while True:
                meta = data.get("metadata") or {}
                cont = meta.get("continue")
                if cont:
                    params = {"limit": str(page), "continue": cont}
                    pending = asyncio.create_task(
                        self.request("GET", path, params=params, protobuf=protobuf))
                    await asyncio.sleep(0)  # let it send before the parsing below
                out.extend(r for r in map(parse, data.get("items") or ()) if r is not None)
                del data
                if pending is None:
                    return out, str(meta.get("resourceVersion") or "")
                data, pending = await pending, None
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    async def watch(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events as dicts (``type``, ``object``); ERROR events are passed through."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        try:
            stream = await self._http.stream(path, params=params,
                                             read_timeout=timeout_seconds + 30.0)
        except TransportError as e:
            raise APIUnreachable(path, e) from e
        try:
            if stream.status >= 400:
                raise APIError.from_status(stream.status, _decode(await stream.read()), path)
            async for line in stream.lines():
                yield orjson.loads(line)
        except TransportError as e:
            raise APIUnreachable(path, e) from e
        finally:
            stream.close()

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", json=body)

    async def bind_retrying(
        self, key: PodKey, namespace: str, name: str, uid: str, node: NodeName, *,
        retries: int = 3, already_bound: Callable[[], bool] = lambda: False,
        first_delay: float = 0.2,
    ) -> BindOutcome:
        """Bind, retrying what may pass later (5xx, 429, no connection) with backoff.

        Permanent failures (404 pod gone, 403, 422, a 409 that is not our own earlier
        success) come back at once as ``BindFailed(permanent=True)``: retrying cannot help.
        """
        delay = first_delay
        last = "API server unavailable"
        for attempt in range(retries + 1):
            try:
                await self.bind(namespace, name, uid, node)
                return Bound(key, node)
            except Conflict as e:
                # A 409 after a lost answer is usually our own earlier attempt: ask the API
                # server (the watch may lag) where the pod is before calling it a failure.
                if already_bound() or await self._bound_to(namespace, name, uid, node):
                    return Bound(key, node)
                return BindFailed(key, node, f"binding {key} to {node}: {e.message}", True)
            except APIError as e:
                if e.status < 500 and e.status != 429:
                    return BindFailed(key, node,
                                      f"binding {key} to {node}: {e.status} {e.message}", True)
                last = f"{e.status} {e.message}"
            except APIUnreachable:
                pass
            if attempt < retries:
                await asyncio.sleep(delay)
                delay *= 2
        return BindFailed(key, node, f"binding {key} to {node}: {last}; kube-scheduler will "
                          "retry", permanent=False)

    async def _bound_to(self, namespace: str, name: str, uid: str, node: NodeName) -> bool:
        try:
            pod = await self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except (APIError, APIUnreachable):
            return False
        meta = pod.get("metadata") or {} if isinstance(pod, dict) else {}
        spec = pod.get("spec") or {} if isinstance(pod, dict) else {}
        return bool(spec.get("nodeName") == node and (not uid or meta.get("uid") == uid))

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        return await self.request(
            "PATCH", path, json=patch, content_type="application/merge-patch+json"
        )

    async def strategic_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        return await self.request(
            "PATCH", path, json=patch, content_type="application/strategic-merge-patch+json"
        )

    async def post_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        await self.request("POST", f"/api/v1/namespaces/{namespace}/events", json=event)

    async def healthy(self) -> bool:
        try:
            async with asyncio.timeout(5.0):
                status, _ = await self._http.request("GET", "/readyz")
        except (TimeoutError, TransportError):
            return False
        return status == 200
