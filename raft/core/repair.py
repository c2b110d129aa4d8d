"""Repair: a damaged flushed batch is neither served nor counted, and comes back from a copy.

Storage records a flushed batch that fails its checksum as damaged (found by the open-time check,
the scrubber or a read: storage/damage.py) and never returns it. The rules here:

- A node never reports a flushed offset past its first damaged offset (`_reportable_flushed`):
  its replies say flushed = just before the damage and `repair_from` = the damage, so the leader
  stops counting the range toward commits; a leader counts its own flushed offset the same way.
- The leader answers `repair_from` by sending the range again (a probe from the damaged offset,
  `_schedule_repair`); the follower writes each damaged batch back in place (`log.repair`: the
  same offsets and term, by log matching), then serves and counts it again. Nothing around it
  moves: the node's log, its vote and its commit index stay as they were.
- A node with damage campaigns only after twice the election timeout, so a whole node leads
  first; as leader it could not send the range to anyone (but see the next rule).
- A leader that finds damage in its own log never truncates it: a leader's log is the reference,
  and an entry it holds may already be committed on a majority it has not heard from. It hands
  leadership to a voter that has the range, which then repairs it. If no voter has it and every
  voter has answered, nobody has a good copy: when the range is not committed the leader steps
  down (a leader without it overwrites it); when it is committed, the node stops with DataLost
  naming the range (loud, never a silent loss).
- "Every voter has answered" is kept as evidence, not inferred from silence (`CopyCensus`): a
  voter counts as answered without a good copy only once a reply of this term, to a request
  sent after the leader knew of the damage, shows its log ends before the range or holds it
  damaged. A voter that is down, or whose reply could not tell (a log that diverges from ours
  before the range), is waited for: a voter that was simply not heard from yet may be the one
  holding the only good copy (simulation seed 29782835, issue 24). Status names the voters a
  leader waits for (`damage_waiting_for`); it repairs as soon as one of them turns up with a
  good copy.

A node that lost flushed batches whose position is unknown (a damaged header, a missing batch)
has its log cut at open instead (storage/lmdb_format.py), and keeps the position it held
(`log.lost_position`) for its votes (raft/core/election.py).

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raft.core import messages as m
from raft.core.membership import ClusterConfig, ConfigEntry
from raft.core.progress import FollowerProgress, ProgressState
from raft.core.ready import StorageWork
from raft.core.snapshot import TERM, StartState
from raft.core.types import DataLost, Role
from storage.batch import Batch, BatchKind, CorruptBatch
from storage.damage import Damage
from storage.mirrored import visible_last

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from storage.api import LogStorage


@dataclass(slots=True)
class CopyCensus:
    """A leader's evidence about its first damaged batch: which voters answered without a good
    copy of it. Kept per (term, first damaged offset); only replies to requests sent after it
    began count (`since_seq`), the latest reply of each voter winning, so a reply describing a
    log from before the damage was known never counts."""

    term: int = -1
    first: int = -1
    since_seq: int = 0
    answers: dict[int, tuple[int, bool]] = field(default_factory=dict)  # voter -> (seq, lacks)

    def follow(self, term: int, first: int, seq: int) -> None:
        if (self.term, self.first) != (term, first):
            self.term, self.first, self.since_seq = term, first, seq
            self.answers.clear()

    def note(self, voter: int, seq: int, lacks: bool) -> None:
        if seq > self.since_seq and seq >= self.answers.get(voter, (0, False))[0]:
            self.answers[voter] = (seq, lacks)

    def lacking(self, voter: int) -> bool:
        return self.answers.get(voter, (0, False))[1]


class Repairs:
    """State lives on RaftCore: `_damage_seen` (the storage damage version acted on),
    `_damage_ticks` (ticks a leader has held damage without a holder) and `_copy_census`."""

    cfg: "RaftConfig"
    log: "LogStorage"
    _copy_census: CopyCensus

    def _reportable_flushed(self) -> int:
        """The flushed offset this node may report and count: never past damage."""
        first = self.log.first_damaged()
        flushed = self.log.flushed_offset
        return flushed if first is None else min(flushed, first - 1)

    def _repair_from(self) -> int:
        first = self.log.first_damaged()
        return -1 if first is None else first

    def _damaged(self) -> bool:
        return self.log.first_damaged() is not None

    def _tick_repair(self) -> None:
        version = self.log.damage_version
        if version != self._damage_seen:
            self._damage_seen = version
            self._damage_ticks = 0
            if self.role != Role.LEADER and self.leader_id is not None:
                # Tell the leader now: it stops counting the range and sends it again.
                self._ping(self.leader_id)
        if self.role == Role.LEADER and self._damaged():
            self._damage_ticks += 1
            self._leader_damaged(self.log.damaged()[0])

    def _leader_damaged(self, d: Damage) -> None:
        self._copy_census.follow(self.term, d.first, self._seq)
        holders = self._holders(d)
        if holders:
            if self.leader.transfer_target is None:
                best = max(holders, key=lambda pr: (pr.match_index, -pr.node_id))
                self.transfer_leadership(best.node_id)
            return
        others = [v for v in self.config.voters if v != self.node_id]
        if d.first > self.commit_index:
            if self._damage_ticks < self.cfg.election_ticks or any(
                    v not in self.leader.progress
                    or self.leader.progress[v].ticks_since_heard >= self.cfg.election_ticks
                    for v in others):
                return  # a voter we have not heard from lately may hold it: wait
            self._become_follower(self.term, None)  # only ours and not committed: overwritten
            return
        # Committed: lost only when every voter has answered without a good copy.
        waiting = self._damage_waiting_for()
        if self._damage_ticks < self.cfg.election_ticks or waiting:
            return  # a voter that has not answered may hold a good copy: wait for it
        raise DataLost(
            f"node {self.node_id}: committed {d.describe()} is damaged here and no other voter "
            f"has a good copy (voters {others} all answered without one), so it is lost; "
            f"stopping rather than serving a log with a hole. See docs/DISK-LOSS.md, 'No "
            f"member has a good copy'")

    def _holders(self, d: Damage) -> list[FollowerProgress]:
        progress = self.leader.progress
        return [progress[v] for v in self.config.voters
                if v in progress and progress[v].durable_offset() >= d.last]

    def _damage_waiting_for(self) -> list[int]:
        """Leader holding a damaged batch that no voter is known to hold: the voters it still
        waits to hear from (a good copy may be theirs) before it may declare the batch lost;
        [] otherwise. Shown by status."""
        if self.role != Role.LEADER or not self._damaged():
            return []
        d = self.log.damaged()[0]
        if self._holders(d):
            return []  # handing over to one of them
        census = self._copy_census
        known = (census.term, census.first) == (self.term, d.first)
        return [v for v in self.config.voters
                if v != self.node_id and not (known and census.lacking(v))]

    def _note_copy_answer(self, msg: m.AppendEntriesReply | m.HeartbeatReply) -> None:
        """Leader: a voter's reply, as evidence about our first damaged batch. It lacks a good
        copy when its log ends before the batch does, or its own copy is damaged; anything
        else (it may hold it, unflushed or in a log that diverges from ours) is not evidence."""
        first = self.log.first_damaged()
        if self.role != Role.LEADER or first is None or msg.src not in self.config.voters:
            return
        d = self.log.damaged()[0]
        self._copy_census.follow(self.term, d.first, self._seq)
        lacks = msg.dirty_offset < d.last or d.first <= msg.repair_from <= d.last
        self._copy_census.note(msg.src, msg.seq, lacks)

    def _schedule_repair(self, pr: FollowerProgress, first: int) -> None:
        """A follower reports damage from `first`: stop counting it, send the range again."""
        pr.flushed_offset = min(pr.flushed_offset, first - 1)
        if pr.repair_at == first and pr.state == ProgressState.PROBE:
            return  # the resend is on its way
        pr.repair_at = first
        self._seq += 1
        # Gone from our log too (retention deleted it, so it was committed): the follower drops
        # it with its prefix, taking the state at our log start (_drop_damaged_prefix).
        pr.become_probe(first if first >= self.log.start_offset else self.log.start_offset - 1,
                        self._seq)

    def _drop_damaged_prefix(self, msg: m.AppendEntries) -> bool:
        """Follower: the leader's log starts at `msg.prev_offset + 1` and our log matches it
        there, but we hold damage below that start. The cluster deleted that range (retention
        deletes only committed entries), so nobody can send it again: cut our log at the
        leader's start with the state there, as retention would have, then rebuild the tables
        from that state and what we hold after it. False when the state does not describe that
        start (the request is refused). Waits (True, nothing done) while the start is not
        flushed here yet."""
        prev, first = msg.prev_offset, self.log.first_damaged()
        if (first is None or first > prev or prev > self.log.flushed_offset
                or msg.snapshot is None):
            return True
        try:
            state = StartState.from_snapshot(msg.snapshot, self.snapshot_context())
        except ValueError:
            return False
        if state.start_offset != prev + 1 or state.states[TERM][0] != msg.prev_term:
            return False
        self._hand_off(StorageWork.truncate_prefix(prev + 1, msg.snapshot),
                       lambda: self._restore_start_state(state), self._rebuild_from_log)
        return True

    def _repair_if_damaged(self, b: Batch) -> None:
        """Follower: `b` is the leader's copy of an entry we hold (same offsets and term); if
        ours is damaged, write it back."""
        d = self.log.first_damaged()
        if d is None or d > b.last_offset:
            return
        hit = [x for x in self.log.damaged() if x.first == b.base_offset]
        if hit and (hit[0].last, hit[0].term) == (b.last_offset, b.term):
            self._hand_off(StorageWork.repair([b]))
            # Bookkeeping the start-up rebuild skipped while it was unreadable: the producer
            # table takes it in its place in log order, and can tell retries again.
            self.producers.record(b)
            if b.kind == BatchKind.MIRRORED:  # (visible offsets grow with log offsets)
                self.visible_end = max(self.visible_end, visible_last(b))
            if (b.kind == BatchKind.CONFIG and b.base_offset > self._configs[0].offset
                    and all(c.offset != b.base_offset for c in self._configs)):
                self._configs.append(ConfigEntry(b.base_offset, b.term,
                                                 ClusterConfig.from_batch(b)))
                self._configs.sort(key=lambda c: c.offset)
                self._hs_dirty = True

    def _read_or_skip(self, offset: int, max_bytes: int) -> tuple[list[Batch], int]:
        """Batches from `offset`, or ([], the offset after the damage) when the batch there is
        damaged (the producer table and configuration rebuild skip what they cannot read)."""
        try:
            return self.log.read(offset, max_bytes), -1
        except CorruptBatch:
            hit = [d for d in self.log.damaged() if d.first <= offset <= d.last]
            if not hit:
                raise
            return [], hit[0].last + 1
