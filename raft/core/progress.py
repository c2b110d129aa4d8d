"""What the leader knows about one follower (etcd's tracker/progress.go, plus the RFC's dirty
and flushed offsets).

Two offsets matter and must not be confused:
- `match_index`: the follower's log equals the leader's up to here (it may be unflushed);
  replication continues from `next_index`.
- `flushed_offset`: the follower has fsynced up to here AND its entry there carries the leader's
  term at that offset (checked on receipt), so by log matching that prefix is the leader's.
Only `durable_offset()` counts towards the commit index. Dirty offsets never do: a follower that
crashes loses its unflushed tail, and a quorum-acked write must survive that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from recovery.window import InflightWindow


class ProgressState(str, Enum):
    # One request at a time until the match point is known (after election, reject or stall).
    PROBE = "probe"
    # Match point known: pipeline up to the in-flight limits.
    REPLICATE = "replicate"


@dataclass(slots=True)
class FollowerProgress:
    node_id: int
    next_index: int
    match_index: int = -1
    dirty_offset: int = -1  # last reported, as the follower said it (not verified)
    flushed_offset: int = -1  # last reported AND verified against the leader's terms
    learner: bool = False
    state: ProgressState = ProgressState.PROBE
    # In probe state: a request is out and we wait for its answer (or a heartbeat reply).
    probe_sent: bool = False
    # Requests sent and not yet acknowledged (recovery.window).
    inflight: InflightWindow = field(default_factory=InflightWindow)
    # Replies to requests sent before the last reset (seq < reset_seq) may describe a log the
    # follower no longer has (it crashed and lost its unflushed tail): they may not raise
    # match_index or trigger another back-off.
    reset_seq: int = 0
    # Set while catch-up needs more than one request (the RFC's recovery); shown in status.
    # Set by the chunk planner when a chunk stops short of the leader's tail and of its commit
    # index; cleared by it when one reaches either, and by `settle_recovering` when a reply or
    # flush report shows the follower holds the tail or everything committed already.
    recovering: bool = False
    # Follower answered "busy" (its unflushed tail is full): wait for a flush report.
    busy: bool = False
    ticks_since_heard: int = 0
    ticks_since_ack: int = 0
    # CheckQuorum: heard from since the last check.
    recent_active: bool = False
    # Bytes acknowledged (for the runtime's catch-up rate), monotonic.
    acked_bytes: int = 0
    # The follower reported damage from here (raft/core/repair.py) and the range is being resent.
    repair_at: int = -1

    @property
    def inflight_bytes(self) -> int:
        return self.inflight.bytes

    def durable_offset(self) -> int:
        """What this follower contributes to the commit index: matched AND flushed."""
        return min(self.match_index, self.flushed_offset)

    def can_send(self, max_inflight: int, max_inflight_bytes: int) -> bool:
        if self.busy:
            return False
        if self.state == ProgressState.PROBE:
            return not self.probe_sent
        return not self.inflight.full(max_inflight, max_inflight_bytes)

    def sent(self, seq: int, last_offset: int, nbytes: int) -> None:
        if self.state == ProgressState.PROBE:
            self.probe_sent = True
            self.inflight.clear()
        self.inflight.add(seq, last_offset, nbytes)
        if self.state == ProgressState.REPLICATE:
            self.next_index = last_offset + 1

    def acked(self, last_appended: int) -> bool:
        """A success reply: the follower matches up to `last_appended`. Returns True if it
        moved match_index."""
        moved = last_appended > self.match_index
        if moved:
            self.match_index = last_appended
        self.acked_bytes += self.inflight.release_upto(last_appended)
        self.ticks_since_ack = 0
        if self.state == ProgressState.PROBE:
            self.become_replicate()
        self.next_index = max(self.next_index, self.match_index + 1)
        return moved

    def become_probe(self, next_index: int, seq: int) -> None:
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.next_index = max(next_index, 0)
        self.reset_seq = seq
        self.ticks_since_ack = 0

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.probe_sent = False
        self.inflight.clear()
        self.next_index = self.match_index + 1

    def settle_recovering(self, leader_last: int, commit_index: int = -1) -> None:
        """A follower that matches the leader's tail (`leader_last`, its dirty offset) needs no
        more requests, so it is not recovering: its next append is a normal, tail-sized one
        asking for a flush, and the recovery throttle no longer applies to it. Whether it has
        flushed yet does not matter (its own deferred flush takes care of that, and only
        flushed offsets count for the commit index anyway). Needed because a reply or flush
        report can raise match_index to the tail while the last chunk sent (a resend after
        a reset, to a follower that already held the rest) stopped short of it, and then no
        further chunk is planned that would clear the flag.

        The same holds for a follower that holds everything committed (`commit_index`): what
        it lacks is the write pipeline the quorum is still flushing, not a backlog to catch
        up, so it is replicated in step (issue 28: under eight producers the leader's log runs
        a few MiB ahead of both followers for good, and treating them as recovering sent one
        256 KiB batch per deferred-flush chunk, read back from LMDB, for the whole run)."""
        if self.recovering and (self.match_index >= leader_last
                                or (commit_index >= 0 and self.match_index >= commit_index)):
            self.recovering = False

    def note_flushed(self, offset: int) -> None:
        """A verified flushed offset. Flushed data survives crashes, so the follower's log
        matches ours up to it for the rest of this term: it raises match_index too."""
        if offset > self.flushed_offset:
            self.flushed_offset = offset
        if offset > self.match_index:
            self.match_index = offset
            self.next_index = max(self.next_index, offset + 1)
