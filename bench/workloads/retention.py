"""`retention`: produce throughput with retention deleting as fast as it is written, against the
same workload with retention off, in the same run (alternating, so the ratio holds on a noisy
machine).

Per repeat and mode: a fresh cluster (`--retention-bytes RETAIN` for "on", nothing for "off");
the log pre-filled past the retention size so every measured second also deletes; then one
pipelined producer of 1 KiB records with acks=quorum, measured like the produce workload. The
figure that matters is the ratio on/off (1.0 = retention costs nothing).
"""

from __future__ import annotations

import time

from bench.disk import DiskNeed
from bench.results import figure
from bench.workers import WorkerGroup
from bench.workloads.common import MB, Ctx
from bench.workloads.produce import ProduceArgs, produce_worker

MODES = ("off", "on")
RECORD = 1024


def _retain_mib(quick: bool) -> int:
    return 16 if quick else 64


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    # "off" keeps the pre-fill (twice the retention size) and what the measured round writes;
    # the bench's own disk bound applies there, so "off" deletes nothing only while the log
    # stays under it (results.json details: the retention each workload ran with).
    return DiskNeed(keep_bytes=2 * _retain_mib(ctx_cfg.quick) * (1 << 20) * 11 // 10,
                    why="the pre-filled log of the 'off' mode, twice the retention size")


def steps(ctx_cfg) -> int:  # noqa: ANN001
    return len(MODES) * ctx_cfg.repeats


def _measure(ctx: Ctx, mode: str, retain_mib: int) -> tuple[float, dict]:
    """MB/s of one measured round, after pre-filling twice the retention size."""
    cfg = ctx.cfg
    cluster = ctx.cluster()
    if mode == "on":
        cluster.extra_args = [*cluster.extra_args, "--retention-bytes", f"{retain_mib}MiB"]
    with cluster:
        leader = cluster.wait_for_leader()
        addr = cluster.nodes[leader].addr
        fill = 2 * retain_mib * (1 << 20) // RECORD
        warmup = 0.2 if cfg.quick else 0.5
        prefill = ProduceArgs(addr, "leader", RECORD, cfg.batch_bytes, cfg.window, 0.0, 1.0,
                              max_records=fill)
        with WorkerGroup(produce_worker, [prefill]) as group:
            group.round(timeout=600)
        cluster.wait_caught_up()
        args = ProduceArgs(addr, "quorum", RECORD, cfg.batch_bytes, cfg.window, warmup,
                           cfg.duration)
        with WorkerGroup(produce_worker, [args]) as group:
            _, res = group.round(timeout=warmup + cfg.duration + 60)
        time.sleep(0.5)  # one retention round after the load, for the status below
        from bench.wire import SyncConn
        with SyncConn(addr, timeout=10) as conn:
            st = conn.request({"t": "status"})["status"]
    recs = sum(x["ok_records"] for x in res)
    ret = st.get("retention") or {}
    return recs * RECORD / cfg.duration / MB, {
        "start_offset": st["start_offset"], "retained_bytes": st.get("retained_bytes"),
        "deleted_bytes": ret.get("deleted_bytes", 0)}


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    retain = _retain_mib(cfg.quick)
    mbps: dict[str, list[float]] = {m: [] for m in MODES}
    after: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(cfg.repeats):
        for mode in MODES:
            ctx.describe(f"retention {mode}: produce quorum 1KiB, log past {retain} MiB "
                         f"(repeat {r + 1})")
            rate, state = _measure(ctx, mode, retain)
            mbps[mode].append(rate)
            after[mode].append(state)
            ctx.advance("retention")
    params = {"acks": "quorum", "record_size": RECORD, "producers": 1,
              "batch_bytes": cfg.batch_bytes, "window": cfg.window,
              "retention_bytes": retain << 20}
    figures = [
        figure("retention.off.MBps", "retention", "produce quorum 1KiB, retention off", "MB/s",
               mbps["off"], params=params, limit="lmdb_append_MBps",
               limit_value=ctx.limit("lmdb_append_MBps")),
        figure("retention.on.MBps", "retention",
               f"produce quorum 1KiB, retention {retain} MiB (deleting while writing)", "MB/s",
               mbps["on"], params=params, limit="lmdb_append_MBps",
               limit_value=ctx.limit("lmdb_append_MBps")),
        figure("retention.ratio", "retention", "throughput with retention / without", "x",
               [a / b for a, b in zip(mbps["on"], mbps["off"]) if b], params=params,
               target=(">=", 0.8)),
    ]
    return figures, {"retain_MiB": retain, "after": after}
