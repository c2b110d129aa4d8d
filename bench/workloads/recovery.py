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

from bench.disk import DiskNeed
from bench.results import figure
from bench.wire import SyncConn
from bench.workloads.common import MB, Ctx

# The RFC's baseline: 32 KiB chunks, one in flight, the follower flushes every chunk before it
# replies. Against raftlog's default recovery (512 KiB chunks, 4 in flight, deferred flushing).
MODES = {"deferred": [],
         "baseline": ["--raft", "recovery_flush_per_chunk=true",
                      "--raft", "recovery_chunk_bytes=32768", "--raft", "max_inflight=1"]}
# Each mode also runs on an emulated slow disk (BENCH ONLY: every fsync + 2 ms, as on a cloud
# volume), clearly labelled in the figures.
SLOW_FSYNC_MS = 2
DISKS = {"local": 0, "slow": SLOW_FSYNC_MS}


def _bulk_mb(quick: bool) -> int:
    return 32 if quick else 200


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    # The restarted follower must catch up from the log, not by a state transfer: the leader
    # keeps the whole backlog (+10% for the batches' framing).
    return DiskNeed(keep_bytes=_bulk_mb(ctx_cfg.quick) * (1 << 20) * 11 // 10,
                    why="the whole backlog the stopped follower catches up from the log")


def steps(ctx_cfg) -> int:  # noqa: ANN001
    return len(MODES) * len(DISKS) * ctx_cfg.repeats


def _status(addr: str) -> dict:
    with SyncConn(addr, timeout=10) as conn:
        return conn.request({"t": "status"})["status"]


# Producers batch ~32 KiB per request here: the log's batches are then the baseline's 32 KiB
# chunks (a chunk is never smaller than one batch), while raftlog's recovery packs 16 of them
# into each 512 KiB chunk.
RECORDS_PER_BATCH = 32


def _fill(addr: str, total_mb: int) -> int:
    """Write total_mb MiB of 1000-byte records in ~32 KiB leader-acked requests; the last
    offset."""
    import msgpack

    record = os.urandom(1000)
    payload = msgpack.packb([[None, record, None]] * RECORDS_PER_BATCH, use_bin_type=True)
    last = -1
    with SyncConn(addr, timeout=60) as conn:
        for _ in range(total_mb * (1 << 20) // (1000 * RECORDS_PER_BATCH)):
            reply = conn.request({"t": "produce", "acks": "leader", "payload": payload,
                                  "count": RECORDS_PER_BATCH, "timeout_ms": 60_000})
            if not reply.get("ok"):
                raise RuntimeError(f"bulk write failed: {reply.get('error')}")
            last = reply["last_offset"]
    return last


def _catch_up(ctx: Ctx, args: list[str], bulk: int) -> tuple[float, float | None]:
    """Seconds until a follower that missed `bulk` MiB has flushed the leader's log, and
    until the restarted process first answered (its start-up, inside the first figure: on a
    calm machine about 0.25 s of a 0.75-1 s catch-up, 0.5 s before start28; docs/PERFORMANCE.md
    "Issue 28: recovery" and "start28")."""
    cluster = ctx.cluster()
    cluster.extra_args = [*cluster.extra_args, *args]
    with cluster:
        leader = cluster.wait_for_leader()
        lag = next(i for i in cluster.nodes if i != leader)
        cluster.kill(lag, signal.SIGTERM)
        top = _fill(cluster.nodes[leader].addr, bulk)
        cluster.start_node(lag)
        t0 = time.perf_counter()
        deadline = t0 + 900
        answered = None
        while time.perf_counter() < deadline:
            try:
                flushed = _status(cluster.nodes[lag].addr)["flushed_offset"]
                if answered is None:
                    answered = time.perf_counter() - t0
                if flushed >= top:
                    break
            except OSError:
                pass
            time.sleep(0.02)
        return time.perf_counter() - t0, answered


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    bulk = _bulk_mb(cfg.quick)
    rates: dict[tuple[str, str], list[float]] = {(m, d): [] for m in MODES for d in DISKS}
    seconds: dict[str, list[float]] = {f"{m}.{d}": [] for m in MODES for d in DISKS}
    startup: dict[str, list[float | None]] = {f"{m}.{d}": [] for m in MODES for d in DISKS}
    # The same catch-ups timed from the restarted follower's first answer: the rate of the
    # catch-up itself, without the process's start-up (imports, opening LMDB), which is a fixed
    # ~0.25 s whatever the backlog (0.5 s before start28) on a calm machine.
    streams: dict[tuple[str, str], list[float | None]] = {(m, d): [] for m in MODES
                                                           for d in DISKS}
    saved = os.environ.get("RAFTLOG_BENCH_FSYNC_DELAY_MS")
    try:
        for r in range(cfg.repeats):
            for disk, delay in DISKS.items():
                os.environ["RAFTLOG_BENCH_FSYNC_DELAY_MS"] = str(delay)
                for mode, args in MODES.items():
                    ctx.describe(f"recovery {mode}, {disk} disk: {bulk} MiB behind "
                                 f"(repeat {r + 1})")
                    took, answered = _catch_up(ctx, args, bulk)
                    seconds[f"{mode}.{disk}"].append(took)
                    startup[f"{mode}.{disk}"].append(answered)
                    rates[(mode, disk)].append(bulk * (1 << 20) / MB / took)
                    streams[(mode, disk)].append(
                        None if answered is None or took <= answered
                        else bulk * (1 << 20) / MB / (took - answered))
                    ctx.advance("recovery")
    finally:
        if saved is None:
            os.environ.pop("RAFTLOG_BENCH_FSYNC_DELAY_MS", None)
        else:
            os.environ["RAFTLOG_BENCH_FSYNC_DELAY_MS"] = saved
    figures = []
    for disk, delay in DISKS.items():
        label = "local disk" if not delay else f"EMULATED slow disk (+{delay} ms per fsync)"
        params = {"bulk_MiB": bulk, "record_bytes": 1000, "acks": "leader",
                  "batch_records": RECORDS_PER_BATCH, "fsync_delay_ms": delay}
        figures += [
            figure(f"recovery.deferred.{disk}.MBps", "recovery",
                   f"catch-up, raftlog recovery, {label}", "MB/s", rates[("deferred", disk)],
                   params=params, limit="seq_write_MBps",
                   limit_value=ctx.limit("seq_write_MBps")),
            figure(f"recovery.baseline.{disk}.MBps", "recovery",
                   f"catch-up, baseline (32 KiB, 1 in flight, flush each), {label}", "MB/s",
                   rates[("baseline", disk)], params=params, limit="seq_write_MBps",
                   limit_value=ctx.limit("seq_write_MBps")),
            figure(f"recovery.deferred.{disk}.after_start.MBps", "recovery",
                   f"catch-up from the follower's first answer, raftlog recovery, {label}",
                   "MB/s", streams[("deferred", disk)], params=params,
                   limit="seq_write_MBps", limit_value=ctx.limit("seq_write_MBps")),
            figure(f"recovery.speedup.{disk}", "recovery", f"raftlog / baseline, {label}", "x",
                   [a / b for a, b in zip(rates[("deferred", disk)], rates[("baseline", disk)])],
                   params=params, target=(">=", 3.0)),
        ]
    # startup_seconds: of each catch-up, the part before the restarted follower first answered.
    return figures, {"bulk_MiB": bulk, "catchup_seconds": seconds, "startup_seconds": startup}
