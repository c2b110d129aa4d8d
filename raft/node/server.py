"""The trio node: drives the sans-IO Raft core and serves peers and clients on one port.

One trio program per node. Tasks:
- the listener (peers and clients on the same address; the first frame, `hello`, says which);
- one `PeerLink` per peer (outgoing connection, bounded queue, reconnect with backoff);
- a tick task (`tick_ms`);
- the Ready loop, woken by an event whenever an input reached the core (no polling);
- the flusher: one `log.flush()` at a time in a worker thread; appends continue meanwhile and the
  next flush takes everything appended since (group commit).

Driver contract (raft/ready.py), in the order the Ready loop applies it: persist `hard_state`
(fsync) BEFORE enqueueing `messages`; request a flush when `flush` is set; route `answers` to the
client requests waiting for them. Quorum acks come from the core only once the commit index covers
the batch, and the commit index counts only flushed offsets, so a SIGKILL at any moment loses
nothing quorum-acked.

Data directory: with no log passed in, the node opens `<data_dir>/node-<id>/` via
`storage.open_log` (see raft.node.config). In-process tests pass a log (MemoryLog or LmdbLog) instead.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from raft.node import wire
from raft.node.config import ConfigError, NodeConfig, format_address, parse_address
from raft.messages import MESSAGE_TYPES, AppendEntries, Message
from raft.node.peer import PeerLink
from raft.ready import ProduceAnswer
from raft.types import Acks, ErrorCode, Role
from recovery.ratelimit import TokenBucket
from storage.api import LogStorage, Meta, OffsetOutOfRange
from storage.batch import Batch, BatchKind, CorruptBatch

log = logging.getLogger("raftlog.node")

HELLO_TIMEOUT_S = 10.0
DEFAULT_FETCH_MAX_BYTES = 1 << 20
# Room for the reply envelope around fetched payloads.
FRAME_OVERHEAD = 64 * 1024
OPEN_PROGRESS_EVERY_S = 2.0
LOAD_CHECK_TICKS = 20  # how often (in ticks) the leader looks for timed-out staged loads

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


@dataclass(slots=True)
class _Pending:
    """A produce request waiting for its answer from a later Ready."""

    event: trio.Event
    answer: ProduceAnswer | None = None


class _CloseConnection(Exception):
    """Raised inside a client connection to send an error frame and hang up."""

    def __init__(self, err: wire.WireError) -> None:
        super().__init__(str(err))
        self.err = err


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
        self.log: LogStorage | None = log_storage
        self._owns_log = log_storage is None
        # MemoryLog is not thread safe (and has no I/O to hide): run its "I/O" inline.
        if inline_io is None:
            inline_io = log_storage is not None and type(log_storage).__name__ == "MemoryLog"
        self._inline_io = inline_io
        # (RaftConfig, RaftCore) to drive; None = raft.raft's. Tests may pass a stand-in.
        self._core_classes = core_classes
        self._rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        self.core: Any = None
        self.address: str | None = None
        self.peer_addresses: dict[int, str] = {k: v for k, v in config.peers.items()
                                               if k != self.node_id}
        self.links: dict[int, PeerLink] = {}
        self._encodings = wire.BatchEncodings()  # one encoding per batch for all followers
        self._meta = Meta()
        self._wake = trio.Event()
        self._flush_wanted = trio.Event()
        self._hw_changed = trio.Event()
        self._state_changed = trio.Event()
        self._last_hw = -1
        self._last_state: tuple[Any, ...] = ()
        self._pending: dict[int, _Pending] = {}
        self._request_ids = itertools.count(1)
        self._closing = False
        self._shutdown_requested = trio.Event()
        self._stopped = trio.Event()
        self._active_requests = 0
        self._requests_idle = trio.Event()
        self._requests_idle.set()
        self._accept_scope: trio.CancelScope | None = None
        self._run_scope = trio.CancelScope()
        self.loads: Any = None  # raft.node.load_service.LoadService once the log is open
        self._link_nursery: trio.Nursery | None = None
        self._link_scopes: dict[int, trio.CancelScope] = {}
        self._known_config: Any = None
        # Recovery throttle (NodeConfig.recovery_rate): flush=False chunks wait for tokens in
        # per-follower FIFO queues, bounded by the core's in-flight window per follower.
        self._recovery_limiter: TokenBucket | None = None
        if config.recovery_rate > 0:
            self._recovery_limiter = TokenBucket(config.recovery_rate * (1 << 20),
                                                 config.recovery_burst * (1 << 20),
                                                 trio.current_time)
        self._throttled: dict[int, collections.deque[Message]] = {}
        self._throttle_wake = trio.Event()
        # Per follower: recent (time, match index, acked bytes) samples for the catch-up rate.
        self._progress_samples: dict[int, collections.deque[tuple[float, int, int]]] = {}
        self._bytes_per_offset = 0.0
        self._handlers: dict[str, tuple[Callable[[dict, int], Any],
                                        Callable[[Any, int], Awaitable[dict]]]] = {
            "produce": (self._parse_produce, self._produce),
            "fetch": (self._parse_fetch, self._fetch),
            "status": (lambda frame, rid: None, self._status),
            "transfer_leader": (self._parse_transfer, self._transfer_leader),
            "add_node": (self._parse_add_node, self._membership),
            "remove_node": (self._parse_remove_node, self._membership),
        }

    # -- public control ----------------------------------------------------------------------------
    def request_shutdown(self) -> None:
        """Begin a graceful stop (what SIGTERM does); `run` returns when it is done."""
        self._shutdown_requested.set()

    def abort(self) -> None:
        """Stop at once without flushing (what SIGKILL does; tests pair it with
        MemoryLog.crash() to drop the unflushed tail)."""
        self._run_scope.cancel()

    def set_peer_address(self, peer_id: int, address: str) -> None:
        self.peer_addresses[peer_id] = address
        if peer_id in self.links:
            self.links[peer_id].set_address(address)

    def peer_address(self, node_id: int | None) -> str | None:
        if node_id is None:
            return None
        if node_id == self.node_id:
            return self.address
        return self.peer_addresses.get(node_id)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        if self._core_classes is not None:
            RaftConfig, RaftCore = self._core_classes
        else:
            from raft.raft import RaftConfig, RaftCore

        with self._run_scope:
            await self._run(RaftConfig, RaftCore, task_status)

    async def _run(self, RaftConfig: Any, RaftCore: Any, task_status: trio.TaskStatus[Node]) -> None:
        if self.log is None:
            self.log = await _open_log_with_progress(self.config)
        try:
            self._meta = self.log.load_meta()
            voters = sorted(self.config.peers)
            if self.config.join:
                # Not a member until the cluster adds it: the others decide, via the log.
                voters = sorted(p for p in self.config.peers if p != self.node_id)
            try:
                raft_cfg = RaftConfig(node_id=self.node_id, voters=voters, learners=[],
                                      **self.config.raft_kwargs())
                self.core = RaftCore(raft_cfg, self.log, self._rng)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"raft settings: {e}; check --raft KEY=VALUE options and "
                                  f"the [raft] table of the config file") from None
            self.loads = _make_load_service(self.log)
            self._last_hw = self.core.high_watermark
            host, port = self.config.listen_address
            try:
                listeners = await trio.open_tcp_listeners(port, host=host)
            except OSError as e:
                raise ConfigError(f"cannot listen on {format_address(host, port)}: "
                                  f"{e.strerror or e}; pick a free --listen address (or stop "
                                  f"the process using it)") from None
            bound = listeners[0].socket.getsockname()
            self.address = format_address(host, bound[1])
            log.info("node_started node=%d address=%s peers=%s term=%d dirty=%d flushed=%d",
                     self.node_id, self.address, self.peer_addresses, self.core.term,
                     self.log.dirty_offset, self.log.flushed_offset)
            async with trio.open_nursery() as nursery:
                self._link_nursery = nursery
                self._sync_members()
                for peer_id, address in sorted(self.peer_addresses.items()):
                    self._open_link(peer_id, address)
                async with trio.open_nursery() as driver:
                    if self._recovery_limiter is not None:
                        driver.start_soon(self._recovery_sender)
                    driver.start_soon(self._progress_sampler)
                    driver.start_soon(self._tick_loop)
                    driver.start_soon(self._ready_loop)
                    driver.start_soon(self._flush_loop)
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
                await self._final_flush()
                nursery.cancel_scope.cancel()
        finally:
            self._closing = True
            for pending in self._pending.values():
                pending.event.set()
            if self._owns_log and self.log is not None:
                self.log.close()
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
        if (self.core.role == Role.LEADER and self.config.shutdown_transfer_ms > 0
                and len(self.config.peers) > 1 and hasattr(self.core, "transfer_leadership")):
            with trio.move_on_after(self.config.shutdown_transfer_ms / 1000):
                try:
                    self.core.transfer_leadership(None)
                except Exception:  # a refusal must not block shutdown
                    log.exception("transfer_on_shutdown_failed node=%d", self.node_id)
                else:
                    self._kick()
                    while self.core.role == Role.LEADER:
                        await self._wait_state_change()
        self._closing = True
        for pending in list(self._pending.values()):
            pending.event.set()  # answered SHUTTING_DOWN by their handlers
        self._hw_changed.set()  # long polls return now
        self._state_changed.set()  # so do transfer_leader waits
        with trio.move_on_after(2.0):
            await self._requests_idle.wait()

    async def _final_flush(self) -> None:
        """Make everything appended durable and persist metadata before closing the log."""
        rd = self.core.ready()
        if rd.hard_state is not None:
            await self._save_meta(rd.hard_state)
        flushed = await self._run_io(self.log.flush)
        self.core.flushed(min(flushed, self.log.flushed_offset))
        log.info("final_flush node=%d flushed=%d", self.node_id, flushed)

    # -- the driver loops --------------------------------------------------------------------------
    def _kick(self) -> None:
        self._wake.set()

    async def _run_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._inline_io:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)

    async def _tick_loop(self) -> None:
        interval = self.config.tick_ms / 1000
        deadline = trio.current_time()
        ticks = 0
        while True:
            deadline += interval
            now = trio.current_time()
            if deadline < now - 10 * interval:  # we were stalled: do not replay missed ticks
                deadline = now
            await trio.sleep_until(deadline)
            self.core.tick()
            self._kick()
            ticks += 1
            if self.loads is not None and ticks % LOAD_CHECK_TICKS == 0:
                self._expire_loads()

    async def _ready_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self._process_ready()

    async def _save_meta(self, hard_state: Any) -> None:
        self._meta = Meta(term=hard_state.term, voted_for=hard_state.voted_for,
                          config=hard_state.config, extra=self._meta.extra)
        await self._run_io(self.log.save_meta, self._meta)

    async def _process_ready(self) -> None:
        rd = self.core.ready()
        if rd.hard_state is not None:
            # A term or vote must be durable before anyone can see a message that depends on it.
            await self._save_meta(rd.hard_state)
        for msg in rd.messages:
            if self._recovery_limiter is not None and isinstance(msg, AppendEntries) and (
                    msg.dst in self._throttled or (not msg.flush and msg.batches)):
                # Recovery chunk (or anything queued behind one, to keep the order).
                self._throttled.setdefault(msg.dst, collections.deque()).append(msg)
                self._throttle_wake.set()
                continue
            self._send_peer(msg)
        if rd.flush:
            self._flush_wanted.set()
        for answer in rd.answers:
            pending = self._pending.get(answer.request_id)
            if pending is not None:
                pending.answer = answer
                pending.event.set()
        self._notify_changes()

    def _send_peer(self, msg: Message) -> None:
        link = self.links.get(msg.dst)
        if link is None:
            log.debug("message_to_unknown_peer node=%d dst=%d", self.node_id, msg.dst)
            return
        link.enqueue(msg)

    async def _recovery_sender(self) -> None:
        """Release throttled recovery chunks as the token bucket allows, in order per
        follower, round-robin across followers."""
        limiter = self._recovery_limiter
        assert limiter is not None
        while True:
            if not self._throttled:
                await self._throttle_wake.wait()
                self._throttle_wake = trio.Event()
                continue
            for dst in list(self._throttled):
                queue = self._throttled[dst]
                msg = queue[0]
                cost = sum(b.size for b in msg.batches) if not msg.flush else 0
                delay = limiter.delay_for(cost) if cost else 0.0
                if delay > 0:
                    await trio.sleep(delay)  # the throttle itself: wait for tokens
                if cost:
                    limiter.take(cost)
                queue.popleft()
                if not queue:
                    del self._throttled[dst]
                self._send_peer(msg)

    def _open_link(self, peer_id: int, address: str) -> None:
        if peer_id in self.links or self._link_nursery is None or peer_id == self.node_id:
            return
        link = PeerLink(
            self.node_id, peer_id, address,
            max_frame_bytes=self.config.max_frame_bytes,
            queue_messages=self.config.peer_queue_messages,
            queue_bytes=self.config.peer_queue_bytes,
            backoff_min_s=self.config.reconnect_min_ms / 1000,
            backoff_max_s=self.config.reconnect_max_ms / 1000,
            rng=random.Random(self._rng.getrandbits(64)), encodings=self._encodings)
        self.links[peer_id] = link
        scope = trio.CancelScope()
        self._link_scopes[peer_id] = scope

        async def run_link() -> None:
            with scope:
                await link.run()

        self._link_nursery.start_soon(run_link)

    def _sync_members(self) -> None:
        """Follow the configuration in force: learn new members' addresses from it and keep a
        link to every member (a removed node's link is closed)."""
        cfg = getattr(self.core, "config", None)
        if cfg is None or cfg == self._known_config:
            return
        self._known_config = cfg
        for node_id, address in cfg.addresses.items():
            if node_id != self.node_id and address:
                self.peer_addresses[node_id] = address
                if node_id in self.links:
                    self.links[node_id].set_address(address)
        if self._link_nursery is None:
            return
        members = set(cfg.members)
        for node_id in sorted(members):
            address = self.peer_addresses.get(node_id)
            if address and node_id != self.node_id:
                self._open_link(node_id, address)
        for node_id in list(self.links):
            if node_id not in members and node_id not in self.config.peers:
                self._link_scopes.pop(node_id).cancel()
                del self.links[node_id]
                self.peer_addresses.pop(node_id, None)

    async def _progress_sampler(self) -> None:
        """Twice a second, remember each follower's match index and acked bytes, so status
        can show a catch-up rate over the last few seconds."""
        while True:
            await trio.sleep(0.5)
            if self.core is None or self.core.role != Role.LEADER or \
                    not hasattr(self.core, "progress"):
                self._progress_samples.clear()
                continue
            now = trio.current_time()
            for f in self.core.status().followers:
                pr = self.core.progress(f.node_id)
                q = self._progress_samples.setdefault(f.node_id, collections.deque(maxlen=12))
                q.append((now, f.match_index, getattr(pr, "acked_bytes", 0)))

    def _recovery_view(self, followers: list[dict[str, Any]]) -> None:
        """Add bytes behind (estimated from offsets and the average bytes per offset) and the
        catch-up rate to each follower's status entry."""
        dirty = self.log.dirty_offset if self.log is not None else -1
        per = self._bytes_per_offset or 0.0
        if not per and self.log is not None and dirty >= self.log.start_offset:
            last = self.log.read(dirty, 1)  # the last batch stands for the average
            per = last[0].size / last[0].count if last else 0.0
        for f in followers:
            behind = max(0, dirty - f["match_index"])
            f["offsets_behind"] = behind
            f["bytes_behind"] = int(behind * per)
            q = self._progress_samples.get(f["node_id"])
            rate_o, rate_b = 0.0, 0.0
            if q and len(q) >= 2 and q[-1][0] > q[0][0]:
                dt = q[-1][0] - q[0][0]
                rate_o = max(0, q[-1][1] - q[0][1]) / dt
                rate_b = max(0, q[-1][2] - q[0][2]) / dt
            f["catchup_offsets_per_s"] = round(rate_o, 1)
            f["catchup_bytes_per_s"] = round(rate_b, 1)
            f["eta_s"] = round(behind / rate_o, 1) if rate_o > 0 and behind else None

    def _notify_changes(self) -> None:
        self._sync_members()
        hw = self.core.high_watermark
        if hw != self._last_hw:
            self._last_hw = hw
            self._hw_changed.set()
            self._hw_changed = trio.Event()
        state = (self.core.role, self.core.term, self.core.leader_id)
        if state != self._last_state:
            if self._last_state:
                log.info("state_changed node=%d role=%s term=%d leader=%s", self.node_id,
                         state[0].value, state[1], state[2])
            self._last_state = state
            self._state_changed.set()
            self._state_changed = trio.Event()

    async def _wait_state_change(self) -> None:
        await self._state_changed.wait()

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            flushed = await self._run_io(self.log.flush)
            # A truncation may have raced the flush; never report more than the log holds.
            self.core.flushed(min(flushed, self.log.flushed_offset))
            self._kick()

    def _expire_loads(self) -> None:
        try:
            batches = self.loads.expired(self.is_leader(), self.core.commit_index,
                                         int(time.time() * 1000))
        except Exception:
            log.exception("load_expiry_failed node=%d", self.node_id)
            return
        for batch in batches:  # fire and forget: a lost abort is retried a minute later
            self.core.propose(next(self._request_ids), batch, Acks.QUORUM)
        if batches:
            self._kick()

    # -- LoadHost (raft.node.load_service) ------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.core is not None and self.core.role == Role.LEADER and not self._closing

    def commit_index(self) -> int:
        return self.core.commit_index

    def not_leader_reply(self, request_id: int) -> dict[str, Any]:
        if self._closing:
            return self._error(request_id, ErrorCode.SHUTTING_DOWN)
        return self._error(request_id, ErrorCode.NOT_LEADER)

    async def propose_and_wait(self, batch: Batch, acks: Acks, timeout_s: float) -> ProduceAnswer:
        """Propose a batch and wait for the core's answer (TIMEOUT/SHUTTING_DOWN answers are
        synthesised when none comes)."""
        if self._closing:
            return ProduceAnswer(-1, ErrorCode.SHUTTING_DOWN)
        core_id = next(self._request_ids)
        pending = _Pending(trio.Event())
        self._pending[core_id] = pending
        try:
            self.core.propose(core_id, batch, acks)
            self._kick()
            with trio.move_on_after(timeout_s):
                await pending.event.wait()
        finally:
            self._pending.pop(core_id, None)
        if pending.answer is not None:
            return pending.answer
        return ProduceAnswer(core_id, ErrorCode.SHUTTING_DOWN if self._closing
                             else ErrorCode.TIMEOUT)

    # -- peer input ------------------------------------------------------------------------------
    def deliver(self, msgs: list[Message], *, from_peer: int) -> None:
        for msg in msgs:
            if msg.dst != self.node_id or msg.src != from_peer:
                log.warning("misaddressed_message node=%d from=%d src=%d dst=%d", self.node_id,
                            from_peer, msg.src, msg.dst)
                continue
            self.core.step(msg)
        self._kick()

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
                self.deliver(msgs, from_peer=peer_id)

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
        per = (len(req["payload"]) + 64) / req["count"] if req["count"] > 0 else 0.0
        self._bytes_per_offset = per if not self._bytes_per_offset else \
            0.9 * self._bytes_per_offset + 0.1 * per
        batch = Batch.create(req["payload"], req["count"], timestamp_ms=req["timestamp_ms"],
                             producer_id=req["producer_id"],
                             sequence=req["sequence"] if req["producer_id"] else -1)
        try:
            answer = await self.propose_and_wait(batch, req["acks"], req["timeout_ms"] / 1000)
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
            changed = self._hw_changed
            with trio.move_on_after(remaining):
                await changed.wait()

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
        self._recovery_view(st.get("followers") or [])
        cfg = getattr(self.core, "config", None)
        if cfg is not None:
            st["addresses"] = {str(k): v for k, v in sorted(cfg.addresses.items())}
        st["address"] = self.address
        # String keys: msgpack maps with int keys trip strict decoders and are not JSON.
        st["peers"] = {str(k): v for k, v in sorted(
            {**self.peer_addresses, self.node_id: self.address}.items())}
        st["leader_addr"] = self.peer_address(self.core.leader_id)
        st["links"] = {str(k): link.status() for k, link in sorted(self.links.items())}
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
        self._kick()
        with trio.move_on_after(req["timeout_ms"] / 1000):
            while self.core.role == Role.LEADER and not self._closing:
                await self._wait_state_change()
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
        core_id = next(self._request_ids)
        pending = _Pending(trio.Event())
        self._pending[core_id] = pending
        try:
            if req["op"] == "add":
                try:
                    host, port = parse_address(req["address"], what="address")
                except ConfigError as e:
                    return self._error(rid, ErrorCode.BAD_REQUEST, str(e))
                self.core.propose_config(core_id, add_learner=req["node_id"],
                                         address=format_address(host, port))
            else:
                self.core.propose_config(core_id, remove=req["node_id"])
            self._kick()
            with trio.move_on_after(self.config.default_timeout_ms / 1000):
                await pending.event.wait()
        finally:
            self._pending.pop(core_id, None)
        answer = pending.answer
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


async def _open_log_with_progress(config: NodeConfig) -> LogStorage:
    """Open `<data_dir>/node-<id>/` in a worker thread, printing progress for long opens
    (a large LMDB log may take a while to verify its tail)."""
    path = config.check_data_dir()
    try:
        from storage import open_log
    except ImportError:
        raise RuntimeError("storage.open_log is not available in this build; cannot open a "
                           "durable log") from None
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        async def progress() -> None:
            while True:
                await trio.sleep(OPEN_PROGRESS_EVERY_S)
                log.warning("opening_log path=%s elapsed_s=%.0f", path,
                            trio.current_time() - started)
        nursery.start_soon(progress)
        opened = await trio.to_thread.run_sync(open_log, path)
        nursery.cancel_scope.cancel()
    return opened


def _make_load_service(log_storage: LogStorage) -> Any:
    """Staged Spark loads (raft.node.load_service) when that module is present in this build."""
    try:
        from raft.node.load_service import LoadService
    except ImportError:
        return None
    return LoadService(log_storage)
