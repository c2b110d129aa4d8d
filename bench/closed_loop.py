"""Closed-loop single-record writers: N writers, each with one record in flight.

What many independent clients that each wait for their write look like to one partition
(issue 28): the throughput comes only from the leader batching what arrives while a flush and
a round trip are under way (group commit), never from a client batching. Writers are spread
over a few worker processes (one Python process cannot generate 10k requests/s and measure
them).

Each worker drives its writers from one plain `epoll` loop over non-blocking sockets, not
from a trio task per writer: on a 2-core machine the clients share the CPU with the three
nodes, and a trio task per writer (a wake-up, a cancel scope and an `epoll_ctl` per reply)
cost the clients ~0.07 ms of CPU per write, a fifth of the whole machine's, taken from the
nodes being measured. What a writer does is unchanged and is what a real client does: one
connection each (hello first), a freshly encoded produce frame per write (its own id and
timestamp), and the next write only after this one's reply arrived.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field

from bench.stats import Histogram
from bench.wire import SyncConn, WireError, decoded_frames, error_code, frame_decoder, \
    produce_frame
from bench.workers import Sync
from raft.protocol.framing import FrameDecoder
from storage.records import encode_values

# A reply that never comes (a node gone) ends the round this long after its end; the parent's
# round timeout is longer, so the worker still reports what it measured.
LATE_S = 20.0


@dataclass(slots=True)
class ClosedArgs:
    addr: str
    writers: int  # in this worker process
    warmup: float
    duration: float
    record_size: int = 100
    acks: str = "quorum"


@dataclass(slots=True)
class _Writer:
    sock: socket.socket
    decoder: FrameDecoder = field(default_factory=frame_decoder)
    next_id: int = 0
    rid: int = 0  # the id of the write in flight, 0 when none
    sent: float = 0.0


async def closed_worker(a: ClosedArgs, sync: Sync) -> None:
    payload = encode_values([b"x" * a.record_size])
    writers = []
    try:
        for _ in range(a.writers):
            # Connects and says hello, as every client does; ids go on across rounds, so a
            # late reply of an earlier round is never taken for this one's.
            writers.append(_Writer(SyncConn(a.addr).detach()))
        sync.ready()
        async for k, t0 in sync.rounds():
            sync.report(k, closed_round(writers, a, payload, t0))
    finally:
        for w in writers:
            w.sock.close()


def closed_round(writer_list: list[_Writer], a: ClosedArgs, payload: bytes,
                 t0: float) -> dict:
    """One round: every writer writes, waits for its reply, writes again, until the round's
    end; only writes sent and answered inside the measured window count."""
    m0 = t0 + a.warmup
    m1 = m0 + a.duration
    hist = Histogram()
    ok = 0
    errors: dict[str, int] = {}
    writers = {w.sock.fileno(): w for w in writer_list}
    ep = select.epoll()
    monotonic = time.monotonic

    def send(w: _Writer, now: float) -> None:
        w.next_id += 1
        w.rid = w.next_id
        w.sent = now
        w.sock.sendall(produce_frame(w.rid, a.acks, payload, 1))  # ~170 B: one write

    try:
        now = monotonic()
        for fd, w in writers.items():
            ep.register(fd, select.EPOLLIN)
            send(w, now)
        in_flight = len(writers)
        while in_flight:
            now = monotonic()
            if now > m1 + LATE_S:
                errors["NO_REPLY"] = errors.get("NO_REPLY", 0) + in_flight
                break
            for fd, _ in ep.poll(1.0):
                w = writers[fd]
                data = w.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(f"{a.addr} closed the connection")
                w.decoder.feed(data)
                for r in decoded_frames(w.decoder):
                    if r.get("t") == "error":
                        raise WireError(f"{a.addr} rejected a frame: {r!r}")
                    if r.get("id") != w.rid:
                        continue
                    now = monotonic()
                    if m0 <= w.sent and now <= m1:
                        code = error_code(r)
                        if code is None:
                            ok += 1
                            hist.record((now - w.sent) * 1e6)
                        else:
                            errors[code] = errors.get(code, 0) + 1
                    if now >= m1:
                        w.rid = 0
                        in_flight -= 1
                    else:
                        send(w, now)
    finally:
        ep.close()
    return {"ok": ok, "rps": ok / a.duration, "errors": errors, "latency": hist.to_json()}
