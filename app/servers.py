"""The two uvicorn servers of a Lockstep process, and what each adds to uvicorn's.

Imported in a thread while the cache lists (``app.process``): uvicorn takes a noticeable
part of a second to import, and the API server encodes the lists meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn

from .service import Lockstep

__all__ = ["ExtenderServer", "WebhookServer"]


class ExtenderServer(uvicorn.Server):
    """The extender's server (verbs, probes, debug), answering parked binds at SIGTERM.

    uvicorn waits for in-flight requests before it runs the lifespan shutdown, and a parked
    bind is an in-flight request that may last until its gang's deadline: without this a
    rolling update would stall for minutes. kube-scheduler retries the answered calls against
    the next Lockstep. Its startup tells the service the verbs are served (gated gangs may be
    lifted now: a lifted member's filter call finds them)."""

    def __init__(self, config: uvicorn.Config, service: Lockstep) -> None:
        super().__init__(config)
        self._service = service
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            self._service.serve_verbs()

    async def shutdown(self, sockets: Any = None) -> None:
        # The service stops here, not after serve() returns: uvicorn then re-raises the
        # signal it caught, and asyncio's SIGINT handler would cancel the stop half way (a
        # watch still closing while the client is closed under it).
        await super().shutdown(sockets)
        await self._service.stop()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._answer_parked)
        super().handle_exit(sig, frame)

    def stop(self) -> None:
        """What SIGTERM does, from inside the loop, without the signal uvicorn re-raises
        at its end (tests, embedding)."""
        self._answer_parked()
        self.should_exit = True

    def _answer_parked(self) -> None:
        self._service.answer_parked(
            "Lockstep is shutting down; kube-scheduler will retry this bind")


class WebhookServer(uvicorn.Server):
    """The admission webhook's server, a second one in the same loop.

    Signals are the extender server's to handle (it answers parked binds first); this one
    stops when that one has. Lockstep is ready only once this one listens: the webhook fails
    open, so a pod created through an unreachable webhook would skip placement at creation."""

    def __init__(self, config: uvicorn.Config, service: Lockstep) -> None:
        super().__init__(config)
        self._service = service

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            self._service.webhook_listening = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def reload_certificate(self, cert_file: str, key_file: str) -> bool:
        """New handshakes use the new certificate; False when uvicorn has not loaded TLS yet
        (it reads the new files when it does)."""
        if self.config.ssl is None:
            return False
        self.config.ssl.load_cert_chain(cert_file, key_file)
        return True
