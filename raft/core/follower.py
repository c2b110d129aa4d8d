"""The follower side of replication: accepting AppendEntries and heartbeats, the follower's
commit index, and the replies that carry its dirty and flushed offsets.

Rules held here:
- An append is accepted only if the log holds `prev_offset` with `prev_term` (log matching);
  otherwise the reply carries a conflict hint (recovery.probe) so the leader can jump back.
- Entries already held with the same term are never rewritten; a different term from some
  offset on means an old term's tail: it is truncated first, never at or below the commit index
  (InvariantViolation: fail-stop).
- Durable log changes (a truncation, the state transfer's reset, a repair) are handed to the
  driver (StorageWork, raft/core/ready.py) and the append is handled again once they are done;
  appends that arrive meanwhile are dropped (the leader resends on its next heartbeat's reply).
- Follower commit index = min(leader commit, own flushed offset, last offset verified to match
  this term's leader). Dirty data is never reported as committed.
- A `flush=True` request is answered only after the flush; `flush=False` (recovery) data is
  flushed on the deferred schedule (recovery.deferred_flush) and reported unasked.
- Replies carry this node's incarnation and standing (raft/core/incarnation.py), and a flushed
  offset never past damage, with the damaged offset to resend (raft/core/repair.py); an entry we
  hold damaged is written back from the leader's copy instead of being skipped.

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft.core import messages as m
from raft.core.ready import StorageWork
from raft.core.snapshot import TERM, StartState
from raft.core.types import InvariantViolation, Role
from recovery.deferred_flush import DeferredFlush
from recovery.probe import conflict_hint
from storage.api import OffsetOutOfRange, TailFull
from storage.batch import Batch

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from storage.api import LogStorage


class FollowerSide:
    """Follower-side state lives on RaftCore: `_leader_commit`, `_matched_upto`,
    `_held_replies`, `_reported_flushed`, `_deferred_flush`."""

    cfg: "RaftConfig"
    log: "LogStorage"
    _deferred_flush: DeferredFlush

    def _handle_append(self, msg: m.AppendEntries) -> None:
        self._follow(msg.src)
        if self._storage_running is not None:
            return  # the log is changing: dropped, resent (the one that asked for it resumes)
        log = self.log
        prev = msg.prev_offset
        batches = msg.batches
        if prev < log.start_offset - 1:
            # Below our log start: that prefix was committed (we only drop committed data), so
            # it matches; skip what we no longer hold.
            batches = [b for b in batches if b.last_offset >= log.start_offset]
            if batches and batches[0].base_offset != log.start_offset:
                batches = []  # not aligned with our start: wait for a better request
            prev = log.start_offset - 1
        elif prev > log.dirty_offset or log.term_at(prev) != msg.prev_term:
            if not (msg.log_start_reset and self._state_transfer(msg)):
                self._reject(msg)
            self._waits_for_storage(msg)  # (the reset: handled again from the new start)
            return
        elif msg.log_start_reset and not self._drop_damaged_prefix(msg):
            self._reject(msg)
            return
        if self._waits_for_storage(msg):
            return  # dropping a damaged prefix
        last = prev
        fresh: list[Batch] = []
        for b in batches:
            if not fresh and b.base_offset <= log.dirty_offset:
                if b.last_offset <= log.dirty_offset and log.term_at(b.last_offset) == b.term:
                    self._repair_if_damaged(b)
                    if self._waits_for_storage(msg):
                        return
                    last = b.last_offset
                    continue  # already held: not rewritten (unless damaged)
                # Our entries from here differ from the leader's (an old term's tail).
                self._truncate_suffix(b.base_offset - 1)
                self._waits_for_storage(msg)
                return
            fresh.append(b)
        if fresh:
            if fresh[0].base_offset != log.dirty_offset + 1:
                self._reject(msg)
                return
            # No CRC check here: the transport verified every batch as it decoded it
            # (raft/protocol/raft_frames.py), and hashing again would cost a second pass per byte.
            try:
                log.append(fresh)
            except TailFull:
                self._flush_wanted = True
                reply = self._append_reply(msg.src, msg.seq, False)
                reply.busy = True
                self._send(reply)
                return
            for b in fresh:
                self._applied_to_log(b)
            last = fresh[-1].last_offset
        self._matched_upto = max(self._matched_upto, last)
        self._leader_commit = max(self._leader_commit, msg.commit_index)
        self._advance_follower_commit()
        reply = self._append_reply(msg.src, msg.seq, True, last)
        if msg.flush and log.flushed_offset < last:
            self._flush_wanted = True
            self._held_replies.append(reply)
            return
        if self._deferred_flush.on_append(log.unflushed_bytes):
            self._flush_wanted = True
        self._send(reply)

    def _follow(self, leader: int) -> None:
        """A message from this term's leader: a (pre-)candidate of this term steps down."""
        if self.role != Role.FOLLOWER:
            self._become_follower(self.term, leader)
        elif self._failed_campaigns:
            self._failed_campaigns = 0  # a leader at last: timeouts back to [e, 2e)
            self._reset_randomized_timeout()
        self.leader_id = leader
        self._election_elapsed = 0

    def _state_transfer(self, msg: m.AppendEntries) -> bool:
        """Our log does not reach or match the leader's log start: restart it there with the
        state the leader holds at that start. Storage writes the new start and that state in
        one durable operation (handed to the driver) before anything after it is appended, so
        a crash either keeps the old log or has the new start with its tables; never batches
        without their state. False (the request is rejected) when the state does not decode
        or does not describe this start."""
        prev = msg.prev_offset
        if self.commit_index > prev:
            raise InvariantViolation(
                f"node {self.node_id}: reset to log start {prev + 1} would drop "
                f"committed offsets up to {self.commit_index}")
        state = None
        if msg.snapshot is not None:
            try:
                state = StartState.from_snapshot(msg.snapshot, self.snapshot_context())
            except ValueError:
                return False
            if state.start_offset != prev + 1 or state.states[TERM][0] != msg.prev_term:
                return False
        self._hand_off(StorageWork.reset(prev + 1, msg.prev_term, msg.snapshot),
                       lambda: self._after_reset(prev, state))
        return True

    def _after_reset(self, prev: int, state: StartState | None) -> None:
        """The log now starts at prev + 1: the tables are those of the state there."""
        if state is not None:
            self._restore_start_state(state)
        else:  # a leader that has no state at its start (a log reset before it was kept)
            self.producers.clear()
            self._mirror_open()
            self._configs = [c for c in self._configs if c.offset <= prev]
            if not self._configs:
                self._configs = [self._bootstrap_config()]
            self._hs_dirty = True

    def _reject(self, msg: m.AppendEntries) -> None:
        log = self.log
        reply = self._append_reply(msg.src, msg.seq, False)
        reply.reject_offset = msg.prev_offset
        reply.conflict_term, reply.conflict_offset = conflict_hint(log, msg.prev_offset)
        self._send(reply)

    def _handle_heartbeat(self, msg: m.Heartbeat) -> None:
        self._follow(msg.src)
        if self._storage_running is not None:
            return  # the reply reads the log, which the change holds: the next heartbeat's will
        # The leader sends min(commit, what it knows we match): safe to take up to our flush.
        self._leader_commit = max(self._leader_commit, msg.commit_index)
        self._matched_upto = max(self._matched_upto, msg.commit_index)
        self._advance_follower_commit()
        reply = self._heartbeat_reply(msg.src, msg.seq)
        if msg.quiesce:
            reply.quiesced = self._quiesce_follower(msg)  # raft/core/quiesce.py
        self._send(reply)

    def _advance_follower_commit(self) -> None:
        if self.role == Role.LEADER:
            return
        new = min(self._leader_commit, self._matched_upto, self.log.flushed_offset)
        if new > self.commit_index:
            self.commit_index = new

    def _truncate_suffix(self, after: int) -> None:
        if after < self.commit_index:
            raise InvariantViolation(
                f"node {self.node_id}: truncating after offset {after} would drop committed "
                f"offsets up to {self.commit_index}")
        self._hand_off(StorageWork.truncate_suffix(after), lambda: self._truncated(after))

    def _truncated(self, after: int) -> None:
        """The log ends at `after` now: forget what the dropped entries had built."""
        self.producers.truncate_after(after)
        self._mirror_truncated(after)
        if self._configs[-1].offset > after:
            self._configs = [c for c in self._configs if c.offset <= after]
            if not self._configs:
                self._configs = [self._bootstrap_config()]
            self._hs_dirty = True

    def _append_reply(self, dst: int, seq: int, success: bool,
                      last_appended: int = -1) -> m.AppendEntriesReply:
        log = self.log
        flushed = self._reportable_flushed()
        return m.AppendEntriesReply(
            self.node_id, dst, self.term, seq, success, last_appended if success else -1,
            log.dirty_offset, log.last_term(), flushed, self._term_or_zero(flushed),
            incarnation=self.incarnation, rejoining=not self.may_vote(),
            repair_from=self._repair_from())

    def _refresh_reply(self, reply: m.AppendEntriesReply) -> m.AppendEntriesReply:
        log = self.log
        reply.dirty_offset, reply.dirty_term = log.dirty_offset, log.last_term()
        reply.flushed_offset = self._reportable_flushed()
        reply.flushed_term = self._term_or_zero(reply.flushed_offset)
        reply.rejoining, reply.repair_from = not self.may_vote(), self._repair_from()
        return reply

    def _follower_flushed(self) -> None:
        """A follower's answers to a flush: the commit index it may take now, the replies
        that waited for the flush, and its own-schedule report to the leader."""
        self._advance_follower_commit()
        held, self._held_replies = self._held_replies, []
        for reply in held:
            if reply.last_appended <= self.log.flushed_offset:
                self._send(self._refresh_reply(reply))  # (its flushed offset: never past damage)
            else:
                self._held_replies.append(reply)
        flushed = self._reportable_flushed()
        if flushed > self._reported_flushed and not held and self.leader_id is not None:
            # Flushed on our own schedule: report so the leader can advance the commit index.
            self._ping(self.leader_id)
        self._reported_flushed = max(self._reported_flushed, flushed)

    def _ping(self, dst: int) -> None:
        """An unsolicited heartbeat reply to `dst` (what this node holds: its log's end and
        that end's term, its flushed offset). It reads the log, so while storage work runs
        (a truncation lowers the end on the driver's worker between the two reads) it is
        sent once stored()."""
        if self._storage_running is not None:
            self._pings_after_storage.add(dst)
            return
        self._send(self._heartbeat_reply(dst, 0))

    def _heartbeat_reply(self, dst: int, seq: int) -> m.HeartbeatReply:
        log = self.log
        flushed = self._reportable_flushed()
        return m.HeartbeatReply(self.node_id, dst, self.term, seq, log.dirty_offset,
                                log.last_term(), flushed, self._term_or_zero(flushed),
                                self.incarnation, not self.may_vote(), self._repair_from())

    def _tick_flush_schedule(self) -> None:
        """Followers flush deferred (flush=False) data after follower_flush_ticks."""
        if self.role == Role.LEADER:
            if self.log.dirty_offset > self.log.flushed_offset:
                self._flush_wanted = True
            return
        if self._deferred_flush.on_tick(self.log.dirty_offset, self.log.flushed_offset):
            self._flush_wanted = True

    def _term_or_zero(self, offset: int) -> int:
        try:
            return self.log.term_at(offset)
        except OffsetOutOfRange:
            return 0
