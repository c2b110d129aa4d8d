"""`link`: cross-cluster replication (issue 30, docs/REPLICATION.md). Run by name:
`raftlog bench link`.

Two 3-node clusters on this machine, a source and a sink; a topic of PARTITIONS partitions on
the source and a link (`raftlog link create`, the CLI as an operator runs it) mirroring it
into the sink. Per repeat, on fresh clusters:

- `link.MBps`: producers write as fast as they can (leader acks, 1 KiB records) for the
  measured seconds; the figure is the bytes written divided by the time from the first write
  until the sink can serve the last one (so a link that falls behind shows in it), next to
  the producers' own rate (`link.source.MBps`).
- `link.lag_p50_ms` / `link.lag_p99_ms`: a steady RATE_MB MB/s, each batch stamped with the
  time it was sent; a consumer of the sink's mirror topic takes, for every batch, the time it
  first sees it minus that stamp: the whole path (source commit, pull, sink commit), what a
  reader in the other cluster waits.
- `link.catchup_s`: the link paused for CUT_S seconds (`raftlog link pause`, the link's cut)
  while the steady producer goes on, then resumed; the time from the resume until the sink
  serves everything the source held at the resume.
- `link.promote_s`: the promote request (what `raftlog topic promote` sends) on the sink, until
  a write to the promoted topic is acknowledged there.

Progress on the sink is read from the mirror topic itself (visible offsets are the source's):
the consumer follows every partition's high watermark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from bench.disk import DiskNeed
from bench.partitions_probe import cpu_seconds, load_average
from bench.results import figure
from bench.workloads.common import MB, Ctx
from raft.client import Client
from raft.client.errors import RaftlogError
from raft.core.types import Acks, ErrorCode
from raft.protocol.link_requests import LinkAlter, TopicPromote
from raft.protocol.requests import Fetch, Produce
from storage.records import encode_values

TOPIC = "linkbench"
LINK = "bench"
RECORD = 1024
BATCH_RECORDS = 64  # 64 KiB a produce: ~150 requests/s at the steady rate
RATE_MB = 10.0  # the steady rate for the lag figure


def sizes(cfg: Any) -> dict[str, Any]:
    if cfg.quick:
        return {"partitions": 2, "cut_s": 2.0, "rate_mb": 2.0, "steady_s": 1.0}
    return {"partitions": 4, "cut_s": 60.0, "rate_mb": RATE_MB, "steady_s": max(5.0, cfg.duration)}


def disk_need(cfg: Any) -> DiskNeed:
    s = sizes(cfg)
    # Both clusters keep what is written: the cut and the steady rounds at rate_mb, plus the
    # flat-out round (bounded by the measured seconds at ~200 MB/s), on 3 nodes each.
    written = (s["cut_s"] + 2 * s["steady_s"] + 10) * s["rate_mb"] * MB + cfg.duration * 200 * MB
    return DiskNeed(keep_bytes=int(written * 6), why="two 3-node clusters keep what they write")


def steps(cfg: Any) -> int:
    return 4 * cfg.repeats


# -- the CLI, as an operator runs it ------------------------------------------------------------
def _cli(servers: str, *args: str, timeout: float = 60.0) -> str:
    cmd = [sys.executable, "-m", "raft.cli", *args, "--servers", servers]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"`raftlog {' '.join(args)}` exited {done.returncode}: "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


# -- load and observation ------------------------------------------------------------------------
@dataclass(slots=True)
class Tracker:
    """What the sink serves: per partition, the next offset to read, and one lag sample per
    batch first seen (arrival - the stamp its producer put on it)."""

    next_offset: dict[int, int]
    lags_ms: list[float] = field(default_factory=list)
    record_lags: bool = False
    bytes_seen: int = 0
    changed: trio.Event = field(default_factory=trio.Event)

    def reached(self, ends: dict[int, int]) -> bool:
        return all(self.next_offset[p] > last for p, last in ends.items())


async def _follow(sink: Client, partition: int, tracker: Tracker) -> None:
    """Read one mirror partition forever, long-polling at its end."""
    while True:
        reply = await sink.call(Fetch(tracker.next_offset[partition], 8 << 20, 500,
                                      topic=TOPIC, partition=partition), timeout=30)
        now_ms = time.time() * 1000
        for b in reply.get("batches", []):
            if tracker.record_lags:
                tracker.lags_ms.append(now_ms - b["timestamp_ms"])
            tracker.bytes_seen += len(b["payload"])
        if reply["next_offset"] != tracker.next_offset[partition]:
            tracker.next_offset[partition] = reply["next_offset"]
            tracker.changed.set()
            tracker.changed = trio.Event()


async def _produce(source: Client, payload: bytes, seconds: float, rate_mb: float | None,
                   ends: dict[int, int], partitions: int, window: int = 8) -> int:
    """Write for `seconds` (paced at rate_mb MB/s, or flat out with `window` requests in
    flight per partition); `ends` gets each partition's last acknowledged offset. Returns the
    record bytes acknowledged."""
    written = 0
    deadline = trio.current_time() + seconds
    interval = None if rate_mb is None else len(payload) / (rate_mb * MB) * partitions

    async def lane(p: int) -> None:
        nonlocal written
        nxt = trio.current_time()
        while trio.current_time() < deadline:
            if interval is not None:
                nxt += interval
                await trio.sleep_until(nxt)
            reply = await source.call(Produce(payload, BATCH_RECORDS, Acks.LEADER, 10_000,
                                              timestamp_ms=int(time.time() * 1000),
                                              topic=TOPIC, partition=p), timeout=30)
            ends[p] = max(ends.get(p, -1), reply["last_offset"])
            written += BATCH_RECORDS * RECORD

    async with trio.open_nursery() as nursery:
        for p in range(partitions):
            for _ in range(1 if interval is not None else window):
                nursery.start_soon(lane, p)
    return written


async def _wait_reached(tracker: Tracker, ends: dict[int, int], timeout: float) -> None:
    with trio.fail_after(timeout):
        while not tracker.reached(ends):
            await tracker.changed.wait()


def _cpu(pids: list[int]) -> float:
    """The CPU seconds (utime + stime) of a cluster's node processes so far."""
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


async def _round(ctx: Ctx, src_addrs: str, sink_addrs: str, s: dict[str, Any],
                 pids: dict[str, list[int]]) -> dict[str, float]:
    parts = s["partitions"]
    payload = encode_values([os.urandom(RECORD)] * BATCH_RECORDS)
    out: dict[str, float] = {}
    async with Client(src_addrs, timeout=30) as source, Client(sink_addrs, timeout=30) as sink:
        await source.create_topic(TOPIC, parts, 3, timeout=60)
        await trio.to_thread.run_sync(
            lambda: _cli(sink_addrs, "link", "create", LINK, "--source", src_addrs,
                         "--topic", TOPIC))
        await sink.wait_for_leaders(TOPIC, trio.current_time() + 60, parts)
        tracker = Tracker({p: 0 for p in range(parts)})
        async with trio.open_nursery() as nursery:
            for p in range(parts):
                nursery.start_soon(_follow, sink, p, tracker)
            # 1. Flat out.
            ctx.describe(f"link: flat-out producers, mirror throughput ({parts} partitions)")
            ends: dict[int, int] = {}
            cpu0 = {side: _cpu(p) for side, p in pids.items()}
            t0 = trio.current_time()
            written = await _produce(source, payload, ctx.cfg.duration, None, ends, parts)
            produced_s = trio.current_time() - t0
            await _wait_reached(tracker, ends, 300)
            out["MBps"] = written / (trio.current_time() - t0) / MB
            out["source_MBps"] = written / produced_s / MB
            # CPU per MB of each cluster (its three nodes): what holds under load, where the
            # MB/s do not. The source's is producing plus serving the link's fetches; the
            # sink's is mirroring plus serving this bench's reader.
            for side, p in pids.items():
                out[f"{side}_cpu_ms_per_MB"] = (_cpu(p) - cpu0[side]) * 1000 / (written / MB)
            out["load_after_flat_out"] = load_average()[0]
            ctx.advance("link")
            # 2. Steady rate: lag per batch.
            ctx.describe(f"link: steady {s['rate_mb']} MB/s, mirror lag")
            tracker.record_lags, tracker.lags_ms = True, []
            ends = {}
            await _produce(source, payload, s["steady_s"], s["rate_mb"], ends, parts)
            await _wait_reached(tracker, ends, 120)
            tracker.record_lags = False
            lags = sorted(tracker.lags_ms)
            out["lag_p50_ms"] = lags[len(lags) // 2] if lags else float("nan")
            out["lag_p99_ms"] = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else \
                float("nan")
            ctx.advance("link")
            # 3. A cut of the link while the producer goes on, then the catch-up.
            ctx.describe(f"link: paused {s['cut_s']:.0f} s under {s['rate_mb']} MB/s, catch-up")
            await sink.call(LinkAlter(LINK, "pause", 10_000), timeout=30)
            ends = {}
            cut_end = trio.current_time() + s["cut_s"]
            async with trio.open_nursery() as load:
                load.start_soon(_produce, source, payload, s["cut_s"] + 3600, s["rate_mb"], ends,
                                parts)
                await trio.sleep_until(cut_end)
                at_resume = dict(ends)
                # What the pause held back (records the sink lacked at the resume): 0 would
                # mean the link went on while paused, and the catch-up measured nothing.
                out["behind_at_resume"] = float(sum(
                    max(0, last + 1 - tracker.next_offset[p]) for p, last in at_resume.items()))
                resumed = trio.current_time()  # the resume's own round trip counts
                sink_cpu0, seen0 = _cpu(pids["sink"]), tracker.bytes_seen
                await sink.call(LinkAlter(LINK, "resume", 10_000), timeout=30)
                await _wait_reached(tracker, at_resume, 600)
                out["catchup_s"] = trio.current_time() - resumed
                mirrored_mb = (tracker.bytes_seen - seen0) / MB  # the reader saw it mirrored
                if mirrored_mb > 0:
                    out["catchup_sink_cpu_ms_per_MB"] = \
                        (_cpu(pids["sink"]) - sink_cpu0) * 1000 / mirrored_mb
                load.cancel_scope.cancel()
            ctx.advance("link")
            # 4. Promote: until a write to the sink's topic is acknowledged.
            ctx.describe("link: promote the mirror, write to it")
            t0 = trio.current_time()
            await sink.call(TopicPromote(TOPIC, 30_000), timeout=60)
            # The promote is answered once the sink's controller committed it; the partition's
            # leader may apply it a moment later and refuse a write until then.
            with trio.fail_after(60):
                while True:
                    try:
                        await sink.call(Produce(payload, BATCH_RECORDS, Acks.QUORUM, 10_000,
                                                topic=TOPIC, partition=0), timeout=60)
                        break
                    except RaftlogError as e:
                        if e.code != ErrorCode.MIRROR_READ_ONLY.name:
                            raise
                        out["promote_refusals"] = out.get("promote_refusals", 0.0) + 1
                        await trio.sleep(0.01)
            out["promote_s"] = trio.current_time() - t0
            ctx.advance("link")
            nursery.cancel_scope.cancel()
    return out


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    s = sizes(cfg)
    rounds: list[dict[str, float]] = []
    for r in range(cfg.repeats):
        with ctx.cluster() as src, ctx.cluster() as sink:
            src.wait_for_leader()
            sink.wait_for_leader()
            try:
                pids = {side: [n.proc.pid for n in c.nodes.values() if n.proc is not None]
                        for side, c in (("source", src), ("sink", sink))}
                rounds.append(trio.run(_round, ctx, ",".join(src.addrs), ",".join(sink.addrs),
                                       s, pids))
            except Exception as e:  # noqa: BLE001 - reported in results.json, next repeat
                while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                    e = e.exceptions[0]  # the nursery's one failure, not its wrapper
                ctx.point_failed("link", f"repeat {r + 1}", e)
    params = {"partitions": s["partitions"], "record_size": RECORD,
              "batch_records": BATCH_RECORDS, "rate_MBps": s["rate_mb"], "cut_s": s["cut_s"]}

    def col(k: str) -> list[float]:
        return [x[k] for x in rounds if k in x]

    # Target: the mirror keeps up with what producers write flat out. With both clusters on
    # one machine, link.MBps is bound by the CPU they share (docs/PERFORMANCE.md, the link
    # section): what says whether a sink on machines like the source's keeps up is its CPU
    # per MB against the source's, within 25%.
    src_cpu = sorted(col("source_cpu_ms_per_MB"))
    keep_up = (("<=", round(1.25 * src_cpu[len(src_cpu) // 2], 1)) if src_cpu else None)
    figures = [
        figure("link.MBps", "link", "mirror throughput, flat-out producers (leader acks)",
               "MB/s", col("MBps"), params=params),
        figure("link.source.MBps", "link", "the producers' own rate on the source", "MB/s",
               col("source_MBps"), params=params),
        figure("link.lag_p50_ms", "link", f"mirror lag p50 at {s['rate_mb']} MB/s", "ms",
               col("lag_p50_ms"), better="lower", params=params),
        figure("link.lag_p99_ms", "link", f"mirror lag p99 at {s['rate_mb']} MB/s", "ms",
               col("lag_p99_ms"), better="lower", params=params, target=("<=", 100.0)),
        figure("link.source.cpu_ms_per_MB", "link",
               "source cluster CPU per MB in the flat-out round (producing, serving the link)",
               "ms/MB", col("source_cpu_ms_per_MB"), better="lower", params=params),
        figure("link.sink.cpu_ms_per_MB", "link",
               "sink cluster CPU per MB in the flat-out round (mirroring, serving the reader)",
               "ms/MB", col("sink_cpu_ms_per_MB"), better="lower", params=params,
               target=keep_up),
        figure("link.catchup_s", "link", f"catch-up after a {s['cut_s']:.0f} s pause", "s",
               col("catchup_s"), better="lower", params=params),
        figure("link.promote_s", "link", "promote, until a write is acknowledged", "s",
               col("promote_s"), better="lower", params=params, target=("<=", 5.0)),
    ]
    return figures, {"rounds": rounds}
