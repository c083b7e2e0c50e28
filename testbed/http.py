"""One GET against the test bed's own components (kube-apiserver, kube-scheduler, Lockstep):
their certificates are the bed's own, so they are not verified."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

__all__ = ["get"]


def get(url: str, token: str | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body); an HTTP error gives its status and body, a component not reachable
    (refused, timed out) status 0."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())
    except (urllib.error.URLError, OSError):
        return 0, b""
