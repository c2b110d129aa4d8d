"""Peer messages of the consensus core. Plain slotted dataclasses; the wire codec maps them
to msgpack and back. Every message names its sender (`src`), receiver (`dst`) and the sender's
current `term`.

Offsets and terms: a log position is the last offset of a batch (or log start - 1). Replies
carry the follower's dirty and flushed offsets *with the term of the entry at each*: by the log
matching property the leader can check (its own term at that offset equal) that the follower's
flushed prefix really is a prefix of the leader's log, whatever reordering, duplication or
crashes happened in between. Without that check a stale "flushed = 10" from before a
truncation could be counted against entries the follower never flushed.

Incarnations (raft/core/incarnation.py): votes and append replies carry the sender's data-directory
identity, and whether it still waits to be (re-)added (`rejoining`), so a leader or voter can
ignore a member that is not the one its configuration knows. Replies also carry `repair_from`,
the first offset the follower holds damaged (raft/core/repair.py), so the leader resends it. Fields
added later have defaults, so older senders still decode (as incarnation 0: unknown).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.batch import Batch


@dataclass(slots=True)
class AppendEntries:
    src: int
    dst: int
    term: int
    prev_offset: int
    prev_term: int
    batches: list[Batch]
    commit_index: int
    # The RFC's flush_after_append: the follower flushes before replying. False during recovery
    # chunks; the follower then flushes on its own schedule and reports flushed offsets later.
    flush: bool
    seq: int  # leader's per-follower request number, echoed in the reply
    # prev_offset is the leader's log start - 1 (retention dropped everything before): a
    # follower whose log does not reach or match it restarts its log there.
    log_start_reset: bool = False
    # With log_start_reset: the state at the leader's log start (raft/core/snapshot.py: term,
    # configuration, producer and loads tables, ...). The follower stores it with the reset, in
    # one storage operation, before it appends anything after it: the state transfer.
    snapshot: dict | None = None


@dataclass(slots=True)
class AppendEntriesReply:
    src: int
    dst: int
    term: int
    seq: int
    success: bool
    # On success: the last offset of the request (prev_offset + its batches), which now matches
    # the leader's log. On failure: -1.
    last_appended: int
    dirty_offset: int
    dirty_term: int
    flushed_offset: int
    flushed_term: int
    # On failure: the follower's term at prev_offset (0 if its log is too short) and the first
    # offset the follower holds of that term (or dirty_offset + 1 when too short), so the leader
    # backs up a whole term at a time.
    conflict_term: int = 0
    conflict_offset: int = -1
    # On failure: the request's prev_offset, so the leader's search stays below it.
    reject_offset: int = -1
    # Failure because the follower's unflushed tail is full: the leader keeps next_index and
    # retries after the follower reports a flush, instead of backing up.
    busy: bool = False
    incarnation: int = 0
    rejoining: bool = False
    # The first offset the follower holds damaged (-1: none): its flushed offset above is
    # already lowered to just before it; the leader sends the range again.
    repair_from: int = -1


@dataclass(slots=True)
class Heartbeat:
    src: int
    dst: int
    term: int
    commit_index: int
    seq: int
    # The leader's group is idle and every follower has everything (raft/core/quiesce.py): a
    # follower whose log, flush and commit index match it stops its election timer and says
    # so in its reply. Older senders leave it out: a plain heartbeat.
    quiesce: bool = False


@dataclass(slots=True)
class HeartbeatReply:
    src: int
    dst: int
    term: int
    seq: int
    dirty_offset: int
    dirty_term: int
    flushed_offset: int
    flushed_term: int
    incarnation: int = 0
    rejoining: bool = False
    repair_from: int = -1
    # The reply to a quiescing heartbeat: the follower went quiet (raft/core/quiesce.py). A
    # leader stops sending heartbeats only once every live follower said so, so a follower that
    # does not know the field (an older version) keeps its leader heartbeating.
    quiesced: bool = False


@dataclass(slots=True)
class RequestVote:
    src: int
    dst: int
    term: int  # for a pre-vote: the term the candidate would campaign in (not yet adopted)
    last_offset: int
    last_term: int
    pre_vote: bool = False
    # Voters ignore their leader lease: set for a leadership transfer (TimeoutNow) and for the
    # real vote a won pre-vote earned (raft/core/election.py, Campaign.skips_lease).
    transfer: bool = False
    incarnation: int = 0


@dataclass(slots=True)
class RequestVoteReply:
    src: int
    dst: int
    term: int
    granted: bool
    pre_vote: bool = False
    incarnation: int = 0


@dataclass(slots=True)
class TimeoutNow:
    """Leadership transfer: the receiver campaigns at once, skipping pre-vote."""

    src: int
    dst: int
    term: int


@dataclass(slots=True)
class BootstrapProbe:
    """From a node that started on an empty data directory, to every voter of its bootstrap
    configuration: "is this cluster new?" (raft/core/incarnation.py). Outside the term rules."""

    src: int
    dst: int
    term: int
    incarnation: int


@dataclass(slots=True)
class BootstrapProbeReply:
    src: int
    dst: int
    term: int
    incarnation: int
    # The replier never saved a term, a vote or an entry: as far as it knows, nothing ever
    # happened in this cluster.
    fresh: bool
    # The probe's incarnation, echoed: a prober ignores an answer to another incarnation of
    # itself (one delayed across a disk loss). 0: from a node that does not echo it yet.
    prober_incarnation: int = 0
    # The replier founded the cluster counting the prober, with this very incarnation, among
    # its fresh voters (raft/core/incarnation.py, the founders rule).
    founder: bool = False


Message = (AppendEntries | AppendEntriesReply | Heartbeat | HeartbeatReply | RequestVote
           | RequestVoteReply | TimeoutNow | BootstrapProbe | BootstrapProbeReply)
MESSAGE_TYPES: tuple[type, ...] = (AppendEntries, AppendEntriesReply, Heartbeat, HeartbeatReply,
                                   RequestVote, RequestVoteReply, TimeoutNow, BootstrapProbe,
                                   BootstrapProbeReply)
