"""One wait for every plain TCP client connection's requests (issue 28).

A connection read by its own task pays, per request, a trio `wait_readable` (an `epoll_ctl`, a
task park and a reschedule), the read that found the socket empty first, and the task's step;
at tens of thousands of requests a second that is a tenth of the leader's loop. Here one task
owns an epoll set of the client sockets, each registered once (edge-triggered), and waits
through trio on that set's descriptor: a wake-up reads every ready socket in one pass and hands
each complete frame to its connection's callback (raft.node.client_requests), which runs what
the connection's own loop would.

What the per-connection loop guarantees holds here too:
- Order: a connection's frames reach its callback in the order they were sent.
- Budget: every frame takes one of the connection's slots (`max_inflight_per_connection`), its
  answer gives it back (`release`). With none left the connection is not read (its bytes stay in
  the kernel, so the client's TCP window fills); what one read brought stays in its decoder,
  bounded by that read. A slow connection stops only itself.
- Bounded steps: a pass reads each socket once and takes at most FRAMES_PER_SOCKET frames from
  it, and stops after FRAMES_PER_PASS frames or BYTES_PER_PASS bytes; the rest wait in order for
  the next pass, after the hub has yielded to the loop.
- Endings: EOF between frames ends a connection cleanly, part of a frame at EOF, a malformed
  frame, an exception from its callback or a broken socket end that connection alone, with that
  error handed to its own task (`finished`), which answers and hangs up as before.

With edge triggering a socket is known readable from its event until a read comes back short
(a stream socket's read returns all it holds, up to the size asked) or empty-handed; a socket
still readable when its turn ends is visited again in the next pass without a new event. The
one thing a short read does not take is an EOF that arrived with the last bytes (one edge for
both): after an event that reports a hang-up the socket is read until the read returns nothing.
"""

from __future__ import annotations

import os
import select
from collections import deque
from typing import Any, Callable

import trio

from raft.protocol.framing import FrameDecoder, decode_body

READ_BYTES = 64 * 1024  # a read's size, or more when the frame in progress needs more
FRAMES_PER_SOCKET = 16  # frames taken from one connection in one pass, at most
FRAMES_PER_PASS = 64  # ... and from all of them, before the hub yields
BYTES_PER_PASS = 1 << 20  # bytes read in one pass before the hub yields (one read may pass it)

_EDGE = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


class HubConn:
    """One connection registered with the hub: its decoder, budget and state."""

    __slots__ = ("fd", "decoder", "on_frame", "budget", "readable", "hangup", "eof", "paused",
                 "queued", "closed", "ended", "_done", "_hub")

    def __init__(self, hub: ClientHub, fd: int, decoder: FrameDecoder, budget: int,
                 on_frame: Callable[[dict[str, Any]], None]) -> None:
        self._hub = hub
        self.fd = fd
        self.decoder = decoder
        self.on_frame = on_frame  # one frame, after the hub took a budget slot for it
        self.budget = budget  # slots left
        self.readable = True  # the socket may hold bytes (until a read comes back short)
        self.hangup = False  # epoll said the client half-closed or the socket failed
        self.eof = False  # a read found the client's EOF (frames before it are still taken)
        self.paused = False  # no slot left: not read until one comes back
        self.queued = False  # in the hub's ready queue
        self.closed = False
        self.ended: BaseException | None = None  # why it ended (None: EOF between frames)
        self._done = trio.Event()

    def release(self) -> None:
        """A request's answer is done: its slot comes back (the connection is read again)."""
        self.budget += 1
        if self.paused and not self.closed:
            self.paused = False
            self._hub._enqueue(self)

    async def finished(self) -> BaseException | None:
        """Until the hub is done with this connection: None at a clean EOF, or the error that
        ended it (WireError for a malformed frame, OSError/trio errors for a broken socket)."""
        await self._done.wait()
        return self.ended


class ClientHub:
    """The epoll set of the node's plain client sockets and the task that reads them."""

    def __init__(self) -> None:
        self._ep: select.epoll | None = None
        self._wake_fd = -1
        self._conns: dict[int, HubConn] = {}
        self._ready: deque[HubConn] = deque()
        self._parked = False  # the task waits on the epoll descriptor
        self._woken = False  # ... and has been sent a wake-up already
        self.running = False
        self.passes = 0  # read passes made (tests and profiles)

    async def run(self) -> None:
        """Read the registered connections until cancelled (the node's connection nursery)."""
        self._ep = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep.register(self._wake_fd, select.EPOLLIN)
        self.running = True
        try:
            while True:
                if self._ready:
                    await trio.lowlevel.checkpoint()  # work left over: yield, then go on
                else:
                    self._parked = True
                    try:
                        await trio.lowlevel.wait_readable(self._ep.fileno())
                    finally:
                        self._parked = self._woken = False
                self._poll()
                self._pass()
        finally:
            self.running = False
            for conn in list(self._conns.values()):
                self._finish(conn, trio.ClosedResourceError("the node stopped reading"))
            self._ep.close()
            os.close(self._wake_fd)
            self._ep, self._wake_fd = None, -1

    def add(self, fd: int, decoder: FrameDecoder, budget: int,
            on_frame: Callable[[dict[str, Any]], None]) -> HubConn:
        """Read this socket's frames from now on (what `decoder` holds first)."""
        assert self._ep is not None, "the hub is not running"
        conn = HubConn(self, fd, decoder, budget, on_frame)
        self._ep.register(fd, _EDGE)
        self._conns[fd] = conn
        self._enqueue(conn)  # frames may already be buffered, with no edge to come
        return conn

    def remove(self, conn: HubConn) -> None:
        """Stop reading this connection (idempotent); before its socket is closed, so a new
        connection given the same descriptor is never taken for it."""
        if conn.closed:
            return
        conn.closed = True
        if self._conns.get(conn.fd) is conn:
            del self._conns[conn.fd]
            if self._ep is not None:
                try:
                    self._ep.unregister(conn.fd)
                except OSError:
                    pass  # already closed: the kernel dropped it from the set
        conn._done.set()

    def _finish(self, conn: HubConn, why: BaseException | None) -> None:
        if not conn.closed:
            conn.ended = why
            self.remove(conn)

    def _enqueue(self, conn: HubConn) -> None:
        if conn.queued:
            return
        conn.queued = True
        self._ready.append(conn)
        if self._parked and not self._woken:
            self._woken = True
            os.eventfd_write(self._wake_fd, 1)

    def _poll(self) -> None:
        assert self._ep is not None
        conns = self._conns
        for fd, events in self._ep.poll(0):
            conn = conns.get(fd)
            if conn is not None:
                conn.readable = True  # also for a hang-up or an error: the read tells which
                if events & _HANGUP:
                    conn.hangup = True  # read on to the EOF: no edge comes after this one
                if not conn.paused:
                    self._enqueue(conn)
            elif fd == self._wake_fd:
                try:
                    os.eventfd_read(fd)
                except BlockingIOError:
                    pass

    def _pass(self) -> None:
        """Serve the ready connections in turn, bounded (module docstring)."""
        self.passes += 1
        ready = self._ready
        frames = nbytes = 0
        for _ in range(len(ready)):
            if frames >= FRAMES_PER_PASS or nbytes >= BYTES_PER_PASS:
                break
            conn = ready.popleft()
            conn.queued = False
            if conn.closed:
                continue
            try:
                took, got, more = self._serve(conn)
            except Exception as e:  # this connection's failure: it alone ends
                self._finish(conn, e)
                continue
            frames += took
            nbytes += got
            if more and not conn.closed:
                conn.queued = True
                ready.append(conn)

    def _serve(self, conn: HubConn) -> tuple[int, int, bool]:
        """One connection's turn: frames taken, bytes read, whether it has more right now."""
        decoder = conn.decoder
        frames = nbytes = 0
        read = False
        while True:
            while True:  # the frames already buffered, within the budget and the turn
                if conn.budget <= 0:
                    conn.paused = True
                    return frames, nbytes, False
                if frames >= FRAMES_PER_SOCKET:
                    return frames, nbytes, True
                body = decoder.next_body()
                if body is None:
                    break
                frames += 1
                conn.budget -= 1
                conn.on_frame(decode_body(body))
                if conn.closed:
                    return frames, nbytes, False
            if conn.eof:
                if decoder.buffered:
                    raise decoder.truncated()
                self._finish(conn, None)
                return frames, nbytes, False
            if read or not conn.readable:
                return frames, nbytes, conn.readable
            read = True
            want = max(READ_BYTES, decoder.wanted())
            try:
                data = os.read(conn.fd, want)
            except BlockingIOError:
                conn.readable = False
                return frames, nbytes, False
            except OSError as e:  # as trio's stream reports a broken connection
                raise trio.BrokenResourceError(f"the connection broke: {e}") from e
            if not data:
                conn.eof = True
                conn.readable = False
                continue
            if len(data) < want and not conn.hangup:
                conn.readable = False  # a short read took all the socket held
            nbytes += len(data)
            decoder.feed(data)
