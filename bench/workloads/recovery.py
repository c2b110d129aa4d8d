"""`recovery`: how fast a follower that missed a bulk of leader-acked writes is caught up, with
the RFC's deferred flushing (chunks sent with flush=False, the follower flushes on its own
schedule) against flushing every chunk before replying (the behaviour it replaces), in the
same run so the ratio holds on a noisy machine.

Per repeat and mode: a fresh cluster; one follower stopped cleanly; BULK MB written with leader
acks; the follower restarted; time until its flushed offset reaches the leader's dirty offset.
"""

from __future__ import annotations

import os
import signal
import time

from bench.results import figure
from bench.wire import SyncConn
from bench.workloads.common import MB, Ctx

MODES = {"deferred": [], "per_chunk": ["--raft", "recovery_flush_per_chunk=true"]}


def _bulk_mb(quick: bool) -> int:
    return 32 if quick else 200


def steps(ctx_cfg) -> int:  # noqa: ANN001
    return len(MODES) * ctx_cfg.repeats


def _status(addr: str) -> dict:
    with SyncConn(addr, timeout=10) as conn:
        return conn.request({"t": "status"})["status"]


def _fill(addr: str, total_mb: int) -> int:
    """Write total_mb of 1 KiB records in ~1 MiB leader-acked requests; the last offset."""
    import msgpack

    record = os.urandom(1000)
    payload = msgpack.packb([[None, record, None]] * 1000, use_bin_type=True)
    last = -1
    with SyncConn(addr, timeout=60) as conn:
        for _ in range(total_mb):
            reply = conn.request({"t": "produce", "acks": "leader", "payload": payload,
                                  "count": 1000, "timeout_ms": 60_000})
            if not reply.get("ok"):
                raise RuntimeError(f"bulk write failed: {reply.get('error')}")
            last = reply["last_offset"]
    return last


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    bulk = _bulk_mb(cfg.quick)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(cfg.repeats):
        for mode, args in MODES.items():
            ctx.describe(f"recovery {mode}: {bulk} MB behind (repeat {r + 1})")
            cluster = ctx.cluster()
            cluster.extra_args = [*cluster.extra_args, *args]
            with cluster:
                leader = cluster.wait_for_leader()
                lag = next(i for i in cluster.nodes if i != leader)
                cluster.kill(lag, signal.SIGTERM)
                top = _fill(cluster.nodes[leader].addr, bulk)
                cluster.start_node(lag)
                t0 = time.perf_counter()
                deadline = t0 + 600
                while time.perf_counter() < deadline:
                    try:
                        st = _status(cluster.nodes[lag].addr)
                        if st["flushed_offset"] >= top:
                            break
                    except OSError:
                        pass
                    time.sleep(0.02)
                took = time.perf_counter() - t0
            seconds[mode].append(took)
            samples[mode].append(bulk * (1 << 20) / MB / took)
            ctx.advance("recovery")
    params = {"bulk_MiB": bulk, "record_bytes": 1000, "acks": "leader"}
    figures = [
        figure("recovery.deferred.MBps", "recovery", "catch-up, deferred flush (RFC)", "MB/s",
               samples["deferred"], params=params, limit="seq_write_MBps",
               limit_value=ctx.limit("seq_write_MBps")),
        figure("recovery.per_chunk.MBps", "recovery", "catch-up, flush every chunk", "MB/s",
               samples["per_chunk"], params=params),
        figure("recovery.speedup", "recovery", "deferred / per-chunk catch-up speed", "x",
               [a / b for a, b in zip(samples["deferred"], samples["per_chunk"])],
               params=params),
    ]
    return figures, {"bulk_MiB": bulk, "catchup_seconds": seconds}
