"""The trio node: serves peers and clients on one port and runs its Raft group.

One trio program per node. What is whose:
- here, the node: its lifecycle (start, graceful stop, abort), the listener (peers and clients
  on the same address; the first frame, `hello`, says which), peer frames handed to the group,
  each client connection's request loop (pipelining limit, backpressure), and the request
  handlers;
- raft.node.group.RaftGroup: one Raft group's driver (tick, Ready loop, flusher, the client
  requests waiting for the core's answers). Today a node runs one group;
- raft.node.transport.PeerTransport: the peer links and the address book, which all of a node's
  groups would share;
- raft.node.serve: running a node as a program (`raftlog serve`, signals, logging).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from raft.node import wire
from raft.node.config import ConfigError, NodeConfig, format_address, parse_address
from raft.node.group import RaftGroup
from raft.node.peer import PeerLink
from raft.node.transport import PeerTransport
from raft.ready import ProduceAnswer
from raft.types import Acks, ErrorCode, Role
from storage.api import LogStorage, OffsetOutOfRange
from storage.batch import Batch, BatchKind, CorruptBatch

log = logging.getLogger("raftlog.node")

HELLO_TIMEOUT_S = 10.0
DEFAULT_FETCH_MAX_BYTES = 1 << 20
# Room for the reply envelope around fetched payloads.
FRAME_OVERHEAD = 64 * 1024

_ERROR_ADVICE: dict[ErrorCode, str] = {
    ErrorCode.NOT_LEADER: "this node is not the leader; send the request to leader_addr (or "
                          "retry shortly if no leader is known yet: an election is running)",
    ErrorCode.BACKPRESSURE: "the leader's unflushed tail or in-flight window is full; retry "
                            "after a short backoff",
    ErrorCode.TOO_LARGE: "the batch exceeds the leader's limit; split it into smaller batches",
    ErrorCode.LEADERSHIP_LOST: "leadership changed before the write committed; it may or may "
                               "not be in the log: retry (idempotent producers make the retry "
                               "safe)",
    ErrorCode.TRUNCATED: "a new leader overwrote the write; it will never commit: retry it",
    ErrorCode.SHUTTING_DOWN: "this node is shutting down; retry on another node",
    ErrorCode.TIMEOUT: "no answer within timeout_ms; the write may still commit: retry with "
                       "the same producer_id/sequence (idempotent) or check with fetch",
    ErrorCode.BAD_REQUEST: "the request was refused as malformed",
    ErrorCode.INTERNAL: "internal error on the node; see its log",
}


def status_to_wire(status: Any) -> dict[str, Any]:
    """raft.ready.Status -> plain msgpack map (role as its string value)."""
    out = dataclasses.asdict(status)
    role = getattr(status, "role", None)
    out["role"] = role.value if isinstance(role, Role) else role
    return out



class Node:
    """One raftlog node. Start it with `await nursery.start(node.run)`; `node.address` is then
    the bound address (pass port 0 in `listen` to get a free port in tests)."""

    def __init__(self, config: NodeConfig, *, log_storage: LogStorage | None = None,
                 rng: random.Random | None = None, inline_io: bool | None = None,
                 core_classes: tuple[Any, Any] | None = None) -> None:
        self.config = config.validate()
        self.node_id = config.node_id
        # One generator for the core and the links (each link draws its own from it).
        rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        self.transport = PeerTransport(config, rng)
        self.group = RaftGroup(config, self.transport, log_storage=log_storage, rng=rng,
                               inline_io=inline_io, core_classes=core_classes)
        self._shutdown_requested = trio.Event()
        self._stopped = trio.Event()
        self._active_requests = 0
        self._requests_idle = trio.Event()
        self._requests_idle.set()
        self._accept_scope: trio.CancelScope | None = None
        self._run_scope = trio.CancelScope()
        self._handlers: dict[str, tuple[Callable[[dict, int], Any],
                                        Callable[[Any, int], Awaitable[dict]]]] = {
            "produce": (self._parse_produce, self._produce),
            "fetch": (self._parse_fetch, self._fetch),
            "status": (lambda frame, rid: None, self._status),
            "transfer_leader": (self._parse_transfer, self._transfer_leader),
            "add_node": (self._parse_add_node, self._membership),
            "remove_node": (self._parse_remove_node, self._membership),
        }

    # -- the group and the peers, as tests and tools see them -------------------------------------
    @property
    def core(self) -> Any:
        return self.group.core

    @property
    def log(self) -> LogStorage | None:
        return self.group.log

    @property
    def loads(self) -> Any:
        """raft.node.load_service.LoadService once the log is open (None without one)."""
        return self.group.loads

    @property
    def address(self) -> str | None:
        return self.transport.address

    @property
    def peer_addresses(self) -> dict[int, str]:
        return self.transport.peer_addresses

    @property
    def links(self) -> dict[int, PeerLink]:
        return self.transport.links

    @property
    def _closing(self) -> bool:
        return self.group.closing

    # -- public control ----------------------------------------------------------------------------
    def request_shutdown(self) -> None:
        """Begin a graceful stop (what SIGTERM does); `run` returns when it is done."""
        self._shutdown_requested.set()

    def abort(self) -> None:
        """Stop at once without flushing (what SIGKILL does; tests pair it with
        MemoryLog.crash() to drop the unflushed tail)."""
        self._run_scope.cancel()

    def set_peer_address(self, peer_id: int, address: str) -> None:
        self.transport.set_peer_address(peer_id, address)

    def peer_address(self, node_id: int | None) -> str | None:
        return self.transport.address_of(node_id)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        with self._run_scope:
            await self._run(task_status)

    async def _run(self, task_status: trio.TaskStatus[Node]) -> None:
        group = self.group
        await group.open_log()
        try:
            group.start_core()
            host, port = self.config.listen_address
            try:
                listeners = await trio.open_tcp_listeners(port, host=host)
            except OSError as e:
                raise ConfigError(f"cannot listen on {format_address(host, port)}: "
                                  f"{e.strerror or e}; pick a free --listen address (or stop "
                                  f"the process using it)") from None
            bound = listeners[0].socket.getsockname()
            self.transport.address = format_address(host, bound[1])
            log.info("node_started node=%d address=%s peers=%s term=%d dirty=%d flushed=%d",
                     self.node_id, self.address, self.peer_addresses, group.core.term,
                     group.log.dirty_offset, group.log.flushed_offset)
            async with trio.open_nursery() as nursery:
                self.transport.start(nursery, group.membership())
                async with trio.open_nursery() as driver:
                    if self.transport.throttled:
                        driver.start_soon(self.transport.run_recovery_sender)
                    group.start(driver)
                    async with trio.open_nursery() as conn_nursery:
                        self._accept_scope = trio.CancelScope()
                        conn_nursery.start_soon(self._accept, listeners, conn_nursery)
                        task_status.started(self)
                        await self._shutdown_requested.wait()
                        await self._graceful_stop()
                        conn_nursery.cancel_scope.cancel()
                    # Stopping the driver waits for a running save_meta/flush thread (those
                    # are not abandoned on cancel), so the final flush below runs alone.
                    driver.cancel_scope.cancel()
                await group.final_flush()
                nursery.cancel_scope.cancel()
        finally:
            group.mark_closed()
            if group.owns_log and group.log is not None:
                group.log.close()
            self._stopped.set()
            log.info("node_stopped node=%d", self.node_id)

    async def _accept(self, listeners: list[trio.SocketListener],
                      conn_nursery: trio.Nursery) -> None:
        assert self._accept_scope is not None
        with self._accept_scope:
            await trio.serve_listeners(self._handle_connection, listeners,
                                       handler_nursery=conn_nursery)

    async def _graceful_stop(self) -> None:
        """SIGTERM: stop accepting, hand leadership over (bounded), answer waiters."""
        log.info("node_stopping node=%d role=%s", self.node_id, self.core.role.value)
        assert self._accept_scope is not None
        self._accept_scope.cancel()  # closes the listeners
        await self.group.hand_over_leadership()
        self.group.begin_shutdown()
        with trio.move_on_after(2.0):
            await self._requests_idle.wait()

    # -- connections -------------------------------------------------------------------------------
    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        """One connection's task. Whatever goes wrong with one connection ends that connection
        only; a core invariant failure (AssertionError) or cancellation propagates (fail-stop)."""
        try:
            await self._connection(stream)
        except BaseException as exc:
            fatal = _split_connection_errors(exc, self.node_id)
            if fatal is not None:
                raise fatal from None

    async def _connection(self, stream: trio.SocketStream) -> None:
        reader = wire.FrameReader(stream, self.config.max_frame_bytes)
        try:
            async with stream:
                try:
                    with trio.fail_after(HELLO_TIMEOUT_S):
                        hello = await reader.receive()
                    if hello is None:
                        return
                    role = self._check_hello(hello)
                    await stream.send_all(wire.encode_frame(
                        {"t": "hello", "node_id": self.node_id}))
                    if role == "peer":
                        await self._serve_peer(reader, hello["node_id"])
                    else:
                        await self._serve_client(stream, reader)
                except trio.TooSlowError:
                    await _send_error(stream, wire.WireError(
                        f"no hello within {HELLO_TIMEOUT_S:.0f} s; open with "
                        f'{{"v":1,"t":"hello","role":"client"}}'))
                except wire.WireError as e:
                    log.info("bad_frame node=%d code=%s error=%s", self.node_id, e.code.name, e)
                    await _send_error(stream, e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    def _check_hello(self, hello: dict[str, Any]) -> str:
        if hello.get("t") != "hello":
            raise wire.WireError(f'the first frame must be {{"v":1,"t":"hello","role":"client"}}, '
                                 f'got type {hello.get("t")!r}')
        role = wire.get_str(hello, "role", choices=["client", "peer"], where="hello")
        if role == "peer":
            peer_id = wire.get_int(hello, "node_id", where="hello")
            if peer_id == self.node_id or peer_id not in self.peer_addresses:
                raise wire.WireError(f"node {peer_id} is not a peer of node {self.node_id} "
                                     f"(peers: {sorted(self.peer_addresses)}); check --peers")
        if self._closing:
            raise wire.WireError("node is shutting down; connect to another node",
                                 code=ErrorCode.SHUTTING_DOWN)
        return role

    async def _serve_peer(self, reader: wire.FrameReader, peer_id: int) -> None:
        while True:
            frame = await reader.receive()
            if frame is None:
                return
            if frame["t"] != "raft":
                raise wire.WireError(f'peer connections carry only "raft" frames, got '
                                     f'{frame["t"]!r}')
            msgs = wire.messages_from_frame(frame)
            if self.core is not None and not self._closing:
                self.group.deliver(msgs, from_peer=peer_id)

    async def _serve_client(self, stream: trio.SocketStream, reader: wire.FrameReader) -> None:
        send_lock = trio.Lock()
        limiter = trio.Semaphore(self.config.max_inflight_per_connection)

        async def send(frame: dict[str, Any]) -> None:
            data = wire.encode_frame(frame)
            async with send_lock:
                await stream.send_all(data)

        failure: wire.WireError | None = None
        async with trio.open_nursery() as nursery:
            while True:
                # Backpressure: with the connection's in-flight budget spent we stop reading,
                # so the client's TCP window fills instead of our memory.
                await limiter.acquire()
                try:
                    frame = await reader.receive()
                    if frame is None:
                        limiter.release()
                        break  # client half-closed: finish in-flight replies, then hang up
                    rid = wire.get_int(frame, "id", where=f'request "{frame["t"]}"')
                    entry = self._handlers.get(frame["t"])
                    if entry is None and self.loads is not None and self.loads.handles(frame["t"]):
                        entry = (lambda f, _rid: f, self._load_request)
                    if entry is None:
                        limiter.release()
                        await send(wire.error_reply(
                            rid, ErrorCode.BAD_REQUEST,
                            f'unknown request type {frame["t"]!r}; known: '
                            f'{", ".join(sorted(self._handlers))}'))
                        continue
                    parse, execute = entry
                    try:
                        request = parse(frame, rid)
                    except wire.WireError as e:
                        e.request_id = rid
                        raise
                except wire.WireError as e:
                    # Raised outside the nursery: trio would wrap it in an ExceptionGroup.
                    failure = e
                    nursery.cancel_scope.cancel()
                    break
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    nursery.cancel_scope.cancel()  # the client is gone: nobody to answer
                    break
                nursery.start_soon(self._run_request, execute, request, rid, send, limiter,
                                   nursery.cancel_scope)
        if failure is not None:
            raise failure

    async def _run_request(self, execute: Callable[[Any, int], Awaitable[dict]], request: Any,
                           rid: int, send: Callable[[dict], Awaitable[None]],
                           limiter: trio.Semaphore, scope: trio.CancelScope) -> None:
        self._active_requests += 1
        self._requests_idle = trio.Event() if self._active_requests == 1 else self._requests_idle
        try:
            try:
                reply = await execute(request, rid)
            except Exception as e:
                log.exception("request_failed node=%d id=%d", self.node_id, rid)
                reply = wire.error_reply(rid, ErrorCode.INTERNAL,
                                         f"internal error: {type(e).__name__}: {e}")
            try:
                await send(reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                scope.cancel()  # the client went away; drop its other requests too
        finally:
            limiter.release()
            self._active_requests -= 1
            if self._active_requests == 0:
                self._requests_idle.set()


    # -- LoadHost (raft.node.load_service) ------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.group.is_leader()

    def commit_index(self) -> int:
        return self.core.commit_index

    def not_leader_reply(self, request_id: int) -> dict[str, Any]:
        if self._closing:
            return self._error(request_id, ErrorCode.SHUTTING_DOWN)
        return self._error(request_id, ErrorCode.NOT_LEADER)

    async def propose_and_wait(self, batch: Batch, acks: Acks, timeout_s: float) -> ProduceAnswer:
        return await self.group.propose_and_wait(batch, acks, timeout_s)

    def _error(self, rid: int, code: ErrorCode, message: str | None = None,
               **extra: Any) -> dict[str, Any]:
        if code == ErrorCode.NOT_LEADER and "leader_id" not in extra and self.core is not None:
            extra["leader_id"] = self.core.leader_id
        if code == ErrorCode.NOT_LEADER:
            extra.setdefault("leader_addr", self.peer_address(extra.get("leader_id")))
        return wire.error_reply(rid, code, message or _ERROR_ADVICE.get(code, code.name),
                                **extra)

    # -- produce ---------------------------------------------------------------------------------
    def _parse_produce(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        w = "produce"
        return {
            "acks": Acks(wire.get_str(frame, "acks", default="quorum",
                                      choices=[a.value for a in Acks], where=w)),
            "timeout_ms": wire.get_int(frame, "timeout_ms", default=self.config.default_timeout_ms,
                                       minimum=1, maximum=self.config.max_timeout_ms, where=w),
            "payload": wire.get_bytes(frame, "payload", where=w),
            "count": wire.get_int(frame, "count", minimum=1, maximum=2**31 - 1, where=w),
            "producer_id": wire.get_int(frame, "producer_id", default=0, minimum=0,
                                        maximum=2**63 - 1, where=w),
            "sequence": wire.get_int(frame, "sequence", default=-1, minimum=-1,
                                     maximum=2**63 - 1, where=w),
            "timestamp_ms": wire.get_int(frame, "timestamp_ms", default=int(time.time() * 1000),
                                         minimum=-(2**63), maximum=2**63 - 1, where=w),
        }

    async def _produce(self, req: dict[str, Any], rid: int) -> dict[str, Any]:
        if self._closing:
            return self._error(rid, ErrorCode.SHUTTING_DOWN)
        if req["producer_id"] and req["sequence"] < 0:
            return self._error(rid, ErrorCode.BAD_REQUEST,
                               "an idempotent produce (producer_id != 0) needs sequence >= 0")
        self.group.catchup.note_produce(len(req["payload"]), req["count"])
        batch = Batch.create(req["payload"], req["count"], timestamp_ms=req["timestamp_ms"],
                             producer_id=req["producer_id"],
                             sequence=req["sequence"] if req["producer_id"] else -1)
        try:
            answer = await self.group.propose_and_wait(batch, req["acks"], req["timeout_ms"] / 1000)
        except ValueError as e:  # the core refused the batch's shape
            return self._error(rid, ErrorCode.BAD_REQUEST, str(e))
        if answer.error == ErrorCode.SHUTTING_DOWN and answer.request_id != -1:
            return self._error(rid, ErrorCode.SHUTTING_DOWN,
                               "this node is shutting down; the write may or may not commit: "
                               "retry on another node (idempotent producers make the retry "
                               "safe)")
        if answer.error == ErrorCode.TIMEOUT:
            return self._error(rid, ErrorCode.TIMEOUT,
                               f"no answer within {req['timeout_ms']} ms; "
                               + _ERROR_ADVICE[ErrorCode.TIMEOUT])
        if answer.error == ErrorCode.OK:
            return wire.ok_reply(rid, base_offset=answer.base_offset,
                                 last_offset=answer.last_offset, duplicate=answer.duplicate)
        message = getattr(answer, "message", "") or None
        if answer.error == ErrorCode.NOT_LEADER:
            return self._error(rid, ErrorCode.NOT_LEADER, message, leader_id=answer.leader_id)
        return self._error(rid, answer.error, message)

    async def _load_request(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        if self._closing:
            return self._error(rid, ErrorCode.SHUTTING_DOWN)
        return await self.loads.handle(self, frame)

    # -- fetch -----------------------------------------------------------------------------------
    def _parse_fetch(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        w = "fetch"
        # Leave room for the reply envelope so the reply itself fits the frame limit.
        limit = self.config.max_frame_bytes - min(FRAME_OVERHEAD, self.config.max_frame_bytes // 8)
        return {
            "offset": wire.get_int(frame, "offset", minimum=-(2**63), maximum=2**63 - 1,
                                   where=w),
            "max_bytes": min(limit, wire.get_int(frame, "max_bytes",
                                                 default=DEFAULT_FETCH_MAX_BYTES, minimum=1,
                                                 maximum=2**63 - 1, where=w)),
            "max_wait_ms": min(self.config.max_fetch_wait_ms,
                               wire.get_int(frame, "max_wait_ms", default=0, minimum=0,
                                            maximum=2**63 - 1, where=w)),
        }

    async def _fetch(self, req: dict[str, Any], rid: int) -> dict[str, Any]:
        offset = req["offset"]
        deadline = trio.current_time() + req["max_wait_ms"] / 1000
        while True:
            hw = self._visible_hw()
            start = self.log.start_offset
            if offset < start or offset > hw + 1:
                return self._error(
                    rid, ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is outside the readable range [{start}, {hw + 1}]; fetch "
                    f"from start_offset or at most high_watermark + 1",
                    start_offset=start, high_watermark=hw)
            if offset <= hw:
                try:
                    batches, next_offset = self._read_committed(offset, hw, req["max_bytes"])
                except OffsetOutOfRange:  # retention moved the log start under us
                    start = self.log.start_offset
                    return self._error(
                        rid, ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"offset {offset} was removed by retention while reading; fetch from "
                        f"start_offset {start}", start_offset=start, high_watermark=hw)
                except CorruptBatch as e:
                    return self._error(rid, ErrorCode.INTERNAL, str(e))
                return wire.ok_reply(rid, batches=batches, high_watermark=hw,
                                     start_offset=start, next_offset=next_offset)
            remaining = deadline - trio.current_time()
            if remaining <= 0 or self._closing:
                return wire.ok_reply(rid, batches=[], high_watermark=hw, start_offset=start,
                                     next_offset=offset)
            with trio.move_on_after(remaining):
                await self.group.wait_hw_change()

    def _visible_hw(self) -> int:
        """What consumers may read: the commit index, held back before any open staged load."""
        hw = self.core.high_watermark
        return hw if self.loads is None else min(hw, self.loads.stable_offset(hw))

    def _read_committed(self, offset: int, hw: int, max_bytes: int) -> tuple[list[dict], int]:
        """DATA batches from `offset` up to `hw` within `max_bytes` (at least one batch when
        there is one), and the offset to fetch next (past any skipped control batches)."""
        out: list[dict[str, Any]] = []
        used = 0
        pos = offset
        # Skipped batches (no-ops, configuration, unpublished staged data) count against a
        # separate scan bound so a reply still carries data when there is some just past them.
        scanned, scan_limit = 0, 4 * max_bytes + (1 << 20)
        while pos <= hw and (used < max_bytes or not out) and scanned < scan_limit:
            got = self.log.read(pos, max(1, max_bytes - used))
            if not got:
                break
            for b in got:
                if b.last_offset > hw or (out and used + b.size > max_bytes):
                    return out, pos
                if self.loads is not None:
                    payload = next((p for _, p in self.loads.visible([b], hw)), None)
                else:
                    payload = b.payload if b.kind == BatchKind.DATA else None
                if payload is not None:
                    out.append({"base_offset": b.base_offset, "count": b.count,
                                "timestamp_ms": b.timestamp_ms, "payload": payload})
                    used += b.size
                scanned += b.size
                pos = b.last_offset + 1
        return out, pos

    # -- status and admin --------------------------------------------------------------------------
    async def _status(self, _req: None, rid: int) -> dict[str, Any]:
        st = status_to_wire(self.core.status())
        self.group.catchup.recovery_view(st.get("followers") or [])
        cfg = getattr(self.core, "config", None)
        if cfg is not None:
            st["addresses"] = {str(k): v for k, v in sorted(cfg.addresses.items())}
        st["address"] = self.address
        # String keys: msgpack maps with int keys trip strict decoders and are not JSON.
        st["peers"] = {str(k): v for k, v in sorted(
            {**self.peer_addresses, self.node_id: self.address}.items())}
        st["leader_addr"] = self.peer_address(self.core.leader_id)
        st["links"] = self.transport.link_status()
        return wire.ok_reply(rid, status=st)

    def _parse_transfer(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        return {"to": wire.get_opt_int(frame, "to", where="transfer_leader"),
                "timeout_ms": wire.get_int(frame, "timeout_ms",
                                           default=self.config.default_timeout_ms, minimum=1,
                                           maximum=self.config.max_timeout_ms,
                                           where="transfer_leader")}

    async def _transfer_leader(self, req: dict[str, Any], rid: int) -> dict[str, Any]:
        if self._closing:
            return self._error(rid, ErrorCode.SHUTTING_DOWN)
        if self.core.role != Role.LEADER:
            return self._error(rid, ErrorCode.NOT_LEADER)
        to = req["to"]
        if to is not None and to not in self.peer_addresses:
            return self._error(rid, ErrorCode.BAD_REQUEST,
                               f"node {to} is not a peer; pick one of "
                               f"{sorted(self.peer_addresses)}")
        try:
            self.core.transfer_leadership(to)
        except ValueError as e:
            return self._error(rid, ErrorCode.BAD_REQUEST, str(e))
        self.group.kick()
        with trio.move_on_after(req["timeout_ms"] / 1000):
            while self.core.role == Role.LEADER and not self._closing:
                await self.group.wait_state_change()
        if self._closing:
            return self._error(rid, ErrorCode.SHUTTING_DOWN)
        if self.core.role == Role.LEADER:
            return self._error(rid, ErrorCode.TIMEOUT,
                               f"leadership did not move within {req['timeout_ms']} ms; the "
                               f"target may be lagging: retry later")
        return wire.ok_reply(rid, leader_id=self.core.leader_id,
                             leader_addr=self.peer_address(self.core.leader_id))

    def _parse_add_node(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        address = wire.get_str(frame, "address", where="add_node")
        return {"op": "add", "node_id": wire.get_int(frame, "node_id", minimum=1,
                                                     where="add_node"),
                "address": address}

    def _parse_remove_node(self, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        return {"op": "remove", "node_id": wire.get_int(frame, "node_id", minimum=1,
                                                        where="remove_node")}

    async def _membership(self, req: dict[str, Any], rid: int) -> dict[str, Any]:
        """add_node / remove_node: one configuration change through the log. Answered when the
        entry commits (add: the node is a learner now, promoted to voter automatically once it
        has caught up)."""
        if self._closing:
            return self._error(rid, ErrorCode.SHUTTING_DOWN)
        if not hasattr(self.core, "propose_config"):
            return self._error(rid, ErrorCode.BAD_REQUEST,
                               "this core does not support membership changes")
        if self.core.role != Role.LEADER:
            return self._error(rid, ErrorCode.NOT_LEADER)
        core = self.core
        if req["op"] == "add":
            try:
                host, port = parse_address(req["address"], what="address")
            except ConfigError as e:
                return self._error(rid, ErrorCode.BAD_REQUEST, str(e))
            address = format_address(host, port)

            def propose(request_id: int) -> None:
                core.propose_config(request_id, add_learner=req["node_id"], address=address)
        else:
            def propose(request_id: int) -> None:
                core.propose_config(request_id, remove=req["node_id"])
        _, answer = await self.group.call_core(propose, self.config.default_timeout_ms / 1000)
        if answer is None:
            return self._error(rid, ErrorCode.SHUTTING_DOWN if self._closing
                               else ErrorCode.TIMEOUT,
                               "the configuration change did not commit in time; check "
                               "`raftlog status` and retry")
        if answer.error != ErrorCode.OK:
            return self._error(rid, answer.error, answer.message or None,
                               leader_id=answer.leader_id)
        cfg = self.core.config
        return wire.ok_reply(rid, offset=answer.base_offset, voters=list(cfg.voters),
                             learners=list(cfg.learners))


_NETWORK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, wire.WireError,
                   wire.ConnectionClosed)


def _split_connection_errors(exc: BaseException, node_id: int) -> BaseException | None:
    """What must propagate out of a connection task (None: the connection just ends).
    Network errors end quietly; other bugs are logged and end only that connection."""
    if isinstance(exc, BaseExceptionGroup):
        fatal = exc.split(lambda e: not isinstance(e, Exception) or isinstance(e, AssertionError))[0]
        benign = exc.split(lambda e: isinstance(e, Exception) and not isinstance(e, AssertionError))[0]
        if benign is not None:
            _, unexpected = benign.split(_NETWORK_ERRORS)
            if unexpected is not None:
                log.error("connection_task_failed node=%d", node_id, exc_info=unexpected)
        return fatal
    if not isinstance(exc, Exception) or isinstance(exc, AssertionError):
        return exc
    if not isinstance(exc, _NETWORK_ERRORS):
        log.error("connection_task_failed node=%d", node_id, exc_info=exc)
    return None


async def _send_error(stream: trio.abc.SendStream, err: wire.WireError) -> None:
    """Best effort: the error frame before hanging up (the peer may already be gone)."""
    try:
        with trio.move_on_after(2.0):
            await stream.send_all(wire.encode_frame(
                wire.error_frame(err.code, str(err), err.request_id)))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
