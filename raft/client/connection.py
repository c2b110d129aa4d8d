"""One client connection to one node: TLS when configured (raft.client.security), the hello
(with the token, if any), then pipelined request/reply frames matched by id."""

from __future__ import annotations

import math
import select
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.client.errors import TooLargeError, error_from_reply
from raft.client.security import ClientSecurity, tls_error
from raft.node.config import parse_address
from raft.protocol.framing import encode_frame, WireError
from raft.protocol.hello import HelloReply
from raft.protocol.streams import FrameReader


# Requests one connection carries at once; beyond it callers wait for a slot (backpressure,
# not an unbounded table). Below the node's max_inflight_per_connection (default 256), so the
# node keeps reading a busy client's frames.
MAX_IN_FLIGHT = 64
# How long past its caller's deadline a request's frame may take to reach the kernel: a frame
# is written whole even when its caller is cancelled meanwhile (half a frame would corrupt the
# stream for every other request on it). A send still stuck then breaks the connection.
SEND_GRACE_S = 5.0


class RequestNotSent(trio.BrokenResourceError):
    """The connection was broken before any byte of this request was written: the node never
    saw it, so even a request that must not be sent twice (a produce without a producer id)
    may be sent again (raft.protocol.errors: a connection failure before the write is
    "certainly not written")."""


@dataclass(slots=True, eq=False)
class _Pending:
    """One request in flight: its reply or its failure, once known, and the event its caller
    sleeps on (set when either is known, or when it is handed the reading role)."""
    reply: dict[str, Any] | None = None
    error: BaseException | None = None
    wake: trio.Event = field(default_factory=trio.Event)

    @property
    def done(self) -> bool:
        return self.reply is not None or self.error is not None


class _Connection:
    """One client connection: hello, then up to MAX_IN_FLIGHT requests in flight, their replies
    matched to them by `id` (the node answers them in any order, docs/PROTOCOL.md).

    Sends are serialized by a lock, so frames never interleave. Replies are read by "whoever
    waits reads" rather than by a reader task: a task needs a nursery to live in, and a `Client`
    has none (it may be used without `async with`, and its callers' tasks come and go), and
    giving it one would change how every program opens a client. One waiting request at a time holds the reading role; it reads frames
    and hands each reply to the request it answers, until its own arrives; then it gives the
    role to another waiting request. Why this is cancellation-safe: a reader is cancelled only
    inside the stream's `receive_some`, which either returns bytes or raises having taken none
    (TCP, and TLS after the handshake: TLS 1.3 has no renegotiation), and `FrameReader` keeps the bytes of a frame it has
    half read in its buffer, so the next reader carries on where the cancelled one stopped; the
    decoding and dispatch between two reads do not wait. A request whose caller is cancelled or
    times out is simply forgotten: its late reply, when it comes, is dropped. The send side is
    made safe by writing a frame whole even when its caller is cancelled (SEND_GRACE_S).

    A connection-level failure (EOF, a broken stream, a bad frame, an `error` frame: the node
    hangs up after one) fails every request in flight and marks the connection broken; the
    `Client` then opens another."""

    def __init__(self, address: str, stream: trio.abc.Stream, node_id: int,
                 max_frame_bytes: int) -> None:
        self.address = address
        self.stream = stream
        self.node_id = node_id
        self.reader = FrameReader(stream, max_frame_bytes)
        self._send_lock = trio.Lock()
        self._slots = trio.Semaphore(MAX_IN_FLIGHT)
        self._pending: dict[int, _Pending] = {}
        self._reading = False  # a waiting request holds the reading role
        self.broken = False
        self.principal: str | None = None  # who the node says we are (authentication on)
        # The node's frame limit, from its hello (None from nodes that do not say): a request
        # over it is refused here, before a byte is sent, instead of being cut off mid-send.
        self.max_request_bytes: int | None = None

    @property
    def in_flight(self) -> int:
        """Requests sent or waiting to be sent whose callers still wait for the reply."""
        return len(self._pending)

    @classmethod
    async def open(cls, address: str, max_frame_bytes: int,
                   security: ClientSecurity | None = None,
                   dial: str | None = None) -> "_Connection":
        """`dial`: where to connect instead of `address` (raft/client/address_map.py); TLS
        still checks the certificate against `address`'s host."""
        security = security or ClientSecurity()
        host, _ = parse_address(address)
        dial_host, port = parse_address(dial or address)
        raw = await trio.open_tcp_stream(dial_host, port)
        stream: trio.abc.Stream = raw
        try:
            stream = await security.wrap(raw, host, address)
            try:
                await stream.send_all(encode_frame(security.hello().to_frame()))
                reader = FrameReader(stream, max_frame_bytes)
                frame = await reader.receive()
            except trio.BrokenResourceError as e:
                if security.tls:  # TLS 1.3: a refused client certificate shows up here
                    raise tls_error(address, e) from None
                raise
            if frame is not None and frame.get("t") == "error" \
                    and frame.get("code") == "UNAUTHENTICATED":
                raise error_from_reply(frame)  # not retried: every node would say the same
            try:
                if frame is None:
                    raise WireError("the connection closed")
                hello = HelloReply.parse(frame)
            except WireError:
                # A node that is stopping hangs up or answers an error: try another node
                # (ConnectionError is an OSError, which call() retries).
                raise ConnectionError(f"{address} did not answer the hello ({frame!r}); is it "
                                      f"a running raftlog node?") from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await raw.aclose()
            raise
        conn = cls(address, stream, hello.node_id, max_frame_bytes)
        conn.reader = reader
        conn.principal = hello.principal
        conn.max_request_bytes = hello.max_frame_bytes
        return conn

    async def request(self, request: Any, rid: int) -> dict[str, Any]:
        """Send a typed request (raft.protocol: anything with `to_frame(rid)`; a raw map with
        its "t" for one that has no type, a test's) and wait for its reply."""
        frame = {**request, "id": rid} if type(request) is dict else request.to_frame(rid)
        data = encode_frame(frame)
        if self.max_request_bytes is not None and len(data) - 4 > self.max_request_bytes:
            raise TooLargeError(
                f"the {frame.get('t')} request is {len(data) - 4:,} bytes; {self.address} accepts "
                f"frames up to {self.max_request_bytes:,} bytes (max_frame_bytes): send smaller "
                f"batches or records, or raise --max-frame-bytes on every node",
                details={"size": len(data) - 4, "limit": self.max_request_bytes})
        async with self._slots:  # at most MAX_IN_FLIGHT: the others wait here
            self._check_open()
            assert rid not in self._pending, f"request id {rid} reused on {self.address}"
            pending = self._pending[rid] = _Pending()
            try:
                await self._send(data)
                while not pending.done:
                    if self._reading:
                        pending.wake = trio.Event()
                        await pending.wake.wait()  # a reply, a failure, or the reading role
                    else:
                        await self._read_until(pending)
            finally:
                del self._pending[rid]
                self._hand_over()  # a reader leaving (even cancelled) passes the role on
            if pending.error is not None:
                raise pending.error
            assert pending.reply is not None
            return pending.reply

    def _check_open(self) -> None:
        if self.broken:
            raise RequestNotSent(f"the connection to {self.address} is broken")

    def peer_closed(self) -> bool:
        """Whether an idle connection has something to read: with no request in flight, that
        is the node's hang-up (it stopped, or was killed, since the last request) or a late
        reply of an abandoned request. Either way the connection is not worth a request that
        must not be sent twice: the caller drops it and opens another, so a request is not
        written into a connection the node has already closed (its fate would look unknown).
        A connection with requests in flight, or whose socket cannot be polled, says no."""
        if self.broken:
            return True
        if self._pending or self._reading:
            return False
        sock = getattr(self.stream, "socket", None) \
            or getattr(getattr(self.stream, "transport_stream", None), "socket", None)
        try:
            fd = sock.fileno() if sock is not None else -1
        except OSError:
            return True
        if fd < 0:
            return sock is not None  # a closed socket; a stream without one: cannot tell
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))

    async def _send(self, data: bytes) -> None:
        """Write one frame whole: shielded from the caller's cancellation (a half-written frame
        would corrupt the stream), but not for longer than SEND_GRACE_S past its deadline."""
        async with self._send_lock:
            self._check_open()
            deadline = trio.current_effective_deadline()
            with trio.CancelScope(shield=True) as scope:
                if deadline != math.inf:
                    scope.deadline = max(deadline, trio.current_time()) + SEND_GRACE_S
                try:
                    await self.stream.send_all(data)
                except trio.Cancelled:
                    raise  # the grace ran out: handled below, once the scope has caught it
                except BaseException as e:
                    self._fail_all(e)
                    raise
            if scope.cancelled_caught:
                e = trio.BrokenResourceError(
                    f"could not send a request to {self.address} within {SEND_GRACE_S} s of its "
                    f"deadline; is the node overloaded or unreachable?")
                self._fail_all(e)
                raise e
        await trio.lowlevel.checkpoint_if_cancelled()  # the caller's cancellation, deferred

    async def _read_until(self, pending: _Pending) -> None:
        """Hold the reading role until `pending` is answered (or the connection fails),
        handing every other reply to its request."""
        self._reading = True
        try:
            while not pending.done:
                try:
                    reply = await self.reader.receive()  # cancellable: see the class docstring
                except (trio.Cancelled, KeyboardInterrupt):
                    raise
                except BaseException as e:
                    self._fail_all(e)
                    return
                if reply is None:
                    self._fail_all(trio.BrokenResourceError(
                        f"{self.address} closed the connection"))
                    return
                self._dispatch(reply)
        finally:
            self._reading = False

    def _dispatch(self, reply: dict[str, Any]) -> None:
        rid = reply.get("id")
        if reply.get("t") == "error":
            # The node hangs up after an error frame (a frame it could not accept): the
            # request it names (every request, when it names none) gets the error itself,
            # the others a lost connection, which Client.call retries where that is safe.
            self._fail_all(None, error_reply=reply)
            return
        pending = self._pending.get(rid) if isinstance(rid, int) else None
        if pending is None or pending.done:
            return  # the reply of an abandoned request (cancelled or timed out): dropped
        pending.reply = reply
        pending.wake.set()

    def _fail_all(self, e: BaseException | None, *, error_reply: dict[str, Any] | None = None
                  ) -> None:
        """Mark the connection broken and fail every request in flight on it."""
        self.broken = True
        rid = error_reply.get("id") if error_reply is not None else None
        for key, pending in self._pending.items():
            if pending.done:
                continue
            if error_reply is not None and rid in (None, key):
                pending.error = error_from_reply(error_reply)
            elif e is not None:
                pending.error = _copy_failure(e, self.address)
            else:
                pending.error = trio.BrokenResourceError(
                    f"{self.address} closed the connection after an error on another request "
                    f"({error_reply and error_reply.get('code')})")
            pending.wake.set()

    def _hand_over(self) -> None:
        """Give the reading role to one request still waiting, if nobody reads."""
        if self._reading:
            return
        for pending in self._pending.values():
            if not pending.done:
                pending.wake.set()
                return

    async def aclose(self) -> None:
        self._fail_all(trio.ClosedResourceError(f"the connection to {self.address} was closed"))
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


def _copy_failure(e: BaseException, address: str) -> BaseException:
    """The failure as each waiting request raises it: a fresh exception per caller (one
    exception object raised in several tasks would get their tracebacks tangled), of a type
    Client.call treats as a lost connection."""
    if isinstance(e, (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                      WireError)):
        try:
            copy = type(e)(*e.args)
        except Exception:  # an exception type whose constructor wants other arguments
            copy = trio.BrokenResourceError(f"the connection to {address} failed: {e}")
        copy.__cause__ = e.__cause__
        return copy
    return trio.BrokenResourceError(f"the connection to {address} failed: {e!r}")
