"""One client connection to one node: TLS when configured (raft.client.security), the hello
(with the token, if any), then request/reply frames matched by id."""

from __future__ import annotations

from typing import Any

import trio

from raft.client.errors import TooLargeError, error_from_reply
from raft.client.security import ClientSecurity, tls_error
from raft.node import wire
from raft.node.config import parse_address


class _Connection:
    """One client connection: hello, then strictly one request at a time (a lock)."""

    def __init__(self, address: str, stream: trio.abc.Stream, node_id: int,
                 max_frame_bytes: int) -> None:
        self.address = address
        self.stream = stream
        self.node_id = node_id
        self.reader = wire.FrameReader(stream, max_frame_bytes)
        self.lock = trio.Lock()
        self.broken = False
        self.principal: str | None = None  # who the node says we are (authentication on)
        # The node's frame limit, from its hello (None from nodes that do not say): a request
        # over it is refused here, before a byte is sent, instead of being cut off mid-send.
        self.max_request_bytes: int | None = None

    @classmethod
    async def open(cls, address: str, max_frame_bytes: int,
                   security: ClientSecurity | None = None) -> "_Connection":
        security = security or ClientSecurity()
        host, port = parse_address(address)
        raw = await trio.open_tcp_stream(host, port)
        stream: trio.abc.Stream = raw
        try:
            stream = await security.wrap(raw, host, address)
            try:
                await stream.send_all(wire.encode_frame(security.hello()))
                reader = wire.FrameReader(stream, max_frame_bytes)
                hello = await reader.receive()
            except trio.BrokenResourceError as e:
                if security.tls:  # TLS 1.3: a refused client certificate shows up here
                    raise tls_error(address, e) from None
                raise
            if hello is not None and hello.get("t") == "error" \
                    and hello.get("code") == "UNAUTHENTICATED":
                raise error_from_reply(hello)  # not retried: every node would say the same
            if hello is None or hello.get("t") != "hello":
                # A node that is stopping hangs up or answers an error: try another node
                # (ConnectionError is an OSError, which call() retries).
                raise ConnectionError(f"{address} did not answer the hello ({hello!r}); is it "
                                      f"a running raftlog node?")
        except BaseException:
            with trio.CancelScope(shield=True):
                await raw.aclose()
            raise
        conn = cls(address, stream, int(hello.get("node_id", 0)), max_frame_bytes)
        conn.reader = reader
        conn.principal = hello.get("principal")
        limit = hello.get("max_frame_bytes")
        conn.max_request_bytes = limit if isinstance(limit, int) and limit > 0 else None
        return conn

    async def request(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        data = wire.encode_frame({**frame, "id": rid})
        if self.max_request_bytes is not None and len(data) - 4 > self.max_request_bytes:
            raise TooLargeError(
                f"the {frame.get('t')} request is {len(data) - 4:,} bytes; {self.address} accepts "
                f"frames up to {self.max_request_bytes:,} bytes (max_frame_bytes): send smaller "
                f"batches or records, or raise --max-frame-bytes on every node",
                details={"size": len(data) - 4, "limit": self.max_request_bytes})
        async with self.lock:
            try:
                await self.stream.send_all(data)
                while True:
                    reply = await self.reader.receive()
                    if reply is None:
                        raise trio.BrokenResourceError(f"{self.address} closed the connection")
                    if reply.get("t") == "error" and reply.get("id") in (None, rid):
                        # The server hung up on a frame it could not accept.
                        self.broken = True
                        raise error_from_reply(reply)
                    if reply.get("id") == rid:
                        return reply
            except BaseException:
                self.broken = True
                raise

    async def aclose(self) -> None:
        self.broken = True
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
