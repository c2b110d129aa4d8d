"""In-process cluster harness for the node tests: Nodes on port 0 and a raw-frame test client.

The client here speaks the wire protocol byte for byte (no raft.client) so these tests pin the
protocol itself. Waiting is always on conditions under generous trio.fail_after deadlines.
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from raft import wire
from raft.config import NodeConfig, parse_address
from raft.node import Node
from raft.types import Role
from storage.api import LogStorage
from storage.memory import MemoryLog
from storage.records import decode_records, encode_values

DEADLINE_S = 20.0


def trio_test(fn: Callable) -> Callable:
    """Run an async test under trio (the venv has no pytest-trio plugin)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return trio.run(functools.partial(fn, *args, **kwargs))
    return wrapper


class RawClient:
    def __init__(self, stream: trio.SocketStream, max_frame: int = 64 << 20) -> None:
        self.stream = stream
        self.reader = wire.FrameReader(stream, max_frame)
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, address: str, *, hello: bool = True) -> "RawClient":
        host, port = parse_address(address)
        client = cls(await trio.open_tcp_stream(host, port))
        if hello:
            await client.send({"t": "hello", "role": "client"})
            reply = await client.recv()
            assert reply is not None and reply["t"] == "hello", reply
            client.server_id = reply["node_id"]
        return client

    async def send(self, frame: dict[str, Any]) -> None:
        await self.stream.send_all(wire.encode_frame(frame))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self) -> dict[str, Any] | None:
        with trio.fail_after(DEADLINE_S):
            return await self.reader.receive()

    async def request(self, t: str, **fields: Any) -> dict[str, Any]:
        rid = next(self._ids)
        await self.send({"t": t, "id": rid, **fields})
        reply = await self.recv()
        assert reply is not None, f"connection closed while waiting for {t} reply"
        assert reply.get("id") == rid, reply
        return reply

    async def closed_after_error(self) -> dict[str, Any] | None:
        """Read frames until EOF; return the error frame seen (if any). Fails if the server
        keeps the connection open."""
        err = None
        with trio.fail_after(DEADLINE_S):
            while True:
                try:
                    frame = await self.reader.receive()
                except (wire.WireError, trio.BrokenResourceError, OSError):
                    return err
                if frame is None:
                    return err
                if frame.get("t") == "error":
                    err = frame

    async def aclose(self) -> None:
        await self.stream.aclose()


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


class Cluster:
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    async def wait_leader(self, *, exclude: int | None = None) -> Node:
        with trio.fail_after(DEADLINE_S):
            while True:
                leaders = [n for n in self.nodes if n.core is not None
                           and n.core.role == Role.LEADER and n.node_id != exclude
                           and not n._closing]
                if len(leaders) == 1:
                    leader = leaders[0]
                    # Every live node knows it: clients can be redirected.
                    if all(n.core.leader_id == leader.node_id for n in self.nodes
                           if not n._closing):
                        return leader
                await trio.sleep(0.02)

    async def wait_hw(self, offset: int, nodes: list[Node] | None = None) -> None:
        with trio.fail_after(DEADLINE_S):
            while any(n.core.high_watermark < offset for n in (nodes or self.nodes)):
                await trio.sleep(0.02)


@asynccontextmanager
async def running_cluster(n: int = 3, *, logs: dict[int, LogStorage] | None = None,
                          data_dir: str = "/nonexistent-in-memory",
                          **overrides: Any) -> AsyncIterator[Cluster]:
    ids = list(range(1, n + 1))
    logs = logs if logs is not None else {i: MemoryLog() for i in ids}
    peers = {i: "127.0.0.1:0" for i in ids}
    settings = {"tick_ms": 10, "election_ticks": 20, "reconnect_min_ms": 5,
                "reconnect_max_ms": 100}
    settings.update(overrides)
    nodes = [Node(NodeConfig(node_id=i, data_dir=data_dir, peers=dict(peers), **settings),
                  log_storage=logs[i]) for i in ids]
    async with trio.open_nursery() as nursery:
        for node in nodes:
            await nursery.start(node.run)
        for node in nodes:
            for other in nodes:
                if other is not node:
                    node.set_peer_address(other.node_id, other.address)
        try:
            yield Cluster(nodes)
        finally:
            for node in nodes:
                node.request_shutdown()


def values_payload(values: list[bytes]) -> bytes:
    return encode_values(values)


def fetched_values(reply: dict[str, Any], from_offset: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a fetch reply at or after from_offset."""
    out = []
    for b in reply["batches"]:
        for i, rec in enumerate(decode_records(b["payload"])):
            off = b["base_offset"] + i
            if off >= from_offset:
                out.append((off, rec.value))
    return out
