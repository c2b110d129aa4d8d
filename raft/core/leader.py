"""The leader side of replication: appending proposals, sending what each follower lacks,
taking replies, and advancing the commit index.

Rules held here:
- Commit index = the highest offset N of the leader's *current term* such that a majority of
  voters has min(match, verified flushed) >= N; the leader counts its own flushed offset, never
  a dirty offset (raft.core.quorum.committed_index over FollowerProgress.durable_offset()).
- A follower's reported flushed (or dirty) offset counts only if the leader's own term at that
  offset equals the term the follower reported for it (`_matches_our_log`).
- Replies to requests sent before the last reset of a follower's stream (`seq < reset_seq`)
  may describe a log the follower no longer has: they neither raise match nor back off.
  Every reset moves `reset_seq`, including a probe resent because the follower answered a
  later heartbeat instead (`_handle_heartbeat_reply`).
- Replies from a data directory the configuration does not know for their sender never get
  here (raft/core/incarnation.py screens them); a reply reporting damage lowers what counts and gets
  the range resent (raft/core/repair.py); the leader's own flushed offset counts only up to its
  first damaged offset, and a damaged range is never sent.
- Leadership transfer: catch the target up, then TimeoutNow.

How a lagging follower is caught up (chunks, flush=False, the window, probing with term hints)
is recovery's (recovery/); this file calls it.

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from raft.core import messages as m
from raft.core.leader_state import Waiting
from raft.core.progress import FollowerProgress, ProgressState
from raft.core.quorum import committed_index, majority
from raft.core.types import Acks, ErrorCode
from recovery.probe import backoff_next
from recovery.stream import StreamLimits, next_chunk
from storage.api import TailFull
from storage.batch import Batch, CorruptBatch

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from recovery.budget import GroupRecovery
    from recovery.ratelimit import TokenBucket
    from storage.api import LogStorage


class LeaderSide:
    """Leader-only state is `self.leader` (raft/core/leader_state.py: progress, waiting produces,
    the transfer, the leader's clocks), None unless leading; RaftCore holds `_stream_limits`."""

    cfg: "RaftConfig"
    log: "LogStorage"
    _stream_limits: StreamLimits
    _recovery_throttle: "TokenBucket | None"
    _recovery_budget: "GroupRecovery | None"

    def transfer_leadership(self, to: int | None = None) -> None:
        """Hand leadership to `to` (or the most caught-up voter): catch it up, then TimeoutNow."""
        lead = self.leader
        if lead is None:
            raise ValueError(f"node {self.node_id} is not the leader; ask node "
                             f"{self.leader_id} instead")
        if self._quiesced:
            self._wake_leader()
        self._seal_open()  # (its writes go to the target with the rest)
        candidates = [v for v in self.config.voters if v != self.node_id]
        if to is None:
            if not candidates:
                raise ValueError("no other voter to transfer leadership to; add a node first")
            to = max(candidates, key=lambda v: (lead.progress[v].match_index, -v))
        elif to == self.node_id:
            return
        elif to not in candidates:
            raise ValueError(f"node {to} is not a voter of this cluster (voters: "
                             f"{list(self.config.voters)}); pick one of them")
        lead.transfer_target = to
        lead.transfer_elapsed = 0
        self._maybe_send_timeout_now()
        self._send_append(lead.progress[to])

    def _tick_leader(self) -> None:
        self._seal_open()
        lead = self.leader
        assert lead is not None
        lead.heartbeat_elapsed += 1
        lead.check_quorum_elapsed += 1
        for pr in lead.progress.values():
            pr.ticks_since_heard += 1
            if pr.inflight or pr.probe_sent:
                pr.ticks_since_ack += 1
                if pr.ticks_since_ack >= self.cfg.election_ticks:
                    # Requests or their replies were lost: start over from what is known.
                    pr.become_probe(pr.match_index + 1, self._next_seq_peek())
        quiescing = self._tick_quiesce()  # raft/core/quiesce.py
        if lead.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            lead.heartbeat_elapsed = 0
            for pr in lead.progress.values():
                if quiescing and pr.node_id in lead.quiesce_acked:
                    continue  # quiet already: it waits for the leader's next news
                self._seq += 1
                self._send(m.Heartbeat(self.node_id, pr.node_id, self.term,
                                       min(self.commit_index, pr.match_index), self._seq,
                                       quiesce=quiescing))
        if lead.transfer_target is not None:
            lead.transfer_elapsed += 1
            if lead.transfer_elapsed >= self.cfg.election_ticks:
                lead.transfer_target = None  # gave up: keep leading
        # Two election timeouts, not one: a leader whose event loop lags under a burst of
        # client load (replies queued, not lost) must not depose itself; an isolated leader
        # still steps down well before clients give up.
        if lead.check_quorum_elapsed >= 2 * self.cfg.election_ticks:
            lead.check_quorum_elapsed = 0
            if self.cfg.check_quorum:
                # (A follower that answered this quiescing round is quiet, not silent.)
                active = sum(1 for v in self.config.voters
                             if v == self.node_id or v in lead.quiesce_acked
                             or (v in lead.progress and lead.progress[v].recent_active))
                for pr in lead.progress.values():
                    pr.recent_active = False
                if active < majority(len(self.config.voters)):
                    self._become_follower(self.term, None)
                    return
        if quiescing:
            self._maybe_quiesced()  # (no follower left to ask: a single voter, or all down)
        self._admit_parked()  # (after a transfer gave up, say: not only when commits move)
        self._bcast_wanted = True

    def _append_as_leader(self, batch: Batch) -> Batch | None:
        """Place `batch` at the end of our log in our term, after the open batch of client
        writes (raft/core/merging.py); None when the unflushed tail is full (a flush is
        requested; the caller answers BACKPRESSURE or steps down)."""
        self._seal_open()
        return self._place_as_leader(batch)

    def _place_as_leader(self, batch: Batch) -> Batch | None:
        placed = batch.placed(self.log.dirty_offset + 1, self.term)
        try:
            self.log.append([placed])
        except TailFull:
            self._flush_wanted = True
            return None
        if self.leader is not None:
            self.leader.backlog.appended(placed.last_offset, placed.size)
        self._applied_to_log(placed)
        self._flush_wanted = True  # the leader flushes in parallel with replication
        self._bcast_wanted = True
        return placed

    def _send_append(self, pr: FollowerProgress) -> None:
        """Send what `pr` lacks, as far as its flow-control window allows (the chunks are
        planned by recovery.stream). Only a leader sends appends: a handler that made us step
        down (a removed leader's configuration committed) sends nothing more."""
        if self.leader is None:
            return
        log = self.log
        throttle, budget = self._recovery_throttle, self._recovery_budget
        # Every reply handler ends here, so a follower that a reply or flush report showed
        # at our tail stops counting as recovering before anything is planned for it.
        pr.settle_recovering(log.dirty_offset, self.commit_index)
        if budget is not None and not pr.recovering:
            budget.done(pr.node_id)  # caught up (or never behind): its slot is free
        while pr.can_send(self.cfg.max_inflight, self.cfg.max_inflight_bytes):
            if budget is not None:
                # The node's budget (recovery/budget.py): a recovering stream needs one of the
                # node's recovery slots and its bytes; a later tick resumes one held here. A
                # follower this group's commit quorum cannot do without goes first: the budget
                # bounds background catch-up, it must never stop a partition's writes.
                if pr.recovering and not self._quorum_needs(pr) and \
                        not budget.may_send(pr.node_id, self.cfg.recovery_chunk_bytes):
                    return
            elif (throttle is not None and pr.recovering
                    and throttle.delay_for(self.cfg.recovery_chunk_bytes) > 0):
                return  # the recovery budget is spent: a later tick resumes the stream
            try:
                chunk = next_chunk(log, pr.next_index,
                                   replicating=pr.state == ProgressState.REPLICATE,
                                   recovering=pr.recovering, limits=self._stream_limits,
                                   commit_index=self.commit_index)
            except CorruptBatch:
                return  # our copy is damaged (now recorded): raft/core/repair.py takes it from here
            if chunk is None:
                return  # nothing new; heartbeats carry the commit index
            # Recovering only while it still lacks committed entries: one that lacks only
            # the uncommitted pipeline is in step (tail-sized appends, each flushed).
            pr.recovering = not chunk.in_step
            self._seq += 1
            # A reset carries the state at our log start (the state transfer).
            self._send(m.AppendEntries(self.node_id, pr.node_id, self.term, chunk.prev_offset,
                                       log.term_at(chunk.prev_offset), chunk.batches,
                                       self.commit_index, chunk.flush, self._seq,
                                       log_start_reset=chunk.log_start_reset,
                                       snapshot=log.snapshot if chunk.log_start_reset else None))
            pr.sent(self._seq, chunk.last_offset, chunk.nbytes)
            if not chunk.flush and chunk.batches:
                if budget is not None:
                    budget.sent(chunk.nbytes)
                elif throttle is not None:
                    throttle.take(chunk.nbytes)
            if pr.state == ProgressState.PROBE or chunk.at_tail:
                return

    def _quorum_needs(self, pr: FollowerProgress) -> bool:
        """Whether the leader and its caught-up voters (replicating, not recovering, heard
        this quorum round) are short of a majority without `pr`: then `pr` catching up is what
        the group's writes wait for."""
        lead = self.leader
        assert lead is not None
        voters = self.config.voters
        healthy = 1 + sum(1 for q in lead.progress.values()
                          if q is not pr and q.node_id in voters and not q.recovering
                          and q.state == ProgressState.REPLICATE and q.recent_active)
        return healthy < majority(len(voters))

    def _handle_append_reply(self, msg: m.AppendEntriesReply) -> None:
        pr = self._progress_of(msg.src)
        if pr is None:
            return
        self._heard(pr)
        fresh = msg.seq >= pr.reset_seq
        self._note_offsets(pr, msg.dirty_offset, msg.dirty_term, msg.flushed_offset,
                           msg.flushed_term, fresh)
        if msg.success:
            if fresh:
                # Only a reply to a request sent since the last reset says what the follower
                # holds now; an older one may describe a tail it has since lost (a crash).
                pr.acked(msg.last_appended)
            pr.busy = False
        elif msg.busy:
            pr.busy = True  # resumes on its next flush report
            if pr.state == ProgressState.PROBE:
                pr.probe_sent = False
        elif fresh:
            self._back_off(pr, msg)
        self._note_damage(pr, msg.repair_from, fresh)
        self._note_copy_answer(msg)
        self._maybe_commit()
        self._maybe_promote(pr)
        self._maybe_send_timeout_now()
        self._send_append(pr)

    def _back_off(self, pr: FollowerProgress, msg: m.AppendEntriesReply) -> None:
        """The follower's log does not match at the request's prev offset: jump back a whole
        term (the conflict hint), or to its dirty offset + 1 when its log is too short."""
        nxt = backoff_next(self.log, msg.conflict_term, msg.conflict_offset,
                           msg.reject_offset)
        # Whatever the follower held beyond this point is no longer known to match.
        pr.match_index = min(pr.match_index, nxt - 1)
        pr.flushed_offset = min(pr.flushed_offset, pr.match_index)
        self._seq += 1
        pr.become_probe(nxt, self._seq)

    def _handle_heartbeat_reply(self, msg: m.HeartbeatReply) -> None:
        pr = self._progress_of(msg.src)
        if pr is None:
            return
        self._heard(pr)
        fresh = msg.seq != 0 and msg.seq >= pr.reset_seq
        self._note_offsets(pr, msg.dirty_offset, msg.dirty_term, msg.flushed_offset,
                           msg.flushed_term, fresh)
        if pr.busy and msg.flushed_offset >= msg.dirty_offset:
            pr.busy = False
        if fresh and msg.dirty_offset < pr.match_index:
            # It lost its unflushed tail (crash): replicate again from what it has.
            pr.match_index = max(pr.flushed_offset, min(pr.match_index, msg.dirty_offset))
            self._seq += 1
            pr.become_probe(msg.dirty_offset + 1, self._seq)
        elif fresh and pr.state == ProgressState.REPLICATE and pr.inflight.lost_before(
                msg.seq, msg.dirty_offset):
            # The follower answered a later heartbeat without having appended earlier
            # requests: they were lost (a dropped connection or queue). Resend from the match.
            self._seq += 1
            pr.become_probe(pr.match_index + 1, self._seq)
        elif fresh and pr.state == ProgressState.REPLICATE:
            self._heartbeat_accounts(pr, msg.seq)
        if pr.state == ProgressState.PROBE:
            if fresh and pr.probe_sent and pr.inflight.sent_before(msg.seq):
                # It answered a heartbeat that left after the probe, and not the probe: lost,
                # or its answer is late and may describe a tail a crash has since taken. The
                # resend is a reset like any other: answers from before it no longer count.
                self._seq += 1
                pr.become_probe(pr.next_index, self._seq)
            else:
                pr.probe_sent = False  # a probe may have been lost: try again
        self._note_damage(pr, msg.repair_from, fresh)
        self._note_copy_answer(msg)
        self._maybe_commit()
        self._maybe_promote(pr)
        self._maybe_send_timeout_now()
        self._send_append(pr)
        self._note_quiesce_answer(msg)  # raft/core/quiesce.py

    def _heartbeat_accounts(self, pr: FollowerProgress, seq: int) -> None:
        """A fresh heartbeat reply that shows nothing lost (the caller checked `lost_before`)
        accounts for every request sent before heartbeat `seq`: the follower holds them (its
        dirty offset, which matches our log, raised match_index), so they leave the window as
        an ack would release them, and whatever is still in flight was sent after the
        heartbeat (on an ordered connection, behind it: the outbox lowers a heartbeat's seq
        below any append of its group still queued on the link). So nothing is overdue: the
        count of ticks without an ack starts again. Why: many groups share one peer link, so a
        group's appends can wait behind other groups' data (or its replies behind a slow
        flush) longer than election_ticks; counting that as loss restarted the stream from
        the match index, withdrew what was queued and re-read it from disk, at 64 partitions
        a third of all appends sent (docs/PERFORMANCE.md, "Per-partition cost"). A follower
        that stops answering altogether still ages into a probe (_tick_leader)."""
        pr.acked_bytes += pr.inflight.release_upto(pr.match_index)
        if not pr.inflight.sent_before(seq):
            pr.ticks_since_ack = 0

    def _note_offsets(self, pr: FollowerProgress, dirty: int, dirty_term: int, flushed: int,
                      flushed_term: int, fresh: bool) -> None:
        pr.dirty_offset = dirty
        if self._matches_our_log(flushed, flushed_term):
            pr.note_flushed(flushed)
        if fresh and self._matches_our_log(dirty, dirty_term) and dirty > pr.match_index:
            pr.match_index = dirty
            if pr.state == ProgressState.PROBE:
                pr.become_replicate()
            pr.next_index = max(pr.next_index, dirty + 1)

    def _note_damage(self, pr: FollowerProgress, repair_from: int, fresh: bool) -> None:
        if repair_from >= 0:
            self._schedule_repair(pr, repair_from)
        elif fresh:
            pr.repair_at = -1

    def _matches_our_log(self, offset: int, term: int) -> bool:
        log = self.log
        if offset < log.start_offset - 1 or offset > log.dirty_offset:
            return False
        return log.term_at(offset) == term

    def _progress_of(self, node_id: int) -> FollowerProgress | None:
        """The leader's progress of `node_id`; None when we do not lead or it is no member."""
        return None if self.leader is None else self.leader.progress.get(node_id)

    def _heard(self, pr: FollowerProgress) -> None:
        pr.ticks_since_heard = 0
        pr.recent_active = True

    def _maybe_commit(self) -> None:
        lead = self.leader
        if lead is None:
            return
        durable = {self.node_id: self._reportable_flushed()}
        for v in self.config.voters:
            if v != self.node_id:
                pr = lead.progress.get(v)
                durable[v] = pr.durable_offset() if pr is not None else -1
        if self.node_id not in self.config.voters:
            del durable[self.node_id]  # removed leader: manages but does not count
        candidate = committed_index(durable.values())
        if candidate > self.commit_index and candidate <= self.log.dirty_offset and \
                self.log.term_at(candidate) == self.term:
            self.commit_index = candidate
            lead.backlog.committed(candidate)
            self._answer_committed()
            self._on_commit()
            self._admit_parked()  # writes that waited for room (raft/core/backlog.py)

    def _answer_committed(self) -> None:
        lead = self.leader
        if lead is None:
            return
        while lead.waiting and lead.waiting[0].last_offset <= self.commit_index:
            w = lead.waiting.popleft()
            self._answer(w.request_id, ErrorCode.OK, base_offset=w.base_offset,
                         last_offset=w.last_offset, duplicate=w.duplicate)

    def _answer_duplicate(self, request_id: int, base: int, last: int, acks: Acks) -> None:
        lead = self.leader
        assert lead is not None  # (propose answers NOT_LEADER first)
        if acks == Acks.QUORUM and last > self.commit_index:
            # The original is not committed yet: answer with it.
            lead.waiting.append(Waiting(request_id, base, last, duplicate=True))
            lead.waiting = deque(sorted(lead.waiting, key=lambda w: w.last_offset))
            return
        self._answer(request_id, ErrorCode.OK, base_offset=base, last_offset=last,
                     duplicate=True)

    def _maybe_send_timeout_now(self) -> None:
        lead = self.leader
        to = None if lead is None else lead.transfer_target
        if to is None:
            return
        pr = self._progress_of(to)
        if pr is None:
            return
        # Caught up: everything we hold, or (raft/core/repair.py) everything we can still send it,
        # up to a damaged batch of ours it lacks. The vote rules stay whole: our entries past
        # that batch are ours alone unless a majority's votes say otherwise.
        ready = self.log.dirty_offset
        blocked = [d.first for d in self.log.damaged() if d.first > pr.match_index]
        if blocked:
            ready = min(ready, min(blocked) - 1)
        if pr.match_index >= ready:
            self._send(m.TimeoutNow(self.node_id, to, self.term))
