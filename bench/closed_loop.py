"""Closed-loop single-record writers: N writers, each with one record in flight.

What many independent clients that each wait for their write look like to one partition
(issue 28): the throughput comes only from the leader batching what arrives while a flush and
a round trip are under way (group commit), never from a client batching. Writers are spread
over a few worker processes (one Python process cannot generate 10k requests/s and measure
them), each running its writers as trio tasks with one connection each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from bench.stats import Histogram
from bench.wire import AsyncConn, error_code, produce_frame
from bench.workers import Sync
from storage.records import encode_values


@dataclass(slots=True)
class ClosedArgs:
    addr: str
    writers: int  # in this worker process
    warmup: float
    duration: float
    record_size: int = 100
    acks: str = "quorum"


async def closed_worker(a: ClosedArgs, sync: Sync) -> None:
    payload = encode_values([b"x" * a.record_size])
    conns = [await AsyncConn.open(a.addr) for _ in range(a.writers)]
    sync.ready()
    try:
        async for k, t0 in sync.rounds():
            sync.report(k, await closed_round(conns, a, payload, t0))
    finally:
        for c in conns:
            await c.aclose()


async def closed_round(conns: list[AsyncConn], a: ClosedArgs, payload: bytes,
                       t0: float) -> dict:
    m0 = t0 + a.warmup
    m1 = m0 + a.duration
    hist = Histogram()
    stats = {"ok": 0, "errors": {}}

    async def writer(conn: AsyncConn) -> None:
        while True:
            sent = time.monotonic()
            if sent >= m1:
                return
            rid = conn.new_id()
            await conn.send_raw(produce_frame(rid, a.acks, payload, 1))
            while True:
                r = await conn.recv()
                if r.get("id") == rid:
                    break
            now = time.monotonic()
            if m0 <= sent and now <= m1:
                code = error_code(r)
                if code is None:
                    stats["ok"] += 1
                    hist.record((now - sent) * 1e6)
                else:
                    stats["errors"][code] = stats["errors"].get(code, 0) + 1

    async with trio.open_nursery() as nursery:
        for conn in conns:
            nursery.start_soon(writer, conn)
    return {"ok": stats["ok"], "rps": stats["ok"] / a.duration, "errors": stats["errors"],
            "latency": hist.to_json()}
