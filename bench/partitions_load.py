"""The keyed load generator of `raftlog bench partitions`: one process is one keyed producer.

Each process owns a key space; every key is placed on its partition with the client's own
partitioner (Kafka's murmur2, raft.protocol.partitioner), and for each partition one batch of
records carrying keys of that partition is encoded once and resent (the server treats payloads
as opaque; encoding per request would measure the generator). Batches go to the partition's
leader as the metadata gave it, round-robin over the partitions, `window` requests in flight per
process over one connection per leader. `rate_bps` > 0 paces the process to a fixed byte rate
(the fsync figure: the same total rate whatever the partition count).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import trio

from bench.stats import Histogram
from bench.wire import AsyncConn, error_code
from bench.workers import Sync
from raft.core.types import Acks
from raft.protocol.framing import PROTOCOL_VERSION
from raft.protocol.framing import encode_frame as pack
from raft.protocol.partitioner import partition_for_key
from raft.protocol.requests import Produce
from storage.records import Record, encode_records


@dataclass(slots=True)
class KeyedArgs:
    topic: str
    leaders: dict[int, str]  # partition -> leader address
    keys: list[bytes]  # this producer's key space
    record_size: int
    batch_records: int
    window: int
    warmup: float
    duration: float
    acks: str = "quorum"
    rate_bps: float = 0.0  # 0: as fast as the window allows
    partitions: int = field(default=0)  # the topic's partition count (hash modulus)


# Request ids from here up encode as msgpack uint32 (0xce and 4 bytes): a frame encoded once
# with such an id is sent again with only those 4 bytes changed.
_ID_BASE = 1 << 31


def prebuilt(a: KeyedArgs, batches: dict[int, bytes]) -> dict[int, tuple[bytes, bytes]]:
    """Each partition's produce frame encoded once, as (head, tail): the head ends just before
    the request id's 4 bytes, the tail is the rest (the payload). A request is head + id,
    then tail, as they are: no per-request encoding or 256 KiB copy (the generator's CPU is
    taken from the node's on a machine with few cores: bench/workloads/scale.py)."""
    out = {}
    for p, payload in batches.items():
        msg = Produce(payload, a.batch_records, Acks(a.acks), 5000, topic=a.topic,
                      partition=p).to_frame(_ID_BASE)
        msg = {"v": PROTOCOL_VERSION, "id": _ID_BASE,
               **{k: v for k, v in msg.items() if k not in ("v", "id")}}
        frame = pack(msg)
        at = frame.index(b"\xa2id\xce" + _ID_BASE.to_bytes(4, "big"), 0, 32) + 4
        out[p] = (frame[:at], frame[at + 4:])
    return out


def payloads(a: KeyedArgs) -> dict[int, bytes]:
    """One encoded batch per partition that some key of this producer hashes to."""
    by_part: dict[int, list[bytes]] = {}
    for k in a.keys:
        by_part.setdefault(partition_for_key(k, a.partitions), []).append(k)
    value = os.urandom(a.record_size)
    out = {}
    for p, ks in by_part.items():
        recs = [Record(value, ks[i % len(ks)]) for i in range(a.batch_records)]
        out[p] = encode_records(recs)
    return out


async def keyed_worker(a: KeyedArgs, sync: Sync) -> None:
    batches = prebuilt(a, payloads(a))
    conns = {addr: await AsyncConn.open(addr) for addr in
             sorted({a.leaders[p] for p in batches})}
    sync.ready()
    try:
        async for k, t0 in sync.rounds():
            sync.report(k, await keyed_round(a, conns, batches, t0))
    finally:
        for c in conns.values():
            await c.aclose()


async def keyed_round(a: KeyedArgs, conns: dict[str, AsyncConn],
                      batches: dict[int, tuple[bytes, bytes]], t0: float) -> dict:
    m0, m1 = t0 + a.warmup, t0 + a.warmup + a.duration
    window = trio.Semaphore(a.window)
    sent: dict[tuple[str, int], float] = {}
    errors: dict[str, int] = {}
    lat = Histogram()
    ok = {"records": 0, "requests": 0}
    batch_bytes = a.record_size * a.batch_records

    async def receiver(addr: str, conn: AsyncConn) -> None:
        while True:
            r = await conn.recv()
            ts = sent.pop((addr, r.get("id")), None)
            if ts is None:
                continue
            window.release()
            now = time.monotonic()
            code = error_code(r)
            if code is not None:
                errors[code] = errors.get(code, 0) + 1
            elif m0 <= now <= m1:
                ok["records"] += a.batch_records
                ok["requests"] += 1
                lat.record((now - ts) * 1e6)

    async def send_loop() -> None:
        parts = sorted(batches)
        i = 0
        while time.monotonic() < m1:
            await window.acquire()
            if a.rate_bps > 0:  # pace: request i leaves at t0 + i * batch_bytes / rate
                delay = t0 + i * batch_bytes / a.rate_bps - time.monotonic()
                if delay > 0:
                    await trio.sleep(delay)
            p = parts[i % len(parts)]
            i += 1
            addr = a.leaders[p]
            conn = conns[addr]
            rid = _ID_BASE + conn.new_id()
            head, tail = batches[p]
            sent[(addr, rid)] = time.monotonic()
            with trio.CancelScope(shield=True):
                await conn.send_parts(head + rid.to_bytes(4, "big"), tail)

    async with trio.open_nursery() as nursery:
        for addr, conn in conns.items():
            nursery.start_soon(receiver, addr, conn)
        with trio.move_on_after(max(0.0, m1 - time.monotonic()) + 1):
            await send_loop()
        with trio.move_on_after(15):
            while sent:
                await trio.sleep(0.002)
        nursery.cancel_scope.cancel()
    return {"ok_records": ok["records"], "ok_requests": ok["requests"], "errors": errors,
            "lost": len(sent), "latency": lat.to_json()}
