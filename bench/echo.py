"""A minimal wire-protocol server for the RPC-floor probe: answers hello and acknowledges every
request at once. Round trips against it measure what our framing, trio and the loopback cost
before any raftlog work, the part of every latency figure that no server change can remove."""

from __future__ import annotations

import socket
import time

import trio

from bench.stats import Histogram
from bench.wire import AsyncConn, decoded_frames, frame_decoder, pack


async def _handle(stream: trio.SocketStream) -> None:
    buf = frame_decoder()
    try:
        while True:
            data = await stream.receive_some(1 << 20)
            if not data:
                return
            buf.feed(data)
            out = []
            for m in decoded_frames(buf):
                if m.get("t") == "hello":
                    out.append(pack({"v": 1, "t": "hello", "node_id": 0}))
                else:
                    out.append(pack({"v": 1, "t": "reply", "id": m.get("id"), "ok": True,
                                     "base_offset": 0, "last_offset": 0, "duplicate": False}))
            await stream.send_all(b"".join(out))
    except trio.BrokenResourceError:
        return


def serve(sock: socket.socket) -> None:
    """Serve on an already-bound listening socket until killed (run in a child process)."""

    async def main() -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        await trio.serve_listeners(_handle, [listener])

    trio.run(main)


async def ping(addr: str, n: int, payload: bytes) -> Histogram:
    """n sequential produce-shaped round trips; microseconds each."""
    h = Histogram()
    # The echo server is a freshly spawned process: on a busy machine it may take seconds to
    # answer the hello (a 2 s limit here once ended a whole bench run in the probes).
    conn = await AsyncConn.open(addr, timeout=60.0)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            await conn.request({"t": "produce", "acks": "quorum", "payload": payload,
                                "count": 1})
            h.record((time.perf_counter() - t0) * 1e6)
    finally:
        await conn.aclose()
    return h
