"""`produce`: batched throughput per ack level, record size and producer count.

Each producer is its own process holding `window` pipelined requests of `batch_bytes` of
records each (what a batching client does with linger and batch size). Only replies received
inside the measured window count; the warmup fills the pipeline first. Between repeats the
runner waits until every node flushed and committed the previous backlog, so leader/none acks
do not leave work that slows the next point.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import trio

from bench.disk import DiskNeed
from bench.partitions_probe import cpu_seconds
from bench.results import figure
from bench.stats import Histogram
from bench.wire import AsyncConn, error_code, produce_frame
from bench.workers import Sync, WorkerError, WorkerGroup
from bench.workloads import latency
from bench.workloads.common import MB, RECORD_SIZES, Ctx, batch_payload, loop_lag_of

ACKS = ("quorum", "leader", "none")
TARGETS_MBPS = {("leader", "1KiB"): 150.0, ("quorum", "1KiB"): 100.0}
TARGETS_RPS = {("leader", "100B"): 1_000_000.0}
STUCK_WRITE_S = 10.0  # a frame not written by then means the server stopped reading


@dataclass(slots=True)
class ProduceArgs:
    addr: str
    acks: str
    record_size: int
    batch_bytes: int
    window: int
    warmup: float
    duration: float
    max_records: int = 0  # >0: stop after this many acknowledged records (pre-filling a log)
    tls_ca: str | None = None  # TLS to the node, trusting this CA


async def produce_worker(a: ProduceArgs, sync: Sync) -> None:
    payload, count = batch_payload(a.record_size, a.batch_bytes)
    conn = await AsyncConn.open(a.addr, tls_ca=a.tls_ca)
    sync.ready()
    try:
        async for k, t0 in sync.rounds():
            result = await produce_round(conn, a, payload, count, t0)
            sync.report(k, result)
            if result["stalled"] or result["lost"]:
                # A send may have been cut mid-frame: start the next round on a clean stream.
                await conn.aclose()
                conn = await AsyncConn.open(a.addr, tls_ca=a.tls_ca)
    finally:
        await conn.aclose()


async def produce_round(conn: AsyncConn, a: ProduceArgs, payload: bytes, count: int,
                        t0: float) -> dict:
    m0 = t0 + a.warmup
    m1 = m0 + a.duration
    window = trio.Semaphore(a.window)
    sent: dict[int, float] = {}
    errors: dict[str, int] = {}
    lat = Histogram()
    ok = {"records": 0, "requests": 0, "all_records": 0}
    backoff_until = 0.0
    last_reply = t0
    # Set when a frame could not be written within STUCK_WRITE_S: the server stopped reading
    # (a real stall). The connection is replaced after such a round.
    stalled = [False]

    async def receiver() -> None:
        nonlocal backoff_until, last_reply
        while True:
            r = await conn.recv()
            now = time.monotonic()
            ts = sent.pop(r.get("id"), None)
            if ts is None:
                continue
            window.release()
            code = error_code(r)
            if code is None:
                ok["all_records"] += count
                last_reply = now
                if m0 <= now <= m1:
                    ok["records"] += count
                    ok["requests"] += 1
                    lat.record((now - ts) * 1e6)
            else:
                errors[code] = errors.get(code, 0) + 1
                backoff_until = now + 0.005

    async def _send_loop() -> None:
        while True:
            if a.max_records:
                if ok["all_records"] >= a.max_records:
                    return
                if ok["all_records"] + len(sent) * count >= a.max_records:
                    await trio.sleep(0.001)
                    continue
            elif time.monotonic() >= m1:
                return
            await window.acquire()
            # Read the clock once: on a busy machine it moves between a check and a
            # subtraction, and trio.sleep refuses a negative delay (that crashed the generator).
            delay = backoff_until - time.monotonic()
            if delay > 0:
                await trio.sleep(delay)
            rid = conn.new_id()
            sent[rid] = time.monotonic()
            # Shielded from the round's deadline: a frame cut off half-written would leave the
            # server waiting for its rest, and its request unanswerable. A saturated server
            # reads the rest as soon as a window slot frees (its per-connection backpressure).
            with trio.CancelScope(shield=True) as write_scope:
                write_scope.deadline = trio.current_time() + STUCK_WRITE_S
                await conn.send_raw(produce_frame(rid, a.acks, payload, count))
            if write_scope.cancelled_caught:
                sent.pop(rid, None)
                stalled[0] = True
                return

    # A stalled server must not hang the generator: sending stops at the window's end (or, when
    # pre-filling, after a generous bound) even if the window never frees or the socket blocks.
    send_deadline = m1 if not a.max_records else t0 + 600.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        with trio.move_on_after(max(0.0, send_deadline - time.monotonic())):
            await _send_loop()
        with trio.move_on_after(15):
            while sent:
                await trio.sleep(0.002)
        nursery.cancel_scope.cancel()
    return {"ok_records": ok["records"], "ok_requests": ok["requests"],
            "all_ok_records": ok["all_records"], "errors": errors, "lost": len(sent),
            "elapsed": last_reply - t0, "latency": lat.to_json(),
            "stalled": stalled[0]}


def configs(quick: bool, only: list[str] | tuple[str, ...] = ()) -> list[tuple[str, str, int]]:
    """The points to run: `--only quorum.1KiB.p8,...` picks points of the full set by their
    figure id (even with --quick, which otherwise runs its own small set)."""
    points = [f"{acks}.{size}.p{n}" for n, acks, size in
              itertools.product((1, 8), ACKS, RECORD_SIZES)]
    picked = [p for p in points if p in only]
    if picked:
        return [(p.split(".")[0], p.split(".")[1], int(p.split(".")[2][1:])) for p in picked]
    if quick:
        return [("quorum", "1KiB", 1), ("leader", "1KiB", 1), ("none", "1KiB", 1),
                ("quorum", "1KiB", 2)]
    return [(acks, size, n) for n, acks, size in
            itertools.product((1, 8), ACKS, RECORD_SIZES)]


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    """Throughput only: nothing is read back, so retention may delete all but the newest batches."""
    return DiskNeed()


def steps(ctx_cfg) -> int:
    after = latency.steps(ctx_cfg) if "latency" in ctx_cfg.workloads else 0
    return len(configs(ctx_cfg.quick, ctx_cfg.only)) * ctx_cfg.repeats + after


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    warmup = 0.2 if cfg.quick else 0.5
    figures: list[dict] = []
    details: dict = {"points": [], "batch_bytes": cfg.batch_bytes, "window": cfg.window,
                     "warmup_s": warmup, "duration_s": cfg.duration}
    with ctx.cluster() as cluster:
        for acks, size_name, nprod in configs(cfg.quick, cfg.only):
            # The leader of each point, not of the first: it may move between points (the
            # leader balancer hands it to the partition's preferred node), and generators
            # pinned to a former leader would only collect NOT_LEADER for the rest of the run.
            leader = cluster.wait_for_leader()
            size = RECORD_SIZES[size_name]
            args = ProduceArgs(cluster.nodes[leader].addr, acks, size, cfg.batch_bytes,
                               cfg.window, warmup, cfg.duration)
            rps, mbps, errs, lat = [], [], {}, Histogram()
            catch_up: list[float] = []  # seconds waiting for the previous backlog before each
            lag: list[dict] = []  # the leader's event-loop lag after each repeat
            cpu: list[dict] = []  # CPU s per GB acknowledged, per process role, each repeat
            failure = None
            done = 0
            try:
                with WorkerGroup(produce_worker, [args] * nprod) as group:
                    for r in range(cfg.repeats):
                        ctx.describe(f"produce acks={acks} {size_name} ×{nprod} "
                                     f"(repeat {r + 1})")
                        t_wait = time.monotonic()
                        cluster.wait_caught_up()
                        catch_up.append(round(time.monotonic() - t_wait, 2))
                        roles = _roles(cluster, leader, group)
                        cpu0 = {k: _cpu(v) for k, v in roles.items()}
                        _, res = group.round(timeout=warmup + cfg.duration + 60)
                        cpu1 = {k: _cpu(v) for k, v in roles.items()}
                        lag.append(loop_lag_of(cluster, leader))
                        acked_gb = sum(x["all_ok_records"] for x in res) * size / 1e9
                        cpu.append({k: round((cpu1[k] - cpu0[k]) / acked_gb, 2)
                                    if acked_gb else None for k in roles})
                        recs = sum(x["ok_records"] for x in res)
                        rps.append(recs / cfg.duration)
                        mbps.append(recs * size / cfg.duration / MB)
                        for x in res:
                            _count_errors(errs, x)
                            lat.merge(Histogram.from_json(x["latency"]))
                        done += 1
                        ctx.advance("produce")
            except WorkerError as e:
                # A dead load generator (on a busy machine, say) loses this point only: it is
                # reported in results.json and the next point runs with fresh generators.
                failure = ctx.point_failed("produce", f"{acks} {size_name} x{nprod}", e)
                for _ in range(cfg.repeats - done):
                    ctx.advance("produce")
            params = {"acks": acks, "record_size": size, "producers": nprod,
                      "batch_bytes": cfg.batch_bytes, "window": cfg.window}
            base = f"produce.{acks}.{size_name}.p{nprod}"
            limit = "lmdb_append_MBps" if acks == "quorum" else "tcp_loopback_MBps"
            figures.append(figure(
                f"{base}.MBps", "produce", f"produce {acks} {size_name} ×{nprod}", "MB/s", mbps,
                params=params, limit=limit, limit_value=ctx.limit(limit),
                target=(">=", TARGETS_MBPS[(acks, size_name)])
                if (acks, size_name) in TARGETS_MBPS else None))
            figures.append(figure(
                f"{base}.rps", "produce", f"produce {acks} {size_name} ×{nprod} records/s",
                "rec/s", rps, params=params,
                target=(">=", TARGETS_RPS[(acks, size_name)])
                if (acks, size_name) in TARGETS_RPS else None))
            nodes_cpu = [c["leader"] + c["followers"] for c in cpu
                         if c["leader"] is not None]
            figures.append(figure(
                f"{base}.cpu_s_per_GB.nodes", "produce",
                f"produce {acks} {size_name} ×{nprod} node CPU per GB", "s", nodes_cpu,
                better="lower", params=params))
            details["points"].append({
                **params, "MBps": mbps, "records_per_s": rps, "errors": errs,
                "catch_up_wait_s": catch_up, "leader_loop_lag": lag, "failure": failure,
                "cpu_s_per_GB": cpu,
                "request_latency_ms": {"p50": _ms(lat.percentile(0.5)),
                                       "p99": _ms(lat.percentile(0.99)), "max": _ms(lat.max)}})
        if "latency" in cfg.workloads:
            # Quorum latency as a user meets it right after heavy writes, on this cluster.
            after, after_details = latency.after_produce(ctx, cluster)
            figures.extend(after)
            details["latency_after_produce"] = after_details
    return figures, details


def _roles(cluster, leader: int, group: WorkerGroup) -> dict[str, list[int]]:  # noqa: ANN001
    """The processes whose CPU a point reports: the leader, the followers, the producers."""
    return {"leader": [cluster.nodes[leader].proc.pid],
            "followers": [n.proc.pid for k, n in cluster.nodes.items() if k != leader and n.proc],
            "producers": [p.pid for p in group.procs if p.pid]}


def _cpu(pids: list[int]) -> float:
    """utime+stime of these processes (one that is gone counts 0: its share is lost, not
    invented)."""
    return sum(cpu_seconds(p) or 0.0 for p in pids)


def _count_errors(errs: dict[str, int], x: dict) -> None:
    if x["lost"]:  # sent, no answer within 15 s after the window
        errs["UNANSWERED"] = errs.get("UNANSWERED", 0) + x["lost"]
    if x["stalled"]:  # the socket blocked a write past the deadline
        errs["STALLED_WRITE"] = errs.get("STALLED_WRITE", 0) + 1
    for k, v in x["errors"].items():
        errs[k] = errs.get(k, 0) + v


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3
