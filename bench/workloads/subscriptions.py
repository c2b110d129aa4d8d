"""`subscriptions`: commit throughput of many subscriptions, and what it costs producers.

One cluster, one run, three phases per repeat:
1. produce alone: quorum acks, 1 KiB records, PRODUCERS producer processes (the baseline);
2. commits alone: CONSUMERS consumers, each with its own subscription, each committing a new
   position every INTERVAL_MS (spread evenly over the interval), from COMMIT_PROCS processes.
   Each process is a consumer process as an application would write it: one `Client` shared
   by its consumers (`raft.client.Consumer`, `commit(position)`), so their commits travel
   together, many per `sub_commit_many` request (raft/client/commits.py); at most one commit
   in flight per consumer. Reported: acknowledged commits/s, commit latency, how many
   operations each log entry carried (the leader's accumulator counters, read through
   `sub_list`), and in the details how many commits each request carried;
3. both at once: produce throughput while the consumers commit. cost = 1 - (3) / (1).

Run it by name: `raftlog bench subscriptions` (it is not in the default set). Client processes
share the machine with the nodes, so on a small machine part of the cost is CPU the committing
clients take from the nodes; docs/SUBSCRIPTIONS.md reports both numbers with the machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from bench.disk import DiskNeed
from bench.results import figure
from bench.stats import Histogram
from bench.workers import Sync, WorkerGroup
from bench.workloads.common import MB, Ctx
from bench.workloads.produce import ProduceArgs, produce_worker
from raft.client import Client, Consumer, RaftlogError

RECORD_SIZE = 1024
PRODUCERS = 2
INTERVAL_MS = 100
COMMIT_TIMEOUT_S = 10.0


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
    # One Client per process, shared by all its consumers, as a consumer process would do:
    # their commits travel together (sub_commit_many; raft/client/commits.py).
    async with Client(a.addr, timeout=COMMIT_TIMEOUT_S) as client:
        consumers = [Consumer(client, f"bench-sub-{a.first + i}",
                              consumer_id=f"bench-sub-{a.first + i}", auto_commit_ms=0,
                              follow=False) for i in range(a.count)]
        for con in consumers:  # one at a time: the client's connection takes them in turn
            await con.open()
        sync.ready()
        async for k, t0 in sync.rounds():
            requests, commits = client.coalescer.requests, client.coalescer.commits
            result = await commit_round(consumers, a, t0)
            result["requests"] = client.coalescer.requests - requests
            result["request_commits"] = client.coalescer.commits - commits
            sync.report(k, result)


async def commit_round(consumers: list[Consumer], a: CommitArgs, t0: float) -> dict:
    """Every consumer commits a new position every interval, spread evenly over it, with at
    most one commit in flight: a slot that comes while its commit is unanswered is skipped
    (the next commit carries a later position), as a real consumer's auto-commit would."""
    m0, m1 = t0 + a.warmup, t0 + a.warmup + a.duration
    interval = a.interval_ms / 1000
    n = len(consumers)
    lat = Histogram()
    out = {"ok": 0, "skipped": 0}
    errors: dict[str, int] = {}
    inflight = [0]

    async def one(i: int, con: Consumer) -> None:
        offset = i * interval / n
        k = 0
        while True:
            due = t0 + k * interval + offset
            if due >= m1:
                return
            delay = due - time.monotonic()
            if delay > 0:
                await trio.sleep(delay)
            sent = time.monotonic()
            inflight[0] += 1
            try:
                await con.commit(con.committed + 1)
            except RaftlogError as e:
                inflight[0] -= 1
                errors[e.code] = errors.get(e.code, 0) + 1
            else:
                inflight[0] -= 1
                now = time.monotonic()
                if m0 <= now <= m1:
                    out["ok"] += 1
                    lat.record((now - sent) * 1e6)
            k += 1
            now = time.monotonic()
            while t0 + k * interval + offset < min(now, m1):
                out["skipped"] += 1  # its slot passed while the commit was unanswered
                k += 1

    # Commits still unanswered this long after the window are counted lost (and cancelled).
    with trio.move_on_after(max(0.0, m1 - time.monotonic()) + COMMIT_TIMEOUT_S + 5):
        async with trio.open_nursery() as nursery:
            for i, con in enumerate(consumers):
                nursery.start_soon(one, i, con)
    return {**out, "errors": errors, "lost": inflight[0], "latency": lat.to_json()}


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


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    """Throughput only: nothing is read back; the subscriptions' holders are released by the bench's --low-disk-mb valve."""
    return DiskNeed()


def steps(ctx_cfg) -> int:
    return 1 + 3 * ctx_cfg.repeats


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    cfg = ctx.cfg
    warmup = 0.3 if cfg.quick else 1.0
    n, procs = consumers(cfg.quick)
    timeout = warmup + cfg.duration + 60
    alone, together, commits, p99, per_entry, cost = [], [], [], [], [], []
    details: dict = {"consumers": n, "processes": procs, "interval_ms": INTERVAL_MS,
                     "clients": "one raft.client.Client per process, shared by its consumers",
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
                    "leader_requests": after.get("requests", 0) - before.get("requests", 0),
                    "commit_requests": sum(x["requests"] for x in cres),
                    "commits_per_request": (sum(x["request_commits"] for x in cres)
                                            / max(1, sum(x["requests"] for x in cres))),
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
