"""The bench's connections to a cluster: lean, pipelined, on raftlog's own protocol.

Why not the client library: a load generator must cost the measured system as little as
possible, and it must keep a fixed window of pipelined requests in flight, which a convenience
API hides. The frames, their version and limits and the request encodings are the protocol's
(raft.protocol); this module only keeps connections: `SyncConn` (blocking socket,
raft.protocol.blocking) for the orchestrating parent (status polls, admin calls), and
`AsyncConn` (trio) for the pipelined generators in worker processes. Both speak TLS when given
the cluster CA (`tls_ca`), for the TLS-versus-plaintext workload (bench/workloads/tls.py): a
path, not a context, so worker arguments stay picklable.
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.protocol.blocking import FrameSocket, connect
from raft.protocol.framing import FrameDecoder
from raft.protocol.framing import WireError as ProtocolError
from raft.protocol.framing import encode_frame as pack
from raft.protocol.hello import Hello, HelloReply
from raft.protocol.requests import Produce, Status
from raft.core.types import Acks

# Replies carry whole fetches: the bench accepts up to this much in one frame.
MAX_FRAME = 64 << 20


class WireError(Exception):
    """The server answered with an error frame or broke the protocol."""


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:7101")
    return host, int(port)


@functools.lru_cache(maxsize=4)
def tls_context(ca: str) -> ssl.SSLContext:
    """A client context trusting the cluster CA (made once per process)."""
    return ssl.create_default_context(cafile=ca)


def frame_decoder() -> FrameDecoder:
    return FrameDecoder(MAX_FRAME)


def decoded_frames(decoder: FrameDecoder) -> list[dict[str, Any]]:
    """Every whole frame buffered in `decoder`; WireError when one is unusable."""
    out = []
    try:
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    except ProtocolError as e:
        raise WireError(str(e)) from None
    return out


def error_code(reply: dict[str, Any]) -> str | None:
    """The error code name of a reply, or None when it succeeded."""
    if reply.get("ok"):
        return None
    err = reply.get("error") or {}
    code = err.get("code") if isinstance(err, dict) else None
    return str(code) if code is not None else "UNKNOWN"


_HELLO = Hello.client().to_frame()


def _node_of(addr: str, frame: dict[str, Any]) -> int:
    """The node id from a hello answer (WireError when it is not one)."""
    try:
        return HelloReply.parse(frame).node_id
    except ProtocolError:
        raise WireError(f"{addr} answered hello with {frame!r}") from None


# -- blocking ------------------------------------------------------------------------------------
class SyncConn:
    """One blocking client connection: hello, then request/reply by id."""

    def __init__(self, addr: str, timeout: float = 2.0, tls_ca: str | None = None) -> None:
        self.addr = addr
        host, _ = split_addr(addr)
        sock = connect(addr, timeout)
        if tls_ca:
            sock = tls_context(tls_ca).wrap_socket(sock, server_hostname=host)
        self._frames = FrameSocket(sock, addr, MAX_FRAME)
        self._next_id = 0
        self._frames.send(_HELLO)
        self.node_id = _node_of(addr, self._read())

    def _read(self) -> dict[str, Any]:
        try:
            return self._frames.receive()
        except ProtocolError as e:
            raise WireError(f"{self.addr}: {e}") from None

    def request(self, msg: Any) -> dict[str, Any]:
        """One request (a typed one from raft.protocol, or a raw map with its "t") and its
        reply."""
        self._next_id += 1
        rid = self._next_id
        self._frames.send({**msg, "id": rid} if isinstance(msg, dict) else msg.to_frame(rid))
        while True:
            reply = self._read()
            if reply.get("t") == "error":
                raise WireError(f"{self.addr} rejected the request: {reply!r}")
            if reply.get("id") == rid:
                return reply

    def close(self) -> None:
        self._frames.close()

    def detach(self) -> socket.socket:
        """The connection's socket, non-blocking, for a caller that drives it itself (the
        closed-loop writers' epoll loop); only between requests (nothing buffered)."""
        sock = self._frames.sock
        sock.setblocking(False)
        return sock

    def __enter__(self) -> "SyncConn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status_of(addr: str, timeout: float = 1.0,
              tls_ca: str | None = None) -> dict[str, Any] | None:
    """The node's status map, or None when it does not answer (down, starting, overloaded)."""
    try:
        with SyncConn(addr, timeout=timeout, tls_ca=tls_ca) as conn:
            reply = conn.request(Status())
    except (OSError, WireError, ValueError):
        return None
    if not reply.get("ok"):
        return None
    st = reply.get("status")
    return st if isinstance(st, dict) else None


# -- trio ----------------------------------------------------------------------------------------
@dataclass(slots=True)
class AsyncConn:
    """A pipelined trio connection. `send` never waits for a reply; `recv` returns the next
    reply frame in arrival order (replies may come out of order; match them by id)."""

    addr: str
    stream: trio.abc.Stream
    node_id: int | None = None
    next_id: int = 0
    _decoder: FrameDecoder = field(default_factory=frame_decoder)
    _ready: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    async def open(cls, addr: str, timeout: float = 2.0,
                   tls_ca: str | None = None) -> "AsyncConn":
        host, port = split_addr(addr)
        with trio.fail_after(timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if tls_ca:
                stream = trio.SSLStream(stream, tls_context(tls_ca), server_hostname=host)
                await stream.do_handshake()
            conn = cls(addr, stream)
            await stream.send_all(pack(_HELLO))
            hello = await conn.recv()
        try:
            conn.node_id = _node_of(addr, hello)
        except WireError:
            await stream.aclose()
            raise
        return conn

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def send(self, msg: dict[str, Any]) -> None:
        await self.stream.send_all(pack(msg))

    async def send_raw(self, frame: bytes) -> None:
        await self.stream.send_all(frame)

    async def send_parts(self, first: bytes, rest: bytes) -> None:
        """`first` then `rest` in one write where the stream is a plain socket (sendmsg):
        a pre-encoded frame's small head and its large tail leave as one segment stream,
        and the node is not woken for the head alone."""
        sock = getattr(self.stream, "socket", None)
        if sock is None:  # TLS: one copy
            await self.stream.send_all(first + rest)
            return
        sent = await sock.sendmsg([first, rest])  # (waits until writable)
        if sent < len(first):
            await self.stream.send_all(first[sent:])
            sent = len(first)
        if sent - len(first) < len(rest):
            await self.stream.send_all(memoryview(rest)[sent - len(first):])

    async def recv(self) -> dict[str, Any]:
        while not self._ready:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                raise ConnectionError(f"{self.addr} closed the connection")
            self._decoder.feed(data)
            self._ready.extend(decoded_frames(self._decoder))
        msg = self._ready.pop(0)
        if msg.get("t") == "error":
            raise WireError(f"{self.addr} rejected a frame: {msg!r}")
        return msg

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send and wait for this request's reply (only when nothing else is pipelined)."""
        rid = self.new_id()
        await self.send({**msg, "id": rid})
        while True:
            reply = await self.recv()
            if reply.get("id") == rid:
                return reply

    async def aclose(self) -> None:
        with trio.move_on_after(1):
            await self.stream.aclose()


def produce_frame(rid: int, acks: str, payload: bytes, count: int,
                  timeout_ms: int = 5000) -> bytes:
    """One encoded produce request; generators pre-build everything but the id."""
    return pack(Produce(payload, count, Acks(acks), timeout_ms, producer_id=0, sequence=-1,
                        timestamp_ms=int(time.time() * 1000)).to_frame(rid))
