"""A Service for the webhook on a test bed with no Service: a TCP forwarder to the replicas.

In a cluster, the API server calls the webhook through the ``lockstep-webhook`` Service,
which spreads connections over every Ready Lockstep pod, leader and standby alike. The test
bed has no kube-proxy, so the webhook configuration points at this forwarder instead: each
connection goes to the next backend in turn, or to the one after it when a backend refuses
(a killed replica, as an endpoint leaves a Service). It relays bytes only, so TLS is between
the API server and the Lockstep answering, with the certificate both replicas keep in one
Secret, as deployed. Runs on its own loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

__all__ = ["Forwarder"]


class Forwarder:
    def __init__(self) -> None:
        self.backends: list[int] = []
        """Ports on 127.0.0.1, tried in turn."""
        self.port = 0
        self.connections = 0
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="forwarder")
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> Forwarder:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection, then the loop itself."""
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._open):
                w.close()
            await asyncio.sleep(0.05)
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            await asyncio.sleep(0)
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream = await self._connect()
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        self._open |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open -= {writer, up_writer}
            for w in (writer, up_writer):
                w.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        backends = list(self.backends)
        start = next(self._turn)
        for i in range(len(backends)):
            port = backends[(start + i) % len(backends)]
            try:
                return await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
        return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then pass the half-close on (the other direction may still talk);
    :meth:`Forwarder._serve` closes both ends once both directions are done."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        with contextlib.suppress(Exception):
            writer.close()
