"""`latency_idle`: does a write's latency hold when the node also carries many idle partitions?

Issue 28's target: with 1,000 idle partitions on the node, the 200/s quorum p50 moves by at
most 10%. Run by name: `raftlog bench latency_idle [--partitions N]` (default 1,000; 4 with
--quick). On ONE fresh cluster, so the two halves share disk, processes and warm caches:

1. open-loop quorum writes of 100 B records at 200/s into the default topic's partition,
   `--repeats` rounds (`latency.idle0.quorum.r200.*`);
2. `topic create idle` with N partitions, replication 3, and wait until every partition is led
   on every node and every group on every node has quiesced (the balancer's transfers over);
3. the same rounds again (`latency.idle<N>.quorum.r200.*`), and the ratio of the two p50s
   (`latency.idle<N>.quorum.r200.p50_ratio`, target <= 1.10).

Why the rounds are not interleaved: taking 1,000 partitions away and back costs minutes of
deletes and creates per round. What is compared is therefore before / after on one cluster;
the load average of each half is in the details, and a ratio taken while the machine's load
moved says so there.
"""

from __future__ import annotations

from typing import Any

from bench.disk import DiskNeed
from bench.harness import Cluster
from bench.partitions_probe import load_average, wait_led, wait_quiet
from bench.results import figure
from bench.stats import Histogram, Summary
from bench.workers import WorkerGroup
from bench.workloads.common import Ctx
from bench.workloads.latency import RECORD_SIZE, LatencyArgs, latency_worker
from bench.workloads.partitions import CREATE_BOUND_S, QUIET_BOUND_S, admin

RATE = 200
RATIO_TARGET = 1.10
TOPIC = "idle"


def disk_need(ctx_cfg: Any) -> DiskNeed:
    """200 writes/s of 100 B: a few MB; nothing is read back."""
    return DiskNeed()


def steps(ctx_cfg: Any) -> int:
    return 2 * ctx_cfg.repeats + 1


def _rounds(ctx: Ctx, cluster: Cluster, label: str) -> dict[str, Any]:
    """`repeats` open-loop rounds at RATE/s on the default topic's leader."""
    cfg = ctx.cfg
    warmup = 0.2 if cfg.quick else 0.5
    leader = cluster.wait_for_leader()
    args = LatencyArgs(cluster.nodes[leader].addr, RATE, warmup, cfg.duration)
    merged, reps = Histogram(), []
    load0 = load_average()
    with WorkerGroup(latency_worker, [args]) as group:
        for r in range(cfg.repeats):
            ctx.describe(f"latency_idle: {RATE}/s {label} (repeat {r + 1})")
            cluster.wait_caught_up()
            _, (res,) = group.round(timeout=warmup + cfg.duration + 30)
            h = Histogram.from_json(res["latency"])
            merged.merge(h)
            reps.append({k: v for k, v in res.items() if k != "latency"}
                        | {"p50_ms": _ms(h.percentile(0.5)), "p99_ms": _ms(h.percentile(0.99))})
            ctx.advance("latency_idle")
    return {"leader": leader, "repeats": reps, "load_start": load0, "load_end": load_average(),
            "p50_ms": _ms(merged.percentile(0.5)), "p99_ms": _ms(merged.percentile(0.99))}


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    n = ctx.cfg.partitions
    det: dict[str, Any] = {"rate": RATE, "record_size": RECORD_SIZE, "partitions": n}
    with ctx.cluster() as cluster:
        det["without"] = _rounds(ctx, cluster, "without idle partitions")
        ctx.describe(f"latency_idle: topic create of {n} idle partitions")
        admin(cluster, "create", TOPIC, n, timeout=CREATE_BOUND_S)  # type: ignore[arg-type]
        led_s, led = wait_led(cluster, TOPIC, n, CREATE_BOUND_S)
        if led_s is None:
            raise RuntimeError(f"only {led} of {n} idle partitions were led on every node "
                               f"after {CREATE_BOUND_S:.0f}s; try a smaller --partitions")
        quiet_s = wait_quiet(cluster, QUIET_BOUND_S)
        det["created"] = {"led_after_s": round(led_s, 2),
                          "quiet_after_s": None if quiet_s is None else round(quiet_s, 2)}
        ctx.advance("latency_idle")
        det["with"] = _rounds(ctx, cluster, f"with {n} idle partitions")
    params = {"rate": RATE, "acks": "quorum", "record_size": RECORD_SIZE}
    figs: list[dict] = []
    for key, parts in (("without", 0), ("with", n)):
        reps = det[key]["repeats"]
        for q in ("p50", "p99"):
            figs.append(figure(
                f"latency.idle{parts}.quorum.r{RATE}.{q}", "latency_idle",
                f"latency {RATE}/s {q}, {parts} idle partitions", "ms",
                [x[f"{q}_ms"] for x in reps], better="lower", params={**params,
                                                                        "idle_partitions": parts}))
    base = Summary.of([x["p50_ms"] for x in det["without"]["repeats"]]).median
    idle = Summary.of([x["p50_ms"] for x in det["with"]["repeats"]]).median
    ratio = idle / base if base and idle is not None else None
    figs.append(figure(f"latency.idle{n}.quorum.r{RATE}.p50_ratio", "latency_idle",
                       f"latency {RATE}/s p50 with {n} idle partitions / without", "x",
                       [ratio], better="lower", params={**params, "idle_partitions": n},
                       target=("<=", RATIO_TARGET)))
    return figs, det


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3
