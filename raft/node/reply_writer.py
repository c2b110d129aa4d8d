"""The replies of one plain TCP client connection, written from tasks and callbacks alike.

A produce answered without a task (raft.node.propose_then, issue 28) writes its reply from
the group's Ready loop, its timer or the shutdown, none of which may wait; the requests
answered in tasks write here too, so one object decides the order of the bytes. A reply goes
straight into the socket with one write(2) when nothing is queued ahead of it; what the socket
does not take now, and every reply behind it, queue in order for one drain task that writes
them through trio (which waits for room). Replies never interleave, and never block the caller.

Once the connection is closed (`close`, or a write found it broken) nothing more is written:
an answer that comes later is dropped, and never reaches a descriptor the kernel may already
have given to another connection. The serve loop waits for `all_answered` before it hangs up
on a client that half-closed, so a client that sent its writes and EOF still gets the replies.
"""

from __future__ import annotations

from collections import deque

import trio

from raft.node.plain_socket import plain_socket, write_now


class ReplyWriter:
    """One plain client connection's replies (see the module docstring)."""

    def __init__(self, stream: trio.abc.Stream, nursery: trio.Nursery) -> None:
        self._stream = stream
        self._sock = plain_socket(stream)
        assert self._sock is not None, "a ReplyWriter needs a plain TCP stream"
        self._nursery = nursery  # the connection's: the drain task runs there
        self._queued: deque[bytes | memoryview] = deque()
        self._draining = False
        self.closed = False
        self.outstanding = 0  # callbacks that will still write (`started`, `answered`)
        self._none_left: trio.Event | None = None

    def write(self, data: bytes) -> None:
        """Send one whole reply, in order after every reply written before; never waits."""
        if self.closed:
            return
        if not self._draining:
            try:
                sent = write_now(self._sock, data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.gone()
                return
            if sent == len(data):
                return
            self._draining = True
            self._queued.append(memoryview(data)[sent:])
            self._nursery.start_soon(self._drain)
            return
        self._queued.append(data)

    async def _drain(self) -> None:
        try:
            while self._queued and not self.closed:
                await self._stream.send_all(self._queued[0])
                self._queued.popleft()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.gone()
        finally:
            self._draining = False

    def gone(self) -> None:
        """The client went away: write nothing more, and end the connection's other work."""
        self.close()
        self._nursery.cancel_scope.cancel()

    def close(self) -> None:
        self.closed = True
        self._queued.clear()
        if self._none_left is not None:
            self._none_left.set()

    def started(self) -> None:
        self.outstanding += 1

    def answered(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0 and self._none_left is not None:
            self._none_left.set()

    async def all_answered(self) -> None:
        """Until every started callback has answered (or the connection closed)."""
        while self.outstanding and not self.closed:
            self._none_left = trio.Event()
            await self._none_left.wait()
