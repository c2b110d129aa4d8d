"""A client connection's requests: read, route to their group, run, answer.

Each request is answered in its own task, up to the connection's in-flight budget
(`max_inflight_per_connection`); with the budget spent the loop stops reading, so the client's
TCP window fills instead of the node's memory. A produce on a plain TCP connection has no task
(issue 28): the loop proposes it and its reply is written by a callback when the answer comes
(raft.node.api.produce.start, raft.node.reply_writer), unless a request read before it has not
started yet (the order rule below) or it is traced. Plain TCP connections are read by one hub
task for all of them (raft.node.client_hub: one epoll wait, not one per connection per
request), which hands each frame to the same routing and dispatch; TLS connections are read by
their own task. A request is parsed into its type, checked
against the connection's permissions, routed by (topic, partition) or its group
(raft.node.topic_runtime), and run by its handler (raft.node.api) with its group's context. The
node waits for `idle` on a graceful stop so in-flight answers go out before it closes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from raft.core.types import ErrorCode
from raft.node import api, trace
from raft.node.api import produce
from raft.node.auth import NAMES_TOPIC
from raft.node.client_hub import ClientHub
from raft.node.plain_socket import plain_socket, send_rest, write_now
from raft.node.reply_writer import ReplyWriter
from raft.protocol.fields import get_int
from raft.protocol.framing import WireError, encode_frame
from raft.protocol.replies import ErrorReply, Reply
from raft.protocol.requests import Produce

log = logging.getLogger("raftlog.node")

READS_PER_YIELD = 16  # requests read without waiting, at most, before the loop yields


class ClientRequests:
    """The request loop of every client connection of one node."""

    def __init__(self, node: Any) -> None:  # raft.node.server.Node (which imports this)
        self._node = node
        self._active = 0  # requests being answered, over all connections
        self.idle = trio.Event()  # set while none is
        self.idle.set()
        self.hub = ClientHub()  # reads the plain connections; run by the node (raft.node.server)

    async def serve(self, conn: Any) -> None:
        """Read requests and answer each in its own task: read, route, run, reply.
        Backpressure: with the connection's in-flight budget spent we stop reading, so the
        client's TCP window fills instead of our memory. A plain TCP connection is read by the
        node's hub (raft.node.client_hub) while it runs; TLS ones by this task."""
        conn.auth = self._node.gate.auth
        sock = plain_socket(conn.stream)
        if sock is not None and self.hub.running:
            await self._serve_from_hub(conn, sock)
        else:
            await self._serve_task(conn)

    async def _serve_from_hub(self, conn: Any, sock: Any) -> None:
        """The hub reads the connection and calls back with each frame (in order, one budget
        slot taken); this task owns the connection's nursery (its request tasks and reply
        drain) and ends it as `_serve_task` would: at EOF after the replies, at once on a
        malformed frame (raised to the caller, which answers it) or a broken socket."""
        assert conn.reader is not None
        decoder = conn.reader.detach_decoder()
        take_prefix = getattr(conn.stream, "take_prefix", None)
        if take_prefix is not None:
            decoder.feed(take_prefix())  # bytes the TLS sniff read that no frame took yet
        failure: BaseException | None = None
        async with trio.open_nursery() as nursery:
            order = _Order(conn, ReplyWriter(conn.stream, nursery), nursery)
            hub_conn = self.hub.add(sock.fileno(), decoder,
                                    self._node.config.max_inflight_per_connection,
                                    lambda frame: self._dispatch(
                                        order, self._route(conn, frame), hub_conn))
            try:
                ended = await hub_conn.finished()
                if ended is None:
                    await order.replies.all_answered()  # half-closed: the replies first
                elif isinstance(ended, (trio.BrokenResourceError, trio.ClosedResourceError,
                                        OSError)):
                    nursery.cancel_scope.cancel()  # the client is gone: nobody to answer
                else:
                    failure = ended  # raised outside the nursery (as `_serve_task`)
                    nursery.cancel_scope.cancel()
            finally:
                self.hub.remove(hub_conn)  # before the socket closes: its descriptor is reused
                if nursery.cancel_scope.cancel_called:
                    order.replies.close()
        order.replies.close()
        if failure is not None:
            raise failure

    async def _serve_task(self, conn: Any) -> None:
        """The connection read by this task: TLS, or a plain one while the hub is not running."""
        limiter = trio.Semaphore(self._node.config.max_inflight_per_connection)
        failure: WireError | None = None
        read = 0
        async with trio.open_nursery() as nursery:
            order = _Order(conn, ReplyWriter(conn.stream, nursery)
                           if plain_socket(conn.stream) is not None else None, nursery)
            replies = order.replies
            try:
                while True:
                    # A budget slot without a reschedule (one per request, issue 28); the read
                    # below yields when it waits for bytes, and this every READS_PER_YIELD
                    # requests, so a client pipelining many cannot hold the loop.
                    read += 1
                    if read % READS_PER_YIELD == 0 or limiter.value == 0:
                        await limiter.acquire()
                    else:
                        limiter.acquire_nowait()
                    assert conn.reader is not None
                    frame = await conn.reader.receive()
                    if frame is None:
                        break  # client half-closed: finish in-flight replies, then hang up
                    self._dispatch(order, self._route(conn, frame), limiter)
                if replies is not None:
                    await replies.all_answered()  # the tasks' replies: the nursery waits
            except WireError as e:
                failure = e  # raised outside the nursery: trio would wrap it in an ExceptionGroup
                nursery.cancel_scope.cancel()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                nursery.cancel_scope.cancel()  # the client is gone: nobody to answer
            finally:
                if replies is not None and nursery.cancel_scope.cancel_called:
                    replies.close()  # answers that come later are dropped
        if replies is not None:
            replies.close()  # the stream closes after this returns: its descriptor is reused
        if failure is not None:
            raise failure

    def _dispatch(self, order: _Order, incoming: _Incoming, budget: _Budget) -> None:
        """Start one routed request, its budget slot taken: a plain connection's untraced
        produce is proposed now (no task, issue 28) unless a request read before it has not
        started yet; anything else runs in a task of the connection's nursery, started after
        the one before it (`_answer`)."""
        replies = order.replies
        if replies is not None and incoming.execute is produce.execute and \
                incoming.trace is None and (order.before is None or order.before.is_set()):
            self._start_produce(incoming, budget, replies)
            order.before = None  # it has started: the next need not wait
            return
        started = trio.Event()
        order.nursery.start_soon(self._answer, order.conn, incoming, budget,
                                 order.nursery.cancel_scope, order.before, started, replies)
        order.before = started

    def _route(self, conn: Any, frame: dict[str, Any]) -> _Incoming:
        """One request frame parsed into its type and routed to its group. A type the node
        does not know, a permission the client lacks or a group the node does not run is
        answered with an error reply; a malformed frame raises WireError (hang up)."""
        started = time.perf_counter()
        t = frame["t"]
        rid = get_int(frame, "id", where=f'request "{t}"')
        execute = api.lookup(self._node.api, t)
        if execute is None:
            return _Incoming(t, rid, started, refusal=ErrorReply(
                ErrorCode.BAD_REQUEST,
                f'unknown request type {t!r}; known: {", ".join(sorted(api.REQUESTS))}'))
        refusal = conn.auth.authorize(conn.session, t) if conn.auth.enabled else None
        if refusal is not None:
            return _Incoming(t, rid, started, refusal=ErrorReply(
                refusal.code, refusal.message, {"permission": refusal.permission}))
        try:
            request = api.parse(self._node.api, t, frame)
        except WireError as e:
            e.request_id = rid
            raise
        routed = self._node.topics.route(t, request)  # by (topic, partition), or its group
        if routed.refusal is not None:
            return _Incoming(t, rid, started, refusal=routed.refusal)
        group_id = routed.group
        if conn.auth.enabled:  # topic grants: checked against the topic the request reaches
            refused = self._authorize_topic(conn, t, request, group_id)
            if refused is not None:
                return _Incoming(t, rid, started, refusal=refused)
        ctx = self._node.registry.api(group_id)
        if ctx is None:
            groups = self._node.registry.ids()
            return _Incoming(t, rid, started, refusal=ErrorReply(
                ErrorCode.BAD_REQUEST,
                f"group {group_id} does not run on node {self._node.node_id}: it runs groups "
                f"{groups}; send the request to a node that runs it, or leave out the group "
                f"field and name the topic and partition", {"groups": groups}))
        incoming = _Incoming(t, rid, started, execute, request, ctx)
        if trace.ENABLED and type(frame.get("trace")) is int:  # a sampled write (bench trace)
            incoming.trace = (frame["trace"], trace.now())
        return incoming

    def _authorize_topic(self, conn: Any, t: str, request: Any,
                         group_id: int | None) -> ErrorReply | None:
        """FORBIDDEN unless the principal may use the request's topic (raft.node.auth); a
        `metadata` request of a principal with topic grants is narrowed to its topics."""
        topics = self._node.topics
        if t == "metadata":
            visible = conn.auth.visible_topics(conn.session, sorted(topics.metadata.topics))
            if visible is not None:
                request.topics = visible if request.topics is None else [
                    n for n in request.topics if n in set(visible)]
            return None
        topic = request.name if t in NAMES_TOPIC else topics.topic_of_group(group_id)
        refusal = conn.auth.authorize_topic(conn.session, t, topic)
        if refusal is None:
            return None
        extra = {"permission": refusal.permission}
        if refusal.topic is not None:
            extra["topic"] = refusal.topic
        return ErrorReply(refusal.code, refusal.message, extra)

    def _start_produce(self, incoming: _Incoming, limiter: _Budget,
                       replies: ReplyWriter) -> None:
        """Propose a produce now and write its reply when the answer comes (a callback from
        the group's Ready loop, timer or shutdown), releasing the budget slot then; nothing
        here may raise into those loops."""
        self._began()
        replies.started()
        answered = False

        def done(reply: Reply) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            try:
                frame = reply.to_frame(incoming.rid)
                self._node.metrics.request_done(incoming.t, frame, incoming.started,
                                                incoming.request.acks.value)
                replies.write(encode_frame(frame))
            except Exception:
                log.exception("reply_failed node=%d id=%d", self._node.node_id, incoming.rid)
            finally:
                limiter.release()
                replies.answered()
                self._ended()

        try:
            produce.start(incoming.ctx, incoming.request, done)
        except Exception as e:
            log.exception("request_failed node=%d id=%d", self._node.node_id, incoming.rid)
            done(ErrorReply(ErrorCode.INTERNAL, f"internal error: {type(e).__name__}: {e}"))

    def _began(self) -> None:
        self._active += 1
        self.idle = trio.Event() if self._active == 1 else self.idle

    def _ended(self) -> None:
        self._active -= 1
        if self._active == 0:
            self.idle.set()

    async def _answer(self, conn: Any, incoming: _Incoming, limiter: _Budget,
                      scope: trio.CancelScope, before: trio.Event | None = None,
                      started: trio.Event | None = None,
                      replies: ReplyWriter | None = None) -> None:
        """Run one request and write its reply. Requests of one connection start in the order
        they were read: each waits until the previous one's handler has started, so the
        synchronous part of a handler (a produce's or a staged load's proposal into the core)
        happens in that order. Trio may run tasks spawned in one turn in either order, and the
        read loop reads frames already buffered without yielding (issue 28): without this, a
        client pipelining two writes to one partition could see them appended swapped."""
        self._began()
        if incoming.trace is not None:  # (set only while tracing: raft.node.trace)
            trace.begin_request(*incoming.trace)
        try:
            if before is not None and not before.is_set():
                await before.wait()
            if started is not None:
                started.set()
            if incoming.refusal is not None:
                frame = incoming.refusal.to_frame(incoming.rid)
                self._node.metrics.count_error(incoming.refusal.code.name)
            else:
                frame = (await self._execute(incoming)).to_frame(incoming.rid)
                acks = incoming.request.acks if isinstance(incoming.request, Produce) else None
                self._node.metrics.request_done(incoming.t, frame, incoming.started,
                                          None if acks is None else acks.value)
            data = encode_frame(frame)
            if replies is not None:  # a plain connection: in order with the callbacks' replies
                replies.write(data)
                if trace.ENABLED:
                    trace.request_hop("sent")
                return
            try:
                await send_reply(conn, data)
                if trace.ENABLED:
                    trace.request_hop("sent")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                scope.cancel()  # the client went away; drop its other requests too
        finally:
            if started is not None:
                started.set()  # also when cancelled or failed first: never blocks the next
            limiter.release()
            self._ended()

    async def _execute(self, incoming: _Incoming) -> Reply:
        assert incoming.execute is not None
        try:
            return await incoming.execute(incoming.ctx, incoming.request)
        except Exception as e:
            log.exception("request_failed node=%d id=%d", self._node.node_id, incoming.rid)
            return ErrorReply(ErrorCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")


async def send_reply(conn: Any, data: bytes) -> None:
    """Write one reply whole. On a plain TCP connection with no reply being written, straight
    into the socket (raft.node.plain_socket): the kernel takes a small reply at once, and
    trio's send_all and lock acquire would cost the loop two reschedules per request (issue
    28). What the socket does not take, and every reply over TLS or behind another, goes
    through trio under the connection's send lock, so replies never interleave."""
    lock = conn.send_lock
    sock = plain_socket(conn.stream)
    if sock is None or lock.locked():
        async with lock:
            await conn.stream.send_all(data)
        return
    lock.acquire_nowait()  # no await since locked(): no other reply can start in between
    try:
        await send_rest(conn.stream, data, write_now(sock, data))
    finally:
        lock.release()


class _Budget(Protocol):
    """Where an answered request gives its slot back: the task loop's semaphore, or the
    hub's connection (raft.node.client_hub.HubConn)."""

    def release(self) -> None: ...


@dataclass(slots=True, eq=False)
class _Order:
    """One connection's serving state: requests start in the order they were read."""

    conn: Any
    replies: ReplyWriter | None  # plain TCP only
    nursery: trio.Nursery
    before: trio.Event | None = None  # set once the previous request's handler started


@dataclass(slots=True)
class _Incoming:
    """One client request, read and routed: run `execute` on `request`, or answer `refusal`."""

    t: str
    rid: int
    started: float
    execute: api.Handler | None = None
    request: Any = None
    ctx: api.ApiContext | None = None  # the request's group's
    refusal: ErrorReply | None = None
    trace: tuple[int, float] | None = None  # a sampled write: (trace id, read at)
