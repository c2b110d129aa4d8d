"""The tests' fault proxy (tests/node/fault_proxy.py) does what the link's process test relies
on: it forwards both ways, a cut resets open connections and every new one until healed, and
it counts what it forwarded and what it refused."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from fault_proxy import FaultProxy


@pytest.fixture
def echo() -> Iterator[str]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def answer(c: socket.socket = conn) -> None:
                try:
                    while data := c.recv(1024):
                        c.sendall(data)
                except OSError:
                    pass
                c.close()
            threading.Thread(target=answer, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.shutdown(socket.SHUT_RDWR)
    server.close()


def dial(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_forwards_cuts_and_heals(echo: str) -> None:
    with FaultProxy(echo) as proxy:
        before = dial(proxy.address)
        before.sendall(b"ping")
        assert before.recv(16) == b"ping"
        proxy.cut()
        with pytest.raises(ConnectionResetError):
            before.recv(16)  # the open connection is reset
        with pytest.raises(ConnectionResetError):  # accepted, then reset at once
            during = dial(proxy.address)  # (the reset may beat the connect's own return)
            during.recv(16)
        proxy.heal()
        after = dial(proxy.address)
        after.sendall(b"pong")
        assert after.recv(16) == b"pong"
        assert (proxy.connections, proxy.refused) == (2, 1)
        for s in (before, after):
            s.close()
