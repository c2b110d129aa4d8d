"""`fetch`: consumer throughput reading a pre-filled log, from the leader and from a follower.

The log is filled first (1 KiB records, leader acks, then waited until committed everywhere),
so a read measures the fetch path alone: LMDB reads (page cache warm after the first pass),
msgpack framing and the socket. One consumer, one fetch in flight, as a Kafka consumer does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from bench.disk import DiskNeed
from bench.results import figure
from bench.wire import AsyncConn, error_code
from bench.workers import Sync, WorkerGroup
from bench.workloads.common import MB, Ctx
from bench.workloads.produce import ProduceArgs, produce_worker

RECORD_SIZE = 1024
FETCH_MAX_BYTES = 1 << 20


@dataclass(slots=True)
class FetchArgs:
    addr: str
    end_offset: int  # read [start, end_offset]
    max_bytes: int = FETCH_MAX_BYTES


async def fetch_worker(a: FetchArgs, sync: Sync) -> None:
    conn = await AsyncConn.open(a.addr)
    sync.ready()
    try:
        async for k, t0 in sync.rounds():
            sync.report(k, await fetch_round(conn, a))
    finally:
        await conn.aclose()


async def fetch_round(conn: AsyncConn, a: FetchArgs) -> dict:
    offset, records, payload_bytes, requests = 0, 0, 0, 0
    error = None
    t0 = time.monotonic()
    while offset <= a.end_offset:
        with trio.fail_after(30):
            r = await conn.request({"t": "fetch", "offset": offset, "max_bytes": a.max_bytes,
                                    "max_wait_ms": 0})
        requests += 1
        code = error_code(r)
        if code is not None:
            error = f"{code}: {(r.get('error') or {}).get('message', '')}"
            break
        for b in r.get("batches", []):
            records += b["count"]
            payload_bytes += len(b["payload"])
        nxt = r.get("next_offset", offset)
        if nxt <= offset:
            error = f"no progress at offset {offset} (next_offset {nxt})"
            break
        offset = nxt
    dt = time.monotonic() - t0
    return {"records": records, "payload_bytes": payload_bytes, "requests": requests,
            "elapsed": dt, "error": error}


def _read_repeats(ctx: Ctx, source: str, addr: str,
                  end: int) -> tuple[list[float], list[float], list[str]]:
    """MB/s and records/s of reading [0, end] from `addr`, once per repeat."""
    mbps: list[float] = []
    rps: list[float] = []
    errors: list[str] = []
    with WorkerGroup(fetch_worker, [FetchArgs(addr, end)]) as group:
        for r in range(ctx.cfg.repeats):
            ctx.describe(f"fetch from {source} (repeat {r + 1})")
            _, (x,) = group.round(timeout=300)
            if x["error"] is None and x["elapsed"] > 0:
                mbps.append(x["records"] * RECORD_SIZE / x["elapsed"] / MB)
                rps.append(x["records"] / x["elapsed"])
            else:
                errors.append(x["error"])
            ctx.advance("fetch")
    return mbps, rps, errors


def prefill_bytes(ctx_cfg) -> int:
    return (4 << 20) if ctx_cfg.quick else (128 << 20)


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    # Every record is read back from offset 0: retention must delete none of it (+10% for the
    # batches' framing).
    return DiskNeed(keep_bytes=prefill_bytes(ctx_cfg) * 11 // 10,
                    why="the whole pre-filled log, read back from its first offset")


def steps(ctx_cfg) -> int:
    return 1 + 2 * ctx_cfg.repeats


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    total = prefill_bytes(cfg)
    n_records = total // RECORD_SIZE
    figures: list[dict] = []
    details: dict = {"prefill_bytes": total, "record_size": RECORD_SIZE,
                     "fetch_max_bytes": FETCH_MAX_BYTES, "sources": {}}
    with ctx.cluster() as cluster:
        leader = cluster.wait_for_leader()
        ctx.describe(f"fetch: pre-filling {total >> 20} MiB")
        fill = ProduceArgs(cluster.nodes[leader].addr, "leader", RECORD_SIZE, cfg.batch_bytes,
                           cfg.window, 0.0, 0.0, max_records=n_records)
        with WorkerGroup(produce_worker, [fill]) as group:
            _, (res,) = group.round(timeout=300)
        cluster.wait_caught_up(timeout=120)
        st = cluster.statuses()[leader] or {}
        end = int(st.get("high_watermark", st.get("commit_index", res["all_ok_records"] - 1)))
        details["prefill_records"] = res["all_ok_records"]
        details["high_watermark"] = end
        ctx.advance("fetch")
        follower = next((i for i in cluster.nodes if i != leader), None)
        for source, node_id in (("leader", leader), ("follower", follower)):
            if node_id is None:  # a 1-node cluster has no follower to read from
                mbps, rps, errors = [], [], ["no follower in a 1-node cluster"]
                for _ in range(cfg.repeats):
                    ctx.advance("fetch")
            else:
                mbps, rps, errors = _read_repeats(ctx, source, cluster.nodes[node_id].addr, end)
            params = {"source": source, "record_size": RECORD_SIZE, "log_bytes": total,
                      "max_bytes": FETCH_MAX_BYTES}
            figures.append(figure(f"fetch.{source}.MBps", "fetch", f"fetch from {source}",
                                  "MB/s", mbps, params=params, limit="tcp_loopback_MBps",
                                  limit_value=ctx.limit("tcp_loopback_MBps")))
            figures.append(figure(f"fetch.{source}.rps", "fetch",
                                  f"fetch from {source} records/s", "rec/s", rps, params=params))
            details["sources"][source] = {"node_id": node_id, "errors": errors}
    return figures, details
