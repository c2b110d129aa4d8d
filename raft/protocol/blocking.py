"""Frames over a blocking socket: for code without a trio loop that must keep its own
connection (Spark's executor threads pipelining staged writes, the bench's orchestrating
parent). The framing itself is raft.protocol.framing's; this only moves the bytes."""

from __future__ import annotations

import socket
from typing import Any

from raft.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame_pieces

_READ_CHUNK = 1 << 20


def connect(addr: str, timeout: float) -> socket.socket:
    """A TCP connection to "host:port" with Nagle off (requests are small and pipelined)."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:7101")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)
    return sock


class FrameSocket:
    """Sends and receives whole frames on a blocking (possibly TLS-wrapped) socket."""

    __slots__ = ("sock", "peer", "_decoder")

    def __init__(self, sock: socket.socket, peer: str,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.sock = sock
        self.peer = peer
        self._decoder = FrameDecoder(max_frame_bytes)

    def send(self, frame: dict[str, Any]) -> None:
        pieces = encode_frame_pieces(frame)
        if len(pieces) <= 2:  # nothing large: one write
            self.sock.sendall(b"".join(pieces))
            return
        for piece in pieces:  # large payloads written from the caller's object, uncopied
            self.sock.sendall(piece)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> dict[str, Any]:
        """The next frame; ConnectionError when the peer closed the connection."""
        decoder = self._decoder
        while (frame := decoder.next_frame()) is None:
            data = self.sock.recv(_READ_CHUNK)
            if not data:
                raise ConnectionError(f"{self.peer} closed the connection")
            decoder.feed(data)
        return frame

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
