"""How a connection that went wrong ends (raft.node.server): which failures end only that
connection and which must stop the node, the error frame sent before hanging up, and draining a
refused oversized frame so the refusal arrives. Apart from the node so server.py keeps to its
job: the node's lifecycle, its groups and the request loop."""

from __future__ import annotations

import logging

import trio

from raft.protocol.framing import ConnectionClosed, WireError, encode_frame
from raft.protocol.replies import error_frame

log = logging.getLogger("raftlog.node")

# How long a refused oversized frame's body is read and dropped so the refusal arrives.
DISCARD_TIMEOUT_S = 5.0
DISCARD_IDLE_S = 0.5  # ... and how long a client that stopped sending is waited for


_NETWORK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, WireError,
                   ConnectionClosed)


def split_connection_errors(exc: BaseException, node_id: int) -> BaseException | None:
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


async def discard_input(stream: trio.abc.Stream, limit: int) -> None:
    """After refusing an oversized frame: stop sending and read (and drop) what the client is
    still sending, bounded in bytes and time, before closing. Closing with unread data would
    reset the connection, and a reset can destroy the TOO_LARGE answer before the client
    reads it. A client that has stopped sending (it sent only the header, or is waiting for
    the answer) is let go after a short pause, not held for the whole bound."""
    try:
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        with trio.move_on_after(DISCARD_TIMEOUT_S):
            while limit > 0:
                with trio.move_on_after(DISCARD_IDLE_S) as idle:
                    data = await stream.receive_some(1 << 16)
                if idle.cancelled_caught or not data:
                    return
                limit -= len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def send_error(stream: trio.abc.SendStream, err: WireError) -> None:
    """Best effort: the error frame before hanging up (the peer may already be gone)."""
    try:
        with trio.move_on_after(2.0):
            await stream.send_all(encode_frame(
                error_frame(err.code, str(err), err.request_id)))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
