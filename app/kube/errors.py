"""Errors from the Kubernetes API, one class per status that callers act on.

::

    APIError (status, reason, message)
     +-- NotFound          404: object gone; treat as deleted
     +-- Conflict          409: already bound / changed under us
     +-- Gone              410: watch resourceVersion expired; relist
     +-- TooManyRequests   429: back off and retry
     +-- NotLeading        never sent: this replica does not lead (``app.kube.lease``)
    APIUnreachable         transport failure; the API server is down or restarting

They carry fields, never parsed messages; ``app.render`` turns them into text at the edge.

:class:`BadRequest` goes the other way: what Lockstep answers a client that sent it something
wrong, always as :func:`error_body` (the message and the fields it names).
"""

from __future__ import annotations

import orjson

__all__ = ["APIError", "APIUnreachable", "BadRequest", "Conflict", "Gone", "NotFound",
           "NotLeading", "TooManyRequests", "error_body"]


class BadRequest(Exception):
    """A request Lockstep will not serve: its 4xx ``status``, a ``message`` that says what is
    wrong, and the ``fields`` it names."""

    def __init__(self, status: int, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields or []


def error_body(message: str, fields: list[str]) -> bytes:
    """Every 4xx and 5xx Lockstep answers has this shape."""
    return orjson.dumps({"error": message, "fields": fields})


class APIError(Exception):
    def __init__(self, status: int, reason: str, message: str, *, path: str = "") -> None:
        super().__init__(f"{status} {reason}: {message} ({path})")
        self.status = status
        self.reason = reason
        self.message = message
        self.path = path

    @classmethod
    def from_status(cls, status: int, body: object, path: str) -> APIError:
        reason, message = "", ""
        if isinstance(body, dict):
            reason = str(body.get("reason") or "")
            message = str(body.get("message") or "")
        kind = {404: NotFound, 409: Conflict, 410: Gone, 429: TooManyRequests}.get(status, cls)
        return kind(status, reason, message or str(body)[:200], path=path)


class NotFound(APIError):
    pass


class Conflict(APIError):
    pass


class Gone(APIError):
    pass


class TooManyRequests(APIError):
    pass


class NotLeading(APIError):
    """A write refused before it was sent: this replica does not lead (or no longer does).
    A 503, so callers treat it as transient and a deposed replica's retries end in
    refusals too, never in a write from stale state."""

    def __init__(self, path: str) -> None:
        super().__init__(503, "NotLeading", "this Lockstep replica does not lead", path=path)


class APIUnreachable(Exception):
    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"API server unreachable ({path}): {cause}")
        self.path = path
        self.cause = cause
