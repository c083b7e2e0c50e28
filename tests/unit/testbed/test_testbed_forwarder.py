"""The test bed's stand-in for the webhook Service: connections go to the backends in turn,
and a backend that refuses (a killed replica) is skipped."""

from __future__ import annotations

import socket
import socketserver
import threading

from testbed.forwarder import Forwarder
from testbed.runner import free_port


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data = self.request.recv(100)
        self.request.sendall(self.server.tag + data)  # type: ignore[attr-defined]


def _server(tag: bytes) -> socketserver.ThreadingTCPServer:
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    srv.tag = tag  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _ask(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"hi")
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(100):
            out += chunk
        return out


def test_connections_alternate_and_a_refusing_backend_is_skipped() -> None:
    a, b = _server(b"a:"), _server(b"b:")
    fwd = Forwarder().start()
    try:
        fwd.backends = [a.server_address[1], b.server_address[1]]
        assert sorted(_ask(fwd.port) for _ in range(2)) == [b"a:hi", b"b:hi"]
        fwd.backends = [free_port(), b.server_address[1]]  # nothing listens on the first
        assert {_ask(fwd.port) for _ in range(3)} == {b"b:hi"}
        assert fwd.connections == 5
    finally:
        fwd.stop()
        for srv in (a, b):
            srv.shutdown()
            srv.server_close()
