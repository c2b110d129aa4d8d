"""The raftlog client library: trio-native `Client` and `Producer`, and `BlockingClient` for
scripts and Spark executors.

What it takes off the caller: finding the leader (any node answers `status`; NOT_LEADER carries
the leader's address), reconnecting, retrying retriable errors with backoff inside the caller's
timeout, and, for producers, idempotence and batching. A `Producer` has a random 63-bit id and
numbers its requests; a retry after a timeout, a dropped connection or a leader change resends
the same (producer id, sequence), so the cluster writes the batch once and answers the retry
with the original offsets.

Errors are typed (`NotLeaderError`, `RequestTimeout`, `TooLargeError`, `OffsetOutOfRangeError`,
`ShuttingDownError`, ...), all subclasses of `RaftlogError` carrying the server's code and
message.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from raft.node import wire
from raft.node.config import ConfigError, parse_address
from storage.records import Record, decode_records, encode_records

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
RETRIABLE = {"NOT_LEADER", "TIMEOUT", "LEADERSHIP_LOST", "BACKPRESSURE", "SHUTTING_DOWN",
             "TRUNCATED", "UNAVAILABLE"}


# ============================================================================ errors
class RaftlogError(Exception):
    """An error answer from the cluster (code = raft.types.ErrorCode name) or from the client
    itself (UNAVAILABLE when no node could be reached)."""

    code = "INTERNAL"

    def __init__(self, message: str, *, code: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details or {}


class NotLeaderError(RaftlogError):
    code = "NOT_LEADER"

    @property
    def leader_id(self) -> int | None:
        return self.details.get("leader_id")

    @property
    def leader_addr(self) -> str | None:
        return self.details.get("leader_addr")


class RequestTimeout(RaftlogError):
    code = "TIMEOUT"


class TooLargeError(RaftlogError):
    code = "TOO_LARGE"


class OffsetOutOfRangeError(RaftlogError):
    code = "OFFSET_OUT_OF_RANGE"

    @property
    def start_offset(self) -> int | None:
        return self.details.get("start_offset")

    @property
    def high_watermark(self) -> int | None:
        return self.details.get("high_watermark")


class ShuttingDownError(RaftlogError):
    code = "SHUTTING_DOWN"


class LeadershipLostError(RaftlogError):
    code = "LEADERSHIP_LOST"


class BackpressureError(RaftlogError):
    code = "BACKPRESSURE"


class BadRequestError(RaftlogError):
    code = "BAD_REQUEST"


class UnavailableError(RaftlogError):
    """No node could be reached (or none answered) within the timeout."""

    code = "UNAVAILABLE"


_BY_CODE: dict[str, type[RaftlogError]] = {
    c.code: c for c in (NotLeaderError, RequestTimeout, TooLargeError, OffsetOutOfRangeError,
                        ShuttingDownError, LeadershipLostError, BackpressureError,
                        BadRequestError, UnavailableError)}


def error_from_reply(err: dict[str, Any]) -> RaftlogError:
    code = str(err.get("code", "INTERNAL"))
    cls = _BY_CODE.get(code, RaftlogError)
    return cls(str(err.get("message", code)), code=code, details=err)


# ============================================================================ results
@dataclass(slots=True, frozen=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False  # the cluster already had this batch (an idempotent retry)


@dataclass(slots=True, frozen=True)
class FetchedRecord:
    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] | None = None
    timestamp_ms: int = 0


@dataclass(slots=True)
class FetchResult:
    records: list[FetchedRecord]
    high_watermark: int
    start_offset: int
    next_offset: int


# ============================================================================ connection
class _Connection:
    """One client connection: hello, then strictly one request at a time (a lock)."""

    def __init__(self, address: str, stream: trio.SocketStream, node_id: int,
                 max_frame_bytes: int) -> None:
        self.address = address
        self.stream = stream
        self.node_id = node_id
        self.reader = wire.FrameReader(stream, max_frame_bytes)
        self.lock = trio.Lock()
        self.broken = False

    @classmethod
    async def open(cls, address: str, max_frame_bytes: int) -> "_Connection":
        host, port = parse_address(address)
        stream = await trio.open_tcp_stream(host, port)
        try:
            await stream.send_all(wire.encode_frame({"t": "hello", "role": "client"}))
            reader = wire.FrameReader(stream, max_frame_bytes)
            hello = await reader.receive()
            if hello is None or hello.get("t") != "hello":
                # A node that is stopping hangs up or answers an error: try another node
                # (ConnectionError is an OSError, which call() retries).
                raise ConnectionError(f"{address} did not answer the hello ({hello!r}); is it "
                                      f"a running raftlog node?")
        except BaseException:
            await stream.aclose()
            raise
        conn = cls(address, stream, int(hello.get("node_id", 0)), max_frame_bytes)
        conn.reader = reader
        return conn

    async def request(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        async with self.lock:
            try:
                await self.stream.send_all(wire.encode_frame({**frame, "id": rid}))
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


# ============================================================================ client
class Client:
    """A connection pool to one cluster. Use as `async with Client("h:p,h:p") as c:`."""

    def __init__(self, servers: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S,
                 max_frame_bytes: int = 64 << 20, rng: random.Random | None = None) -> None:
        self.servers = parse_servers(servers)
        self.timeout = timeout
        self.max_frame_bytes = max_frame_bytes
        self._rng = rng or random.Random()
        self._conns: dict[str, _Connection] = {}
        self._leader_addr: str | None = None
        self._rotation: list[str] = []
        self._ids = itertools.count(1)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.aclose()

    # -- plumbing ------------------------------------------------------------------------------
    async def _conn(self, address: str) -> _Connection:
        conn = self._conns.get(address)
        if conn is not None and not conn.broken:
            return conn
        conn = await _Connection.open(address, self.max_frame_bytes)
        self._conns[address] = conn
        return conn

    async def _drop(self, address: str) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            await conn.aclose()

    def _next_target(self) -> str:
        """The known leader, else the next server in a shuffled rotation."""
        if self._leader_addr:
            return self._leader_addr
        if not self._rotation:
            self._rotation = list(self.servers)
            self._rng.shuffle(self._rotation)
        return self._rotation.pop()

    async def call(self, t: str, *, timeout: float | None = None, leader: bool = True,
                   server: str | None = None, attempt_timeout: float | None = None,
                   **fields: Any) -> dict[str, Any]:
        """Send one request and return its OK reply. With `leader`, follow NOT_LEADER redirects;
        retriable errors and connection failures are retried with backoff until `timeout`.
        `server` pins the request to one node (no redirects). One attempt waits at most
        `attempt_timeout` (default a third of the budget, at least 2 s), so a hung node does
        not eat the whole budget.

        A produce without a producer id is not idempotent: once it may have reached the
        server, an ambiguous failure (no answer, connection lost, leadership lost) is raised
        instead of retried, since a retry could write the batch twice."""
        budget = self.timeout if timeout is None else timeout
        per_attempt = attempt_timeout if attempt_timeout is not None else max(2.0, budget / 3)
        deadline = trio.current_time() + budget
        safe_to_retry = t != "produce" or bool(fields.get("producer_id"))
        backoff = 0.01
        last: RaftlogError | None = None
        while True:
            target = server or self._next_target()
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            sent = False
            try:
                with trio.fail_after(min(remaining, per_attempt)):
                    conn = await self._conn(target)
                    sent = True
                    reply = await conn.request({"t": t, **fields}, next(self._ids))
            except trio.TooSlowError:
                await self._drop(target)
                if self._leader_addr == target:
                    self._leader_addr = None
                if last is not None and remaining <= per_attempt:
                    break  # out of time: report the more telling earlier error
                last = RequestTimeout(f"no answer from {target} to {t} within "
                                      f"{min(remaining, per_attempt):.1f} s")
                if sent and not safe_to_retry:
                    raise last from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    wire.WireError) as e:
                await self._drop(target)
                if self._leader_addr == target:
                    self._leader_addr = None
                last = UnavailableError(f"{target}: {e}; check the node is running")
                if sent and not safe_to_retry:
                    raise last from None
            except RaftlogError as e:  # the server hung up on our frame: not retriable
                await self._drop(target)
                raise e
            else:
                if reply.get("ok"):
                    if leader and not server:
                        self._leader_addr = target
                    return reply
                err = error_from_reply(reply.get("error") or {})
                if isinstance(err, NotLeaderError) and server:
                    raise err  # pinned to this node: no redirect to follow
                if isinstance(err, NotLeaderError) and leader and not server:
                    self._leader_addr = err.leader_addr if err.leader_addr != target else None
                    last = err
                    if self._leader_addr:
                        continue  # follow the redirect at once
                elif err.code not in RETRIABLE:
                    raise err
                elif not safe_to_retry and err.code not in ("NOT_LEADER", "BACKPRESSURE"):
                    raise err  # it may have been written: the caller decides
                else:
                    last = err
                    if isinstance(err, ShuttingDownError) and self._leader_addr == target:
                        self._leader_addr = None
            pause = min(backoff, max(0.0, deadline - trio.current_time()))
            await trio.sleep(pause * (0.5 + self._rng.random()))  # retry backoff with jitter
            backoff = min(backoff * 2, 0.5)
        if last is None:
            last = RequestTimeout(f"{t} did not complete within {budget:.1f} s")
        if not isinstance(last, RequestTimeout):
            last = type(last)(f"{last.message} (gave up after {budget:.1f} s; is a majority of "
                              f"the cluster up?)", code=last.code, details=last.details)
        raise last

    # -- operations ----------------------------------------------------------------------------
    async def produce(self, records: Iterable[bytes | str | Record], *, acks: str = "quorum",
                      timeout: float | None = None, producer_id: int = 0,
                      sequence: int = -1, timestamp_ms: int = 0) -> ProduceResult:
        """Write records as one batch. Returns its offsets (with acks="none" too: the leader
        assigns them on acceptance). Retries are only safe with a producer id (use Producer);
        without one, an ambiguous failure after the send is raised, not retried."""
        recs = [_as_record(r) for r in records]
        if not recs:
            raise ValueError("produce needs at least one record")
        budget = self.timeout if timeout is None else timeout
        fields: dict[str, Any] = {"acks": acks, "payload": encode_records(recs),
                                  "count": len(recs), "timeout_ms": max(1, int(budget * 1000))}
        if producer_id:
            fields.update(producer_id=producer_id, sequence=sequence)
        if timestamp_ms:
            fields["timestamp_ms"] = timestamp_ms
        reply = await self.call("produce", timeout=budget, **fields)
        return ProduceResult(reply["base_offset"], reply["last_offset"],
                             bool(reply.get("duplicate", False)))

    async def fetch(self, offset: int, *, max_bytes: int = 1 << 20, max_wait: float = 0.0,
                    address: str | None = None, timeout: float | None = None) -> FetchResult:
        """Committed records from `offset` (long-polls up to `max_wait` s when there is nothing
        new). Reads from the leader unless `address` names a node."""
        budget = (self.timeout if timeout is None else timeout) + max_wait
        reply = await self.call("fetch", timeout=budget, server=address,
                                attempt_timeout=max_wait + max(2.0, budget / 3),
                                offset=offset, max_bytes=max_bytes,
                                max_wait_ms=int(max_wait * 1000))
        out: list[FetchedRecord] = []
        for b in reply.get("batches", []):
            base = b["base_offset"]
            for i, r in enumerate(decode_records(b["payload"])):
                if base + i >= offset:
                    out.append(FetchedRecord(base + i, r.value, r.key, r.headers,
                                             b.get("timestamp_ms", 0)))
        return FetchResult(out, reply["high_watermark"], reply["start_offset"],
                           reply["next_offset"])

    async def status(self, address: str | None = None) -> dict[str, Any]:
        """One node's status (the leader's when no address is given)."""
        reply = await self.call("status", server=address, leader=address is None)
        return reply["status"]

    async def cluster_status(self, timeout: float = 2.0) -> dict[str, dict[str, Any]]:
        """Every known node's status, keyed by address (an `error` entry for unreachable
        ones). Nodes are found from the servers given and each node's peer list."""
        seen: dict[str, dict[str, Any]] = {}
        todo = list(self.servers)
        while todo:
            addr = todo.pop(0)
            if addr in seen:
                continue
            try:
                st = await self.call("status", server=addr, leader=False, timeout=timeout)
                seen[addr] = st["status"]
                for peer in (st["status"].get("peers") or {}).values():
                    if peer and peer not in seen and peer not in todo:
                        todo.append(peer)
            except RaftlogError as e:
                seen[addr] = {"error": f"{e.code}: {e.message}"}
        return seen

    async def transfer_leader(self, to: int | None = None, *,
                              timeout: float | None = None) -> dict[str, Any]:
        budget = self.timeout if timeout is None else timeout
        fields: dict[str, Any] = {"timeout_ms": max(1, int(budget * 1000))}
        if to is not None:
            fields["to"] = to
        return await self.call("transfer_leader", timeout=budget, **fields)

    async def add_node(self, node_id: int, address: str, *,
                       timeout: float | None = None) -> dict[str, Any]:
        return await self.call("add_node", timeout=timeout, node_id=node_id, address=address)

    async def remove_node(self, node_id: int, *, timeout: float | None = None) -> dict[str, Any]:
        return await self.call("remove_node", timeout=timeout, node_id=node_id)


# ============================================================================ producer
@dataclass(slots=True)
class _Pending:
    record: Record
    size: int
    done: trio.Event = field(default_factory=trio.Event)
    offset: int = -1
    error: BaseException | None = None


class Producer:
    """Idempotent, batching producer. Use inside a nursery-owning context:

        async with Client(servers) as c, Producer(c, acks="quorum") as p:
            offset = await p.send(b"value")            # batched with concurrent sends
            offsets = await p.send_many(lines)        # one call, thousands of records

    Records wait at most `linger` seconds (or until `batch_bytes` accumulate) before they go
    out as one batch. Each batch gets the next sequence number; retries reuse it."""

    def __init__(self, client: Client, *, acks: str = "quorum", linger: float = 0.005,
                 batch_bytes: int = 1 << 20, timeout: float | None = None,
                 producer_id: int | None = None) -> None:
        if acks not in ("quorum", "leader", "none"):
            raise ValueError(f"acks={acks!r}: choose quorum, leader or none")
        if batch_bytes < 1 or linger < 0:
            raise ValueError("batch_bytes must be >= 1 and linger >= 0")
        self.client = client
        self.acks = acks
        self.linger = linger
        self.batch_bytes = batch_bytes
        self.timeout = client.timeout if timeout is None else timeout
        self.producer_id = producer_id or random.SystemRandom().randrange(1, 2**63)
        self._sequence = 0
        self._buffer: list[_Pending] = []
        self._buffered = 0
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None
        self._closed = False
        self.records_sent = 0
        self.batches_sent = 0
        self.duplicates = 0

    async def __aenter__(self) -> "Producer":
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._sender)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        self._closed = True
        self._wake.set()
        return await self._nursery_cm.__aexit__(*exc)

    async def send(self, record: bytes | str | Record) -> int:
        """Queue one record; returns its offset once its batch is acknowledged."""
        (offset,) = await self.send_many([record])
        return offset

    async def send_many(self, records: Iterable[bytes | str | Record]) -> list[int]:
        if self._closed or self._nursery is None:
            raise RuntimeError("use the Producer inside `async with`")
        pending = []
        for r in records:
            rec = _as_record(r)
            p = _Pending(rec, len(rec.value) + len(rec.key or b"") + 8)
            pending.append(p)
            self._buffer.append(p)
            self._buffered += p.size
            if self._buffered >= self.batch_bytes:
                self._wake.set()
        self._wake.set()
        for p in pending:
            await p.done.wait()
        errors = [p.error for p in pending if p.error is not None]
        if errors:
            raise errors[0]
        return [p.offset for p in pending]

    async def _sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._buffer and self._buffered < self.batch_bytes and not self._closed \
                    and self.linger > 0:
                with trio.move_on_after(self.linger):
                    while self._buffered < self.batch_bytes and not self._closed:
                        await self._wake.wait()
                        self._wake = trio.Event()
            while self._buffer:
                batch, size = [], 0
                while self._buffer and (not batch or size + self._buffer[0].size
                                        <= self.batch_bytes):
                    p = self._buffer.pop(0)
                    batch.append(p)
                    size += p.size
                self._buffered -= size
                await self._send_batch(batch)
            if self._closed:
                return

    async def _send_batch(self, batch: list[_Pending]) -> None:
        seq = self._sequence
        self._sequence += 1
        try:
            res = await self.client.produce([p.record for p in batch], acks=self.acks,
                                            timeout=self.timeout, producer_id=self.producer_id,
                                            sequence=seq)
        except RaftlogError as e:
            for p in batch:
                p.error = e
                p.done.set()
            return
        self.batches_sent += 1
        self.records_sent += len(batch)
        self.duplicates += res.duplicate
        for i, p in enumerate(batch):
            p.offset = res.base_offset + i
            p.done.set()


# ============================================================================ blocking wrapper
class BlockingClient:
    """The client for code without a trio loop (scripts, Spark executors): a private trio loop
    runs in a daemon thread and each call is handed to it.

        with BlockingClient("127.0.0.1:7101") as c:
            c.produce([b"a", b"b"], acks="leader")
    """

    def __init__(self, servers: str | Sequence[str], **kwargs: Any) -> None:
        self._client = Client(servers, **kwargs)
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="raftlog-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()
            await self._client.aclose()

        try:
            trio.run(main)
        except BaseException as e:  # surfaced to the constructor
            self._error = e
            self._ready.set()

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self._token is None or self._stop is None:
            raise RuntimeError("the client is closed")

        async def run() -> T:
            return await fn(*args, **kwargs)

        return trio.from_thread.run(run, trio_token=self._token)

    def produce(self, records: Iterable[bytes | str | Record], **kwargs: Any) -> ProduceResult:
        return self._call(self._client.produce, list(records), **kwargs)

    def produce_idempotent(self, values: Iterable[bytes | str | Record], *, acks: str = "quorum",
                           batch_bytes: int = 1 << 20, linger: float = 0.0,
                           producer_id: int | None = None) -> list[int]:
        """Send many records in batches through an idempotent Producer; their offsets."""
        vals = list(values)

        async def go() -> list[int]:
            async with Producer(self._client, acks=acks, batch_bytes=batch_bytes,
                                linger=linger, producer_id=producer_id) as p:
                return await p.send_many(vals)

        return self._call(go)

    def fetch(self, offset: int, **kwargs: Any) -> FetchResult:
        return self._call(self._client.fetch, offset, **kwargs)

    def status(self, address: str | None = None) -> dict[str, Any]:
        return self._call(self._client.status, address)

    def cluster_status(self, timeout: float = 2.0) -> dict[str, dict[str, Any]]:
        return self._call(self._client.cluster_status, timeout)

    def transfer_leader(self, to: int | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.transfer_leader, to, **kwargs)

    def add_node(self, node_id: int, address: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.add_node, node_id, address, **kwargs)

    def remove_node(self, node_id: int, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.remove_node, node_id, **kwargs)

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            stop = self._stop
            try:
                trio.from_thread.run_sync(stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._thread.join(timeout=10)
            self._token = None

    def __enter__(self) -> "BlockingClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ============================================================================ helpers
def parse_servers(servers: str | Sequence[str]) -> list[str]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s and s.strip()]
    if not out:
        raise ConfigError("no servers given: pass --servers HOST:PORT[,HOST:PORT...], e.g. "
                          "127.0.0.1:7101")
    for s in out:
        parse_address(s, what="server address")
    return out


def _as_record(r: bytes | str | Record) -> Record:
    if isinstance(r, Record):
        return r
    if isinstance(r, str):
        return Record(r.encode())
    if isinstance(r, (bytes, bytearray, memoryview)):
        return Record(bytes(r))
    raise TypeError(f"a record is bytes, str or storage.records.Record, not {type(r).__name__}")


__all__ = [
    "BackpressureError", "BadRequestError", "BlockingClient", "Client", "FetchResult",
    "FetchedRecord", "LeadershipLostError", "NotLeaderError", "OffsetOutOfRangeError",
    "ProduceResult", "Producer", "RaftlogError", "RequestTimeout", "ShuttingDownError",
    "TooLargeError", "UnavailableError", "error_from_reply", "parse_servers",
]
