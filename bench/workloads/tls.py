"""`tls`: what TLS costs. Run when named: `raftlog bench tls`.

Two 3-node clusters in the same run, one plaintext and one with TLS on every connection (the
generator's to the leader and the nodes' mutual-TLS peer links, certificates from
raft/cli/pki.py). Their measurements alternate round by round, the order flipped on every
repeat, so both modes see the same machine (the figures are compared, not taken alone):

- throughput: one producer keeping `window` pipelined requests of `batch_bytes` of 1 KiB
  records, at acks=quorum and acks=leader, with the request latency under that load;
- latency: open-loop single 100-byte records at a fixed rate, at acks=quorum and acks=leader
  (measured from the intended send instant, as the `latency` workload does).

The TLS overhead lands where the bytes are encrypted: trio's SSLStream (Python code around
OpenSSL's memory BIOs) on the client connection and on every peer link.
"""

from __future__ import annotations

from bench.disk import DiskNeed
from bench.results import figure
from bench.stats import Histogram
from bench.workers import WorkerGroup
from bench.workloads.common import MB, RECORD_SIZES, Ctx
from bench.workloads.latency import LatencyArgs, latency_worker
from bench.workloads.produce import ProduceArgs, produce_worker

MODES = ("plaintext", "tls")
ACKS = ("quorum", "leader")
RECORD = "1KiB"
RATE, QUICK_RATE = 200, 200  # low enough that a shared 2-core machine keeps up


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    return DiskNeed(clusters=len(MODES))  # both clusters run at once


def steps(ctx_cfg) -> int:
    return ctx_cfg.repeats * len(MODES) * len(ACKS) * 2


def _ms(us: float | None) -> float | None:
    return None if us is None else round(us / 1e3, 3)


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    warmup = 0.2 if cfg.quick else 0.5
    rate = QUICK_RATE if cfg.quick else RATE
    size = RECORD_SIZES[RECORD]
    figures: list[dict] = []
    details: dict = {"record_size": size, "batch_bytes": cfg.batch_bytes, "window": cfg.window,
                     "rate": rate, "points": []}
    clusters = {mode: ctx.cluster(tls=mode == "tls") for mode in MODES}
    try:
        for c in clusters.values():
            c.start()
        leaders = {mode: c.wait_for_leader() for mode, c in clusters.items()}
        for acks in ACKS:
            for kind in ("throughput", "latency"):
                per_mode = {m: {"values": [], "lat": Histogram()} for m in MODES}
                groups = {}
                for mode, c in clusters.items():
                    addr = c.nodes[leaders[mode]].addr
                    if kind == "throughput":
                        args = ProduceArgs(addr, acks, size, cfg.batch_bytes, cfg.window,
                                           warmup, cfg.duration, tls_ca=c.tls_ca)
                        groups[mode] = WorkerGroup(produce_worker, [args])
                    else:
                        args = LatencyArgs(addr, rate, warmup, cfg.duration, acks=acks,
                                           tls_ca=c.tls_ca)
                        groups[mode] = WorkerGroup(latency_worker, [args])
                    groups[mode].__enter__()
                try:
                    for r in range(cfg.repeats):
                        order = MODES if r % 2 == 0 else MODES[::-1]
                        for mode in order:
                            ctx.describe(f"tls: {kind} acks={acks} {mode} (repeat {r + 1})")
                            clusters[mode].wait_caught_up()
                            _, (res,) = groups[mode].round(timeout=warmup + cfg.duration + 60)
                            h = Histogram.from_json(res["latency"])
                            per_mode[mode]["lat"].merge(h)
                            if kind == "throughput":
                                per_mode[mode]["values"].append(
                                    res["ok_records"] * size / cfg.duration / MB)
                            else:
                                per_mode[mode]["values"].append(_ms(h.percentile(0.5)))
                            ctx.advance("tls")
                finally:
                    for g in groups.values():
                        g.__exit__(None, None, None)
                figures.extend(_figures(kind, acks, per_mode, rate))
                details["points"].append({
                    "kind": kind, "acks": acks, **{
                        mode: {"values": v["values"],
                               "p50_ms": _ms(v["lat"].percentile(0.5)),
                               "p99_ms": _ms(v["lat"].percentile(0.99)),
                               "max_ms": _ms(v["lat"].max)} for mode, v in per_mode.items()}})
    finally:
        for c in clusters.values():
            c.stop()
    return figures, details


def _figures(kind: str, acks: str, per_mode: dict, rate: int) -> list[dict]:
    out = []
    for mode, v in per_mode.items():
        params = {"mode": mode, "acks": acks, "kind": kind}
        if kind == "throughput":
            out.append(figure(f"tls.{mode}.{acks}.{RECORD}.MBps", "tls",
                              f"produce {acks} {RECORD} ({mode})", "MB/s", v["values"],
                              params=params))
            out.append(figure(f"tls.{mode}.{acks}.loaded_p99", "tls",
                              f"produce {acks} under load p99 ({mode})", "ms",
                              [_ms(v["lat"].percentile(0.99))], better="lower", params=params))
        else:
            out.append(figure(f"tls.{mode}.{acks}.r{rate}.p50", "tls",
                              f"latency {acks} {rate}/s p50 ({mode})", "ms", v["values"],
                              better="lower", params=params))
            out.append(figure(f"tls.{mode}.{acks}.r{rate}.p99", "tls",
                              f"latency {acks} {rate}/s p99 ({mode})", "ms",
                              [_ms(v["lat"].percentile(0.99))], better="lower", params=params))
    return out
