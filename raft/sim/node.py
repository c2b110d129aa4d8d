"""One simulated node: the real RaftCore on a MemoryLog, driven exactly as raft/core/ready.py says.

Hard state is saved before the Ready's messages leave. One flush runs at a time and takes
simulated disk time; it covers what was appended before it started (`flush(upto=...)`), and only
then does the core hear `flushed()`. A crash drops everything past the flushed offset
(MemoryLog.crash) and any flush in progress, and the node restarts later with a fresh core on
the same log, as a real process would.

Storage faults (the `disk` nemesis: MemoryLog.fail_next) are handled as the runtime handles
them (raft/node/group.py): a full disk on a flush is retried later and on a metadata save holds
the Ready (its messages depend on it) until the save succeeds; any other storage error stops
the node at once (fail-stop: like a crash, nothing more is flushed) and it restarts later."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raft.core import messages as m
from raft.core.raft import RaftConfig, RaftCore
from raft.core.ready import ProduceAnswer, Ready, StorageWork
from raft.core.retention import Hold, Plan, RetentionPolicy, core_holds, plan
from raft.sim.loop import EventLoop
from raft.core.types import Role
from storage.api import DiskFull, Meta, StorageError
from storage.memory import MemoryLog

# Simulated time before a retry on a full disk, and before a fail-stopped node restarts.
DISK_FULL_RETRY_US = 2_000
FAIL_STOP_RESTART_US = 50_000


@dataclass(slots=True)
class DiskModel:
    min_flush_us: int = 300
    max_flush_us: int = 4_000


@dataclass
class SimNode:
    node_id: int
    loop: EventLoop
    rng: random.Random
    make_config: Callable[[int], RaftConfig]
    send: Callable[[m.Message], None]
    on_answer: Callable[[int, ProduceAnswer], None]
    on_event: Callable[["SimNode", str], None]
    tick_us: int = 10_000
    disk: DiskModel = field(default_factory=DiskModel)
    # Mutation hook for the teeth tests: a driver that forgets to persist the vote/term.
    persist_hard_state: bool = True
    # Retention as the runtime applies it (raft/node/retention.py), every few ticks; the
    # delete reaches the disk a simulated disk delay after the start moved in memory, so a
    # crash in between comes back with the longer log.
    retention: RetentionPolicy | None = None
    retention_every_ticks: int = 5
    # A proposal's Ready pass runs this long after it (0: at once), as a busy runtime's event
    # loop takes several requests before its next pass: proposals in between may be appended
    # as one batch (raft/core/merging.py).
    propose_ready_us: int = 0

    def __post_init__(self) -> None:
        self.log = self._open_log()
        self.up = False
        self.paused = False
        self.epoch = 0  # bumped on crash: stale timers and flush completions are ignored
        self.flushing = False
        self.flush_again = False
        self.inbox: list[m.Message] = []  # messages that arrived while paused
        self.ready_due = False  # a Ready pass is scheduled for proposals (propose_ready_us)
        self.core: RaftCore | None = None
        self.restarts = 0
        self.fail_stops = 0
        # Readys whose hard state could not be saved yet (full disk), in order.
        self.held: deque[Ready] = deque()
        self.ticks = 0
        self.quiet_ticks = 0  # ticks skipped because the core was quiesced
        self.retention_cuts = 0
        self.planned: Plan | None = None  # the retention cut about to be applied
        self.start()

    def recovery(self) -> Any:
        """The node's recovery budget for this core (recovery/budget.py); None: the core's own
        throttle (one group per node)."""
        return None

    def _open_log(self) -> MemoryLog:
        """A log of its own; a group on a many-group node (raft/sim/topics_node.py) opens
        its log from the node's store instead."""
        return MemoryLog(max_tail_bytes=64 << 20)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.core = RaftCore(self.make_config(self.node_id), self.log,
                             random.Random(self.rng.getrandbits(64)), recovery=self.recovery())
        self.up = True
        self.paused = False
        self.flushing = False
        self.flush_again = False
        self.held.clear()
        self.ready_due = False
        self.epoch += 1
        epoch = self.epoch
        self.loop.after(self.rng.randint(0, self.tick_us), lambda: self._tick(epoch))
        self.on_event(self, "start")

    def crash(self) -> None:
        """SIGKILL / power cut: the unflushed tail and the in-flight flush are lost."""
        if not self.up:
            return
        self.up = False
        self.epoch += 1
        self.inbox.clear()
        self.held.clear()
        self._lose_unflushed()
        self.core = None
        self.restarts += 1
        self.on_event(self, "crash")

    def _lose_unflushed(self) -> None:
        """What the crash does to storage: the log drops what it had not flushed."""
        self.log.crash()

    def fail_stop(self, error: StorageError) -> None:
        """A storage fault the node cannot trust itself after: stop now (what the runtime's
        RaftGroup.fail does) and come back later from the durable state."""
        self.fail_stops += 1
        self.on_event(self, f"fail-stop {type(error).__name__}")
        self.crash()
        epoch = self.epoch

        def restart() -> None:
            if self.epoch == epoch and not self.up:
                self.start()

        self.loop.after(FAIL_STOP_RESTART_US, restart)

    def pause(self) -> None:
        if self.up:
            self.paused = True

    def resume(self) -> None:
        if self.up and self.paused:
            self.paused = False
            inbox, self.inbox = self.inbox, []
            for msg in inbox:
                self.receive(msg)
            if self.up and self.flush_again and not self.flushing:
                # A flush that completed while paused was never reported to the core (replies
                # held for it stayed held until some later write's flush): report it now.
                self._start_flush()

    # -- inputs ----------------------------------------------------------------------------
    def _tick(self, epoch: int) -> None:
        if epoch != self.epoch or not self.up:
            return
        self.loop.after(self.tick_us, lambda: self._tick(epoch))
        if self.paused:
            return
        assert self.core is not None
        if self.core.quiesced:
            # What the runtime is to do (raft/core/quiesce.py): a quiesced core is not ticked.
            self.quiet_ticks += 1
        else:
            try:
                self.core.tick()
            except StorageError as e:
                self.fail_stop(e)
                return
            self.process()
        if not self.up:
            return  # the Ready stopped the node (a storage fault)
        self.ticks += 1
        if (self.retention is not None and self.ticks % self.retention_every_ticks == 0
                and self.up and self.core is not None):
            self._retain()

    def _retain(self) -> None:
        core = self.core
        assert core is not None and self.retention is not None
        p = plan(self.log, self.retention, self.retention_holds(),
                 now_ms=self.loop.now // 1000, free_bytes=None, ctx=core.snapshot_context())
        d = p.decision
        if d.cut <= d.start:
            return
        self.planned = p
        self.on_event(self, "retention-plan")  # the checkers look at the log before the cut
        self.planned = None
        held = self.log.retained_bytes
        self.log.advance_start(d.cut, p.snapshot, d.deleted_bytes)
        # The figure the runtime hands the LMDB log (which trusts it) is what the cut dropped.
        assert held - self.log.retained_bytes == d.deleted_bytes, (held, d.deleted_bytes)
        self.retention_cuts += 1
        self.on_event(self, "retention")
        epoch = self.epoch
        delay = self.rng.randint(self.disk.min_flush_us, self.disk.max_flush_us)
        self.loop.after(delay, lambda: self._persist_start(epoch))

    def retention_holds(self) -> list[Hold]:
        """What retention must keep: the core's holds (commit index, flushed offset, members)."""
        assert self.core is not None
        return list(core_holds(self.core.status()))

    def _persist_start(self, epoch: int) -> None:
        if epoch != self.epoch or not self.up:
            return
        try:
            self.log.persist_start()
        except DiskFull:  # the start stays advanced in memory; the runtime retries next round
            self.loop.after(DISK_FULL_RETRY_US, lambda: self._persist_start(epoch))
        except StorageError as e:
            self.fail_stop(e)

    def receive(self, msg: m.Message) -> None:
        if not self.up:
            return
        if self.paused:
            self.inbox.append(msg)
            return
        assert self.core is not None
        try:
            self.core.step(msg)
        except StorageError as e:
            self.fail_stop(e)
            return
        self.process()

    def peer_down(self, peer: int) -> None:
        """The node-level failure detector (raft/sim/liveness.py) reports `peer` down."""
        self._liveness(peer, down=True)

    def peer_up(self, peer: int) -> None:
        self._liveness(peer, down=False)

    def _liveness(self, peer: int, *, down: bool) -> None:
        if not self.up or self.paused or self.core is None:
            return
        try:
            (self.core.peer_down if down else self.core.peer_up)(peer)
        except StorageError as e:
            self.fail_stop(e)
            return
        self.process()

    def propose(self, request_id: int, batch, acks) -> bool:  # noqa: ANN001
        if not self.up or self.paused:
            return False
        assert self.core is not None
        try:
            self.core.propose(request_id, batch, acks)
        except StorageError as e:
            self.fail_stop(e)
            return True
        if not self.propose_ready_us:
            self.process()
        elif not self.ready_due:
            self.ready_due = True
            epoch = self.epoch
            self.loop.after(self.propose_ready_us, lambda: self._proposals_ready(epoch))
        return True

    def _proposals_ready(self, epoch: int) -> None:
        if epoch != self.epoch:
            return  # (crashed since: a new life schedules its own)
        self.ready_due = False
        if self.up and not self.paused and self.core is not None:
            self.process()  # (paused: the pass after resume() takes them)

    # -- the Ready loop --------------------------------------------------------------------
    def process(self) -> None:
        core = self.core
        assert core is not None
        self.held.append(core.ready())
        self._release_held()

    def _release_held(self) -> None:
        """Carry out held Readys in order; each one's hard state is saved before its messages
        leave. A full disk keeps them held and retries later."""
        while self.held and self.up:
            rd = self.held[0]
            if rd.hard_state is not None and self.persist_hard_state:
                hs = rd.hard_state
                try:
                    self.log.save_meta(Meta(hs.term, hs.voted_for, hs.config))
                except DiskFull:
                    epoch = self.epoch
                    self.loop.after(DISK_FULL_RETRY_US, lambda: self._retry_held(epoch))
                    return
                except StorageError as e:
                    self.fail_stop(e)
                    return
            self.held.popleft()
            self._carry_out(rd)

    def _retry_held(self, epoch: int) -> None:
        if epoch == self.epoch and self.up:
            self._release_held()

    def _carry_out(self, rd: Ready) -> None:
        self.on_event(self, "ready")
        for msg in rd.messages:
            self.send(msg)
        for answer in rd.answers:
            self.on_answer(self.node_id, answer)
        if rd.flush:
            if self.flushing:
                self.flush_again = True
            else:
                self._start_flush()
        if rd.storage is not None:
            # A durable log change (truncation, reset, repair): simulated disk time, like a
            # flush; the core goes on once it is done.
            epoch, work = self.epoch, rd.storage
            delay = self.rng.randint(self.disk.min_flush_us, self.disk.max_flush_us)
            self.loop.after(delay, lambda: self._storage_done(epoch, work))

    def _storage_done(self, epoch: int, work: StorageWork) -> None:
        if epoch != self.epoch or not self.up:
            return  # crashed first: the change never reached the disk (it is all or nothing)
        if self.paused:
            self.loop.after(self.tick_us, lambda: self._storage_done(epoch, work))
            return
        assert self.core is not None
        try:
            work.run(self.log)
            self.core.stored()
        except StorageError as e:
            self.fail_stop(e)
            return
        self.on_event(self, f"stored {work.op.value}")
        self.process()

    def _start_flush(self) -> None:
        self.flushing = True
        self.flush_again = False
        upto = self.log.dirty_offset
        epoch = self.epoch
        delay = self.rng.randint(self.disk.min_flush_us, self.disk.max_flush_us)
        self.loop.after(delay, lambda: self._flush_done(epoch, upto))

    def _flush_done(self, epoch: int, upto: int) -> None:
        if epoch != self.epoch or not self.up:
            return
        # Truncation may have cut below `upto` meanwhile: flush what is there.
        try:
            self.log.flush(min(upto, self.log.dirty_offset))
        except DiskFull:
            # Nothing was written; the tail stays in memory. Try again shortly.
            self.flushing = False
            self.loop.after(DISK_FULL_RETRY_US, lambda: self._retry_flush(epoch))
            return
        except StorageError as e:
            self.fail_stop(e)
            return
        self.flushing = False
        if self.paused:
            self.flush_again = True
            return
        assert self.core is not None
        self.core.flushed(self.log.flushed_offset)
        self.on_event(self, "flushed")
        self.process()
        if self.flush_again and not self.flushing:
            self._start_flush()

    def _retry_flush(self, epoch: int) -> None:
        if epoch == self.epoch and self.up and not self.flushing:
            self._start_flush()

    @property
    def is_leader(self) -> bool:
        return self.up and self.core is not None and self.core.role == Role.LEADER
