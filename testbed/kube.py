"""A small synchronous Kubernetes client for tests, the demo and benchmarks."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

__all__ = ["Kube", "KubeError"]


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str, path: str) -> None:
        super().__init__(f"{status} {path}: {message}")
        self.status = status
        self.message = message
        self.path = path


class Kube:
    def __init__(self, server: str, token: str) -> None:
        self.server = server
        self._http = httpx.Client(
            base_url=server, verify=False, timeout=30.0,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    @classmethod
    def from_kubeconfig(cls, path: str | Path) -> Kube:
        doc = yaml.safe_load(Path(path).read_text())
        return cls(doc["clusters"][0]["cluster"]["server"], doc["users"][0]["user"]["token"])

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: Any = None,
                params: dict[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        r = self._http.request(
            method, path, params=params,
            content=orjson.dumps(body) if body is not None else None,
            headers={"Content-Type": content_type} if body is not None else None,
        )
        data = orjson.loads(r.content) if r.content and r.content[:1] in b"{[" else r.text
        if r.status_code >= 400:
            msg = data.get("message", "") if isinstance(data, dict) else str(data)
            raise KubeError(r.status_code, msg, path)
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

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        ns = pod["metadata"].get("namespace", "default")
        return dict(self.create(f"/api/v1/namespaces/{ns}/pods", pod))

    def pods(self, ns: str, **params: str) -> builtins.list[dict[str, Any]]:
        return self.list(f"/api/v1/namespaces/{ns}/pods", **params)

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/namespaces/{ns}/pods/{name}"))

    def delete_pod(self, ns: str, name: str) -> None:
        self.delete(f"/api/v1/namespaces/{ns}/pods/{name}")

    def events(self, ns: str, name: str | None = None) -> builtins.list[dict[str, Any]]:
        params = {"fieldSelector": f"involvedObject.name={name}"} if name else {}
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
                raise KubeError(r.status_code, r.text, path)
            for line in r.iter_lines():
                if line:
                    yield orjson.loads(line)
