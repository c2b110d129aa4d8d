"""The node side of subscriptions: the leader's accumulator, applying the table, expiry, and the
retention hook.

The state lives in raft/core/subscription_table.py (pure; every node applies the same committed entries);
this module only moves things:
- `submit(op)`: a request's operation joins the accumulator (raft/core/subscription_batcher.py); the
  runner proposes one CONTROL entry per batch (quorum), and when it commits, applies the log
  through it and answers every requester with the verdict its operation got (`Applied`).
- `sync()`: a barrier through the log, so a read of the table (list, get) on a new leader sees
  every commit acknowledged before it.
- a maintenance task: keeps the table caught up on every node (followers too, so a new leader
  starts close), and on the leader proposes deletion of subscriptions unused past
  `--subscription-expiry-ms`.
- `retention_holds()`: the retention floor's holders when `--retention-respect-subscriptions`
  is on (registered with the group's RetentionTask, raft/node/retention.py, by
  `attach_retention` before retention's first pass).

The group starts `run` into its driver nursery; handlers (raft/node/api/subscribe.py) reach
the service as `ctx.group.subs`.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from typing import Any

import trio

from raft.core.retention import Hold
from raft.core.subscription_batcher import CommitBatcher, Outgoing
from raft.core.subscription_index import TABLE_KINDS, SubscriptionIndex
from raft.core.subscription_table import Applied, Op, OpRequest, Outcome, make_entry
from raft.core.types import Acks, ErrorCode
from raft.node import mirror_reads
from storage.api import OffsetOutOfRange
from storage.batch import CorruptBatch

log = logging.getLogger("raftlog.subscriptions")

MAINTENANCE_INTERVAL_S = 1.0
# Applied per event-loop step (bytes and batches, like the load index): the loop runs other
# tasks between steps. 4 MiB of 4 KiB batches held a node's loop 13-19 ms of CPU in the
# catch-up bench, the longest step of all (docs/PERFORMANCE.md, the 20 ms bound).
CATCH_UP_STEP_BYTES = 1 << 20
CATCH_UP_STEP_BATCHES = 1024
# What one maintenance step reads (in a worker thread) for the index: the loop applies at most
# CATCH_UP_STEP_BATCHES of it, headers mostly, so it may cover far more bytes than a step.
READ_STEP_BYTES = 16 << 20
MAINTENANCE_STEPS = 64  # steps per maintenance round (up to 1 GiB read), then the next round
EXPIRY_RETRY_S = 10.0  # an expiry delete that did not apply is proposed again after this


# The holder name (subscription_table.holds) of a link's position on this, its source,
# partition: raft.controller.links.link_subscription names it "__link.<sink>.<link>".
LINK_HOLDER = "subscription '__link."

class _Waiter:
    """One requester waiting for its operation's verdict."""

    __slots__ = ("event", "outcome")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.outcome: Outcome | None = None

    def resolve(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.event.set()


class SubscriptionService:
    def __init__(self, group: Any, *, expiry_ms: int = 0, respect_retention: bool = False,
                 batcher: CommitBatcher[_Waiter] | None = None) -> None:
        self.group = group
        self.index = SubscriptionIndex(group.log)
        self.batcher: CommitBatcher[_Waiter] = batcher or CommitBatcher()
        self.expiry_ms = expiry_ms
        self.respect_retention = respect_retention
        # Our entries carry (node id, incarnation, sequence): the incarnation keeps a restarted
        # node from taking an earlier run's entry for its own.
        self._incarnation = int.from_bytes(os.urandom(6), "big")
        self._awaiting: dict[tuple[int, ...], Outgoing[_Waiter]] = {}
        self._wake = trio.Event()
        self._expiring: dict[str, float] = {}
        self.entries_committed = 0
        self.requests = 0  # requests that brought operations (a sub_commit_many counts once)

    # -- requests ------------------------------------------------------------------------------
    @property
    def table(self) -> Any:
        return self.index.table

    async def submit(self, op: OpRequest, timeout_s: float) -> Outcome:
        """Queue `op` for the next entry and wait for its verdict."""
        refused = self._refuse()
        if refused is not None:
            return refused
        waiter = _Waiter()
        if not self.batcher.add(op, waiter, _mono_ms()):
            return self._backpressure()
        self.requests += 1
        self._wake.set()
        return await self._wait(waiter, timeout_s)

    async def submit_many(self, ops: list[OpRequest], timeout_s: float) -> list[Outcome]:
        """Queue every op of one request (sub_commit_many) and wait for all their verdicts, in
        order: one waiter each, no task each. An op the full accumulator refuses gets
        BACKPRESSURE on its own; ops still unanswered at the timeout get TIMEOUT."""
        refused = self._refuse()
        if refused is not None:
            return [refused] * len(ops)
        now = _mono_ms()
        waiters: list[_Waiter] = []
        for op in ops:
            waiter = _Waiter()
            if not self.batcher.add(op, waiter, now):
                waiter.resolve(self._backpressure())
            waiters.append(waiter)
        self.requests += 1
        self._wake.set()
        with trio.move_on_after(timeout_s):
            for waiter in waiters:
                await waiter.event.wait()
        return [w.outcome if w.outcome is not None else _timed_out() for w in waiters]

    async def sync(self, timeout_s: float) -> Outcome:
        """Wait until an entry proposed after this call is committed and applied: the table then
        holds everything acknowledged before the call (a linearizable read)."""
        refused = self._refuse()
        if refused is not None:
            return refused
        waiter = _Waiter()
        self.batcher.add_barrier(waiter, _mono_ms())
        self._wake.set()
        return await self._wait(waiter, timeout_s)

    def _backpressure(self) -> Outcome:
        return Outcome(ErrorCode.BACKPRESSURE,
                       f"{self.batcher.pending} subscription operations are waiting for the "
                       f"log; retry after a short backoff")

    def _refuse(self) -> Outcome | None:
        if self.group.closing:
            return Outcome(ErrorCode.SHUTTING_DOWN)
        if not self.group.is_leader():
            return Outcome(ErrorCode.NOT_LEADER)
        return None

    @staticmethod
    async def _wait(waiter: _Waiter, timeout_s: float) -> Outcome:
        with trio.move_on_after(timeout_s):
            await waiter.event.wait()
        return waiter.outcome if waiter.outcome is not None else _timed_out()

    # -- the runner ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Propose entries as the accumulator says, and keep the table current. Runs until the
        group's driver nursery is cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._guarded, self._maintenance, "subscriptions maintenance")
            try:
                while True:
                    self._wake = trio.Event()
                    now = _mono_ms()
                    while self.batcher.can_send(now):
                        nursery.start_soon(self._guarded, self._propose, "subscriptions",
                                           self.batcher.take())
                    due = self.batcher.due_at()
                    if due is None or self.batcher.inflight >= self.batcher.max_inflight:
                        await self._wake.wait()
                    else:
                        with trio.move_on_after(max(0, due - now) / 1000):
                            await self._wake.wait()
            finally:
                self._answer_all_waiting(ErrorCode.SHUTTING_DOWN)

    async def _guarded(self, fn: Any, where: str, *args: Any) -> None:
        """Run a task; an unexpected exception (a table that cannot apply the log, a storage
        fault while reading it) stops the node: it can no longer trust its table."""
        try:
            await fn(*args)
        except Exception as e:
            self.group.fail(e, where)

    async def _propose(self, out: Outgoing[_Waiter]) -> None:
        src = (self.group.node_id, self._incarnation, out.seq)
        self._awaiting[src] = out
        error, message = ErrorCode.OK, ""
        try:
            # A mirror's positions are visible offsets: bound them by its visible end + 1.
            batch = make_entry(src, out.ops, _wall_ms(), self.group.core.visible_end + 1
                               if self.group.translated else None)
            timeout_s = self.group.config.default_timeout_ms / 1000
            answer = await self.group.propose_and_wait(batch, Acks.QUORUM, timeout_s)
            error, message = answer.error, answer.message
            if error == ErrorCode.OK:
                self.entries_committed += 1
                await self.catch_up_to(answer.last_offset)
                if src in self._awaiting:
                    error = ErrorCode.TIMEOUT
                    message = ("the entry committed but is not applied here yet; retry (the "
                               "operation is idempotent)")
        finally:
            self.batcher.done()
            self._wake.set()
            leftover = self._awaiting.pop(src, None)
            if leftover is not None:
                self._answer(leftover, Outcome(error if error != ErrorCode.OK
                                               else ErrorCode.SHUTTING_DOWN, message))

    def _on_applied(self, applied: Applied) -> None:
        out = self._awaiting.pop(applied.src, None)
        if out is None:
            return  # another node's entry, or ours that we stopped waiting for
        if len(applied.outcomes) != len(out.slots):
            log.error("subscription entry at %d has %d verdicts for %d operations",
                      applied.offset, len(applied.outcomes), len(out.slots))
        for slot, outcome in zip(out.slots, applied.outcomes):
            for w in slot.waiters:
                w.resolve(outcome)
        for w in out.barriers:
            w.resolve(Outcome(ErrorCode.OK))

    @staticmethod
    def _answer(out: Outgoing[_Waiter], outcome: Outcome) -> None:
        for slot in out.slots:
            for w in slot.waiters:
                w.resolve(outcome)
        for w in out.barriers:
            w.resolve(outcome)

    def _answer_all_waiting(self, code: ErrorCode) -> None:
        for out in list(self._awaiting.values()):
            self._answer(out, Outcome(code))
        self._awaiting.clear()
        waiters, barriers = self.batcher.drain()
        for w in waiters + barriers:
            w.resolve(Outcome(code))

    # -- applying ------------------------------------------------------------------------------
    def catch_up(self, max_bytes: int = CATCH_UP_STEP_BYTES) -> bool:
        """Apply up to about max_bytes of committed batches; True if caught up."""
        return self.index.catch_up(self.group.core.commit_index, max_bytes,
                                   on_applied=self._on_applied, mine=self._is_mine,
                                   max_batches=CATCH_UP_STEP_BATCHES)

    def _is_mine(self, src: tuple[int, ...]) -> bool:
        return src in self._awaiting

    async def catch_up_to(self, offset: int) -> None:
        """Apply through `offset` (committed), yielding to the event loop between steps."""
        while self.index.table.applied < offset:
            before = self.index.table.applied
            self.catch_up()
            if self.index.table.applied == before:
                return  # nothing more can be applied now
            await trio.lowlevel.checkpoint()

    async def _catch_up_read_off_loop(self) -> bool:
        """One catch-up step whose read runs in a worker thread; True if caught up. Why: the
        index falls behind a fast producer between rounds, and what it then reads back is no
        longer among the newest headers held in memory; from LMDB that read waits on the disk
        once the logs outgrow the page cache (issue 28: 98% of the event loop's major faults
        at the retention limit of `bench produce`). A moved log start, or nothing to read,
        goes through the synchronous step, which handles them."""
        pending = self.index.next_read(self.group.core.commit_index)
        if pending is None:
            done = self.catch_up()
            await trio.lowlevel.checkpoint()
            return done
        log = self.group.log
        try:
            batches = await self.group.run_io(log.read_heads, pending.start, READ_STEP_BYTES,
                                              CATCH_UP_STEP_BATCHES, TABLE_KINDS)
        except (CorruptBatch, OffsetOutOfRange):
            return False  # damaged (repair fetches it again) or the start moved: next round
        if not batches or self.group.log is not log:
            return False
        done = self.index.apply_read(pending, batches, on_applied=self._on_applied,
                                     mine=self._is_mine)
        await trio.lowlevel.checkpoint()  # (an in-memory log reads inline: yield anyway)
        return done

    async def _maintenance(self) -> None:
        seen = -1
        while True:
            await trio.sleep(MAINTENANCE_INTERVAL_S)
            if not self.expiry_ms:
                # Nothing is newly committed while the group is quiesced and untouched.
                seen = await self.group.until_input(seen)
            for _ in range(MAINTENANCE_STEPS):
                before = self.index.table.applied
                if await self._catch_up_read_off_loop() or self.index.table.applied == before:
                    break  # caught up, or nothing applies now (damage, a moved start): next round
            if self.expiry_ms and self.group.is_leader():
                self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        for name, last_used in self.index.table.expired(_wall_ms(), self.expiry_ms):
            if now - self._expiring.get(name, -1e18) < EXPIRY_RETRY_S:
                continue
            self._expiring[name] = now
            log.warning("subscription_expired name=%s last_used_ms=%d expiry_ms=%d: deleting "
                        "it", name, last_used, self.expiry_ms)
            self.batcher.add(OpRequest(Op.DELETE, name, "", -1, last_used), _Waiter(),
                             _mono_ms())
        for name in [n for n, t in self._expiring.items() if now - t > 10 * EXPIRY_RETRY_S]:
            del self._expiring[name]
        self._wake.set()

    # -- retention (issue 15) ------------------------------------------------------------------
    def retention_holds(self) -> list[tuple[str, int, bool]]:
        """(holder, first offset it needs, a valve may release it) for retention's floor: with
        --retention-respect-subscriptions, every subscription's position (valves release
        them), and what the table has not applied yet (an entry there may create one); without
        it, the positions of cross-cluster links' subscriptions (`__link.*`) alone."""
        t = self.index.table
        chosen = t.holds()
        if not self.respect_retention:
            # Cross-cluster links hold retention whatever the setting (docs/REPLICATION.md):
            # the source keeps what a link has not mirrored, up to the valves.
            chosen = [(h, o) for h, o in chosen if h.startswith(LINK_HOLDER)]
            if not chosen:
                return []
        holds = [("subscriptions table (not applied yet)", t.applied + 1, False)]
        if self.group.translated:
            # Positions are visible offsets: each holds the log from the batch it reads next.
            at: dict[int, int] = {}
            for holder, position in chosen:
                if position not in at:
                    at[position] = mirror_reads.to_log(self.group, position)
                holds.append((holder, at[position], True))
            return holds
        holds.extend((holder, offset, True) for holder, offset in chosen)
        return holds

    def attach_retention(self, retention: Any) -> None:
        """Register `retention_holds` with the group's retention task (once, at start; the
        holds are empty while the setting is off)."""
        retention.holders.register(
            "subscriptions", lambda: [Hold(h, o, v) for h, o, v in self.retention_holds()])

    # -- views ---------------------------------------------------------------------------------
    def view(self, sub: dict[str, Any], hw: int, now_ms: int) -> dict[str, Any]:
        """A subscription as `sub_get`/`sub_list` show it: its fields, lag behind the visible
        high watermark in records and bytes, and the age of its last commit."""
        records, nbytes, exact = self.index.lag(*self._log_range(sub["position"], hw))
        last = sub["last_commit_ms"]
        return {**sub, "lag_records": records, "lag_bytes": nbytes, "lag_exact": exact,
                "lag_offsets": max(0, hw + 1 - sub["position"]),
                "last_commit_age_ms": max(0, now_ms - last) if last >= 0 else None}

    def lag_series(self, hw: int, limit: int) -> dict[str, Any]:
        """Per-subscription figures for /metrics (raft/node/metrics.py), bounded: the `limit`
        subscriptions furthest behind (lag in offsets, then name), how many were left out, and
        totals over every subscription (the skip count is the replicated table's, so it is the
        same on every node and survives a fail-over). One pass over the table, `limit` lag
        look-ups."""
        subs = self.index.table.subs.values()
        end = hw + 1
        top = heapq.nsmallest(limit, subs, key=lambda s: (s.position, s.name))
        series = []
        for s in top:
            records, _nbytes, _exact = self.index.lag(*self._log_range(s.position, hw))
            series.append({"name": s.name, "lag_offsets": max(0, end - s.position),
                           "lag_records": records, "skipped_offsets": s.skipped_offsets})
        return {"series": series, "left_out": len(self.index.table.subs) - len(series),
                "skipped_offsets": sum(s.skipped_offsets for s in subs),
                "resets": sum(s.resets for s in subs)}

    def _log_range(self, position: int, hw: int) -> tuple[int, int]:
        """[position, hw + 1) in log offsets, for the data counter: as given in a plain group;
        a translated group's positions and high watermark are visible offsets."""
        if not self.group.translated:
            return position, hw + 1
        return mirror_reads.to_log(self.group, position), self.group.core.commit_index + 1

    def status(self) -> dict[str, Any]:
        b = self.batcher
        low = self.index.table.min_position()
        return {"subscriptions": len(self.index.table.subs), "applied": self.index.table.applied,
                "pending_ops": b.pending, "inflight_entries": b.inflight,
                "requests": self.requests, "ops": b.ops_added, "coalesced": b.ops_coalesced,
                "entries": b.entries,
                "lowest": None if low is None else {"name": low[1], "position": low[0]}}


def _timed_out() -> Outcome:
    return Outcome(ErrorCode.TIMEOUT, "the subscription operation did not commit in time; it "
                                      "may still apply: retry (commits of the same position "
                                      "are harmless)")


def _mono_ms() -> int:
    return int(trio.current_time() * 1000)


def _wall_ms() -> int:
    return int(time.time() * 1000)
