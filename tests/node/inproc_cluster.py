"""In-process cluster harness for the node tests: Nodes on port 0 and a raw-frame test client.

The client here speaks the wire protocol byte for byte (no raft.client) so these tests pin the
protocol itself. Waiting is always on conditions under generous trio.fail_after deadlines.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from raft.node.config import NodeConfig, parse_address
from raft.node.server import Node
from raft.protocol.framing import encode_frame, WireError
from raft.protocol.streams import FrameReader
from raft.core.types import Role
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
        self.reader = FrameReader(stream, max_frame)
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
        await self.stream.send_all(encode_frame(frame))

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
                except (WireError, trio.BrokenResourceError, OSError):
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
    def __init__(self, nodes: list[Node], nursery: trio.Nursery,
                 logs: dict[int, LogStorage],
                 reopen: Callable[[int], LogStorage] | None = None) -> None:
        self.nodes = nodes
        self.nursery = nursery
        self.logs = logs
        self._reopen = reopen

    def reopen(self, node_id: int) -> LogStorage:
        assert self._reopen is not None, "this cluster's logs cannot be reopened"
        return self._reopen(node_id)

    async def stop(self, node_id: int, *, crash: bool = False) -> None:
        """Graceful stop (SIGTERM path), or with crash=True an abort that loses the unflushed
        tail (SIGKILL; needs MemoryLog)."""
        node = self.node(node_id)
        if crash:
            node.abort()
        else:
            node.request_shutdown()
        with trio.fail_after(DEADLINE_S):
            await node._stopped.wait()
        if crash:
            log_storage = self.logs[node_id]
            if hasattr(log_storage, "crash"):
                log_storage.crash()  # MemoryLog: drop the unflushed tail
            else:  # a durable log: what is on disk is what a SIGKILL leaves
                log_storage.close()
                self.logs[node_id] = self.reopen(node_id)

    async def restart(self, node_id: int) -> Node:
        old = self.node(node_id)
        assert old._stopped.is_set(), "stop the node first"
        node = Node(dataclasses.replace(old.config, listen="127.0.0.1:0"),
                    log_storage=self.logs[node_id])
        for other in self.nodes:
            if other is not old:
                node.set_peer_address(other.node_id, other.address)
        await self.nursery.start(node.run)
        self.nodes[self.nodes.index(old)] = node
        for other in self.nodes:
            if other is not node:
                other.set_peer_address(node_id, node.address)
        return node

    @property
    def live(self) -> list[Node]:
        return [n for n in self.nodes if not n._stopped.is_set() and not n._closing]

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    async def wait_leader(self, *, exclude: int | None = None) -> Node:
        with trio.fail_after(DEADLINE_S):
            while True:
                leaders = [n for n in self.live if n.core.role == Role.LEADER
                           and n.node_id != exclude]
                if len(leaders) == 1:
                    leader = leaders[0]
                    # Every live node knows it: clients can be redirected.
                    if all(n.core.leader_id == leader.node_id for n in self.live):
                        return leader
                await trio.sleep(0.02)

    async def wait_hw(self, offset: int, nodes: list[Node] | None = None) -> None:
        with trio.fail_after(DEADLINE_S):
            while any(n.core.high_watermark < offset for n in (nodes or self.live)):
                await trio.sleep(0.02)


def lmdb_available() -> bool:
    try:
        from storage import open_log  # noqa: F401
        import storage.lmdb_log  # noqa: F401
    except ImportError:
        return False
    return True


@asynccontextmanager
async def running_cluster(n: int = 3, *, storage: str = "memory", tmp_path: Any = None,
                          **overrides: Any) -> AsyncIterator[Cluster]:
    """n Nodes on 127.0.0.1 port 0. storage="memory" (MemoryLog, I/O inline) or "lmdb"
    (storage.open_log under tmp_path, flushes in worker threads as in production)."""
    ids = list(range(1, n + 1))
    reopen: Callable[[int], LogStorage] | None = None
    if storage == "memory":
        logs: dict[int, LogStorage] = {i: MemoryLog() for i in ids}
        data_dir = "/nonexistent-in-memory"
    else:
        from storage import open_log
        assert tmp_path is not None, "lmdb clusters need tmp_path"
        data_dir = str(tmp_path)

        def reopen(node_id: int) -> LogStorage:
            path = tmp_path / f"node-{node_id}"
            path.mkdir(parents=True, exist_ok=True)
            return open_log(path)

        logs = {i: reopen(i) for i in ids}
    peers = {i: "127.0.0.1:0" for i in ids}
    settings = {"tick_ms": 10, "election_ticks": 20, "reconnect_min_ms": 5,
                "reconnect_max_ms": 100}
    settings.update(overrides)
    nodes = [Node(NodeConfig(node_id=i, data_dir=data_dir, peers=dict(peers), **settings),
                  log_storage=logs[i]) for i in ids]
    try:
        async with trio.open_nursery() as nursery:
            for node in nodes:
                await nursery.start(node.run)
            for node in nodes:
                for other in nodes:
                    if other is not node:
                        node.set_peer_address(other.node_id, other.address)
            cluster = Cluster(nodes, nursery, logs, reopen)
            try:
                yield cluster
            finally:
                for node in cluster.nodes:
                    node.request_shutdown()
    finally:
        if storage != "memory":
            for log_storage in logs.values():
                log_storage.close()


def values_payload(values: list[bytes]) -> bytes:
    return encode_values(values)


def fetched_values(reply: dict[str, Any], from_offset: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a fetch reply at or after from_offset."""
    out = []
    for b in reply["batches"]:
        try:
            vals = [r.value for r in decode_records(b["payload"])]
        except Exception:  # hostile tests may have written payloads that are not records
            vals = []
        if len(vals) != b["count"]:
            vals = [b"<undecodable>"] * b["count"]
        for i, value in enumerate(vals):
            off = b["base_offset"] + i
            if off >= from_offset:
                out.append((off, value))
    return out


RETRYABLE = {"NOT_LEADER", "LEADERSHIP_LOST", "TIMEOUT", "BACKPRESSURE", "SHUTTING_DOWN",
             "TRUNCATED"}


class Producer:
    """An idempotent producer that follows redirects and retries a batch with the same
    sequence until it is acknowledged; `acked` records what the cluster promised to keep."""

    def __init__(self, addresses: list[str], producer_id: int, acks: str = "quorum") -> None:
        self.addresses = list(addresses)
        self.producer_id = producer_id
        self.acks = acks
        self.sequence = 0
        self.acked: list[tuple[int, list[bytes]]] = []
        self.duplicates = 0
        self._client: RawClient | None = None
        self._target = 0
        self._redirect: str | None = None

    async def _connect(self) -> RawClient:
        if self._client is None:
            address = self._redirect or self.addresses[self._target % len(self.addresses)]
            self._redirect = None
            self._client = await RawClient.connect(address)
        return self._client

    async def _drop(self) -> None:
        if self._client is not None:
            with trio.CancelScope(shield=True):
                await self._client.aclose()
        self._client = None

    async def produce(self, values: list[bytes], timeout_ms: int = 2000) -> int:
        seq = self.sequence
        self.sequence += 1
        payload = values_payload(values)
        with trio.fail_after(DEADLINE_S * 2):
            while True:
                try:
                    client = await self._connect()
                    reply = await client.request(
                        "produce", acks=self.acks, timeout_ms=timeout_ms, payload=payload,
                        count=len(values), producer_id=self.producer_id, sequence=seq)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                        WireError, AssertionError):
                    await self._drop()
                    self._target += 1
                    await trio.sleep(0.02)  # retry backoff, not synchronisation
                    continue
                if reply["ok"]:
                    if reply["duplicate"]:
                        self.duplicates += 1
                    self.acked.append((reply["base_offset"], values))
                    return reply["base_offset"]
                err = reply["error"]
                assert err["code"] in RETRYABLE, err
                if err["code"] == "NOT_LEADER":
                    await self._drop()
                    if err.get("leader_addr") and err.get("leader_id") != client.server_id:
                        self._redirect = err["leader_addr"]
                    else:
                        self._target += 1
                await trio.sleep(0.02)

    async def aclose(self) -> None:
        await self._drop()


async def read_all(address: str, *, upto: int | None = None) -> list[tuple[int, bytes]]:
    """Every (offset, value) visible on the node at `address` (up to its HW, or `upto`)."""
    client = await RawClient.connect(address)
    out: list[tuple[int, bytes]] = []
    try:
        offset = (await client.request("status"))["status"]["start_offset"]
        while True:
            reply = await client.request("fetch", offset=offset, max_bytes=1 << 20,
                                         max_wait_ms=0)
            assert reply["ok"], reply
            out.extend(fetched_values(reply, offset))
            offset = reply["next_offset"]
            if offset > reply["high_watermark"] or (upto is not None and offset > upto):
                return out
    finally:
        await client.aclose()


def check_acked(acked: list[tuple[int, list[bytes]]], records: list[tuple[int, bytes]]) -> None:
    """Every acknowledged value is at its acknowledged offset, exactly once."""
    at = dict(records)
    assert len(at) == len(records), "an offset appears twice in the log"
    seen: dict[bytes, int] = {}
    for _, value in records:
        seen[value] = seen.get(value, 0) + 1
    for base, values in acked:
        for i, value in enumerate(values):
            assert at.get(base + i) == value, (base + i, at.get(base + i), value)
            assert seen[value] == 1, f"{value!r} is in the log {seen[value]} times"
