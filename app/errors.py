"""Errors from the Kubernetes API, one class per status that callers act on.

::

    APIError (status, reason, message)
     +-- NotFound          404: object gone; treat as deleted
     +-- Conflict          409: already bound / changed under us
     +-- Gone              410: watch resourceVersion expired; relist
     +-- TooManyRequests   429: back off and retry
    APIUnreachable         transport failure; the API server is down or restarting

They carry fields, never parsed messages; ``app.render`` turns them into text at the edge.
"""

from __future__ import annotations

__all__ = ["APIError", "APIUnreachable", "Conflict", "Gone", "NotFound", "TooManyRequests"]


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


class APIUnreachable(Exception):
    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"API server unreachable ({path}): {cause}")
        self.path = path
        self.cause = cause
