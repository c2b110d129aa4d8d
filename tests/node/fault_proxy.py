"""A TCP forwarder that a test can cut and heal: a network fault without iptables (CI has none).

    with FaultProxy("127.0.0.1:7101") as proxy:   # listens on proxy.address
        ...                                         # clients dial proxy.address
        proxy.cut()     # every open connection is reset, new ones are accepted and reset
        proxy.heal()    # new connections are forwarded again

Threads, not trio: the test drives blocking clients and real processes, and the proxy must
keep forwarding while the test's own code blocks. Each accepted connection gets one upstream
connection and two pump threads. `cut` resets (SO_LINGER 0) rather than closing politely, as
a network that drops a flow looks to both ends once they notice: the peer sees a reset, not
an orderly end of stream. `connections` counts what was forwarded, so a test can check its
clients really went through the proxy, and `refused` what arrived while cut (they retried).
"""

from __future__ import annotations

import socket
import struct
import threading

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(sock: socket.socket) -> None:
    """Close with a reset; shutting the read side first wakes a thread blocked reading it
    (close alone does not, on Linux)."""
    for step in (lambda: sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET),
                 lambda: sock.shutdown(socket.SHUT_RD), sock.close):
        try:
            step()
        except OSError:
            pass


class FaultProxy:
    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        up_host, _, up_port = upstream.rpartition(":")
        self.upstream = (up_host, int(up_port))
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.connections = 0  # forwarded
        self.refused = 0  # reset on arrival while cut: the clients kept trying
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name=f"fault-proxy {self.address}")
        self._thread.start()

    # -- what the test does ----------------------------------------------------------------------
    def cut(self) -> None:
        """Reset every connection through the proxy; new ones are reset as they arrive."""
        with self._lock:
            self._cut = True
            doomed, self._open = self._open, set()
        for sock in doomed:
            _reset(sock)

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding ------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener closed
            with self._lock:
                cut = self._cut
                self.connections += 0 if cut else 1
                self.refused += 1 if cut else 0
            if cut:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)  # the node is down: the client sees a reset, as if refused
                continue
            with self._lock:
                if self._cut:
                    _reset(client)
                    _reset(upstream)
                    continue
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            gone = {src, dst} & self._open
            self._open -= gone
        for sock in gone:  # one side ended: end the other (the node or the client hung up)
            _reset(sock) if self._cut else _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


__all__ = ["FaultProxy"]
