"""`catchup`: a follower catches up a large backlog while producers keep writing, and nobody
loses leadership over it.

Per ack level and repeat, on a fresh cluster: one follower is stopped cleanly; BULK MiB (200 by
default, 16 with --quick) are written with leader acks in small batches (1 KiB records, 4 per
request: many batches per recovery chunk, the case that used to hold the leader's event loop);
then steady producers start at the ack level under test, the follower is restarted, and the
harness polls every node until the follower has flushed the backlog.

Figures (all four required by docs/PERFORMANCE.md):
- `catchup.leader_changes`: elections seen during the whole run (term changes or a different
  leader), summed over every ack level and repeat: must be 0;
- `catchup.max_loop_lag_ms`: the worst event-loop lag the leader reported while the follower
  caught up (raft.node.looplag; polled twice a second over its last-second maximum);
- `catchup.produce_p99_ms`: p99 latency of the steady producers' requests sent during the
  catch-up, open loop (from each request's intended send instant);
- `catchup.MBps`: backlog bytes / seconds from the restart until the follower flushed it.
The same per ack level, and the follower's own loop lag, are in `details`.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import trio

from bench.disk import DiskNeed
from bench.harness import Cluster
from bench.results import figure
from bench.stats import Histogram
from bench.wire import AsyncConn, error_code, produce_frame, status_of
from bench.workers import Sync, WorkerGroup
from bench.workloads.common import MB, Ctx, batch_payload
from bench.workloads.produce import ProduceArgs, produce_worker

ACKS = ("quorum", "leader", "none")
LAG_BOUND_MS = 20.0  # the documented bound on one event-loop step (docs/PERFORMANCE.md)
BULK_RECORD = 1024
BULK_BATCH_BYTES = 4 * BULK_RECORD
BULK_PRODUCERS = 4
# The steady load during catch-up: open loop, so a stall is charged to every request it delays.
STEADY_PRODUCERS = 2
STEADY_RATE = 200  # requests per second per producer
STEADY_BATCH_BYTES = 16 * BULK_RECORD
POLL_S = 0.5
CATCHUP_TIMEOUT_S = 600.0


def _bulk_mib(quick: bool) -> int:
    return 16 if quick else 200


# What the steady producers add while the follower catches up (2 x 200/s x 16 KiB is 6.5 MB/s:
# about 10 s of it).
STEADY_HEADROOM = 64 << 20


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    # The follower must catch up from the log: the leader keeps the whole backlog (+10% for
    # the small batches' framing) and what the steady load writes meanwhile.
    return DiskNeed(keep_bytes=_bulk_mib(ctx_cfg.quick) * (1 << 20) * 11 // 10
                    + STEADY_HEADROOM,
                    why="the whole backlog the stopped follower catches up from the log, and "
                        "the steady load written meanwhile")


def steps(ctx_cfg) -> int:  # noqa: ANN001
    return len(ACKS) * ctx_cfg.repeats


@dataclass(slots=True)
class SteadyArgs:
    addr: str
    acks: str
    rate: float
    record_size: int
    batch_bytes: int
    max_s: float


async def steady_worker(a: SteadyArgs, sync: Sync) -> None:
    """Open-loop produce at a fixed rate from round start until the stop flag (or max_s);
    latencies count only requests due after the event instant (the follower's restart)."""
    payload, count = batch_payload(a.record_size, a.batch_bytes)
    conn = await AsyncConn.open(a.addr)
    sync.ready()
    try:
        t0 = await sync.wait_round(1)
        if t0 is not None:
            sync.report(1, await _steady_round(conn, a, payload, count, t0, sync))
        await sync.wait_round(2)  # returns None once the parent stops the group
    finally:
        await conn.aclose()


async def _steady_round(conn: AsyncConn, a: SteadyArgs, payload: bytes, count: int, t0: float,
                        sync: Sync) -> dict:
    interval = 1.0 / a.rate
    due_of: dict[int, float] = {}
    hist = Histogram()
    errors: dict[str, int] = {}
    ok = [0]

    def counted(due: float) -> bool:
        event = sync.event
        return event > 0 and due >= event

    async def receiver() -> None:
        while True:
            r = await conn.recv()
            now = time.monotonic()
            due = due_of.pop(r.get("id"), None)
            if due is None or not counted(due):
                continue
            hist.record((now - due) * 1e6)
            code = error_code(r)
            if code is None:
                ok[0] += 1
            else:
                errors[code] = errors.get(code, 0) + 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        i = 0
        while not sync.stopped and time.monotonic() - t0 < a.max_s:
            due = t0 + i * interval
            i += 1
            delay = due - time.monotonic()
            if delay > 0:
                await trio.sleep(delay)
            rid = conn.new_id()
            due_of[rid] = min(due, time.monotonic())
            await conn.send_raw(produce_frame(rid, a.acks, payload, count, timeout_ms=30_000))
        with trio.move_on_after(30):
            while due_of:
                await trio.sleep(0.002)
        nursery.cancel_scope.cancel()
    now = time.monotonic()
    lost = 0
    for due in due_of.values():  # never answered: the worst latencies of all, at their age
        if counted(due):
            hist.record((now - due) * 1e6)
            lost += 1
    return {"ok": ok[0], "errors": errors, "lost": lost, "latency": hist.to_json()}


async def idle_loop_worker(_: None, sync: Sync) -> None:
    """The control: a trio loop that does nothing but sleep 10 ms at a time, in its own
    process, during the catch-up. How late it wakes is what the machine alone (other
    processes competing for the CPUs) adds to any node's loop lag."""
    sync.ready()
    t0 = await sync.wait_round(1)
    if t0 is None:
        return
    lags: list[float] = []
    while not sync.stopped:
        asked = trio.current_time() + 0.010
        await trio.sleep_until(asked)
        if sync.event > 0:
            lags.append((trio.current_time() - asked) * 1e3)
    lags.sort()
    sync.report(1, {"max_ms": lags[-1] if lags else None,
                    "p99_ms": lags[int(0.99 * (len(lags) - 1))] if lags else None})
    await sync.wait_round(2)


def _fill(cluster: Cluster, leader: int, mib: int) -> None:
    """Write `mib` MiB of BULK_RECORD-byte records in BULK_BATCH_BYTES requests, leader acks."""
    records = mib * (1 << 20) // BULK_RECORD
    per = -(-records // BULK_PRODUCERS)
    args = ProduceArgs(cluster.nodes[leader].addr, "leader", BULK_RECORD, BULK_BATCH_BYTES,
                       window=16, warmup=0.0, duration=0.0, max_records=per)
    with WorkerGroup(produce_worker, [args] * BULK_PRODUCERS) as group:
        _, res = group.round(timeout=900)
    bad = {k: v for r in res for k, v in r["errors"].items()}
    if sum(r["all_ok_records"] for r in res) < records:
        raise RuntimeError(f"bulk write fell short: {bad or 'no errors reported'}")


class _Watch:
    """Polls every live node: elections seen, the leader's and the follower's loop lag."""

    def __init__(self, cluster: Cluster, leader: int, follower: int) -> None:
        self.cluster, self.leader, self.follower = cluster, leader, follower
        st = status_of(cluster.nodes[leader].addr, timeout=5.0) or {}
        self.term = st.get("term")
        self.changes = 0
        self.leaders_seen: set[tuple[int, int]] = {(st.get("term", -1), leader)}
        self.leader_lag = 0.0
        self.follower_lag = 0.0
        self.leader_cpu = 0.0  # the most CPU one event-loop step used (RAFTLOG_SLOW_STEP_MS)
        self.follower_cpu = 0.0
        self.cpu_tasks: set[str] = set()

    def poll(self) -> dict | None:
        """One round of status calls; the follower's status (None while it starts)."""
        mine = None
        for node_id, node in self.cluster.nodes.items():
            if not node.alive:
                continue
            st = status_of(node.addr, timeout=5.0)
            if st is None:
                continue
            loop = st.get("loop_lag") or {}
            lag = loop.get("max_1s_ms", 0.0)
            cpu = loop.get("step_cpu_max_ms", 0.0)
            if cpu and cpu >= LAG_BOUND_MS / 2:
                self.cpu_tasks.add(f"{node_id}:{loop.get('step_cpu_max_task')}")
            if node_id == self.leader:
                self.leader_lag = max(self.leader_lag, lag)
                self.leader_cpu = max(self.leader_cpu, cpu)
            if node_id == self.follower:
                self.follower_lag = max(self.follower_lag, lag)
                self.follower_cpu = max(self.follower_cpu, cpu)
                mine = st
            if st.get("role") == "leader":
                self.leaders_seen.add((st.get("term", -1), node_id))
            if self.term is not None and st.get("term", self.term) > self.term:
                self.changes += st["term"] - self.term  # any election in between counts
                self.term = st["term"]
        return mine

    @property
    def leader_changes(self) -> int:
        return max(self.changes, len(self.leaders_seen) - 1)


def _scenario(ctx: Ctx, acks: str, bulk: int) -> dict:
    with ctx.cluster() as cluster:
        leader = cluster.wait_for_leader()
        lag_node = next(i for i in cluster.nodes if i != leader)
        cluster.kill(lag_node, signal.SIGTERM)
        _fill(cluster, leader, bulk)
        top = (status_of(cluster.nodes[leader].addr, timeout=10.0) or {})["dirty_offset"]
        steady = SteadyArgs(cluster.nodes[leader].addr, acks, STEADY_RATE, BULK_RECORD,
                            STEADY_BATCH_BYTES, max_s=CATCHUP_TIMEOUT_S + 60)
        watch = _Watch(cluster, leader, lag_node)
        with WorkerGroup(steady_worker, [steady] * STEADY_PRODUCERS) as group, \
                WorkerGroup(idle_loop_worker, [None]) as control:
            group.release()
            control.release()
            time.sleep(0.5)  # the steady load runs before the restart too
            cluster.start_node(lag_node)
            t_restart = group.mark_event()
            control.mark_event()
            took = None
            while time.monotonic() - t_restart < CATCHUP_TIMEOUT_S:
                time.sleep(POLL_S)
                mine = watch.poll()
                if mine is not None and mine.get("flushed_offset", -1) >= top:
                    took = time.monotonic() - t_restart
                    break
            time.sleep(POLL_S)
            watch.poll()  # the last second of the catch-up
            group.stop_flag.value = 1
            control.stop_flag.value = 1
            res = group.collect(timeout=90)
            (machine,) = control.collect(timeout=30)
        hist = Histogram()
        errors: dict[str, int] = {}
        for r in res:
            hist.merge(Histogram.from_json(r["latency"]))
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
            if r["lost"]:
                errors["UNANSWERED"] = errors.get("UNANSWERED", 0) + r["lost"]
        p99 = hist.percentile(0.99)
        return {"acks": acks, "bulk_MiB": bulk, "catchup_s": took,
                "MBps": None if took is None else bulk * (1 << 20) / MB / took,
                "leader_changes": watch.leader_changes,
                "leader_max_loop_lag_ms": watch.leader_lag,
                "follower_max_loop_lag_ms": watch.follower_lag,
                "leader_max_step_cpu_ms": watch.leader_cpu,
                "follower_max_step_cpu_ms": watch.follower_cpu,
                "step_cpu_max_tasks": sorted(watch.cpu_tasks),
                "machine_max_loop_lag_ms": machine["max_ms"],
                "machine_p99_loop_lag_ms": machine["p99_ms"],
                "produce_p99_ms": None if p99 is None else p99 / 1e3,
                "produce_p50_ms": None if hist.percentile(0.5) is None
                else hist.percentile(0.5) / 1e3,
                "produce_requests": hist.count, "produce_errors": errors}


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    # The nodes measure the CPU each loop step takes (raft.node.looplag.SlowSteps) and log
    # steps over the bound with their task's name; only this workload's nodes.
    saved = os.environ.get("RAFTLOG_SLOW_STEP_MS")
    os.environ["RAFTLOG_SLOW_STEP_MS"] = saved or str(LAG_BOUND_MS)
    try:
        return _run(ctx)
    finally:
        if saved is None:
            os.environ.pop("RAFTLOG_SLOW_STEP_MS", None)


def _run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    bulk = _bulk_mib(cfg.quick)
    runs: list[dict] = []
    for r in range(cfg.repeats):
        for acks in ACKS:
            ctx.describe(f"catchup acks={acks}: follower {bulk} MiB behind (repeat {r + 1})")
            runs.append(_scenario(ctx, acks, bulk))
            ctx.advance("catchup")
    params = {"bulk_MiB": bulk, "bulk_record_bytes": BULK_RECORD,
              "bulk_batch_bytes": BULK_BATCH_BYTES, "steady_producers": STEADY_PRODUCERS,
              "steady_rate_per_producer": STEADY_RATE, "steady_batch_bytes": STEADY_BATCH_BYTES,
              "runs": len(runs)}
    figures = [
        figure("catchup.leader_changes", "catchup",
               f"catch-up: leader changes (sum over {len(runs)} runs)", "changes",
               [sum(x["leader_changes"] for x in runs)], better="lower", params=params,
               target=("<=", 0)),
        figure("catchup.max_loop_lag_ms", "catchup",
               f"catch-up: leader's max event-loop lag (worst of {len(runs)} runs)", "ms",
               [max(x["leader_max_loop_lag_ms"] for x in runs)], better="lower",
               params=params, target=("<=", LAG_BOUND_MS)),
        figure("catchup.follower_max_loop_lag_ms", "catchup",
               f"catch-up: follower's max event-loop lag (worst of {len(runs)} runs)", "ms",
               [max(x["follower_max_loop_lag_ms"] for x in runs)], better="lower",
               params=params, target=("<=", LAG_BOUND_MS)),
        figure("catchup.max_step_cpu_ms", "catchup",
               f"catch-up: most CPU one loop step used, leader or follower (worst of "
               f"{len(runs)} runs)", "ms",
               [max(max(x["leader_max_step_cpu_ms"], x["follower_max_step_cpu_ms"])
                    for x in runs)], better="lower", params=params,
               target=("<=", LAG_BOUND_MS)),
        figure("catchup.machine_max_loop_lag_ms", "catchup",
               f"catch-up: an idle trio loop's max lag beside it (the machine; worst of "
               f"{len(runs)} runs)", "ms", [max(x["machine_max_loop_lag_ms"] or 0 for x in runs)],
               better="lower", params=params),
        figure("catchup.produce_p99_ms", "catchup", "catch-up: produce p99 during it (all acks)",
               "ms", [x["produce_p99_ms"] for x in runs], better="lower", params=params),
        figure("catchup.MBps", "catchup", "catch-up: follower MB/s (all acks)", "MB/s",
               [x["MBps"] for x in runs], params=params, limit="seq_write_MBps",
               limit_value=ctx.limit("seq_write_MBps")),
    ]
    for acks in ACKS:
        mine = [x for x in runs if x["acks"] == acks]
        p = {**params, "acks": acks, "runs": len(mine)}
        figures.append(figure(f"catchup.{acks}.produce_p99_ms", "catchup",
                              f"catch-up, acks={acks}: produce p99", "ms",
                              [x["produce_p99_ms"] for x in mine], better="lower", params=p))
        figures.append(figure(f"catchup.{acks}.MBps", "catchup",
                              f"catch-up, acks={acks}: follower MB/s", "MB/s",
                              [x["MBps"] for x in mine], params=p, limit="seq_write_MBps",
                              limit_value=ctx.limit("seq_write_MBps")))
    return figures, {"bulk_MiB": bulk, "lag_bound_ms": LAG_BOUND_MS, "runs": runs}
