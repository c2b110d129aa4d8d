"""`trace`: where a quorum write's time goes, hop by hop, next to the machine's floor.

Open-loop quorum produce of single 100-byte records at TRACE_RATE/s (the latency workload's
first point); one write in SAMPLE_EVERY carries `"trace": <id>`. The cluster's nodes run with
RAFTLOG_TRACE set (raft/node/trace.py): the leader stamps a sampled request's hops, and every
node stamps flushes, peer frames and commits by log offset. All stamps are CLOCK_MONOTONIC,
which the client and the nodes share on one machine, so a write's hops line up across
processes without clock sync. The nodes write their stamps at their clean stop; this module
then matches them to each sampled write by its offset (the first event of a kind covering
the offset, after the write was sent) and prints the median and p99 of each stage.

The follower a stage is measured on is the write's quorum follower: the one whose reply the
leader read first. Stages overlap where the work is parallel (the leader's flush and the
follower's round trip): `total` is the client's round trip, not the sum.

Also CPU per write: utime+stime (/proc) of all nodes over the window, divided by the writes
answered, which holds up on a loaded machine where wall-clock figures do not.
"""

from __future__ import annotations

import bisect
import glob
import os
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

import msgpack
import trio

from bench.disk import DiskNeed
from bench.partitions_probe import cpu_seconds
from bench.results import figure
from bench.stats import percentiles
from bench.wire import AsyncConn, error_code, pack
from bench.workloads.common import Ctx
from raft.core.types import Acks
from raft.protocol.requests import Produce
from storage.records import encode_values

TRACE_RATE = 200
SAMPLE_EVERY = 2
CLOSED_WRITERS = 64
CLOSED_SAMPLE_EVERY = 8
RECORD_SIZE = 100
WARMUP_S = 0.5
IDLE_S = 2.0  # measuring the idle cluster's CPU

# (stage, from hop, to hop). Hops: ("c", kind) the client, ("L", kind) the leader, ("F", kind)
# the write's quorum follower.
STAGES = (
    ("client -> leader read", "c_send", "L_recv"),
    ("leader parse -> proposed", "L_recv", "L_propose"),
    ("proposed -> leader flush start", "L_propose", "L_flush_start"),
    ("leader flush: thread hand-off in", "L_flush_start", "L_fsync_start"),
    ("leader fsync (LMDB commit)", "L_fsync_start", "L_fsync_end"),
    ("leader flush: hand-off out", "L_fsync_end", "L_flush_end"),
    ("proposed -> append written", "L_propose", "L_net_send"),
    ("append: wire + decode", "L_net_send", "F_f_read"),
    ("follower step (append)", "F_f_read", "F_f_stepped"),
    ("follower stepped -> flush start", "F_f_stepped", "F_flush_start"),
    ("follower flush: hand-off in", "F_flush_start", "F_fsync_start"),
    ("follower fsync (LMDB commit)", "F_fsync_start", "F_fsync_end"),
    ("follower flush: hand-off out", "F_fsync_end", "F_flush_end"),
    ("follower flushed -> reply written", "F_flush_end", "F_reply_send"),
    ("reply: wire + decode", "F_reply_send", "L_reply_read"),
    ("leader steps reply", "L_reply_read", "L_reply_stepped"),
    ("reply stepped -> commit (Ready)", "L_reply_stepped", "L_commit"),
    ("commit -> handler woken", "L_commit", "L_woken"),
    ("woken -> answer written", "L_woken", "L_sent"),
    ("answer -> client read", "L_sent", "c_recv"),
    ("total (client round trip)", "c_send", "c_recv"),
)


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    return DiskNeed()


def steps(ctx_cfg) -> int:  # noqa: ANN001
    return 1


@dataclass(slots=True)
class Sample:
    trace_id: int
    sent: float
    received: float = 0.0
    offset: int = -1


@dataclass(slots=True)
class _Series:
    """One (node, kind, group, peer) series of events, in time order."""

    times: list[float] = field(default_factory=list)
    reach: list[int] = field(default_factory=list)  # running max of the offsets

    def add(self, t: float, offset: int) -> None:
        self.times.append(t)
        self.reach.append(max(offset, self.reach[-1]) if self.reach else offset)

    def first(self, offset: int, after: float) -> float | None:
        """When the first event covering `offset` at or after `after` happened."""
        i = max(bisect.bisect_left(self.reach, offset), bisect.bisect_left(self.times, after))
        return self.times[i] if i < len(self.times) else None


async def _drive(addr: str, rate: float, duration: float) -> tuple[list[Sample], int, float,
                                                                       float]:
    """Send at `rate` for WARMUP_S + duration; returns the measured samples, the writes answered
    in the window, and the window."""
    payload = encode_values([b"x" * RECORD_SIZE])
    conn = await AsyncConn.open(addr)
    interval = 1.0 / rate
    n_warm, n = int(WARMUP_S * rate), int((WARMUP_S + duration) * rate)
    samples: dict[int, Sample] = {}
    pending: dict[int, Sample | None] = {}
    answered = 0
    done = trio.Event()

    async def receiver() -> None:
        nonlocal answered
        while pending or not done.is_set():
            r = await conn.recv()
            now = time.monotonic()
            s = pending.pop(r.get("id"), None)
            if error_code(r) is None:  # (warm-up too: the CPU is measured over all of it)
                answered += 1
            if s is not None and error_code(r) is None:
                s.received, s.offset = now, r["last_offset"]
                samples[s.trace_id] = s

    t0 = time.monotonic() + 0.05
    window = (t0 + n_warm * interval, t0 + n * interval)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        for i in range(n):
            delay = t0 + i * interval - time.monotonic()
            if delay > 0:
                await trio.sleep(delay)
            rid = conn.new_id()
            frame = Produce(payload, 1, Acks.QUORUM, 5000).to_frame(rid)
            sample = None
            if i >= n_warm and i % SAMPLE_EVERY == 0:
                frame["trace"] = rid
                sample = Sample(rid, 0.0)
            pending[rid] = sample
            if sample is not None:
                sample.sent = time.monotonic()
            await conn.send_raw(pack(frame))
        done.set()
        with trio.move_on_after(10):
            while pending:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await conn.aclose()
    return list(samples.values()), answered, *window


async def _drive_closed(addr: str, writers: int, duration: float) -> tuple[list[Sample], int,
                                                                          float, float]:
    """`writers` connections, one record in flight each, for WARMUP_S + duration; one write
    in CLOSED_SAMPLE_EVERY per writer traced."""
    payload = encode_values([b"x" * RECORD_SIZE])
    conns = [await AsyncConn.open(addr) for _ in range(writers)]
    t0 = time.monotonic()
    m0, m1 = t0 + WARMUP_S, t0 + WARMUP_S + duration
    samples: list[Sample] = []
    answered = 0

    async def writer(conn: AsyncConn, w: int) -> None:
        nonlocal answered
        k = 0
        while time.monotonic() < m1:
            k += 1
            rid = conn.new_id()
            frame = Produce(payload, 1, Acks.QUORUM, 5000).to_frame(rid)
            sample = None
            if time.monotonic() >= m0 and k % CLOSED_SAMPLE_EVERY == 0:
                frame["trace"] = w * 1_000_000 + rid
                sample = Sample(frame["trace"], time.monotonic())
            await conn.send_raw(pack(frame))
            while True:
                r = await conn.recv()
                if r.get("id") == rid:
                    break
            if error_code(r) is None:
                answered += 1
                if sample is not None:
                    sample.received, sample.offset = time.monotonic(), r["last_offset"]
                    samples.append(sample)

    async with trio.open_nursery() as nursery:
        for w, conn in enumerate(conns):
            nursery.start_soon(writer, conn, w)
    for conn in conns:
        await conn.aclose()
    return samples, answered, m0, m1


def _load_events(trace_dir: str, pids: dict[int, int]) -> tuple[dict, dict]:
    """(series by (node, kind, group, peer), request hops by (trace id, kind)) from the
    nodes' trace files."""
    series: dict[tuple, _Series] = defaultdict(_Series)
    hops: dict[tuple[int, str], float] = {}
    for path in glob.glob(os.path.join(trace_dir, "trace-*.msgpack")):
        with open(path, "rb") as f:
            data = msgpack.unpackb(f.read(), use_list=False)
        node = pids.get(data["pid"])
        if node is None:
            continue
        for kind, key, offset, t, extra in data["events"]:
            if kind in ("recv", "propose", "woken", "sent"):
                hops[(key, kind)] = t
            else:
                series[(node, kind, key, extra)].add(t, offset)
                if extra:  # also findable whatever the peer (one node's file: in time order)
                    series[(node, kind, key, 0)].add(t, offset)
    return series, hops


def _stamps(s: Sample, leader: int, followers: list[int], group: int, series: dict,
            hops: dict) -> dict[str, float | None]:
    o, t0 = s.offset, s.sent

    def at(node: int, kind: str, peer: int = 0) -> float | None:
        ser = series.get((node, kind, group, peer))
        return None if ser is None else ser.first(o, t0)

    replies = {f: at(leader, "reply_read", f) for f in followers}
    known = [f for f in followers if replies[f] is not None]
    f = min(known, key=lambda x: replies[x]) if known else followers[0]
    out: dict[str, float | None] = {"c_send": t0, "c_recv": s.received}
    for kind in ("recv", "propose", "woken", "sent"):
        out["L_" + kind] = hops.get((s.trace_id, kind))
    for kind in ("flush_start", "fsync_start", "fsync_end", "flush_end", "commit"):
        out["L_" + kind] = at(leader, kind)
    out["L_net_send"] = at(leader, "net_send", f)
    out["L_reply_read"] = replies.get(f)
    out["L_reply_stepped"] = at(leader, "reply_stepped", f)
    out["F_f_read"] = at(f, "f_read", leader)
    out["F_f_stepped"] = at(f, "f_stepped", leader)
    for kind in ("flush_start", "fsync_start", "fsync_end", "flush_end"):
        out["F_" + kind] = at(f, kind)
    out["F_reply_send"] = at(f, "reply_send", leader)
    return out


def _cpu(pids: dict[int, int]) -> dict[int, float | None]:
    return {node: cpu_seconds(pid) for pid, node in pids.items()}


def _thread_cpu(pids: dict[int, int]) -> dict[int, tuple[float, float]]:
    """Per node: CPU seconds of its main thread (the event loop) and of its other threads
    (flushes, disk reads)."""
    out = {}
    for pid, node in pids.items():
        main = other = 0.0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            secs = (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
            if int(tid) == pid:
                main += secs
            else:
                other += secs
        out[node] = (main, other)
    return out


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    trace_dir = tempfile.mkdtemp(prefix="raftlog-trace-", dir=ctx.data_dir or cfg.base_dir)
    duration = cfg.duration * cfg.repeats
    before = os.environ.get("RAFTLOG_TRACE")
    os.environ["RAFTLOG_TRACE"] = trace_dir
    try:
        with ctx.cluster() as cluster:
            leader = cluster.wait_for_leader()
            cluster.wait_caught_up()
            pids = {n.proc.pid: n.node_id for n in cluster.nodes.values() if n.proc}
            closed = "closed" in cfg.only
            ctx.describe(f"trace: quorum {TRACE_RATE}/s, 1 in {SAMPLE_EVERY} traced" if not closed
                         else f"trace: {CLOSED_WRITERS} closed-loop writers")
            idle0 = _cpu(pids)
            time.sleep(IDLE_S)  # the cluster's own CPU without writes (ticks, heartbeats)
            cpu0 = _cpu(pids)
            threads0 = _thread_cpu(pids)
            idle = {n: None if idle0[n] is None or cpu0[n] is None
                    else (cpu0[n] - idle0[n]) / IDLE_S for n in cpu0}
            t_cpu = time.monotonic()
            if closed:
                samples, answered, w0, w1 = trio.run(_drive_closed, cluster.nodes[leader].addr,
                                                     CLOSED_WRITERS, duration)
            else:
                samples, answered, w0, w1 = trio.run(_drive, cluster.nodes[leader].addr,
                                                     TRACE_RATE, duration)
            cpu1 = _cpu(pids)
            threads1 = _thread_cpu(pids)
            elapsed = time.monotonic() - t_cpu
    finally:
        if before is None:
            os.environ.pop("RAFTLOG_TRACE", None)
        else:
            os.environ["RAFTLOG_TRACE"] = before
    ctx.advance("trace")
    series, hops = _load_events(trace_dir, pids)
    if not cfg.keep:
        shutil.rmtree(trace_dir, ignore_errors=True)
    nodes = sorted(pids.values())
    followers = [n for n in nodes if n != leader]
    sends = defaultdict(int)
    for (node, kind, group, peer), s in series.items():
        if node == leader and kind == "net_send" and peer == 0:
            sends[group] += len(s.times)
    group = max(sends, key=sends.__getitem__) if sends else 0
    stamps = [_stamps(s, leader, followers, group, series, hops) for s in samples]
    # Group commit at work: writes per leader flush and per append frame to each follower.
    batching = {"writes": answered}
    for name, key in (("leader_flushes", (leader, "flush_start", group, 0)),
                      *((f"appends_to_n{f}", (leader, "net_send", group, f))
                        for f in followers)):
        n = len(series[key].times) if key in series else 0
        batching[name] = n
        batching[f"writes_per_{name}"] = answered / n if n else None
    net = {n: None if cpu0[n] is None or cpu1[n] is None or idle[n] is None
           else cpu1[n] - idle[n] * elapsed for n in cpu1}
    what = (f"{CLOSED_WRITERS} closed-loop writers ({answered / (elapsed or 1):.0f} writes/s)"
            if closed else f"{TRACE_RATE}/s")
    figures, details = _report(ctx, stamps, answered, cpu0, cpu1, net, leader, len(samples),
                               what)
    details["batching"] = batching
    split = {n: ((threads1[n][0] - threads0[n][0]) * 1e3 / max(1, answered),
                 (threads1[n][1] - threads0[n][1]) * 1e3 / max(1, answered)) for n in threads0}
    details["cpu_ms_per_write_threads"] = {str(n): v for n, v in split.items()}
    tline = "CPU ms per write, event loop / other threads: " + ", ".join(
        f"n{n} {a:.3f} / {b:.3f}" for n, (a, b) in sorted(split.items()))
    print(tline)
    details["table"].append(tline)
    line = ("group commit: " + ", ".join(
        f"{k[len('writes_per_'):]} {v:.1f} writes each" for k, v in batching.items()
        if k.startswith("writes_per_") and v is not None))
    print(line)
    details["table"].append(line)
    return figures, details


def _report(ctx: Ctx, stamps: list[dict], answered: int, cpu0: dict, cpu1: dict, net: dict,
            leader: int, sampled: int, what: str) -> tuple[list[dict], dict]:
    lim = ctx.limits
    floor = {k: (lim.get(k) or {}).get("p50") for k in ("fsync_ms", "lmdb_commit_ms",
                                                         "rpc_floor_ms")}
    rows, figures = [], []
    for name, a, b in STAGES:
        d = [(st[b] - st[a]) * 1e3 for st in stamps
             if st.get(a) is not None and st.get(b) is not None]
        p50, p99 = percentiles(d, (0.5, 0.99)) if d else (None, None)
        rows.append({"stage": name, "from": a, "to": b, "n": len(d), "p50_ms": p50,
                     "p99_ms": p99})
        slug = a + "." + b
        figures.append(figure(f"trace.{slug}.p50", "trace", f"trace {name} p50", "ms",
                              [p50], better="lower"))
        figures.append(figure(f"trace.{slug}.p99", "trace", f"trace {name} p99", "ms",
                              [p99], better="lower"))
    cpu = {str(n): (None if cpu0.get(n) is None or cpu1.get(n) is None
                    else (cpu1[n] - cpu0[n]) * 1e3 / max(1, answered)) for n in cpu0}
    total_cpu = sum(v for v in cpu.values() if v is not None)
    # Net of what the idle cluster burns in the same time (ticks, heartbeats, pings).
    net_cpu = sum((net[n] - cpu0[n]) * 1e3 / max(1, answered) for n in cpu0
                  if net.get(n) is not None and cpu0.get(n) is not None)
    figures.append(figure("trace.cpu_ms_per_write", "trace", "CPU ms per write (all nodes)",
                          "ms", [total_cpu], better="lower"))
    figures.append(figure("trace.cpu_ms_per_write.net_of_idle", "trace",
                          "CPU ms per write (all nodes, net of idle)", "ms", [net_cpu],
                          better="lower"))
    lines = [f"trace: {sampled} sampled quorum writes of {RECORD_SIZE} B at {what} "
             f"(leader n{leader}); load {os.getloadavg()[0]:.2f}",
             f"{'stage':<40} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}"]
    for r in rows:
        lines.append(f"{r['stage']:<40} {r['n']:>5} {_f(r['p50_ms']):>8} {_f(r['p99_ms']):>8}")
    lines.append("floor: fsync p50 {} ms, LMDB commit p50 {} ms, loopback round trip p50 {} ms"
                 .format(*(_f(floor[k]) for k in ("fsync_ms", "lmdb_commit_ms",
                                                  "rpc_floor_ms"))))
    lines.append("CPU ms per write: " + ", ".join(f"n{k} {_f(v)}" for k, v in cpu.items())
                 + f"; all nodes {_f(total_cpu)}, net of idle {_f(net_cpu)} ({answered} writes)")
    print("\n".join(lines))
    return figures, {"stages": rows, "floor_ms": floor, "cpu_ms_per_write": cpu,
                     "cpu_ms_per_write_total": total_cpu, "cpu_ms_per_write_net": net_cpu,
                     "answered": answered,
                     "sampled": sampled, "leader": leader, "rate": TRACE_RATE,
                     "sample_every": SAMPLE_EVERY, "table": lines}


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
