"""The retention task: applies raft/core/retention.py's policy to this node's log, in bounded slices,
without ever stalling the event loop on a delete.

Each round (every RETENTION_INTERVAL_S, or at once while a slice limit cut the last one short):
1. on the event loop: let the loads table catch up with the commit index (in small steps), then
   ask every holder where it needs the log from (commit index, flushed offset, members' flushed
   offsets on the leader, open Spark loads, registered holders such as subscriptions);
2. in a worker thread: plan one slice (read the front of the log, decide the cut, fold the
   dropped batches into the state at the new start: raft.core.retention.plan);
3. on the event loop: drop the plan if the log start changed meanwhile (a state transfer), else
   `log.advance_start(cut, state)`: the core sees the new start between two of its steps;
4. in a worker thread: `log.persist_start()` deletes the slice and writes the start with its
   state in one transaction. A full disk leaves it for the next round (the in-memory start
   stays advanced, which is safe); any other storage error stops the node (fail-stop).

Valves are logged loudly when they release a holder, and `report()` (in `status`) says what holds
retention back and what a valve skipped.

The policy is either fixed or read from a function at every round (a partition follows its
topic's settings: raft.node.topic_settings), so a topic alter takes effect without a restart.
While the policy keeps everything the task waits on an event (`wake()`), never on a timer: an
idle partition costs no work per tick.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import trio

from raft.core.retention import (
    LOG_END,
    SATISFIED,
    Hold,
    Holders,
    Plan,
    RetentionPolicy,
    core_holds,
    load_holds,
    plan,
)
from storage.api import DiskFull, OffsetOutOfRange

log = logging.getLogger("raftlog.retention")

# How often a round runs while there is nothing to delete. Between two rounds the log grows by
# the write rate times this, which is what the data directory holds beyond the retained size.
RETENTION_INTERVAL_S = 0.25
# A quiesced group (no input since its last round) runs a round only when an input comes, its
# settings change, or time alone could change the decision (an age limit, an age valve, the
# low-disk valve): then at most every QUIET_MAX_S, sooner for short ages. A node with 1,000
# idle partitions under a size limit must not make 4,000 rounds (each a status, a disk-usage
# call and a worker-thread hop) a second: that was 60% of a core (docs/PERFORMANCE.md).
QUIET_MAX_S = 30.0
# The loads table catches up in steps of this many bytes, yielding to the event loop between.
LOADS_CATCHUP_STEP = 4 << 20
LOADS_CATCHUP_STEPS = 64
# A flush that leaves the log this far past its size limit ends the pause between rounds at once
# (`on_flushed`): at least OVERSHOOT_MIN_BYTES, or a 64th of the limit.
OVERSHOOT_MIN_BYTES = 8 << 20
OVERSHOOT_FRACTION = 64
# Skip events remembered for status.
SKIP_HISTORY = 16


class RetentionTask:
    def __init__(self, group: Any, policy: RetentionPolicy | Callable[[], RetentionPolicy], *,
                 clock_ms: Callable[[], int] | None = None,
                 free_bytes: Callable[[], int | None] | None = None) -> None:
        self.group = group
        # A fixed policy, or where the current one is read (a topic's settings).
        self._policy_of: Callable[[], RetentionPolicy] = (
            policy if callable(policy) else (lambda: policy))
        self.follows_settings = callable(policy)
        self._wake = trio.Event()
        self.holders = Holders()
        self.holders.register("core", lambda: core_holds(group.core.status()))
        self.holders.register("loads", self._load_holds)
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._free_bytes = free_bytes or self._disk_free
        self._skipping: dict[str, str] = {}  # holder -> valve, while a valve releases it
        self._skips: list[dict[str, Any]] = []  # recent skip events, newest last
        self._last: dict[str, Any] = {}
        self.deleted_bytes = 0
        self.deleted_batches = 0
        self.rounds = 0
        self._cut_last = False  # the last round moved the log start
        self._bytes_after_round = 0  # the log's retained bytes when the last round ended

    @property
    def policy(self) -> RetentionPolicy:
        """The policy in force now (read again at every round)."""
        return self._policy_of()

    def wake(self) -> None:
        """The policy may have changed: an idle task looks again."""
        self._wake.set()

    def on_flushed(self) -> None:
        """A flush grew the log (the group calls this): past its size limit by more than the
        overshoot, the next round starts now instead of at the end of the pause. Why: with a
        round every RETENTION_INTERVAL_S only, a writer puts interval x rate bytes past the
        limit before the round that cuts them (50 MB at 200 MB/s), and the data file grows by
        as much; driven by the bytes too, the file stays within about the limit plus the
        overshoot plus a slice whatever the write rate (docs/RETENTION.md). One comparison
        per flush; no timer."""
        limit = self.policy.max_bytes
        if limit is None or self._last.get("held_by") or self._wake.is_set():
            return  # (held: what frees it is not a write; the timer's rounds look)
        log = self.group.log
        if log is None:
            return
        over = max(OVERSHOOT_MIN_BYTES, limit // OVERSHOOT_FRACTION)
        now = log.retained_bytes
        # Past the limit by `over`, and `over` written since the last round: at most one
        # round per `over` bytes written, so a log retention cannot cut (a batch larger than
        # the limit) never spins it.
        if now > limit + over and now - self._bytes_after_round >= over:
            self._wake.set()

    # -- holders -------------------------------------------------------------------------------
    def _load_holds(self) -> list[Hold]:
        loads = self.group.loads
        return [] if loads is None else load_holds(loads.index.table)

    async def _catch_up_loads(self) -> None:
        """The loads table must have applied what may be deleted (an entry it has not seen may
        open a load); catch it up in small steps so no single step stalls the event loop."""
        loads = self.group.loads
        if loads is None:
            return
        for _ in range(LOADS_CATCHUP_STEPS):
            before = loads.index.table.applied
            if loads.index.catch_up(self.group.core.commit_index, LOADS_CATCHUP_STEP):
                return
            if loads.index.table.applied == before:
                return
            await trio.lowlevel.checkpoint()

    def _disk_free(self) -> int | None:
        path = self.group.log.path
        if path is None:
            return None
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return None

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        seen = -1
        while True:
            if not self.policy.active:  # keeps everything: sleep until the settings change
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            seen = self.group.inputs  # what this round sees; a later input earns another
            try:
                more = await self.step()
            except DiskFull as e:
                log.error("retention_disk_full node=%d error=%s: the log start moved in memory "
                          "but the delete could not be written; retrying in %.0f s",
                          self.group.node_id, e, RETENTION_INTERVAL_S)
                more = False
            except Exception as e:  # a storage fault or a broken invariant: fail-stop
                self.group.fail(e, "retention")
                return
            if more:
                await trio.lowlevel.checkpoint()
            else:
                await self._pause(seen)
                if self._wake.is_set():
                    self._wake = trio.Event()

    async def _pause(self, seen: int) -> None:
        """Until the next round: RETENTION_INTERVAL_S while the group is awake (writes move
        the log); while it is quiesced, until an input, a settings change or, when time alone
        can change the decision, `_quiet_wait_s()`. A settings change always ends it at once."""
        group = self.group
        if not getattr(group, "quiet", False) or self._cut_last:
            # (After a cut: its own kick is an input; the next round comes after the usual
            # interval, as it always did, not at once.)
            with trio.move_on_after(RETENTION_INTERVAL_S):
                await self._wake.wait()
            return
        limit = self._quiet_wait_s()
        with trio.move_on_after(limit if limit is not None else float("inf")):
            async with trio.open_nursery() as nursery:
                async def until(wait: Callable[[], Any]) -> None:
                    await wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until, self._wake.wait)
                nursery.start_soon(until, lambda: group.until_input(seen))

    def _quiet_wait_s(self) -> float | None:
        """How long a quiesced group's decision can stay valid with no input: None when only
        inputs can change it (a size limit alone); QUIET_MAX_S for the low-disk valve (free
        space moves with other groups' writes, and 30 s is soon enough for one that writes
        nothing); for an age limit or valve, a twentieth of the shortest (a 7-day age waits
        30 s, a 3 s valve 0.25 s, as before), within [RETENTION_INTERVAL_S, QUIET_MAX_S]."""
        p = self.policy
        ages = [a for a in (p.max_age_ms, p.valve_age_ms) if a]
        if not ages:
            return QUIET_MAX_S if p.low_disk_bytes else None
        return min(QUIET_MAX_S, max(RETENTION_INTERVAL_S, min(ages) / 20_000))

    async def step(self) -> bool:
        """One round; True when a slice limit stopped it (there is more to delete now)."""
        group, policy = self.group, self.policy
        core, lg = group.core, group.log
        if not policy.active or core is None or lg is None or group.closing:
            return False
        self.rounds += 1
        await self._catch_up_loads()
        holds = self.holders.gather()
        now_ms, free = self._clock_ms(), self._free_bytes()
        before = (lg.start_offset, lg.start_term, lg.snapshot)
        ctx = core.snapshot_context()
        def stale() -> bool:  # a state transfer reset the log while the plan read it
            return ((lg.start_offset, lg.start_term) != before[:2]
                    or lg.snapshot is not before[2])

        try:
            p: Plan = await group._run_io(
                lambda: plan(lg, policy, holds, now_ms=now_ms, free_bytes=free, ctx=ctx))
        except (OffsetOutOfRange, ValueError):
            if stale():
                return False  # the reads raced the reset: plan again next round
            raise
        if stale():
            return False
        d = p.decision
        self._cut_last = d.cut > d.start
        self._note(p, holds, now_ms, free)
        if d.cut > d.start:
            if not p.had_state:
                log.warning("retention_without_state node=%d start=%d: this log start has no "
                            "stored state (it was reset by an older version); the producer "
                            "and loads tables start empty from here", group.node_id, d.start)
            lg.advance_start(d.cut, p.snapshot, d.deleted_bytes)  # the plan read them
            group.kick()
            await group._run_io(lg.persist_start)
            self.deleted_bytes += d.deleted_bytes
            self.deleted_batches += d.deleted_batches
            log.info("retention node=%d start=%d->%d deleted_bytes=%d batches=%d stopped_by=%s",
                     group.node_id, d.start, d.cut, d.deleted_bytes, d.deleted_batches,
                     d.stopped_by)
        self._bytes_after_round = lg.retained_bytes
        return d.more

    # -- reporting -----------------------------------------------------------------------------
    def _note(self, p: Plan, holds: list[Hold], now_ms: int, free: int | None) -> None:
        d = p.decision
        skipping = {s.holder: s.valve for s in d.skipped}
        for s in d.skipped:
            if self._skipping.get(s.holder) != s.valve:
                log.warning("retention_valve node=%d valve=%s skipped=%r offset=%d: deleting "
                            "data it still needs (it will get a state transfer when it comes "
                            "back)%s", self.group.node_id, s.valve, s.holder, s.offset,
                            f"; free disk {free >> 20} MiB" if free is not None else "")
                self._skips.append({"holder": s.holder, "offset": s.offset, "valve": s.valve,
                                    "at_ms": now_ms})
                del self._skips[:-SKIP_HISTORY]
        for holder in self._skipping.keys() - skipping.keys():
            log.info("retention_valve_closed node=%d holder=%r", self.group.node_id, holder)
        self._skipping = skipping
        stopped = d.stopped_by
        held_by = None if stopped in (SATISFIED, LOG_END) or stopped.startswith(
            ("retention_", "slice")) else stopped
        self._last = {"at_ms": now_ms, "start": d.start, "cut": d.cut,
                      "stopped_by": stopped, "held_by": held_by,
                      "holds": [{"holder": h.holder, "offset": h.offset, "valve": h.valve}
                                for h in sorted(holds, key=lambda h: h.offset)],
                      "free_disk_bytes": free}

    def report(self) -> dict[str, Any]:
        """For `status`: the policy, what holds retention back now, and what valves skipped."""
        p = self.policy
        lg = self.group.log
        out: dict[str, Any] = {
            "active": p.active,
            "policy": {"retention_bytes": p.max_bytes, "retention_ms": p.max_age_ms,
                       "retention_min_ms": p.min_age_ms, "retention_max_ms": p.valve_age_ms,
                       "low_disk_mb": p.low_disk_bytes >> 20},
            "start_offset": lg.start_offset if lg is not None else None,
            "retained_bytes": lg.retained_bytes if lg is not None else None,
            "deleted_bytes": self.deleted_bytes, "deleted_batches": self.deleted_batches,
            "skipping": [{"holder": h, "valve": v} for h, v in sorted(self._skipping.items())],
            "skipped": list(self._skips),
        }
        out.update(self._last)
        return out


def data_dir_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes the files under `path` take (for tests and tools: what retention bounds)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total
