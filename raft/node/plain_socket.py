"""Writes into a plain TCP socket without trio's per-call machinery (issue 28).

trio's `SocketStream.send_all` costs the loop a reschedule and two generator context managers
per call, whatever the size; on the leader that is paid per request (the reply) and per round
(an append frame to each follower), on a follower per round (its reply). A small frame fits in
the socket's send buffer: written straight in, it costs one syscall. What the socket does not
take goes through trio's send_all, which waits for room; the caller keeps writes from
interleaving (one writer task, or a lock). TLS streams always take trio's path.
"""

from __future__ import annotations

import os
from typing import Any

import trio


def plain_socket(stream: Any) -> Any:
    """The trio socket under a plain TCP stream (also through raft.node.tls.PrefixedStream,
    which wraps it after the TLS sniff), or None (TLS, or another stream)."""
    inner = getattr(stream, "stream", stream)
    return inner.socket if type(inner) is trio.SocketStream else None


def write_now(sock: Any, data: bytes | bytearray | memoryview) -> int:
    """Write what the socket takes now without waiting; how many bytes that was. Raises
    trio.BrokenResourceError if the connection is broken, trio.ClosedResourceError if closed
    (as trio's send_all)."""
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the connection is closed")
    try:
        return os.write(fd, data)  # trio's sockets are non-blocking
    except BlockingIOError:
        return 0
    except OSError as e:  # as trio's send_all reports a broken connection
        raise trio.BrokenResourceError(f"the connection broke: {e}") from e


async def send_rest(stream: trio.abc.SendStream, data: bytes | bytearray | memoryview,
                    sent: int) -> None:
    """After write_now took `sent` bytes: the rest through trio (waits for room)."""
    if sent < len(data):
        await stream.send_all(memoryview(data)[sent:])
