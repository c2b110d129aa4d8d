"""`latency`: open-loop quorum produce of single small records at fixed rates.

Open loop: request i is due at t0 + i/rate whatever happened before, and its latency is
measured from that intended instant, not from when it was actually sent. A stall therefore
shows up in every request it delayed (no coordinated omission, as in wrk2/HdrHistogram).
The gate follows `etcdctl check perf`: pass when >= 90% of the target rate was achieved
and p99 stays under the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from bench.closed_loop import ClosedArgs, closed_worker
from bench.disk import DiskNeed
from bench.partitions_probe import cpu_seconds
from bench.results import figure
from bench.stats import Histogram, Summary
from bench.wire import AsyncConn, error_code, produce_frame
from bench.workers import Sync, WorkerGroup
from bench.harness import Cluster
from bench.workloads.common import Ctx, loop_lag_of
from storage.records import encode_values

P99_LIMIT_MS = 5.0
P50_TARGET_MS = 1.0
RECORD_SIZE = 100
DEFAULT_RATES = (200, 1000, 2000)
QUICK_RATES = (200,)
_TIMER_SLACK = 0.001
CLOSED_WRITERS = 64
CLOSED_PROCS = 2  # worker processes the closed-loop writers are spread over
CLOSED_TARGET_RPS = 10_000


@dataclass(slots=True)
class LatencyArgs:
    addr: str
    rate: float
    warmup: float
    duration: float
    drain_timeout: float = 5.0
    acks: str = "quorum"
    tls_ca: str | None = None  # TLS to the node, trusting this CA


async def latency_worker(a: LatencyArgs, sync: Sync) -> None:
    payload = encode_values([b"x" * RECORD_SIZE])
    conn = await AsyncConn.open(a.addr, tls_ca=a.tls_ca)
    sync.ready()
    try:
        async for k, t0 in sync.rounds():
            sync.report(k, await latency_round(conn, a, payload, t0))
    finally:
        await conn.aclose()


async def latency_round(conn: AsyncConn, a: LatencyArgs, payload: bytes, t0: float) -> dict:
    interval = 1.0 / a.rate
    n_warm = int(a.warmup * a.rate)
    n = n_warm + int(a.duration * a.rate)
    m1 = t0 + n * interval  # end of the measured sending window
    intended: dict[int, float] = {}
    hist = Histogram()
    stats = {"ok_in_window": 0, "ok": 0, "errors": {}, "late_sends": 0}
    base_id = conn.next_id

    async def receiver() -> None:
        while True:
            r = await conn.recv()
            now = time.monotonic()
            t_int = intended.pop(r.get("id"), None)
            if t_int is None:
                continue
            if r["id"] - base_id <= n_warm:
                continue
            code = error_code(r)
            hist.record((now - t_int) * 1e6)
            if code is None:
                stats["ok"] += 1
                if now <= m1:
                    stats["ok_in_window"] += 1
            else:
                stats["errors"][code] = stats["errors"].get(code, 0) + 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        for i in range(n):
            due = t0 + i * interval
            delay = due - time.monotonic()
            # epoll timeouts round up to whole milliseconds: wake up to 1 ms early instead of
            # up to 1 ms late, and time an early send from when it really left (below).
            if delay > _TIMER_SLACK:
                await trio.sleep(delay - _TIMER_SLACK)
            elif delay < -interval:
                stats["late_sends"] += 1
            rid = conn.new_id()
            # Latency runs from the intended instant, or from the real send if that was earlier:
            # a late send is charged to the system (no coordinated omission), an early one is
            # never credited.
            intended[rid] = min(due, time.monotonic())
            await conn.send_raw(produce_frame(rid, a.acks, payload, 1))
        with trio.move_on_after(a.drain_timeout):
            while intended:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    # Requests never answered are the worst latencies of all: count them at their age.
    now = time.monotonic()
    lost = 0
    for rid, t_int in intended.items():
        if rid - base_id > n_warm:
            hist.record((now - t_int) * 1e6)
            lost += 1
    measured = n - n_warm
    return {"target_rate": a.rate, "sent": measured, "ok": stats["ok"], "lost": lost,
            "achieved_rate": stats["ok_in_window"] / a.duration, "errors": stats["errors"],
            "late_sends": stats["late_sends"], "latency": hist.to_json()}


def quorum_floor_ms(limits: dict) -> float | None:
    """The least a quorum write can take here: the client's round trip to the leader, the
    leader's round trip to a follower (both the RPC floor) and one durable LMDB commit (leader
    and follower commit in parallel at best; LMDB syncs data and meta page, two fsyncs)."""
    try:
        commit = limits.get("lmdb_commit_ms", limits["fsync_ms"])["p50"]
        return commit + 2 * limits["rpc_floor_ms"]["p50"]
    except (KeyError, TypeError):
        return None


def rates(ctx_cfg) -> tuple[int, ...]:
    if "closed64" in getattr(ctx_cfg, "only", ()):  # `--only closed64`: the writers alone
        return ()
    return QUICK_RATES if ctx_cfg.quick else DEFAULT_RATES


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    """Latency only: nothing is read back, so retention may delete all but the newest batches."""
    return DiskNeed()


def steps(ctx_cfg) -> int:
    return (len(rates(ctx_cfg)) + 1) * ctx_cfg.repeats  # (+1: closed64)


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    """On a fresh cluster (the default set runs this first)."""
    with ctx.cluster() as cluster:
        return measure(ctx, cluster, "latency", "")


def after_produce(ctx: Ctx, cluster: Cluster) -> tuple[list[dict], dict]:
    """The same measurement on the cluster the produce workload just filled, as a user meets
    it right after heavy writes: a big log, the disk still writing back, a warm tail. Figure
    ids `latency.after_produce.quorum.r<rate>.*`."""
    return measure(ctx, cluster, "latency.after_produce", " after produce")


def measure(ctx: Ctx, cluster: Cluster, prefix: str, label: str) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    warmup = 0.2 if cfg.quick else 0.5
    floor = quorum_floor_ms(ctx.limits)
    figures: list[dict] = []
    details: dict = {"p99_limit_ms": P99_LIMIT_MS, "quorum_floor_ms": floor,
                     "record_size": RECORD_SIZE, "rates": []}
    leader = cluster.wait_for_leader()
    for rate in rates(cfg):
        args = LatencyArgs(cluster.nodes[leader].addr, rate, warmup, cfg.duration)
        per_rep = []
        merged = Histogram()
        with WorkerGroup(latency_worker, [args]) as group:
            for r in range(cfg.repeats):
                ctx.describe(f"latency{label} quorum {rate}/s (repeat {r + 1})")
                cluster.wait_caught_up()
                _, (res,) = group.round(timeout=warmup + cfg.duration + 30)
                h = Histogram.from_json(res["latency"])
                merged.merge(h)
                per_rep.append({**res, "p50_ms": _ms(h.percentile(0.5)),
                                "p99_ms": _ms(h.percentile(0.99)),
                                "p999_ms": _ms(h.percentile(0.999)), "max_ms": _ms(h.max)})
                ctx.advance("latency")
        params = {"rate": rate, "acks": "quorum", "record_size": RECORD_SIZE}
        base = f"{prefix}.quorum.r{rate}"
        for q, key, tgt in (("p50", "p50_ms", ("<=", P50_TARGET_MS)),
                            ("p99", "p99_ms", ("<=", P99_LIMIT_MS)),
                            ("p99.9", "p999_ms", None), ("max", "max_ms", None)):
            figures.append(figure(
                f"{base}.{q}", "latency", f"latency{label} {rate}/s {q}", "ms",
                [x[key] for x in per_rep], better="lower", params=params,
                limit="quorum_floor_ms" if q == "p50" else None,
                limit_value=floor if q == "p50" else None, target=tgt))
        achieved = Summary.of([x["achieved_rate"] for x in per_rep])
        figures.append(figure(f"{base}.achieved", "latency",
                              f"latency{label} {rate}/s achieved",
                              "req/s", achieved.samples, params=params,
                              target=(">=", 0.9 * rate)))
        p99 = Summary.of([x["p99_ms"] for x in per_rep]).median
        passed = (achieved.median is not None and achieved.median >= 0.9 * rate
                  and p99 is not None and p99 <= P99_LIMIT_MS)
        details["rates"].append({
            "rate": rate, "pass": passed, "leader_loop_lag": loop_lag_of(cluster, leader),
            "repeats": [
                {k: v for k, v in x.items() if k != "latency"} for x in per_rep],
            "cdf_ms": [(v / 1e3, f) for v, f in merged.cdf()],
            "p50_ms": _ms(merged.percentile(0.5)), "p99_ms": _ms(merged.percentile(0.99)),
            "p999_ms": _ms(merged.percentile(0.999)), "max_ms": _ms(merged.max)})
    closed_figures, details["closed64"] = measure_closed(ctx, cluster, leader, prefix, label)
    figures.extend(closed_figures)
    return figures, details


def measure_closed(ctx: Ctx, cluster: Cluster, leader: int, prefix: str,
                   label: str) -> tuple[list[dict], dict]:
    """CLOSED_WRITERS single-record quorum writers, one record in flight each (issue 28:
    the leader must batch them, group commit): writes/s, latency, and CPU ms per write of
    the nodes (utime+stime), the figure that holds up on a loaded machine."""
    cfg = ctx.cfg
    warmup = 0.2 if cfg.quick else 0.5
    per = CLOSED_WRITERS // CLOSED_PROCS
    args = [ClosedArgs(cluster.nodes[leader].addr, per, warmup, cfg.duration)
            for _ in range(CLOSED_PROCS)]
    pids = {n.node_id: n.proc.pid for n in cluster.nodes.values() if n.proc}
    reps = []
    with WorkerGroup(closed_worker, args) as group:
        for r in range(cfg.repeats):
            ctx.describe(f"latency{label} closed-loop {CLOSED_WRITERS} writers (repeat {r + 1})")
            cluster.wait_caught_up()
            cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
            _, results = group.round(timeout=warmup + cfg.duration + 30)
            cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
            h = Histogram()
            for res in results:
                h.merge(Histogram.from_json(res["latency"]))
            ok = sum(res["ok"] for res in results)
            # The CPU window spans the whole round (warm-up too): per write answered in it,
            # the measured ones scaled up by the round's length.
            total = ok * (warmup + cfg.duration) / cfg.duration
            cpu = {str(k): None if cpu0[k] is None or cpu1[k] is None
                   else (cpu1[k] - cpu0[k]) * 1e3 / max(1.0, total) for k in pids}
            reps.append({"rps": ok / cfg.duration, "p50_ms": _ms(h.percentile(0.5)),
                         "p99_ms": _ms(h.percentile(0.99)), "cpu_ms_per_write": cpu,
                         "errors": [res["errors"] for res in results]})
            ctx.advance("latency")
    params = {"writers": CLOSED_WRITERS, "acks": "quorum", "record_size": RECORD_SIZE}
    base = f"{prefix}.closed{CLOSED_WRITERS}.quorum"
    cpu_all = [sum(v for v in x["cpu_ms_per_write"].values() if v is not None) for x in reps]
    figures = [
        figure(f"{base}.rps", "latency", f"latency{label} closed-loop {CLOSED_WRITERS} writers",
               "req/s", [x["rps"] for x in reps], params=params,
               target=(">=", CLOSED_TARGET_RPS)),
        figure(f"{base}.p50", "latency", f"latency{label} closed{CLOSED_WRITERS} p50", "ms",
               [x["p50_ms"] for x in reps], better="lower", params=params),
        figure(f"{base}.p99", "latency", f"latency{label} closed{CLOSED_WRITERS} p99", "ms",
               [x["p99_ms"] for x in reps], better="lower", params=params),
        figure(f"{base}.cpu_ms_per_write", "latency",
               f"latency{label} closed{CLOSED_WRITERS} CPU ms per write (all nodes)", "ms",
               cpu_all, better="lower", params=params)]
    return figures, {"writers": CLOSED_WRITERS, "leader": leader, "repeats": reps}
