"""`subscriptions`: commit throughput of many subscriptions, and what it costs producers.

One cluster, one run, three phases per repeat:
1. produce alone: quorum acks, 1 KiB records, PRODUCERS producer processes (the baseline);
2. commits alone: CONSUMERS consumers, each with its own subscription, each committing a new
   position every INTERVAL_MS (spread evenly over the interval), from COMMIT_PROCS processes
   with one pipelined connection each (at most one commit in flight per consumer, as a real
   consumer does): acknowledged commits/s, commit latency, and how many operations each log
   entry carried (the leader's accumulator counters, read through `sub_list`);
3. both at once: produce throughput while the consumers commit. cost = 1 - (3) / (1).

Run it by name: `raftlog bench subscriptions` (it is not in the default set). Client processes
share the machine with the nodes, so on a small machine part of the cost is CPU the committing
clients take from the nodes; docs/SUBSCRIPTIONS.md reports both numbers with the machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from bench.results import figure
from bench.stats import Histogram
from bench.wire import VERSION, AsyncConn, error_code, pack
from bench.workers import Sync, WorkerGroup
from bench.workloads.common import MB, Ctx
from bench.workloads.produce import ProduceArgs, produce_worker

RECORD_SIZE = 1024
PRODUCERS = 2
INTERVAL_MS = 100


def consumers(quick: bool) -> tuple[int, int]:
    """(consumers, processes)."""
    return (100, 2) if quick else (1000, 4)


@dataclass(slots=True)
class CommitArgs:
    addr: str
    first: int  # this process's consumers are sub-<first> .. sub-<first + count - 1>
    count: int
    interval_ms: int
    warmup: float
    duration: float


async def commit_worker(a: CommitArgs, sync: Sync) -> None:
    conn = await AsyncConn.open(a.addr, timeout=10)
    names = [f"bench-sub-{a.first + i}" for i in range(a.count)]
    positions = await _open_all(conn, names)
    sync.ready()
    k = 0
    try:
        while True:
            k += 1
            t0 = await sync.wait_round(k)
            if t0 is None:
                return
            sync.report(k, await commit_round(conn, a, names, positions, t0))
    finally:
        await conn.aclose()


async def _open_all(conn: AsyncConn, names: list[str]) -> list[int]:
    ids = {}
    for name in names:
        rid = conn.new_id()
        ids[rid] = name
        await conn.send({"v": VERSION, "t": "sub_open", "id": rid, "name": name,
                         "consumer": name, "from": "start", "timeout_ms": 30_000})
    got: dict[str, int] = {}
    with trio.fail_after(60):
        while len(got) < len(names):
            r = await conn.recv()
            name = ids.pop(r.get("id"), None)
            if name is None:
                continue
            if error_code(r) is not None:
                raise RuntimeError(f"sub_open {name}: {r.get('error')}")
            got[name] = int(r["subscription"]["position"])
    return [got[n] for n in names]


async def commit_round(conn: AsyncConn, a: CommitArgs, names: list[str], positions: list[int],
                       t0: float) -> dict:
    m0, m1 = t0 + a.warmup, t0 + a.warmup + a.duration
    interval = a.interval_ms / 1000
    inflight: dict[int, tuple[int, float]] = {}  # rid -> (consumer index, sent at)
    busy = [False] * len(names)
    lat = Histogram()
    out = {"ok": 0, "skipped": 0}
    errors: dict[str, int] = {}

    async def receiver() -> None:
        while True:
            r = await conn.recv()
            entry = inflight.pop(r.get("id"), None)
            if entry is None:
                continue
            i, sent = entry
            busy[i] = False
            now = time.monotonic()
            code = error_code(r)
            if code is not None:
                errors[code] = errors.get(code, 0) + 1
            elif m0 <= now <= m1:
                out["ok"] += 1
                lat.record((now - sent) * 1e6)

    async def sender() -> None:
        n = len(names)
        k = 0
        while True:
            for i in range(n):
                due = t0 + k * interval + i * interval / n
                if due >= m1:
                    return
                delay = due - time.monotonic()
                if delay > 0:
                    await trio.sleep(delay)
                if busy[i]:
                    out["skipped"] += 1  # the last commit is not answered yet
                    continue
                positions[i] += 1
                rid = conn.new_id()
                busy[i] = True
                inflight[rid] = (i, time.monotonic())
                await conn.send_raw(pack({"v": VERSION, "t": "sub_commit", "id": rid,
                                          "name": names[i], "consumer": names[i],
                                          "position": positions[i], "timeout_ms": 10_000}))
            k += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await sender()
        with trio.move_on_after(15):
            while inflight:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    return {**out, "errors": errors, "lost": len(inflight), "latency": lat.to_json()}


def _accumulator(addr: str) -> dict:
    """The leader's accumulator counters (ops, entries) via sub_list."""
    from bench.wire import SyncConn

    with SyncConn(addr, timeout=10) as conn:
        r = conn.request({"t": "sub_list", "limit": 1})
    return r.get("service") or {}


def _release_together(groups: list[WorkerGroup], delay: float = 0.1) -> None:
    t0 = time.monotonic() + delay
    for g in groups:
        g.rounds += 1
        g.start_at.value = t0
        g.round_no.value = g.rounds


def steps(ctx_cfg) -> int:
    return 1 + 3 * ctx_cfg.repeats


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    warmup = 0.3 if cfg.quick else 1.0
    n, procs = consumers(cfg.quick)
    timeout = warmup + cfg.duration + 60
    alone, together, commits, p99, per_entry, cost = [], [], [], [], [], []
    details: dict = {"consumers": n, "processes": procs, "interval_ms": INTERVAL_MS,
                     "producers": PRODUCERS, "record_size": RECORD_SIZE, "rounds": []}
    with ctx.cluster() as cluster:
        leader = cluster.wait_for_leader()
        addr = cluster.nodes[leader].addr
        ctx.describe(f"subscriptions: opening {n} subscriptions")
        prod = ProduceArgs(addr, "quorum", RECORD_SIZE, cfg.batch_bytes, cfg.window, warmup,
                           cfg.duration)
        per = n // procs
        commit_args = [CommitArgs(addr, p * per, per, INTERVAL_MS, warmup, cfg.duration)
                       for p in range(procs)]
        with WorkerGroup(produce_worker, [prod] * PRODUCERS) as producers, \
                WorkerGroup(commit_worker, commit_args) as committers:
            ctx.advance("subscriptions")
            for r in range(cfg.repeats):
                ctx.describe(f"subscriptions: produce alone (repeat {r + 1})")
                cluster.wait_caught_up()
                _, res = producers.round(timeout=timeout)
                base = sum(x["ok_records"] for x in res) * RECORD_SIZE / cfg.duration / MB
                alone.append(base)
                ctx.advance("subscriptions")

                ctx.describe(f"subscriptions: {n} consumers committing every {INTERVAL_MS} ms "
                             f"(repeat {r + 1})")
                cluster.wait_caught_up()
                before = _accumulator(addr)
                _, cres = committers.round(timeout=timeout)
                after = _accumulator(addr)
                ops = after.get("ops", 0) - before.get("ops", 0)
                entries = after.get("entries", 0) - before.get("entries", 0)
                per_entry.append(ops / entries if entries else None)
                commits.append(sum(x["ok"] for x in cres) / cfg.duration)
                lat = Histogram()
                for x in cres:
                    lat.merge(Histogram.from_json(x["latency"]))
                p99.append(None if lat.percentile(0.99) is None else lat.percentile(0.99) / 1e3)
                ctx.advance("subscriptions")

                ctx.describe(f"subscriptions: produce while committing (repeat {r + 1})")
                cluster.wait_caught_up()
                _release_together([producers, committers])
                res2 = producers.collect(timeout)
                cres2 = committers.collect(timeout)
                both = sum(x["ok_records"] for x in res2) * RECORD_SIZE / cfg.duration / MB
                together.append(both)
                cost.append(100 * (1 - both / base) if base else None)
                details["rounds"].append({
                    "commit_errors": _merge([x["errors"] for x in cres + cres2]),
                    "commits_skipped": sum(x["skipped"] for x in cres),
                    "commits_lost": sum(x["lost"] for x in cres + cres2),
                    "ops": ops, "entries": entries,
                    "commits_per_s_with_produce": sum(x["ok"] for x in cres2) / cfg.duration,
                    "produce_errors": _merge([x["errors"] for x in res + res2])})
                ctx.advance("subscriptions")
    params = {"consumers": n, "interval_ms": INTERVAL_MS, "producers": PRODUCERS,
              "record_size": RECORD_SIZE, "acks": "quorum"}
    figures = [
        figure("subscriptions.commits_per_s", "subscriptions",
               f"{n} subscriptions committing every {INTERVAL_MS} ms", "commits/s", commits,
               params=params, target=(">=", 0.9 * n * 1000 / INTERVAL_MS)),
        figure("subscriptions.commit_p99_ms", "subscriptions", "commit latency p99", "ms", p99,
               better="lower", params=params),
        figure("subscriptions.ops_per_entry", "subscriptions",
               "subscription operations per log entry", "ops/entry", per_entry, params=params),
        figure("subscriptions.produce_alone.MBps", "subscriptions", "produce quorum 1KiB alone",
               "MB/s", alone, params=params),
        figure("subscriptions.produce_with_commits.MBps", "subscriptions",
               f"produce quorum 1KiB while {n} subscriptions commit", "MB/s", together,
               params=params),
        figure("subscriptions.produce_cost_pct", "subscriptions",
               "produce throughput lost to the commits", "%", cost, better="lower",
               params=params),
    ]
    return figures, details


def _merge(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out
