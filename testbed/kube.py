"""A small synchronous Kubernetes client for tests, the demo and benchmarks.

Plain JSON over httpx with the test bed's bearer token (TLS verification off: the API server's
certificate is self-signed on 127.0.0.1), so tests see exactly what the API returns. Non-2xx
answers raise ``KubeError`` (``NotFound`` for 404, ``Conflict`` for 409) with the status and
the API's message.
"""

from __future__ import annotations

import builtins
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

__all__ = ["Conflict", "Kube", "KubeError", "NotFound"]


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str, path: str) -> None:
        super().__init__(f"{status} {path}: {message}")
        self.status = status
        self.message = message
        self.path = path


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


def _error(status: int, message: str, path: str) -> KubeError:
    cls = {404: NotFound, 409: Conflict}.get(status, KubeError)
    return cls(status, message, path)


class Kube:
    def __init__(self, server: str, token: str) -> None:
        self.server = server
        self.token = token
        self._watch_sockets: set[socket.socket] = set()
        self._http = httpx.Client(
            base_url=server, verify=False, timeout=30.0,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    def clone(self) -> Kube:
        """A client of its own, sharing nothing with this one."""
        return Kube(self.server, self.token)

    def abort_watches(self) -> None:
        """Hang up every open watch now (from any thread); its iterator then raises."""
        for sock in list(self._watch_sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.abort_watches()
        self._http.close()

    def __enter__(self) -> Kube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None,
                params: dict[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if body is not None else None
        for _ in range(20):  # 429: a watch cache (re)initializing, e.g. a CRD just created
            r = self._http.request(method, path, params=params, content=content,
                                   headers=headers)
            if r.status_code != 429:
                break
            time.sleep(min(float(r.headers.get("Retry-After") or 1), 1.0) or 0.2)
        data = orjson.loads(r.content) if r.content and r.content[:1] in b"{[" else r.text
        if r.status_code >= 400:
            msg = data.get("message", "") if isinstance(data, dict) else str(data)
            raise _error(r.status_code, msg, path)
        return data

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def delete(self, path: str, grace: int | None = 0) -> Any:
        params = {"gracePeriodSeconds": str(grace)} if grace is not None else None
        try:
            return self.request("DELETE", path, params=params)
        except KubeError as e:
            if e.status != 404:
                raise
            return None

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def list(self, path: str, **params: str) -> builtins.list[dict[str, Any]]:
        return list(self.request("GET", path, params=params or None).get("items") or [])

    # conveniences ----------------------------------------------------------------

    def ensure_namespace(self, ns: str) -> None:
        try:
            self.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        except KubeError as e:
            if e.status != 409:
                raise

    def nodes(self, **params: str) -> builtins.list[dict[str, Any]]:
        return self.list("/api/v1/nodes", **params)

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/nodes/{name}"))

    def create_node(self, node: dict[str, Any]) -> dict[str, Any]:
        return dict(self.create("/api/v1/nodes", node))

    def delete_node(self, name: str) -> None:
        self.delete(f"/api/v1/nodes/{name}")

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        ns = pod["metadata"].get("namespace", "default")
        return dict(self.create(f"/api/v1/namespaces/{ns}/pods", pod))

    def pods(self, ns: str, **params: str) -> builtins.list[dict[str, Any]]:
        return self.list(f"/api/v1/namespaces/{ns}/pods", **params)

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/namespaces/{ns}/pods/{name}"))

    def delete_pod(self, ns: str, name: str) -> None:
        self.delete(f"/api/v1/namespaces/{ns}/pods/{name}")

    def events(self, ns: str, name: str | None = None, kind: str | None = None
               ) -> builtins.list[dict[str, Any]]:
        """Events in ``ns`` about the object ``name`` (of ``kind``), in the API's order."""
        sel = [f"involvedObject.name={name}"] if name else []
        sel += [f"involvedObject.kind={kind}"] if kind else []
        params = {"fieldSelector": ",".join(sel)} if sel else {}
        return self.list(f"/api/v1/namespaces/{ns}/events", **params)

    def wait(self, what: str, cond: Any, timeout: float = 60.0, interval: float = 0.2) -> Any:
        """Poll ``cond()`` until truthy; raises TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = cond()
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")

    def watch(self, path: str, resource_version: str, timeout: int = 60
              ) -> Iterator[dict[str, Any]]:
        params = {"watch": "1", "resourceVersion": resource_version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout)}
        with self._http.stream("GET", path, params=params,
                               timeout=httpx.Timeout(timeout + 10.0)) as r:
            if r.status_code >= 400:
                r.read()
                raise _error(r.status_code, r.text, path)
            stream = r.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                self._watch_sockets.add(sock)
            try:
                for line in r.iter_lines():
                    if line:
                        yield orjson.loads(line)
            finally:
                self._watch_sockets.discard(sock)
