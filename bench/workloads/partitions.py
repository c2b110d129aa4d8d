"""`partitions`: what many partitions cost and give (issue 26 item 12), on real `raftlog serve`
processes. Run by name: `raftlog bench partitions [--only throughput,keyed,fsyncs,idle,create,
failover] [--partitions N]`. Sub-measures, each on its own fresh topic (deleted after it) or
cluster, each bounded in time:

- throughput: quorum MB/s of 8 keyed producer processes (1 KiB records, one 256 KiB batch per
  partition per request) into a topic of 1, 8, 64 partitions (`partitions.pN.quorum.MBps`) and
  the ratios to 1 partition (`partitions.ratio.pN`: no loss = 1.0);
- keyed: 1,000 keys over 64 partitions, small batches (4 records): MB/s and request p99;
- fsyncs: fsyncs/s per node (raftlog_fsyncs_total) at 1, 8, 64 partitions under the SAME total
  write rate (paced producers), and p64/p1;
- idle: CPU per node (/proc utime+stime) and peer frames/s per node pair (raftlog_peer_frames_
  sent_total) with nothing written, at 1, 100 and N partitions (one topic grown);
- create: seconds from `topic create` of N partitions until the metadata shows every leader;
- failover (on the create cluster): SIGKILL the node leading most partitions, seconds until
  every partition has a leader on the others, elections per partition (term increments seen in
  `status`), then restart it and time until leadership is balanced again (rebalance: every
  node leads within one of the mean).
N is `--partitions` (default 1,000). Figure ids name the count measured.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from bench.catalogue import PARTITION_MEASURES as MEASURES
from bench.disk import DiskNeed
from bench.partitions_load import KeyedArgs, keyed_worker
from bench.partitions_probe import (MetricsCluster, Window, led_partitions, load_average,
                                    partition_view, terms, wait_led, wait_quiet)
from bench.results import figure
from bench.stats import Histogram
from bench.workers import WorkerError, WorkerGroup
from bench.workloads.common import MB, Ctx
from raft.client import Client

RECORD = 1024
FSYNC_RATE_BPS = 8 * MB  # the fsync figure's total write rate (quick: 1 MB/s)
CREATE_BOUND_S = 600.0
QUIET_BOUND_S = 120.0  # the longest wait for every group to quiesce before an idle window
FAILOVER_BOUND_S = 120.0
REBALANCE_BOUND_S = 90.0
SETTLE_BOUND_S = 90.0  # a fresh topic's leaders reaching their preferred replicas
QUICK_SETTLE_BOUND_S = 5.0  # --quick: the smoke test does not wait out the balancer


def sizes(cfg: Any) -> dict[str, Any]:
    big = cfg.partitions
    if cfg.quick:
        return {"tp": (1, 2), "fs": (1, 2), "idle": (1, 2), "big": big, "producers": 2,
                "keys": 20, "keyed_parts": 2, "settle": 0.3, "idle_s": 0.5, "fs_rate": 1 * MB}
    return {"tp": (1, 8, 64), "fs": (1, 8, 64), "idle": (1, 100), "big": big, "producers": 8,
            "keys": 1000, "keyed_parts": 64, "settle": 3.0, "idle_s": 5.0,
            "fs_rate": FSYNC_RATE_BPS}


def chosen(cfg: Any) -> list[str]:
    return [m for m in MEASURES if not cfg.only or m in cfg.only]


def disk_need(ctx_cfg: Any) -> DiskNeed:
    """Throughput only, bounded by the measured seconds: nothing is read back."""
    return DiskNeed()


def steps(ctx_cfg: Any) -> int:
    s = sizes(ctx_cfg)
    per = {"throughput": len(s["tp"]) * ctx_cfg.repeats, "keyed": ctx_cfg.repeats,
           "fsyncs": len(s["fs"]) * ctx_cfg.repeats, "idle": len(s["idle"]) + 1,
           "create": 1, "failover": 2}
    return sum(per[m] for m in chosen(ctx_cfg))


async def _admin(addrs: list[str], op: str, name: str, partitions: int = 0,
                 timeout: float = 120.0) -> dict[str, Any]:
    """Create / grow / delete a topic and return {partition: leader address} (create/grow wait
    for every leader)."""
    async with Client(addrs, timeout=timeout) as c:
        if op == "delete":
            await c.delete_topic(name)
            return {}
        if op == "create":
            info = await c.create_topic(name, partitions, 3, timeout=timeout)
        elif op == "grow":
            info = await c.alter_topic(name, partitions=partitions, timeout=timeout)
        else:
            info = await c.topic(name, refresh=True)
        if op == "preferred" and any(p.replicas and p.leader != p.replicas[0]
                                     for p in info.partitions):
            return {}  # not settled yet
        return {p.partition: p.leader_address for p in info.partitions}


def admin(cluster: MetricsCluster, op: str, name: str, partitions: int = 0,
          timeout: float = 120.0) -> dict[int, str]:
    addrs = [n.addr for n in cluster.nodes.values() if n.alive]
    return trio.run(_admin, addrs, op, name, partitions, timeout)


def settled_leaders(cluster: MetricsCluster, name: str, created: dict[int, str],
                    bound_s: float = SETTLE_BOUND_S) -> tuple[dict[int, str], float | None]:
    """Wait (bounded) until every partition is led by its preferred replica, the leadership
    the node's leader balancer (raft.node.leader_balance) moves it to stable_ms after the
    create: load sent to the creation's leaders would meet those transfers mid-window
    (NOT_LEADER, and requests in flight at a transfer wait out their timeout, holding a window
    slot), so the figure would measure the balancer, not the data path. Returns the leaders
    and the seconds waited (None: not settled within the bound; the creation's leaders)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s:
        leaders = admin(cluster, "preferred", name)
        if leaders:
            return leaders, time.monotonic() - t0
        time.sleep(0.5)
    return created, None


def _keys(n: int, producers: int, tag: str) -> list[list[bytes]]:
    return [[f"{tag}-key-{i}".encode() for i in range(p, n, producers)]
            for p in range(producers)]


def _load(cluster: MetricsCluster, ctx: Ctx, topic: str, parts: int, s: dict, *,
          batch: int, rate: float, repeats: int, window: Window | None = None) -> list[dict]:
    """`repeats` rounds of keyed load on a fresh topic of `parts` partitions; per round the
    producers' results merged, with the node window's rates when measured."""
    leaders, settled_s = settled_leaders(cluster, topic, admin(cluster, "create", topic, parts),
                                         QUICK_SETTLE_BOUND_S if ctx.cfg.quick
                                         else SETTLE_BOUND_S)
    warmup = 0.2 if ctx.cfg.quick else 0.5
    keys = _keys(max(s["keys"], parts * 4), s["producers"], topic)
    args = [KeyedArgs(topic, leaders, k, RECORD, batch, ctx.cfg.window, warmup,
                      ctx.cfg.duration, rate_bps=rate / s["producers"], partitions=parts)
            for k in keys]
    rounds = []
    try:
        with WorkerGroup(keyed_worker, args) as group:
            for _ in range(repeats):
                t0 = group.release()
                time.sleep(max(0.0, t0 + warmup - time.monotonic()))
                w = Window(cluster).start() if window is not None else None
                res = group.collect(timeout=warmup + ctx.cfg.duration + 60)
                dt = time.monotonic() - w.t0 if w is not None else 0.0
                rates = w.end() if w is not None else {}
                lat = Histogram()
                for x in res:
                    lat.merge(Histogram.from_json(x["latency"]))
                errs: dict[str, int] = {}
                for x in res:
                    for k, v in x["errors"].items():
                        errs[k] = errs.get(k, 0) + v
                recs = sum(x["ok_records"] for x in res)
                mb = recs * RECORD / MB
                cpu_s = {n: pct / 100 * dt for n, pct in rates.get("cpu_pct", {}).items()}
                rounds.append({"MBps": recs * RECORD / ctx.cfg.duration / MB,
                               "p99_ms": None if lat.percentile(0.99) is None
                               else lat.percentile(0.99) / 1e3,
                               "errors": errs, "lost": sum(x["lost"] for x in res),
                               "leaders_settled_s": settled_s,
                               # every node's CPU (utime+stime) over the window per MB
                               # acknowledged: what a partition costs, load-independent
                               "cpu_ms_per_MB": (round(1000 * sum(cpu_s.values()) / mb, 1)
                                                 if mb and cpu_s else None),
                               "node_cpu_ms_per_MB": {n: round(1000 * c / mb, 1)
                                                      for n, c in cpu_s.items()} if mb else {},
                               "load": load_average(), **rates})
                ctx.advance("partitions")
    finally:
        admin(cluster, "delete", topic)
    return rounds


def _mean(d: dict[int, float]) -> float | None:
    return sum(d.values()) / len(d) if d else None


def throughput(ctx: Ctx, cluster: MetricsCluster, s: dict, det: dict) -> list[dict]:
    figs, base, all_rounds = [], None, {}
    for p in s["tp"]:
        ctx.describe(f"partitions: quorum x{s['producers']} keyed into {p} partitions")
        rounds = _load(cluster, ctx, f"tp{p}", p, s, batch=ctx.cfg.batch_bytes // RECORD,
                       rate=0, repeats=ctx.cfg.repeats, window=Window(cluster))
        all_rounds[p] = rounds
        mb = [r["MBps"] for r in rounds]
        figs.append(figure(f"partitions.p{p}.quorum.MBps", "partitions",
                           f"quorum 1KiB x{s['producers']} keyed, {p} partitions", "MB/s", mb,
                           params={"partitions": p, "producers": s["producers"]}))
        figs.append(_cpu_figure(f"partitions.p{p}.quorum.cpu_ms_per_MB", rounds,
                                f"CPU of all nodes per MB acknowledged, {p} partitions", p))
        if base is None:
            base = mb
        else:
            figs.append(figure(f"partitions.ratio.p{p}", "partitions",
                               f"quorum MB/s {p} partitions / 1 partition (same round)",
                               "x", [a / b if b else None for a, b in zip(mb, base)],
                               params={"partitions": p}, target=(">=", 0.9)))
    det["throughput"] = {str(k): v for k, v in all_rounds.items()}
    return figs


def keyed(ctx: Ctx, cluster: MetricsCluster, s: dict, det: dict) -> list[dict]:
    p = s["keyed_parts"]
    ctx.describe(f"partitions: {s['keys']} keys over {p} partitions, small batches")
    rounds = _load(cluster, ctx, f"keyed{p}", p, s, batch=4, rate=0, repeats=ctx.cfg.repeats,
                   window=Window(cluster))
    det["keyed"] = rounds
    params = {"partitions": p, "keys": s["keys"], "batch_records": 4}
    return [figure(f"partitions.keyed{p}.quorum.MBps", "partitions",
                   f"{s['keys']} keys over {p} partitions, 4-record batches", "MB/s",
                   [r["MBps"] for r in rounds], params=params),
            figure(f"partitions.keyed{p}.quorum.p99_ms", "partitions",
                   "its request latency p99", "ms", [r["p99_ms"] for r in rounds],
                   better="lower", params=params),
            _cpu_figure(f"partitions.keyed{p}.quorum.cpu_ms_per_MB", rounds,
                        "its CPU of all nodes per MB acknowledged", p)]


def _cpu_figure(fid: str, rounds: list[dict], label: str, parts: int) -> dict:
    return figure(fid, "partitions", label, "ms/MB", [r["cpu_ms_per_MB"] for r in rounds],
                  better="lower", params={"partitions": parts,
                                          "per_node": [r["node_cpu_ms_per_MB"] for r in rounds]})


def fsyncs(ctx: Ctx, cluster: MetricsCluster, s: dict, det: dict) -> list[dict]:
    figs, base, out = [], None, {}
    for p in s["fs"]:
        ctx.describe(f"partitions: fsyncs at {s['fs_rate'] / MB:.0f} MB/s over {p} partitions")
        rounds = _load(cluster, ctx, f"fs{p}", p, s, batch=16, rate=s["fs_rate"],
                       repeats=ctx.cfg.repeats, window=Window(cluster))
        out[str(p)] = rounds
        fps = [_mean(r["fsyncs_ps"]) for r in rounds]
        figs.append(figure(f"partitions.fsyncs_ps.p{p}", "partitions",
                           f"fsyncs/s per node, {p} partitions, same total rate", "fsyncs/s",
                           fps, better="lower", params={"partitions": p,
                                                        "total_Bps": s["fs_rate"]}))
        if base is None:
            base = fps
        else:
            figs.append(figure(f"partitions.fsyncs_ratio.p{p}", "partitions",
                               f"fsyncs/s {p} partitions / 1 partition", "x",
                               [a / b if a is not None and b else None
                                for a, b in zip(fps, base)], better="lower",
                               params={"partitions": p}, target=("<=", 1.5)))
    det["fsyncs"] = out
    return figs


def idle(ctx: Ctx, cluster: MetricsCluster, s: dict, det: dict) -> list[dict]:
    figs, out, frames1 = [], {}, None
    for p in (*s["idle"], s["big"]):
        ctx.describe(f"partitions: idle with {p} partitions")
        t0 = time.monotonic()
        admin(cluster, "create" if not out else "grow", "idle", p, timeout=CREATE_BOUND_S)
        meta_s = time.monotonic() - t0
        led_s, led = wait_led(cluster, "idle", p, CREATE_BOUND_S)
        ready_s = time.monotonic() - t0
        if led_s is None:
            raise RuntimeError(f"only {led} of {p} idle partitions led on every node after "
                               f"{ready_s:.0f}s: the largest count that works is lower")
        time.sleep(s["settle"])
        # Idle means settled: every group quiesced on every node (the balancer moves leaders
        # 5 s after they are elected, and each transfer wakes its group), within a bound.
        quiet_s = wait_quiet(cluster, QUIET_BOUND_S)
        w = Window(cluster).start()
        time.sleep(s["idle_s"])
        r = w.end()
        out[str(p)] = {**r, "metadata_led_s": round(meta_s, 2), "led_after_s": round(ready_s, 2),
                       "quiet_after_s": None if quiet_s is None else round(quiet_s, 2),
                       "load": load_average()}
        fr = _mean(r["frames_ps"])
        frames1 = fr if frames1 is None else frames1
        figs.append(figure(f"partitions.idle.frames_ps.p{p}", "partitions",
                           f"peer frames/s per node pair, idle, {p} partitions", "frames/s",
                           [fr], better="lower", params={"partitions": p}))
        ctx.advance("partitions")
    big = s["big"]
    figs.append(figure(f"partitions.idle.frames_ratio.p{big}", "partitions",
                       f"idle frames/s {big} partitions / 1 partition", "x",
                       [fr / frames1 if frames1 else None], better="lower",
                       params={"partitions": big}, target=("<=", 2.0)))
    cpu = out[str(big)]["cpu_pct"]
    figs.append(figure(f"partitions.idle{big}.cpu_pct", "partitions",
                       f"idle CPU of the busiest node, {big} partitions RF 3", "% of a core",
                       [max(cpu.values()) if cpu else None], better="lower",
                       params={"partitions": big, "per_node": cpu}, target=("<=", 2.0)))
    det["idle"] = out
    return figs


def create_and_failover(ctx: Ctx, cluster: MetricsCluster, s: dict, det: dict,
                        which: list[str]) -> list[dict]:
    big, figs = s["big"], []
    ctx.describe(f"partitions: topic create of {big} partitions")
    t0 = time.monotonic()
    admin(cluster, "create", "big", big, timeout=CREATE_BOUND_S)
    meta_s = time.monotonic() - t0
    led_s, led = wait_led(cluster, "big", big, CREATE_BOUND_S)
    created = None if led_s is None else time.monotonic() - t0
    det["create"] = {"s": created, "metadata_led_s": meta_s, "led": led, "load": load_average()}
    if "create" in which:
        figs.append(figure(f"partitions.create{big}.s", "partitions",
                           f"topic create of {big} partitions until all led (every node's "
                           f"status)", "s", [created],
                           better="lower", params={"partitions": big}))
        ctx.advance("partitions")
    if "failover" not in which:
        return figs
    time.sleep(s["settle"])
    before = partition_view(cluster, "big")
    led = led_partitions(before)
    counts = {n: sum(1 for v in led.values() if v == n) for n in cluster.nodes}
    victim = max(counts, key=lambda n: counts[n])
    t_before = terms(before)
    ctx.describe(f"partitions: SIGKILL node {victim} (leads {counts[victim]} of {big})")
    t0 = time.monotonic()
    cluster.kill(victim)
    failover, view = None, before
    while time.monotonic() - t0 < FAILOVER_BOUND_S:
        view = partition_view(cluster, "big")
        if len(led_partitions(view, exclude=victim)) == big:
            failover = time.monotonic() - t0
            break
        time.sleep(0.1)
    t_after = terms(view)
    bumps = sum(t_after.get(p, 0) - t_before.get(p, 0) for p in range(big))
    det["failover"] = {"victim": victim, "led_before": counts, "s": failover,
                       "led_at_end": len(led_partitions(view, exclude=victim)),
                       "term_increments": bumps, "load": load_average()}
    figs.append(figure(f"partitions.failover{big}.s", "partitions",
                       f"SIGKILL until all {big} partitions led", "s", [failover],
                       better="lower", params={"partitions": big}, target=("<=", 3.0)))
    figs.append(figure(f"partitions.failover{big}.elections_per_partition", "partitions",
                       "elections (term increments) per partition the killed node led", "x",
                       [bumps / counts[victim] if counts[victim] else None], better="lower",
                       params={"partitions": big, "failed_over": counts[victim]},
                       target=("<=", 1.1)))
    ctx.advance("partitions")
    ctx.describe(f"partitions: node {victim} back; waiting for balanced leadership")
    cluster.start_node(victim)
    t0, balanced, spread, within_10pct = time.monotonic(), None, None, None
    tol = max(1, round(0.1 * big / len(cluster.nodes)))
    mean = big / len(cluster.nodes)
    while time.monotonic() - t0 < (REBALANCE_BOUND_S if not ctx.cfg.quick else 5.0):
        led = led_partitions(partition_view(cluster, "big"))
        c = [sum(1 for v in led.values() if v == n) for n in cluster.nodes]
        spread = c
        if within_10pct is None and len(led) == big and max(c) - min(c) <= tol:
            within_10pct = time.monotonic() - t0
        # Balanced: every node leads within one of the mean (issue 26 item 2).
        if len(led) == big and all(abs(x - mean) <= 1 for x in c):
            balanced = time.monotonic() - t0
            break
        time.sleep(0.5)
    det["rebalance"] = {"s": balanced, "leaders_per_node_at_end": spread,
                        "within_10pct_s": within_10pct, "tolerance_10pct": tol,
                        "load": load_average()}
    figs.append(figure(f"partitions.rebalance{big}.s", "partitions",
                       "node back until every node leads within one of the mean", "s",
                       [balanced], better="lower", params={"partitions": big},
                       target=("<=", 60.0)))
    ctx.advance("partitions")
    return figs


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    s, which = sizes(cfg), chosen(cfg)
    det: dict[str, Any] = {"measures": which, "sizes": {k: v for k, v in s.items()},
                           "load_start": load_average()}
    figs: list[dict] = []
    steps_ = {"throughput": throughput, "keyed": keyed, "fsyncs": fsyncs, "idle": idle}
    for name, fn in steps_.items():
        if name not in which:
            continue
        # Each its own cluster: idle groups of an earlier measure (not quiesced before
        # mr-live) must not load a later one.
        try:
            with _cluster(ctx) as cluster:
                cluster.wait_for_leader()
                figs += fn(ctx, cluster, s, det)
        except (WorkerError, Exception) as e:  # noqa: BLE001 - one measure lost, not the run
            det[name] = {"error": ctx.point_failed("partitions", name, e)}
    if "create" in which or "failover" in which:
        try:
            with _cluster(ctx) as cluster:
                cluster.wait_for_leader()
                figs += create_and_failover(ctx, cluster, s, det, which)
        except Exception as e:  # noqa: BLE001
            det["create_failover"] = {"error": ctx.point_failed("partitions", "create", e)}
    det["load_end"] = load_average()
    return figs, det


def _cluster(ctx: Ctx) -> MetricsCluster:
    bound = ctx.disk.server_args if ctx.disk is not None else []
    return MetricsCluster(ctx.cfg.nodes, base_dir=ctx.data_dir or ctx.cfg.base_dir,
                          extra_args=[*bound, *ctx.cfg.server_args], keep=ctx.cfg.keep)
