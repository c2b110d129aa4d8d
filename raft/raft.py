"""The sans-IO Raft core: messages, ticks and storage completions in; messages, storage work and
client answers out (raft/ready.py). No sockets, clocks, threads or global randomness here: the
trio runtime (raft/node.py) and the deterministic simulation (raft/sim/) drive the same object.

What differs from textbook Raft, after Redpanda's recovery RFC:
- Appends are not durable when they are acknowledged. Every node has a *dirty offset* (last
  appended) and a *flushed offset* (last fsynced); replies and heartbeat replies carry both, with
  the term of the entry at each so the leader can check them against its own log.
- The commit index is the highest offset that a majority has *flushed* and matched, for an entry
  of the leader's term. Dirty offsets never count.
- Producers choose per request: `quorum` (answered at commit), `leader` (answered when the leader
  appended), `none` (answered on acceptance). Consumers only ever see the commit index.
- A lagging follower is caught up in large pipelined chunks sent with `flush=False`; it flushes
  on its own schedule (bytes or ticks) and reports, and the leader advances the commit index as
  those reports arrive. The last chunk, which reaches the leader's tail, asks for a flush.

The core appends to and truncates its LogStorage directly (appends only touch the in-memory
tail); flushes and metadata writes are the driver's work, announced through Ready.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from raft import messages as m
from raft.membership import ClusterConfig
from raft.producers import ProducerTable, Verdict
from raft.progress import FollowerProgress, ProgressState
from raft.quorum import VoteResult, committed_index, majority, vote_result
from raft.ready import FollowerStatus, HardState, ProduceAnswer, Ready, Status
from raft.types import Acks, ErrorCode, Role
from storage.api import LogStorage, OffsetOutOfRange, StorageError, TailFull
from storage.batch import Batch, BatchKind

# How many recent configuration entries the metadata keeps, so a crash that drops unflushed
# configuration entries can fall back to the one still in the log.
_CONFIG_HISTORY = 4
# Request id of proposals the core makes itself (no-op, promotions): nobody waits for them.
INTERNAL_REQUEST = -1


class Rng(Protocol):
    """The only randomness the core uses (election timeouts), passed in already seeded: the
    runtime seeds it from the OS, the simulation from its schedule seed."""

    def randrange(self, stop: int) -> int: ...


class InvariantViolation(AssertionError):
    """A safety invariant failed. Fail-stop: the runtime lets this crash the node rather than
    continue with a log it can no longer trust."""


@dataclass(slots=True)
class RaftConfig:
    """Knobs of the core. Ticks are the runtime's unit of time (raft.node.config.NodeConfig.tick_ms,
    50 ms by default)."""

    node_id: int
    voters: list[int]
    learners: list[int] = field(default_factory=list)
    # A follower that hears nothing for a random [election_ticks, 2 * election_ticks) campaigns.
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    # Bytes per AppendEntries in normal replication and per recovery chunk (at least one batch
    # is always sent, whatever its size).
    max_append_bytes: int = 1 << 20
    recovery_chunk_bytes: int = 512 << 10
    # Pipelining limits per follower.
    max_inflight: int = 4
    max_inflight_bytes: int = 8 << 20
    # A follower receiving flush=False data flushes once this many bytes are unflushed, or
    # after this many ticks, whichever comes first.
    follower_flush_bytes: int = 8 << 20
    follower_flush_ticks: int = 2
    pre_vote: bool = True
    check_quorum: bool = True
    # Quorum produce requests waiting for commit; beyond it the leader answers BACKPRESSURE.
    max_pending_produce: int = 10_000
    # Sequences remembered per idempotent producer, and producers remembered.
    producer_window: int = 8
    max_producers: int = 100_000
    # Baseline for benchmarks only: every recovery chunk asks the follower to flush before it
    # replies (the behaviour the RFC replaces). Off in production.
    recovery_flush_per_chunk: bool = False
    # The commit index is saved with the metadata at most this often (and whenever term, vote
    # or configuration change), so a restarted node starts from a recent commit index instead
    # of -1 (Kafka checkpoints its high watermark the same way). 0 = only with other changes.
    commit_checkpoint_ticks: int = 20

    def validate(self) -> "RaftConfig":
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"raft setting {name}={value!r} must be a positive integer")

        for name in ("node_id", "election_ticks", "heartbeat_ticks", "max_append_bytes",
                     "recovery_chunk_bytes", "max_inflight", "max_inflight_bytes",
                     "follower_flush_bytes", "follower_flush_ticks", "max_pending_produce",
                     "producer_window", "max_producers"):
            positive(name)
        if self.heartbeat_ticks >= self.election_ticks:
            raise ValueError(f"heartbeat_ticks ({self.heartbeat_ticks}) must be below "
                             f"election_ticks ({self.election_ticks}); raise election_ticks")
        if not self.voters:
            raise ValueError("voters is empty: list every voting node, this one included")
        return self


@dataclass(slots=True)
class _ConfigEntry:
    offset: int  # -1: the bootstrap configuration (not in the log)
    term: int
    config: ClusterConfig


@dataclass(slots=True)
class _Waiting:
    """A quorum produce waiting for the commit index."""

    request_id: int
    base_offset: int
    last_offset: int
    duplicate: bool = False


class RaftCore:
    def __init__(self, cfg: RaftConfig, log: LogStorage, rng: Rng) -> None:
        self.cfg = cfg.validate()
        self.log = log
        self.rng = rng
        self.node_id = cfg.node_id
        meta = log.load_meta()
        self.term: int = meta.term
        self.voted_for: int | None = meta.voted_for
        self.role = Role.FOLLOWER
        self.leader_id: int | None = None
        # The last checkpointed commit index, bounded by what survived in our log.
        saved_commit = int((meta.config or {}).get("commit", -1))
        self.commit_index = max(log.start_offset - 1,
                                min(saved_commit, log.flushed_offset, log.dirty_offset))
        self._saved_commit = self.commit_index
        self._checkpoint_elapsed = 0
        self._configs: list[_ConfigEntry] = self._load_configs(meta.config)
        self.producers = ProducerTable(cfg.producer_window, cfg.max_producers)
        self._rebuild_from_log()

        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = 0
        self._reset_randomized_timeout()
        self._votes: dict[int, bool] = {}
        self._progress: dict[int, FollowerProgress] = {}
        self._seq = 0
        self._waiting: deque[_Waiting] = deque()
        self._noop_offset = -1  # this leader's first entry; commit past it = "committed in term"
        self._transfer_target: int | None = None
        self._transfer_elapsed = 0
        self._check_quorum_elapsed = 0
        # Follower side.
        self._leader_commit = -1  # last commit index the leader told us (this term)
        self._matched_upto = -1  # our log equals this term's leader's up to here
        self._held_replies: list[m.AppendEntriesReply] = []  # flush=True replies awaiting flush
        self._unflushed_ticks = 0
        self._reported_flushed = log.flushed_offset

        # Ready output.
        self._messages: list[m.Message] = []
        self._answers: list[ProduceAnswer] = []
        self._flush_wanted = False
        self._hs_dirty = False
        self._bcast_wanted = False

        if len(self.config.voters) == 1 and self.config.voters[0] == self.node_id and \
                self.term == 0:
            # A brand-new single-voter cluster needs no election timeout to start serving.
            self._randomized_timeout = 1

    # ================================================================== public properties
    @property
    def config(self) -> ClusterConfig:
        return self._configs[-1].config

    @property
    def high_watermark(self) -> int:
        """What consumers may read: the commit index (never a dirty offset)."""
        return self.commit_index

    def is_voter(self, node_id: int | None = None) -> bool:
        return (self.node_id if node_id is None else node_id) in self.config.voters

    # ================================================================== inputs
    def tick(self) -> None:
        self._checkpoint_elapsed += 1
        if (self.cfg.commit_checkpoint_ticks and self.commit_index > self._saved_commit
                and self._checkpoint_elapsed >= self.cfg.commit_checkpoint_ticks):
            self._hs_dirty = True
        if self.role == Role.LEADER:
            self._tick_leader()
        else:
            self._tick_follower()
        self._tick_flush_schedule()

    def step(self, msg: m.Message) -> None:
        if msg.dst != self.node_id:
            return
        if isinstance(msg, m.RequestVote) and msg.src not in self.config.members:
            return  # a removed (or never added) node must not disturb the cluster's term
        if msg.term > self.term:
            if isinstance(msg, m.RequestVote):
                if self._in_lease(msg):
                    return  # a leader is alive: ignore the disruptive candidate
                if msg.pre_vote:
                    self._handle_pre_vote(msg)
                    return
                self._become_follower(msg.term, None)
            elif isinstance(msg, m.RequestVoteReply) and msg.pre_vote and msg.granted:
                pass  # a granted pre-vote carries the term we would campaign in
            elif isinstance(msg, (m.AppendEntries, m.Heartbeat, m.TimeoutNow)):
                self._become_follower(msg.term, msg.src)
            else:
                self._become_follower(msg.term, None)
        elif msg.term < self.term:
            if isinstance(msg, (m.AppendEntries, m.Heartbeat)):
                # Tell the stale leader about the newer term so it steps down.
                self._send(self._append_reply(msg.src, msg.seq, False))
            elif isinstance(msg, m.RequestVote):
                self._send(m.RequestVoteReply(self.node_id, msg.src, self.term, False,
                                              msg.pre_vote))
            return

        if isinstance(msg, m.AppendEntries):
            self._handle_append(msg)
        elif isinstance(msg, m.Heartbeat):
            self._handle_heartbeat(msg)
        elif isinstance(msg, m.AppendEntriesReply):
            self._handle_append_reply(msg)
        elif isinstance(msg, m.HeartbeatReply):
            self._handle_heartbeat_reply(msg)
        elif isinstance(msg, m.RequestVote):
            self._handle_vote(msg)
        elif isinstance(msg, m.RequestVoteReply):
            self._handle_vote_reply(msg)
        elif isinstance(msg, m.TimeoutNow):
            if self.role != Role.LEADER and self.is_voter():
                self._campaign(transfer=True)

    def propose(self, request_id: int, batch: Batch, acks: Acks) -> None:
        """Offer a batch for the log; the answer comes through ready().answers."""
        acks = Acks(acks)
        if batch.kind not in (BatchKind.DATA, BatchKind.CONTROL, BatchKind.STAGED):
            raise ValueError(f"clients may not propose {batch.kind.name} batches")
        if self.role != Role.LEADER or self._transfer_target is not None:
            hint = self._transfer_target if self._transfer_target is not None else self.leader_id
            self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=hint)
            return
        if batch.producer_id and batch.kind == BatchKind.DATA:
            verdict, written = self.producers.lookup(batch.producer_id, batch.sequence)
            if verdict == Verdict.DUPLICATE:
                assert written is not None
                self._answer_duplicate(request_id, written.base_offset, written.last_offset,
                                       acks)
                return
            if verdict == Verdict.TOO_OLD:
                self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                    f"sequence {batch.sequence} of producer {batch.producer_id} is older than "
                    f"the last {self.cfg.producer_window} remembered: its outcome is unknown; "
                    f"read the log to check, and use a new producer id for new writes"))
                return
        if acks == Acks.QUORUM and len(self._waiting) >= self.cfg.max_pending_produce:
            self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                f"{len(self._waiting)} quorum writes are waiting for commit; retry shortly"))
            return
        placed = self._append_as_leader(batch)
        if placed is None:
            self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                "the leader's unflushed tail is full; retry after the running flush"))
            return
        if acks == Acks.QUORUM:
            self._waiting.append(_Waiting(request_id, placed.base_offset, placed.last_offset))
            self._answer_committed()  # a single voter may already cover it
        else:
            # LEADER: appended on the leader, nothing flushed yet. NONE: the same moment (the
            # client does not wait for it; the offsets cost nothing to report).
            self._answer(request_id, ErrorCode.OK, base_offset=placed.base_offset,
                         last_offset=placed.last_offset)

    def flushed(self, offset: int) -> None:
        """The driver's flush completed; `offset` is the log's flushed offset now."""
        self._unflushed_ticks = 0
        if self.role == Role.LEADER:
            self._maybe_commit()
            return
        self._advance_follower_commit()
        flushed = self.log.flushed_offset
        held, self._held_replies = self._held_replies, []
        for reply in held:
            if reply.last_appended <= flushed:
                self._send(self._refresh_reply(reply))
            else:
                self._held_replies.append(reply)
        if flushed > self._reported_flushed and not held and self.leader_id is not None:
            # Flushed on our own schedule: report so the leader can advance the commit index.
            self._send(self._heartbeat_reply(self.leader_id, 0))
        self._reported_flushed = max(self._reported_flushed, flushed)

    def transfer_leadership(self, to: int | None = None) -> None:
        """Hand leadership to `to` (or the most caught-up voter): catch it up, then TimeoutNow."""
        if self.role != Role.LEADER:
            raise ValueError(f"node {self.node_id} is not the leader; ask node "
                             f"{self.leader_id} instead")
        candidates = [v for v in self.config.voters if v != self.node_id]
        if to is None:
            if not candidates:
                raise ValueError("no other voter to transfer leadership to; add a node first")
            to = max(candidates, key=lambda v: (self._progress[v].match_index, -v))
        elif to == self.node_id:
            return
        elif to not in candidates:
            raise ValueError(f"node {to} is not a voter of this cluster (voters: "
                             f"{list(self.config.voters)}); pick one of them")
        self._transfer_target = to
        self._transfer_elapsed = 0
        self._maybe_send_timeout_now()
        self._send_append(self._progress[to])

    def propose_config(self, request_id: int, *, add_learner: int | None = None,
                       address: str | None = None, remove: int | None = None) -> None:
        """One membership change: add a learner (promoted to voter automatically once caught
        up) or remove a member. Answered through ready().answers when the entry commits."""
        if self.role != Role.LEADER or self._transfer_target is not None:
            self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=self.leader_id)
            return
        if (add_learner is None) == (remove is None):
            raise ValueError("give exactly one of add_learner or remove")
        reason = self._config_change_blocked()
        if reason:
            self._answer(request_id, ErrorCode.BACKPRESSURE, message=reason)
            return
        cfg = self.config
        if add_learner is not None:
            if add_learner in cfg.members:
                self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                    f"node {add_learner} is already a member ({self._describe(cfg)})"))
                return
            new = cfg.with_learner(add_learner, address)
        else:
            assert remove is not None
            if remove not in cfg.members:
                self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                    f"node {remove} is not a member ({self._describe(cfg)})"))
                return
            if remove == self.node_id:
                # Removing the leader: hand over first, the new leader does the removal.
                others = [v for v in cfg.voters if v != self.node_id]
                if not others:
                    self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                        "cannot remove the only voter; add another node first"))
                    return
                self.transfer_leadership(None)
                self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=self._transfer_target,
                             message="leadership is moving; retry the removal at the new leader")
                return
            if remove in cfg.voters and len(cfg.voters) == 1:
                self._answer(request_id, ErrorCode.BAD_REQUEST,
                             message="cannot remove the only voter")
                return
            new = cfg.without(remove)
        self._propose_config(request_id, new)

    def ready(self) -> Ready:
        if self._bcast_wanted and self.role == Role.LEADER:
            self._bcast_wanted = False
            for pr in self._progress.values():
                self._send_append(pr)
        hs = None
        if self._hs_dirty:
            hs = HardState(self.term, self.voted_for, self._config_meta())
            self._hs_dirty = False
            self._saved_commit = self.commit_index
            self._checkpoint_elapsed = 0
        rd = Ready(hs, self._messages, self._flush_wanted, self._answers)
        self._messages, self._answers, self._flush_wanted = [], [], False
        return rd

    def status(self) -> Status:
        followers = []
        if self.role == Role.LEADER:
            for pr in self._progress.values():
                followers.append(FollowerStatus(
                    pr.node_id, pr.match_index, pr.next_index, pr.dirty_offset,
                    pr.flushed_offset, len(pr.inflight), pr.inflight_bytes, pr.learner,
                    pr.recovering, pr.ticks_since_heard))
        cfg = self.config
        return Status(self.node_id, self.role, self.term, self.leader_id, self.log.dirty_offset,
                      self.log.flushed_offset, self.commit_index, self.high_watermark,
                      self.log.start_offset, list(cfg.voters), list(cfg.learners), followers)

    def progress(self, node_id: int) -> FollowerProgress | None:
        """The leader's view of one follower (None elsewhere); for the runtime and tests."""
        return self._progress.get(node_id)

    # ================================================================== time
    def _tick_follower(self) -> None:
        self._election_elapsed += 1
        if self._election_elapsed >= self._randomized_timeout and self.is_voter():
            self._election_elapsed = 0
            self._campaign(transfer=False)

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._check_quorum_elapsed += 1
        for pr in self._progress.values():
            pr.ticks_since_heard += 1
            if pr.inflight or pr.probe_sent:
                pr.ticks_since_ack += 1
                if pr.ticks_since_ack >= self.cfg.election_ticks:
                    # Requests or their replies were lost: start over from what is known.
                    pr.become_probe(pr.match_index + 1, self._next_seq_peek())
        if self._heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for pr in self._progress.values():
                self._seq += 1
                self._send(m.Heartbeat(self.node_id, pr.node_id, self.term,
                                       min(self.commit_index, pr.match_index), self._seq))
        if self._transfer_target is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.cfg.election_ticks:
                self._transfer_target = None  # gave up: keep leading
        # Two election timeouts, not one: a leader whose event loop lags under a burst of
        # client load (replies queued, not lost) must not depose itself; an isolated leader
        # still steps down well before clients give up.
        if self._check_quorum_elapsed >= 2 * self.cfg.election_ticks:
            self._check_quorum_elapsed = 0
            if self.cfg.check_quorum:
                active = sum(1 for v in self.config.voters
                             if v == self.node_id or (v in self._progress
                                                      and self._progress[v].recent_active))
                for pr in self._progress.values():
                    pr.recent_active = False
                if active < majority(len(self.config.voters)):
                    self._become_follower(self.term, None)
                    return
        self._bcast_wanted = True

    def _tick_flush_schedule(self) -> None:
        """Followers flush deferred (flush=False) data after follower_flush_ticks."""
        if self.role == Role.LEADER:
            if self.log.dirty_offset > self.log.flushed_offset:
                self._flush_wanted = True
            return
        if self.log.dirty_offset > self.log.flushed_offset:
            self._unflushed_ticks += 1
            if self._unflushed_ticks >= self.cfg.follower_flush_ticks:
                self._flush_wanted = True
        else:
            self._unflushed_ticks = 0

    def _reset_randomized_timeout(self) -> None:
        e = self.cfg.election_ticks
        self._randomized_timeout = e + self.rng.randrange(e)

    # ================================================================== roles
    def _become_follower(self, term: int, leader: int | None) -> None:
        was_leader = self.role == Role.LEADER
        if term != self.term:
            self.term = term
            self.voted_for = None
            self._hs_dirty = True
            self._leader_commit = -1
            self._matched_upto = -1
            self._held_replies = []
        self.role = Role.FOLLOWER
        self.leader_id = leader
        self._election_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {}
        if was_leader:
            self._step_down_cleanup()

    def _step_down_cleanup(self) -> None:
        for w in self._waiting:
            self._answer(w.request_id, ErrorCode.LEADERSHIP_LOST, leader_id=self.leader_id,
                         message=("leadership changed before the write committed; it may or may "
                                  "not commit: retry (idempotent producers make it safe)"))
        self._waiting.clear()
        self._progress = {}
        self._transfer_target = None

    def _campaign(self, *, transfer: bool) -> None:
        if self.cfg.pre_vote and not transfer:
            self.role = Role.PRE_CANDIDATE
            self.leader_id = None
            self._votes = {self.node_id: True}
            term = self.term + 1
        else:
            self.role = Role.CANDIDATE
            self.term += 1
            self.voted_for = self.node_id
            self._hs_dirty = True
            self.leader_id = None
            self._votes = {self.node_id: True}
            term = self.term
            self._leader_commit = -1
            self._matched_upto = -1
            self._held_replies = []
        self._election_elapsed = 0
        self._reset_randomized_timeout()
        if vote_result(self.config.voters, self._votes) == VoteResult.WON:
            if self.role == Role.PRE_CANDIDATE:
                self._campaign(transfer=True)
            else:
                self._become_leader()
            return
        last_offset, last_term = self.log.dirty_offset, self.log.last_term()
        for v in self.config.voters:
            if v != self.node_id:
                self._send(m.RequestVote(self.node_id, v, term, last_offset, last_term,
                                         pre_vote=self.role == Role.PRE_CANDIDATE,
                                         transfer=transfer))

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self._heartbeat_elapsed = 0
        self._check_quorum_elapsed = 0
        self._transfer_target = None
        self._progress = {}
        for node_id in self.config.members:
            if node_id != self.node_id:
                self._progress[node_id] = self._new_progress(node_id)
        # A no-op of our term: entries of earlier terms commit once it does.
        noop = self._append_as_leader(Batch.create(b"", 1, kind=BatchKind.NOOP), force=True)
        assert noop is not None
        self._noop_offset = noop.base_offset
        self._maybe_commit()

    def _new_progress(self, node_id: int) -> FollowerProgress:
        pr = FollowerProgress(node_id, next_index=self.log.dirty_offset + 1,
                              learner=node_id in self.config.learners)
        pr.recent_active = True
        return pr

    def _in_lease(self, msg: m.RequestVote) -> bool:
        """CheckQuorum's lease: while we heard from a leader within the election timeout, a
        vote request (not a transfer) is ignored, so a partitioned node rejoining cannot depose
        a healthy leader."""
        return (self.cfg.check_quorum and not msg.transfer and self.leader_id is not None
                and self._election_elapsed < self.cfg.election_ticks)

    # ================================================================== votes
    def _log_up_to_date(self, last_offset: int, last_term: int) -> bool:
        my_term = self.log.last_term()
        return last_term > my_term or (last_term == my_term
                                       and last_offset >= self.log.dirty_offset)

    def _handle_pre_vote(self, msg: m.RequestVote) -> None:
        granted = self.is_voter(msg.src) and self._log_up_to_date(msg.last_offset,
                                                                   msg.last_term)
        self._send(m.RequestVoteReply(self.node_id, msg.src, msg.term if granted else self.term,
                                      granted, pre_vote=True))

    def _handle_vote(self, msg: m.RequestVote) -> None:
        if msg.pre_vote:  # same term as ours: a pre-candidate of our own term cannot win
            self._send(m.RequestVoteReply(self.node_id, msg.src, self.term, False, True))
            return
        can_vote = (self.voted_for in (None, msg.src) and self.leader_id is None
                    and self.role != Role.LEADER) or self.voted_for == msg.src
        granted = (can_vote and self.is_voter(msg.src)
                   and self._log_up_to_date(msg.last_offset, msg.last_term))
        if granted:
            self.voted_for = msg.src
            self._hs_dirty = True  # durable before the reply leaves (driver contract)
            self._election_elapsed = 0
        self._send(m.RequestVoteReply(self.node_id, msg.src, self.term, granted, False))

    def _handle_vote_reply(self, msg: m.RequestVoteReply) -> None:
        if msg.pre_vote != (self.role == Role.PRE_CANDIDATE):
            return
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            return
        if msg.pre_vote and msg.granted and msg.term != self.term + 1:
            return  # a reply to an older pre-campaign
        self._votes[msg.src] = msg.granted
        result = vote_result(self.config.voters, self._votes)
        if result == VoteResult.WON:
            if self.role == Role.PRE_CANDIDATE:
                self._campaign(transfer=True)  # real election, pre-vote done
            else:
                self._become_leader()
        elif result == VoteResult.LOST:
            self._become_follower(self.term, None)

    # ================================================================== follower: appends
    def _handle_append(self, msg: m.AppendEntries) -> None:
        self.role = Role.FOLLOWER
        self.leader_id = msg.src
        self._election_elapsed = 0
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
            if msg.log_start_reset:
                if self.commit_index > prev:
                    raise InvariantViolation(
                        f"node {self.node_id}: reset to log start {prev + 1} would drop "
                        f"committed offsets up to {self.commit_index}")
                log.reset(prev + 1, msg.prev_term)
                self.producers.clear()
                self._configs = [c for c in self._configs if c.offset <= prev]
                if not self._configs:
                    self._configs = [self._bootstrap_config()]
                self._hs_dirty = True
            else:
                self._reject(msg)
                return
        last = prev
        fresh: list[Batch] = []
        for b in batches:
            if not fresh and b.base_offset <= log.dirty_offset:
                if b.last_offset <= log.dirty_offset and log.term_at(b.last_offset) == b.term:
                    last = b.last_offset
                    continue  # already held: not rewritten
                # Our entries from here differ from the leader's (an old term's tail).
                self._truncate_suffix(b.base_offset - 1)
            fresh.append(b)
        if fresh:
            if fresh[0].base_offset != log.dirty_offset + 1:
                self._reject(msg)
                return
            # No CRC check here: the transport verified every batch as it decoded it
            # (raft/wire.py), and hashing again would cost a second pass per byte.
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
        if log.unflushed_bytes >= self.cfg.follower_flush_bytes:
            self._flush_wanted = True
        self._send(reply)

    def _reject(self, msg: m.AppendEntries) -> None:
        log = self.log
        reply = self._append_reply(msg.src, msg.seq, False)
        reply.reject_offset = msg.prev_offset
        if msg.prev_offset > log.dirty_offset:
            reply.conflict_term, reply.conflict_offset = 0, log.dirty_offset + 1
        else:
            t = log.term_at(msg.prev_offset)
            reply.conflict_term = t
            reply.conflict_offset = self._first_offset_of_term(t, msg.prev_offset)
        self._send(reply)

    def _handle_heartbeat(self, msg: m.Heartbeat) -> None:
        self.role = Role.FOLLOWER
        self.leader_id = msg.src
        self._election_elapsed = 0
        # The leader sends min(commit, what it knows we match): safe to take up to our flush.
        self._leader_commit = max(self._leader_commit, msg.commit_index)
        self._matched_upto = max(self._matched_upto, msg.commit_index)
        self._advance_follower_commit()
        self._send(self._heartbeat_reply(msg.src, msg.seq))

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
        self.log.truncate_suffix(after)
        self.producers.truncate_after(after)
        if self._configs[-1].offset > after:
            self._configs = [c for c in self._configs if c.offset <= after]
            if not self._configs:
                self._configs = [self._bootstrap_config()]
            self._hs_dirty = True

    def _append_reply(self, dst: int, seq: int, success: bool,
                      last_appended: int = -1) -> m.AppendEntriesReply:
        log = self.log
        return m.AppendEntriesReply(
            self.node_id, dst, self.term, seq, success, last_appended if success else -1,
            log.dirty_offset, log.last_term(), log.flushed_offset,
            self._term_or_zero(log.flushed_offset))

    def _refresh_reply(self, reply: m.AppendEntriesReply) -> m.AppendEntriesReply:
        log = self.log
        reply.dirty_offset, reply.dirty_term = log.dirty_offset, log.last_term()
        reply.flushed_offset = log.flushed_offset
        reply.flushed_term = self._term_or_zero(log.flushed_offset)
        return reply

    def _heartbeat_reply(self, dst: int, seq: int) -> m.HeartbeatReply:
        log = self.log
        return m.HeartbeatReply(self.node_id, dst, self.term, seq, log.dirty_offset,
                                log.last_term(), log.flushed_offset,
                                self._term_or_zero(log.flushed_offset))

    # ================================================================== leader: replication
    def _append_as_leader(self, batch: Batch, *, force: bool = False) -> Batch | None:
        placed = batch.placed(self.log.dirty_offset + 1, self.term)
        try:
            self.log.append([placed])
        except TailFull:
            self._flush_wanted = True
            if not force:
                return None
            raise
        self._applied_to_log(placed)
        self._flush_wanted = True  # the leader flushes in parallel with replication
        self._bcast_wanted = True
        return placed

    def _send_append(self, pr: FollowerProgress) -> None:
        """Send what `pr` lacks, as far as its flow-control window allows."""
        log = self.log
        while pr.can_send(self.cfg.max_inflight, self.cfg.max_inflight_bytes):
            nxt = pr.next_index
            reset = False
            if nxt < log.start_offset:
                nxt, reset = log.start_offset, log.start_offset > 0
            if nxt > log.dirty_offset + 1:
                nxt = log.dirty_offset + 1
            if pr.state == ProgressState.REPLICATE and nxt > log.dirty_offset:
                return  # nothing new; heartbeats carry the commit index
            budget = self.cfg.recovery_chunk_bytes if pr.recovering else \
                self.cfg.max_append_bytes
            batches = log.read(nxt, budget) if nxt <= log.dirty_offset else []
            prev = batches[0].base_offset - 1 if batches else nxt - 1
            if prev < log.start_offset - 1:
                batches = log.read(log.start_offset, budget)
                prev = log.start_offset - 1
            reset = reset or (prev == log.start_offset - 1 and log.start_offset > 0)
            last = batches[-1].last_offset if batches else prev
            at_tail = last >= log.dirty_offset
            pr.recovering = not at_tail
            flush = at_tail or self.cfg.recovery_flush_per_chunk
            self._seq += 1
            self._send(m.AppendEntries(self.node_id, pr.node_id, self.term, prev,
                                       log.term_at(prev), batches, self.commit_index, flush,
                                       self._seq, log_start_reset=reset))
            pr.sent(self._seq, last, sum(b.size for b in batches))
            if pr.state == ProgressState.PROBE or at_tail:
                return

    def _handle_append_reply(self, msg: m.AppendEntriesReply) -> None:
        if self.role != Role.LEADER:
            return
        pr = self._progress.get(msg.src)
        if pr is None:
            return
        self._heard(pr)
        fresh = msg.seq >= pr.reset_seq
        self._note_offsets(pr, msg.dirty_offset, msg.dirty_term, msg.flushed_offset,
                           msg.flushed_term, fresh)
        if msg.success:
            if fresh or msg.last_appended > pr.match_index:
                pr.acked(msg.last_appended)
            pr.busy = False
        elif msg.busy:
            pr.busy = True  # resumes on its next flush report
            if pr.state == ProgressState.PROBE:
                pr.probe_sent = False
        elif fresh:
            self._back_off(pr, msg)
        self._maybe_commit()
        self._maybe_promote(pr)
        self._maybe_send_timeout_now()
        self._send_append(pr)

    def _back_off(self, pr: FollowerProgress, msg: m.AppendEntriesReply) -> None:
        """The follower's log does not match at the request's prev offset: jump back a whole
        term (the conflict hint), or to its dirty offset + 1 when its log is too short."""
        log = self.log
        if msg.conflict_term == 0:
            nxt = msg.conflict_offset
        else:
            # If we hold entries of the follower's conflicting term, those match up to our
            # last one of that term; otherwise its whole run of that term is wrong: resend from
            # where that term starts on the follower.
            limit = log.dirty_offset if msg.reject_offset < 0 else \
                min(log.dirty_offset, msg.reject_offset)
            last = self._last_offset_with_term_at_most(msg.conflict_term, limit)
            if last >= log.start_offset and log.term_at(last) == msg.conflict_term:
                nxt = last + 1
            else:
                nxt = msg.conflict_offset
        if msg.reject_offset >= 0:
            nxt = min(nxt, msg.reject_offset)  # always strictly below the rejected probe
        nxt = max(min(nxt, log.dirty_offset + 1), 0)
        # Whatever the follower held beyond this point is no longer known to match.
        pr.match_index = min(pr.match_index, nxt - 1)
        pr.flushed_offset = min(pr.flushed_offset, pr.match_index)
        self._seq += 1
        pr.become_probe(nxt, self._seq)

    def _handle_heartbeat_reply(self, msg: m.HeartbeatReply) -> None:
        if self.role != Role.LEADER:
            return
        pr = self._progress.get(msg.src)
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
        elif fresh and pr.state == ProgressState.REPLICATE and any(
                f.seq < msg.seq and f.last_offset > msg.dirty_offset for f in pr.inflight):
            # The follower answered a later heartbeat without having appended earlier
            # requests: they were lost (a dropped connection or queue). Resend from the match.
            self._seq += 1
            pr.become_probe(pr.match_index + 1, self._seq)
        if pr.state == ProgressState.PROBE:
            pr.probe_sent = False  # a probe may have been lost: try again
        self._maybe_commit()
        self._maybe_promote(pr)
        self._maybe_send_timeout_now()
        self._send_append(pr)

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

    def _matches_our_log(self, offset: int, term: int) -> bool:
        log = self.log
        if offset < log.start_offset - 1 or offset > log.dirty_offset:
            return False
        return log.term_at(offset) == term

    def _heard(self, pr: FollowerProgress) -> None:
        pr.ticks_since_heard = 0
        pr.recent_active = True

    def _maybe_commit(self) -> None:
        if self.role != Role.LEADER:
            return
        durable = {self.node_id: self.log.flushed_offset}
        for v in self.config.voters:
            if v != self.node_id:
                pr = self._progress.get(v)
                durable[v] = pr.durable_offset() if pr is not None else -1
        if self.node_id not in self.config.voters:
            del durable[self.node_id]  # removed leader: manages but does not count
        candidate = committed_index(durable.values())
        if candidate > self.commit_index and candidate <= self.log.dirty_offset and \
                self.log.term_at(candidate) == self.term:
            self.commit_index = candidate
            self._answer_committed()
            self._on_commit()

    def _answer_committed(self) -> None:
        while self._waiting and self._waiting[0].last_offset <= self.commit_index:
            w = self._waiting.popleft()
            self._answer(w.request_id, ErrorCode.OK, base_offset=w.base_offset,
                         last_offset=w.last_offset, duplicate=w.duplicate)

    def _answer_duplicate(self, request_id: int, base: int, last: int, acks: Acks) -> None:
        if acks == Acks.QUORUM and last > self.commit_index:
            # The original is not committed yet: answer with it.
            self._waiting.append(_Waiting(request_id, base, last, duplicate=True))
            self._waiting = deque(sorted(self._waiting, key=lambda w: w.last_offset))
            return
        self._answer(request_id, ErrorCode.OK, base_offset=base, last_offset=last,
                     duplicate=True)

    def _maybe_send_timeout_now(self) -> None:
        to = self._transfer_target
        if to is None or self.role != Role.LEADER:
            return
        pr = self._progress.get(to)
        if pr is not None and pr.match_index >= self.log.dirty_offset:
            self._send(m.TimeoutNow(self.node_id, to, self.term))

    # ================================================================== membership
    def _config_change_blocked(self) -> str:
        if self.commit_index < self._noop_offset:
            return "this leader has not committed an entry of its term yet; retry shortly"
        if self._configs[-1].offset > self.commit_index:
            return "another membership change is in progress; retry once it commits"
        return ""

    def _propose_config(self, request_id: int, new: ClusterConfig) -> None:
        placed = self._append_as_leader(new.to_batch())
        if placed is None:
            self._answer(request_id, ErrorCode.BACKPRESSURE,
                         message="the leader's unflushed tail is full; retry shortly")
            return
        self._waiting.append(_Waiting(request_id, placed.base_offset, placed.last_offset))

    def _maybe_promote(self, pr: FollowerProgress) -> None:
        """A learner is promoted once it holds everything the leader has flushed."""
        if (not pr.learner or pr.node_id not in self.config.learners
                or self._config_change_blocked()):
            return
        if pr.match_index >= self.log.flushed_offset:
            self._propose_config(INTERNAL_REQUEST, self.config.promoted(pr.node_id))

    def _on_commit(self) -> None:
        """A removed leader steps down once the configuration without it commits."""
        if (self.role == Role.LEADER and self.node_id not in self.config.voters
                and self._configs[-1].offset <= self.commit_index):
            self._become_follower(self.term, None)

    def _applied_to_log(self, batch: Batch) -> None:
        """Bookkeeping for every batch that enters our log (leader or follower)."""
        if batch.kind == BatchKind.DATA:
            self.producers.record(batch)
        elif batch.kind == BatchKind.CONFIG:
            self._configs.append(_ConfigEntry(batch.base_offset, batch.term,
                                              ClusterConfig.from_batch(batch)))
            keep = max(_CONFIG_HISTORY, 1)
            self._configs = self._configs[-keep:]
            self._hs_dirty = True
            self._config_changed()

    def _config_changed(self) -> None:
        cfg = self.config
        if self.role != Role.LEADER:
            return
        for node_id in cfg.members:
            if node_id != self.node_id and node_id not in self._progress:
                self._progress[node_id] = self._new_progress(node_id)
        for node_id in list(self._progress):
            if node_id not in cfg.members:
                del self._progress[node_id]
            else:
                self._progress[node_id].learner = node_id in cfg.learners

    def _bootstrap_config(self) -> _ConfigEntry:
        return _ConfigEntry(-1, 0, ClusterConfig(tuple(sorted(self.cfg.voters)),
                                                 tuple(sorted(self.cfg.learners))))

    def _config_meta(self) -> dict[str, Any]:
        return {"history": [{"offset": c.offset, "term": c.term, "config": c.config.to_dict()}
                            for c in self._configs],
                "commit": self.commit_index}

    def _load_configs(self, meta: dict | None) -> list[_ConfigEntry]:
        """The latest configuration entry still in the log (a crash may have dropped newer,
        unflushed ones), else the bootstrap configuration."""
        out = [self._bootstrap_config()]
        if not meta or "history" not in meta:
            return out
        for item in meta["history"]:
            off, term = int(item["offset"]), int(item["term"])
            if off < 0:
                out = [_ConfigEntry(-1, 0, ClusterConfig.from_dict(item["config"]))]
                continue
            if off < self.log.start_offset or (off <= self.log.dirty_offset
                                                and self.log.term_at(off) == term):
                out.append(_ConfigEntry(off, term, ClusterConfig.from_dict(item["config"])))
        return out[-_CONFIG_HISTORY:]

    def _rebuild_from_log(self) -> None:
        """Producer table and any configuration entries past the saved metadata, from the log.
        Reads the whole log once at start (the table must know every remembered producer)."""
        log = self.log
        offset = log.start_offset
        known = {c.offset for c in self._configs}
        while offset <= log.dirty_offset:
            batches = log.read(offset, 8 << 20)
            for b in batches:
                if b.kind == BatchKind.DATA:
                    self.producers.record(b)
                elif b.kind == BatchKind.CONFIG and b.base_offset not in known \
                        and b.base_offset > self._configs[-1].offset:
                    self._configs.append(_ConfigEntry(b.base_offset, b.term,
                                                      ClusterConfig.from_batch(b)))
            offset = batches[-1].last_offset + 1

    @staticmethod
    def _describe(cfg: ClusterConfig) -> str:
        return f"voters {list(cfg.voters)}, learners {list(cfg.learners)}"

    # ================================================================== log search
    def _term_or_zero(self, offset: int) -> int:
        try:
            return self.log.term_at(offset)
        except OffsetOutOfRange:
            return 0

    def _first_offset_of_term(self, term: int, upto: int) -> int:
        """First offset in [start, upto] whose entry has `term` (terms never decrease along
        the log, so binary search)."""
        lo, hi = self.log.start_offset, upto
        while lo < hi:
            mid = (lo + hi) // 2
            if self.log.term_at(mid) < term:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _last_offset_with_term_at_most(self, term: int, upto: int) -> int:
        """Last offset in [start - 1, upto] whose term is <= `term`."""
        lo, hi = self.log.start_offset - 1, upto
        if hi < lo:
            return lo
        if self.log.term_at(lo) > term:
            return lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.log.term_at(mid) <= term:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ================================================================== output helpers
    def _send(self, msg: m.Message) -> None:
        self._messages.append(msg)

    def _next_seq_peek(self) -> int:
        self._seq += 1
        return self._seq

    def _answer(self, request_id: int, error: ErrorCode, *, base_offset: int = -1,
                last_offset: int = -1, leader_id: int | None = None, duplicate: bool = False,
                message: str = "") -> None:
        if request_id == INTERNAL_REQUEST:
            return
        self._answers.append(ProduceAnswer(request_id, error, base_offset, last_offset,
                                           leader_id, duplicate, message))


__all__ = ["InvariantViolation", "RaftConfig", "RaftCore", "StorageError"]
