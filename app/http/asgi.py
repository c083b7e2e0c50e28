"""What Lockstep's two plain ASGI apps share: the extender's (``app.http.verbs.VerbsApp``) and the
webhook's (``app.http.webhook.WebhookApp``). Both skip FastAPI on their hot routes, so each reads a
body, answers and speaks uvicorn's lifespan protocol itself, the same way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..kube.errors import BadRequest

__all__ = ["JSON", "TEXT", "ASGIApp", "Message", "Receive", "Scope", "Send", "answer",
           "lifespan", "read_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"


async def read_body(receive: Receive, scope: Scope, limit: int, expected: str) -> bytes:
    """The request body, at most ``limit`` bytes (413 beyond, from the header or while it
    streams), not empty (400 saying the body should be ``expected``); a client that hangs
    up before it is sent raises ``ConnectionAbortedError``."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise BadRequest(413, f"request body of {value.decode()} bytes exceeds the "
                             f"{limit}-byte limit", ["body"])
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"request body exceeds the {limit}-byte limit", ["body"])
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    if not body:
        raise BadRequest(400, f"empty request body: expected {expected}", ["body"])
    return body


async def answer(send: Send, status: int, body: bytes, content_type: bytes,
                 head: bool = False, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """One whole response; a HEAD gets the headers (its length too) and no body."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra]})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def lifespan(receive: Receive, send: Send) -> None:
    """uvicorn's lifespan protocol: nothing to start or stop (the CLI runs the service)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
