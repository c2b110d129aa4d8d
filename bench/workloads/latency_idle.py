"""`latency_idle`: does a write's latency hold when the node also carries many idle partitions?

Issue 28's target: with 1,000 idle partitions on the node, the 200/s quorum p50 moves by at
most 10%. Run by name: `raftlog bench latency_idle [--partitions N]` (default 1,000; 4 with
--quick). Two fresh 3-node clusters side by side on this machine: `idle` gets a topic of N
partitions (replication 3) and waits until every partition is led on every node by its
preferred replica (the leader balancer moves leaderships a few seconds after a create: each
transfer wakes its group and saves a term, so rounds taken meanwhile measure the balancer)
and every group on every node has quiesced; `plain` has only the default topic. Then
open-loop quorum writes of 100 B at 200/s into the default topic of each, round by round,
the order flipped every repeat (as `bench tls` does), so a load that moves on a shared machine
moves both halves alike. Figures `latency.idle0.quorum.r200.*`,
`latency.idle<N>.quorum.r200.*` and the ratio of the p50s (`...p50_ratio`, target <= 1.10).

What the pairing costs the comparison: while `plain` is measured, `idle`'s nodes burn their
idle CPU (3.5-3.9% of a core each at 1,000 partitions, docs/PERFORMANCE.md) beside it, and
`plain`'s idle nodes (2.6-2.8%) beside `idle`: a difference of about 3% of one core, which
makes the ratio slightly kinder than on separate machines.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

from bench.disk import DiskNeed
from bench.harness import Cluster
from bench.partitions_probe import cpu_seconds, load_average, wait_led, wait_quiet
from bench.results import figure
from bench.stats import Histogram, Summary
from bench.workers import WorkerGroup
from bench.workloads.common import Ctx
from bench.workloads.latency import RECORD_SIZE, LatencyArgs, latency_worker
from bench.workloads.partitions import (CREATE_BOUND_S, QUIET_BOUND_S, SETTLE_BOUND_S, admin,
                                       settled_leaders)

RATE = 200
RATIO_TARGET = 1.10
TOPIC = "idle"


def disk_need(ctx_cfg: Any) -> DiskNeed:
    """200 writes/s of 100 B: a few MB; nothing is read back."""
    return DiskNeed()


def steps(ctx_cfg: Any) -> int:
    return 2 * ctx_cfg.repeats + 1


def _round(ctx: Ctx, cluster: Cluster, group: WorkerGroup, label: str, r: int) -> dict:
    ctx.describe(f"latency_idle: {RATE}/s {label} (repeat {r + 1})")
    cluster.wait_caught_up()
    load = load_average()
    warmup = 0.2 if ctx.cfg.quick else 0.5
    _, (res,) = group.round(timeout=warmup + ctx.cfg.duration + 30)
    h = Histogram.from_json(res["latency"])
    ctx.advance("latency_idle")
    return {k: v for k, v in res.items() if k != "latency"} | {
        "p50_ms": _ms(h.percentile(0.5)), "p99_ms": _ms(h.percentile(0.99)), "load": load,
        "warm": int(warmup * RATE),
        "latency": res["latency"]}


def _settle(ctx: Ctx, cluster: Cluster, n: int) -> dict[str, Any]:
    """Create the idle topic and wait until it is led, settled and quiet."""
    ctx.describe(f"latency_idle: topic create of {n} idle partitions")
    cluster.wait_for_leader()
    created = admin(cluster, "create", TOPIC, n, timeout=CREATE_BOUND_S)  # type: ignore[arg-type]
    led_s, led = wait_led(cluster, TOPIC, n, CREATE_BOUND_S)
    if led_s is None:
        raise RuntimeError(f"only {led} of {n} idle partitions were led on every node after "
                           f"{CREATE_BOUND_S:.0f}s; try a smaller --partitions")
    bound = 5.0 if ctx.cfg.quick else SETTLE_BOUND_S
    _, settled_s = settled_leaders(cluster, TOPIC, created, bound)  # type: ignore[arg-type]
    quiet_s = wait_quiet(cluster, QUIET_BOUND_S)
    ctx.advance("latency_idle")
    return {"led_after_s": round(led_s, 2),
            "settled_after_s": None if settled_s is None else round(settled_s, 2),
            "quiet_after_s": None if quiet_s is None else round(quiet_s, 2)}


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg, n = ctx.cfg, ctx.cfg.partitions
    warmup = 0.2 if cfg.quick else 0.5
    det: dict[str, Any] = {"rate": RATE, "record_size": RECORD_SIZE, "partitions": n,
                           "without": {"repeats": []}, "with": {"repeats": []}}
    with ctx.cluster() as plain, ctx.cluster() as idle:
        det["created"] = _settle(ctx, idle, n)
        groups = {}
        with ExitStack() as stack:
            for key, cluster in (("without", plain), ("with", idle)):
                leader = cluster.wait_for_leader()
                det[key]["leader"] = leader
                args = LatencyArgs(cluster.nodes[leader].addr, RATE, warmup, cfg.duration)
                groups[key] = (cluster, stack.enter_context(WorkerGroup(latency_worker, [args])))
            for r in range(cfg.repeats):
                order = ("without", "with") if r % 2 == 0 else ("with", "without")
                for key in order:
                    cluster, group = groups[key]
                    label = "without idle partitions" if key == "without" else (
                        f"with {n} idle partitions")
                    before = _cpu(plain, idle)
                    rep = _round(ctx, cluster, group, label, r)
                    after = _cpu(plain, idle)
                    rep["cpu_s"] = after[0] - before[0]  # the measured cluster's nodes
                    rep["other_cpu_s"] = after[1] - before[1]
                    if key == "with":  # (plain, idle) order
                        rep["cpu_s"], rep["other_cpu_s"] = rep["other_cpu_s"], rep["cpu_s"]
                    rep["wall_s"] = after[2] - before[2]
                    det[key]["repeats"].append(rep)
    params = {"rate": RATE, "acks": "quorum", "record_size": RECORD_SIZE}
    figs: list[dict] = []
    for key, parts in (("without", 0), ("with", n)):
        reps = det[key]["repeats"]
        merged = Histogram()
        for x in reps:
            merged.merge(Histogram.from_json(x.pop("latency")))
        det[key]["p50_ms"] = _ms(merged.percentile(0.5))
        det[key]["p99_ms"] = _ms(merged.percentile(0.99))
        for q in ("p50", "p99"):
            figs.append(figure(
                f"latency.idle{parts}.quorum.r{RATE}.{q}", "latency_idle",
                f"latency {RATE}/s {q}, {parts} idle partitions", "ms",
                [x[f"{q}_ms"] for x in reps], better="lower",
                params={**params, "idle_partitions": parts}))
    figs += _cpu_figures(det, n, params)
    base = Summary.of([x["p50_ms"] for x in det["without"]["repeats"]]).median
    idle_p50 = Summary.of([x["p50_ms"] for x in det["with"]["repeats"]]).median
    ratio = idle_p50 / base if base and idle_p50 is not None else None
    figs.append(figure(f"latency.idle{n}.quorum.r{RATE}.p50_ratio", "latency_idle",
                       f"latency {RATE}/s p50 with {n} idle partitions / without", "x",
                       [ratio], better="lower", params={**params, "idle_partitions": n},
                       target=("<=", RATIO_TARGET)))
    return figs, det


def _cpu(plain: Cluster, idle: Cluster) -> tuple[float, float, float]:
    """CPU seconds (utime+stime) of each cluster's nodes together, and the clock."""
    def of(c: Cluster) -> float:
        return sum(cpu_seconds(nd.proc.pid) or 0.0 for nd in c.nodes.values() if nd.proc)
    return of(plain), of(idle), time.monotonic()


def _cpu_figures(det: dict[str, Any], n: int, params: dict) -> list[dict]:
    """CPU ms per write over each cluster's three nodes, net of what the same nodes burn
    idle: a cluster sits idle while the other is measured, and its CPU then is its idle
    rate. Holds up on a loaded machine where the latencies do not: the same code doing the
    same writes costs the same CPU whatever else runs."""
    figs, rates = [], {}
    for key, other in (("without", "with"), ("with", "without")):
        reps, others = det[key]["repeats"], det[other]["repeats"]
        # This cluster idle = while the other one was measured (its "other_cpu_s").
        idle_s = sum(x["other_cpu_s"] for x in others)
        idle_wall = sum(x["wall_s"] for x in others)
        rates[key] = idle_s / idle_wall if idle_wall else 0.0
        per = []
        for x in reps:
            writes = x["sent"] + x.get("warm", 0)
            net = x["cpu_s"] - rates[key] * x["wall_s"]
            per.append(net * 1e3 / writes if writes else None)
        det[key]["idle_cpu_cores"] = rates[key]
        parts = 0 if key == "without" else n
        figs.append(figure(f"latency.idle{parts}.quorum.r{RATE}.cpu_ms_per_write", "latency_idle",
                           f"CPU ms per write at {RATE}/s, 3 nodes net of idle, {parts} idle "
                           f"partitions", "ms", per, better="lower",
                           params={**params, "idle_partitions": parts}))
    return figs


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3
