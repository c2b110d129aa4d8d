"""`failover`: how long writes stop when the leader dies (SIGKILL) or hands over (transfer).

A generator process keeps quorum writes going over several connections, each a closed loop
that follows NOT_LEADER hints and otherwise tries the next node. The parent kills the leader
at instant E; the figure is the time from E until the first write *sent after E* is
acknowledged by another node. The killed node is then restarted and allowed to catch up before
the next repeat, so every repeat starts from a healthy 3-node cluster.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import trio

from bench.disk import DiskNeed
from bench.results import figure
from bench.stats import Summary
from bench.wire import AsyncConn, WireError, error_code
from bench.workers import Sync, WorkerGroup
from bench.workloads.common import Ctx, batch_payload

TARGET_S = 2.0
MAX_OUTAGE_S = 15.0  # give up on a repeat after this long without a successful write
AFTER_RECOVERY_S = 0.5  # keep writing this long after recovery (the timeline shows it)
WARMUP_S = 1.0
LOOPS = 4
TIMELINE_POINTS = 3000


@dataclass(slots=True)
class FailoverArgs:
    addrs: list[str]
    old_addr: str  # the leader struck at the event: writes it acks do not end the outage
    loops: int = LOOPS
    record_size: int = 1024
    batch_bytes: int = 16 << 10
    request_timeout: float = 1.0


async def failover_worker(a: FailoverArgs, sync: Sync) -> None:
    payload, count = batch_payload(a.record_size, a.batch_bytes)
    sync.ready()
    k = 0
    while True:
        k += 1
        t0 = await sync.wait_round(k)
        if t0 is None:
            return
        sync.report(k, await failover_round(a, sync, payload, count))


async def failover_round(a: FailoverArgs, sync: Sync, payload: bytes, count: int) -> dict:
    events: list[tuple[float, float, bool, str]] = []  # (sent, replied, ok, addr)
    recovered_at: list[float] = []

    def finished(now: float) -> bool:
        ev = sync.event
        if sync.stopped:
            return True
        if ev <= 0:
            return False
        if now > ev + MAX_OUTAGE_S:
            return True
        return bool(recovered_at) and now > recovered_at[0] + AFTER_RECOVERY_S

    async def loop(k: int) -> None:
        idx = k % len(a.addrs)
        hint: str | None = None
        conn: AsyncConn | None = None
        while not finished(time.monotonic()):
            ts = time.monotonic()
            addr = hint or a.addrs[idx]
            try:
                if conn is None or conn.addr != addr:
                    if conn is not None:
                        await conn.aclose()
                    conn = None
                    conn = await AsyncConn.open(addr, timeout=a.request_timeout)
                    ts = time.monotonic()
                with trio.fail_after(a.request_timeout):
                    r = await conn.request({
                        "t": "produce", "acks": "quorum", "payload": payload, "count": count,
                        "timeout_ms": int(a.request_timeout * 1000), "producer_id": 0,
                        "sequence": -1, "timestamp_ms": int(time.time() * 1000)})
                now = time.monotonic()
                code = error_code(r)
                events.append((ts, now, code is None, addr))
                if code is None:
                    ev = sync.event
                    if ev > 0 and ts >= ev and addr != a.old_addr and not recovered_at:
                        recovered_at.append(now)
                    continue
                err = r.get("error") or {}
                hint = err.get("leader_addr") if code == "NOT_LEADER" else None
                if hint == addr:
                    hint = None
                if hint is None:
                    idx = (idx + 1) % len(a.addrs)
                await trio.sleep(0.005)
            except (OSError, ConnectionError, WireError, trio.TooSlowError,
                    trio.BrokenResourceError, trio.ClosedResourceError):
                events.append((ts, time.monotonic(), False, addr))
                if conn is not None:
                    await conn.aclose()
                conn = None
                hint = None
                idx = (idx + 1) % len(a.addrs)
                await trio.sleep(0.005)
        if conn is not None:
            await conn.aclose()

    async with trio.open_nursery() as nursery:
        for k in range(a.loops):
            nursery.start_soon(loop, k)
    return {"events": events}


def outage(events: list, event_at: float, old_addr: str) -> float | None:
    """Seconds from the event until the first write sent after it succeeded elsewhere."""
    done = [tr for ts, tr, ok, addr in events if ok and ts >= event_at and addr != old_addr]
    return (min(done) - event_at) if done else None


def timeline(events: list, event_at: float) -> list[tuple[float, float, bool]]:
    """(seconds since the event, latency ms, ok) per request, thinned for results.json."""
    pts = [(ts - event_at, (tr - ts) * 1e3, ok) for ts, tr, ok, _ in sorted(events)]
    step = max(1, len(pts) // TIMELINE_POINTS)
    return [p for i, p in enumerate(pts) if i % step == 0 or not p[2]]


def repeats(ctx_cfg) -> int:
    return 1 if ctx_cfg.quick else max(ctx_cfg.repeats, 3)


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    """Outage time only: nothing is read back, and a restarted leader may catch up by state transfer."""
    return DiskNeed()


def steps(ctx_cfg) -> int:
    return 2 * repeats(ctx_cfg)


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    n = repeats(ctx.cfg)
    details: dict = {"kill": [], "transfer": [], "transfer_supported": None,
                     "loops": LOOPS, "timeline_kill": [], "timeline_transfer": []}
    kill_s: list[float | None] = []
    transfer_s: list[float | None] = []
    with ctx.cluster() as cluster:
        cluster.wait_for_leader()
        for mode in ("kill", "transfer"):
            for r in range(n):
                ctx.describe(f"failover by {mode} (repeat {r + 1})")
                if mode == "transfer" and details["transfer_supported"] is False:
                    ctx.advance("failover")
                    continue
                cluster.wait_caught_up()
                leader = cluster.wait_for_leader()
                old_addr = cluster.nodes[leader].addr
                with WorkerGroup(failover_worker, [FailoverArgs(cluster.addrs, old_addr)]) as g:
                    g.release()
                    time.sleep(0.05 + WARMUP_S)  # writers reach steady state, then strike
                    ok = True
                    ev = g.mark_event()
                    if mode == "kill":
                        cluster.kill(leader, signal.SIGKILL)
                    else:
                        reply = cluster.admin(leader, {"t": "transfer_leader"})
                        ok = bool(reply.get("ok"))
                        details["transfer_supported"] = ok
                        if not ok:
                            details["transfer_error"] = reply.get("error")
                            g.stop_flag.value = 1
                    (res,) = g.collect(WARMUP_S + MAX_OUTAGE_S + AFTER_RECOVERY_S + 30)
                events = res["events"]
                secs = outage(events, ev, old_addr) if ok else None
                (kill_s if mode == "kill" else transfer_s).append(secs)
                details[mode].append({"leader": leader, "outage_s": secs,
                                      "requests": len(events),
                                      "failed": sum(1 for e in events if not e[2])})
                if r == 0 and ok:
                    details[f"timeline_{mode}"] = timeline(events, ev)
                if mode == "kill":
                    cluster.start_node(leader)
                    cluster.wait_for_leader()
                ctx.advance("failover")
    figures = [
        figure("failover.kill.s", "failover", "failover after SIGKILL of leader", "s", kill_s,
               better="lower", params={"repeats": n}, target=("<=", TARGET_S)),
        figure("failover.transfer.s", "failover", "failover by leadership transfer", "s",
               transfer_s, better="lower", params={"repeats": n}),
    ]
    details["kill_summary"] = Summary.of(kill_s).to_json()
    return figures, details

