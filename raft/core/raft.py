"""The sans-IO Raft core: messages, ticks and storage completions in; messages, storage work and
client answers out (raft/core/ready.py). No sockets, clocks, threads or global randomness here: the
trio runtime (raft/node/) and the deterministic simulation (raft/sim/) drive the same object.

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

The core appends to its LogStorage directly (appends only touch the in-memory tail); flushes,
metadata writes and durable log changes (truncations, a reset, repairs: StorageWork) are the
driver's work, announced through Ready, so no fsync runs on the driver's event loop.

One concern a file, after etcd-io/raft: this file holds the state, the inputs (tick, step,
propose, flushed, stored), the Ready output and the role changes (only the _become_* methods set
the role; what only a leader has is `self.leader`, raft/core/leader_state.py, None unless
leading); elections are in raft/core/election.py, the follower side of replication in
raft/core/follower.py, the leader side and the commit rule in raft/core/leader.py, membership
changes in raft/core/confchange.py, data-directory identities (a node that lost its disk neither
votes nor counts until re-added) in raft/core/incarnation.py, damaged batches in
raft/core/repair.py; the recovery machinery the leader and follower call (chunk planning,
probing hints, deferred flush, the in-flight window) is in recovery/. """

from __future__ import annotations

from collections.abc import Callable

from raft.core import messages as m
from raft.core.config import RaftConfig, Rng
from raft.core.backlog import PARKED_FACTOR
from raft.core.confchange import INTERNAL_REQUEST, ConfChanges
from raft.core.election import Campaign, Elections
from raft.core.follower import FollowerSide
from raft.core.incarnation import Incarnations, Standing
from raft.core.leader import LeaderSide
from raft.core.leader_state import LeaderState, Waiting
from raft.core.membership import ClusterConfig, ConfigEntry
from raft.core.merging import ProduceMerging
from raft.core.mirror import Mirror
from raft.core.producers import ProducerTable, Verdict
from raft.core.quiesce import Quiescence
from raft.core.snapshot import CONFIG, PRODUCERS, SnapshotContext, StartState, section_raw
from raft.core.progress import FollowerProgress
from raft.core.ready import FollowerStatus, HardState, ProduceAnswer, Ready, Status, StorageWork
from raft.core.repair import CopyCensus, Repairs
from raft.core.types import Acks, ErrorCode, InvariantViolation, Role
from recovery.deferred_flush import DeferredFlush
from recovery.budget import GroupRecovery
from recovery.ratelimit import TokenBucket
from recovery.stream import StreamLimits
from storage.api import LogStorage, StorageError
from storage.batch import Batch, BatchKind

# The election timeout's random spread doubles at most this many times after failed campaigns.
MAX_BACKOFF_DOUBLINGS = 3
# What a client may propose (MIRRORED: a link, into a translated group), and which of those the
# idempotent producer check covers.
_PROPOSED = frozenset({BatchKind.DATA, BatchKind.CONTROL, BatchKind.STAGED, BatchKind.MIRRORED})
_IDEMPOTENT = frozenset({BatchKind.DATA, BatchKind.MIRRORED})


class RaftCore(Elections, FollowerSide, LeaderSide, ConfChanges, Incarnations, Repairs,
               Quiescence, Mirror, ProduceMerging):
    """One Raft group's consensus state machine. Drive it with tick/step/propose/flushed and
    drain ready(); see raft/core/ready.py for the driver contract. An idle group quiesces
    (raft/core/quiesce.py): while `quiesced`, tick() is a no-op, and the runtime feeds node
    liveness through peer_down()/peer_up()."""

    # Every core starts as a follower; only the _become_* methods below change the role.
    role: Role = Role.FOLLOWER

    def __init__(self, cfg: RaftConfig, log: LogStorage, rng: Rng,
                 recovery: GroupRecovery | None = None) -> None:
        self.cfg = cfg.validate()
        self.log = log
        self.rng = rng
        self.node_id = cfg.node_id
        meta = log.load_meta()
        self.term: int = meta.term
        self.voted_for: int | None = meta.voted_for
        self.leader_id: int | None = None
        # The last checkpointed commit index, bounded by what survived in our log.
        saved_commit = int((meta.config or {}).get("commit", -1))
        self.commit_index = max(log.start_offset - 1,
                                min(saved_commit, log.flushed_offset, log.dirty_offset))
        self._saved_commit = self.commit_index
        self._checkpoint_elapsed = 0
        self._configs: list[ConfigEntry] = self._load_configs(meta.config)
        self.producers = ProducerTable(cfg.producer_window, cfg.max_producers)
        # The tables as of the log start come from the state stored with it (retention or a
        # state transfer dropped the batches that built them); the log after it does the rest.
        raw = section_raw(log.snapshot, PRODUCERS)
        if raw is not None:
            self.producers.load(raw)
        self._mirror_open()  # the visible end at the log start (raft/core/mirror.py)
        self._rebuild_from_log()

        self._election_elapsed = 0
        self._randomized_timeout = 0
        # Campaigns in a row that timed out without a leader (see _reset_randomized_timeout).
        self._failed_campaigns = 0
        self._reset_randomized_timeout()
        self._votes: dict[int, bool] = {}
        # Exists only while leading (raft/core/leader_state.py).
        self.leader: LeaderState | None = None
        self._seq = 0
        self._stream_limits = StreamLimits(cfg.max_append_bytes, cfg.recovery_chunk_bytes,
                                           cfg.recovery_flush_per_chunk, cfg.max_append_batches)
        self._ticks = 0  # the recovery throttle's clock
        self._recovery_throttle: TokenBucket | None = None
        # The node's recovery budget (recovery/budget.py), shared by every group of the
        # process: slots for concurrent catch-ups and one byte rate. Given, it replaces the
        # group's own throttle below.
        self._recovery_budget = recovery
        if cfg.recovery_rate_bytes_per_tick and recovery is None:
            self._recovery_throttle = TokenBucket(
                cfg.recovery_rate_bytes_per_tick,
                cfg.recovery_burst_bytes or cfg.recovery_chunk_bytes, lambda: self._ticks)
        # Follower side.
        self._leader_commit = -1  # last commit index the leader told us (this term)
        self._matched_upto = -1  # our log equals this term's leader's up to here
        self._held_replies: list[m.AppendEntriesReply] = []  # flush=True replies awaiting flush
        self._deferred_flush = DeferredFlush(cfg.follower_flush_bytes,
                                             cfg.follower_flush_ticks)
        self._reported_flushed = log.flushed_offset

        # Durable log changes handed to the driver (StorageWork, raft/core/ready.py): the one not
        # handed out yet, the one running, what to do once it is done, and the append to
        # handle again then. One at a time; the core leaves the log alone meanwhile.
        self._storage_out: StorageWork | None = None
        self._storage_running: StorageWork | None = None
        self._after_storage: tuple[Callable[[], object], ...] = ()
        self._resume: m.AppendEntries | None = None
        # What waits for stored() because it reads the log (its end and that end's term, which
        # a running truncation changes on the driver's worker): the follower's answers to a
        # flush, and pings to these nodes.
        self._flushed_after_storage = False
        self._pings_after_storage: set[int] = set()

        # Ready output.
        self._messages: list[m.Message] = []
        self._answers: list[ProduceAnswer] = []
        self._flush_wanted = False
        self._hs_dirty = False
        self._bcast_wanted = False

        self._damage_seen = -1  # damage found at open is reported at the first tick
        self._damage_ticks = 0
        self._copy_census = CopyCensus()  # who answered without a good copy (raft/core/repair.py)
        # Quiescence (raft/core/quiesce.py).
        self._quiesced = False
        self._quiesce_seq = 0  # follower: the seq of the quiescing heartbeat it obeyed
        self._peers_down: set[int] = set()  # nodes the runtime's failure detector reports down
        self._init_incarnation(meta)

        if len(self.config.voters) == 1 and self.config.voters[0] == self.node_id and \
                self.term == 0:
            # A brand-new single-voter cluster needs no election timeout to start serving.
            self._randomized_timeout = 1

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> ClusterConfig:
        return self._configs[-1].config

    @property
    def high_watermark(self) -> int:
        """What consumers may read: the commit index (never a dirty offset)."""
        return self.commit_index

    def is_voter(self, node_id: int | None = None) -> bool:
        return (self.node_id if node_id is None else node_id) in self.config.voters

    # ------------------------------------------------------------------ inputs
    def tick(self) -> None:
        if self._quiesced:
            if self.log.damage_version == self._damage_seen:
                return  # quiet: nothing to time, nothing to send (raft/core/quiesce.py)
            self.wake()  # storage recorded damage since: report it, have it repaired
        self._ticks += 1
        self._checkpoint_elapsed += 1
        self._tick_incarnation()
        self._tick_repair()
        if (self.cfg.commit_checkpoint_ticks and self.commit_index > self._saved_commit
                and self._checkpoint_elapsed >= self.cfg.commit_checkpoint_ticks):
            self._hs_dirty = True
        if self.role == Role.LEADER:
            self._tick_leader()
            self._maybe_readd()
        else:
            self._tick_follower()
        self._tick_flush_schedule()

    def step(self, msg: m.Message) -> None:
        if msg.dst != self.node_id:
            return
        if self._quiesced:
            if self._quiet_step(msg):
                return  # older than the quiescing round: dropped (raft/core/quiesce.py)
            self._step(msg)
            self._after_quiet_step()
            return
        if self.leader is not None and self.leader.quiesce_seq >= 0:
            self._round_step(msg)
        self._step(msg)

    def _step(self, msg: m.Message) -> None:
        if isinstance(msg, m.BootstrapProbe):  # outside the term rules (raft/core/incarnation.py)
            self._handle_probe(msg)
            return
        if isinstance(msg, m.BootstrapProbeReply):
            self._handle_probe_reply(msg)
            return
        if msg.term == 0 and self._founders:
            self._vouch_for_announce(msg)  # a founder that never saved a term (incarnation.py)
        if not self._screen(msg):
            return  # from a data directory the configuration does not know for its sender
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
                                              msg.pre_vote, self.incarnation))
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
            if self.role != Role.LEADER and self.is_voter() and self._may_campaign():
                self._campaign(Campaign.TRANSFER)

    def propose(self, request_id: int, batch: Batch, acks: Acks) -> None:
        """Offer a batch for the log; the answer comes through ready().answers."""
        acks = Acks(acks)
        if batch.kind not in _PROPOSED:
            raise ValueError(f"clients may not propose {batch.kind.name} batches")
        lead = self.leader
        if self._quiesced and lead is not None:
            self._wake_leader()  # (a follower answers NOT_LEADER: nothing to wake for)
        if lead is None or lead.transfer_target is not None:
            hint = self.leader_id if lead is None else lead.transfer_target
            self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=hint)
            return
        limit = self.cfg.max_uncommitted_bytes
        if lead.backlog.must_wait(acks, limit):  # paced by replication (raft/core/backlog.py)
            room = PARKED_FACTOR * limit
            if not lead.backlog.park(request_id, batch, acks, room, self.cfg.max_pending_produce):
                self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                    f"the leader holds {lead.backlog.bytes} bytes its followers have not "
                    f"committed (max_uncommitted_bytes {limit}) and {lead.backlog.parked_bytes} "
                    f"bytes of writes wait; retry shortly"))
            return
        self._propose_now(request_id, batch, acks)

    def _admit_parked(self) -> None:
        """The commit index moved: writes waiting for room go in, in the order they came."""
        lead = self.leader
        while lead is not None and lead.transfer_target is None:
            item = lead.backlog.next_admitted(self.cfg.max_uncommitted_bytes)
            if item is None:
                return
            self._propose_now(*item)

    def _propose_now(self, request_id: int, batch: Batch, acks: Acks) -> None:
        lead = self.leader
        assert lead is not None
        if batch.producer_id and batch.kind in _IDEMPOTENT:
            verdict, written = self.producers.lookup(batch.producer_id, batch.sequence)
            if verdict == Verdict.DUPLICATE:
                assert written is not None
                self._answer_duplicate(request_id, written.base_offset, written.last_offset,
                                       acks)
                return
            if verdict == Verdict.UNKNOWN:
                self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                    "this leader holds a damaged batch it cannot read until it is repaired, so "
                    "it cannot tell whether this write is a retry of it; retry shortly"))
                return
            if verdict == Verdict.TOO_OLD:
                self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                    f"sequence {batch.sequence} of producer {batch.producer_id} is older than "
                    f"the last {self.cfg.producer_window} remembered: its outcome is unknown; "
                    f"read the log to check, and use a new producer id for new writes"))
                return
        if self.cfg.translated or batch.kind == BatchKind.MIRRORED:
            converted = self._mirror_propose(request_id, batch)  # raft/core/mirror.py
            if converted is None:
                return
            batch = converted
        waiting = len(lead.waiting) + self._open_waiting()
        if acks == Acks.QUORUM and waiting >= self.cfg.max_pending_produce:
            self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                f"{waiting} quorum writes are waiting for commit; retry shortly"))
            return
        if self._open_propose(request_id, batch, acks):
            return  # appended with the writes proposed beside it (raft/core/merging.py)
        placed = self._append_as_leader(batch)
        if placed is None:
            self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                "the leader's unflushed tail is full; retry after the running flush"))
            return
        if acks == Acks.QUORUM:
            lead.waiting.append(Waiting(request_id, placed.base_offset, placed.last_offset))
            self._answer_committed()  # a single voter may already cover it
        else:
            # LEADER: appended on the leader, nothing flushed yet. NONE: the same moment (the
            # client does not wait for it; the offsets cost nothing to report).
            self._answer(request_id, ErrorCode.OK, base_offset=placed.base_offset,
                         last_offset=placed.last_offset)

    def flushed(self, offset: int) -> None:
        """The driver's flush completed; `offset` is the log's flushed offset now."""
        self._deferred_flush.on_flushed()
        if self.role == Role.LEADER:
            self._maybe_commit()
            return
        if self._storage_running is not None:
            self._flushed_after_storage = True  # the log is changing: answer once stored()
            return
        self._follower_flushed()

    def stored(self) -> None:
        """The driver finished the StorageWork of an earlier Ready: the change is durable."""
        if self._storage_running is None:
            raise ValueError("stored() without storage work running: call it once per "
                             "Ready.storage, after running it")
        then, resume = self._after_storage, self._resume
        self._storage_running, self._after_storage, self._resume = None, (), None
        for fn in then:
            fn()
        if self._flushed_after_storage:
            self._flushed_after_storage = False
            if self.role != Role.LEADER:
                self._follower_flushed()
        pings, self._pings_after_storage = self._pings_after_storage, set()
        for node_id in sorted(pings):
            self._ping(node_id)
        if resume is not None and resume.term == self.term:
            self.step(resume)  # the append that needed the change, from where it stopped

    def request_meta_save(self) -> None:
        """The runtime changed what it keeps beside the hard state (Meta.extra: the cluster
        id): the next Ready carries the hard state, so the driver saves the metadata."""
        self._hs_dirty = True

    # ------------------------------------------------------------------ outputs
    def ready(self) -> Ready:
        self._seal_open()
        if self._bcast_wanted and self.leader is not None:
            self._bcast_wanted = False
            for pr in self.leader.progress.values():
                self._send_append(pr)
        hs = None
        if self._hs_dirty:
            hs = HardState(self.term, self.voted_for, self._config_meta())
            self._hs_dirty = False
            self._saved_commit = self.commit_index
            self._checkpoint_elapsed = 0
        rd = Ready(hs, self._messages, self._flush_wanted, self._answers, self._storage_out)
        self._messages, self._answers, self._flush_wanted = [], [], False
        self._storage_out = None
        return rd

    def status(self) -> Status:
        followers = []
        if self.leader is not None:
            for pr in self.leader.progress.values():
                followers.append(FollowerStatus(
                    pr.node_id, pr.match_index, pr.next_index, pr.dirty_offset,
                    pr.flushed_offset, len(pr.inflight), pr.inflight_bytes, pr.learner,
                    pr.recovering, pr.ticks_since_heard,
                    self._rejoiners.get(pr.node_id, self.config.incarnations.get(
                        pr.node_id, self._incarnation_heard.get(pr.node_id, 0))),
                    pr.node_id in self._rejoiners, pr.repair_at))
        cfg = self.config
        return Status(self.node_id, self.role, self.term, self.leader_id, self.log.dirty_offset,
                      self.log.flushed_offset, self.commit_index, self.high_watermark,
                      self.log.start_offset, list(cfg.voters), list(cfg.learners), followers,
                      self.log.retained_bytes, self.log.start_term,
                      self.incarnation, self.standing().value,
                      [[d.first, d.last] for d in self.log.damaged()], self.votes_refused,
                      self._damage_waiting_for())

    def snapshot_context(self) -> SnapshotContext:
        """What the sections of the state at the log start need on this node (raft/core/snapshot.py):
        the producer table's bounds and the configuration before the log's first CONFIG."""
        first = self._configs[0]
        boot = first if first.offset < 0 else self._bootstrap_config()
        return SnapshotContext(self.cfg.producer_window, self.cfg.max_producers,
                               boot.config.to_dict(), tuple(self.cfg.snapshot_sections))

    def _restore_start_state(self, state: StartState) -> None:
        """Take the tables from the state at a new log start (after a state transfer reset the
        log there): the configuration in force and the producer table, as of start - 1."""
        self.producers = state.states[PRODUCERS]
        self._configs = [state.states[CONFIG][0]]
        self._mirror_restore(state)
        self._hs_dirty = True

    def progress(self, node_id: int) -> FollowerProgress | None:
        """The leader's view of one follower (None elsewhere); for the runtime and tests."""
        return None if self.leader is None else self.leader.progress.get(node_id)

    # ------------------------------------------------------------------ roles and time
    def _tick_follower(self) -> None:
        self._election_elapsed += 1
        timeout = self._randomized_timeout * (2 if self._damaged() else 1)
        if self._election_elapsed < timeout:
            return
        if self.is_voter() and self._may_campaign():
            if self.role is not Role.FOLLOWER:
                self._failed_campaigns += 1  # our last campaign timed out: split or unheard
            self._election_elapsed = 0
            self._campaign(Campaign.PRE_VOTE if self.cfg.pre_vote else Campaign.ELECTION)
        elif ((self._election_elapsed - timeout) % self.cfg.election_ticks == 0
              and self.leader_id is None and self.node_id in self.config.members
              and self.standing() != Standing.CHECKING):
            # May not campaign (yet): a quiet leader must hear of us (raft/core/quiesce.py).
            # The count goes on, so we campaign at the first tick we may, as before.
            self._announce()

    def _reset_randomized_timeout(self) -> None:
        """A random timeout in [e, 2e) ticks; after campaigns that timed out in a row, the
        spread doubles with each (up to 8e): when votes take about as long as the spread (an
        overloaded node, hundreds of groups electing at once), equal spreads make the same
        candidates collide term after term, and a wider one separates them. Back to [e, 2e)
        once a leader is known. Timing only: safety never depends on it."""
        e = self.cfg.election_ticks
        spread = e << min(self._failed_campaigns, MAX_BACKOFF_DOUBLINGS)
        self._randomized_timeout = e + self.rng.randrange(spread)

    def _enter_term(self, term: int, voted_for: int | None) -> None:
        """A new term: a new vote (durable before anyone sees a message of it) and nothing
        known yet of this term's leader's log."""
        self.term = term
        self.voted_for = voted_for
        self._hs_dirty = True
        self._leader_commit = -1
        self._matched_upto = -1
        self._held_replies = []
        self._quiesce_seq = 0

    def _become_follower(self, term: int, leader: int | None) -> None:
        lead = self.leader
        if term != self.term:
            self._enter_term(term, None)
        self.role = Role.FOLLOWER
        self.leader_id = leader
        self._quiesced = False
        self._election_elapsed = 0
        if leader is not None:
            self._failed_campaigns = 0
        self._reset_randomized_timeout()
        self._votes = {}
        if lead is not None:
            self._step_down(lead)

    def _become_pre_candidate(self) -> None:
        """Ask whether we would win, in our current term (raft/core/election.py)."""
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None
        self._quiesced = False
        self._votes = {self.node_id: True}
        self._election_elapsed = 0
        self._reset_randomized_timeout()

    def _become_candidate(self) -> None:
        """Campaign in the next term, voting for ourselves (raft/core/election.py)."""
        self._enter_term(self.term + 1, self.node_id)
        self.role = Role.CANDIDATE
        self.leader_id = None
        self._quiesced = False
        self._votes = {self.node_id: True}
        self._election_elapsed = 0
        self._reset_randomized_timeout()

    def _step_down(self, lead: LeaderState) -> None:
        """What only a leader held goes with its leadership; its waiting writes are told."""
        self.leader = None
        self._drop_open(lead)
        if self._recovery_budget is not None:
            self._recovery_budget.release()  # its catch-up streams end with its leadership
        for w in lead.waiting:
            self._answer(w.request_id, ErrorCode.LEADERSHIP_LOST, leader_id=self.leader_id,
                         message=("leadership changed before the write committed; it may or may "
                                  "not commit: retry (idempotent producers make it safe)"))
        for request_id, _, _ in lead.backlog.take_parked():  # never appended
            self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=self.leader_id,
                         message="leadership changed while the write waited for replication; "
                                 "nothing was written: send it to the new leader")

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self._failed_campaigns = 0
        self._quiesced = False
        self.leader = LeaderState({node_id: self._new_progress(node_id)
                                   for node_id in self.config.members if node_id != self.node_id})
        # A no-op of our term: entries of earlier terms commit once it does.
        noop = self._append_as_leader(Batch.create(b"", 1, kind=BatchKind.NOOP))
        if noop is None:
            # The unflushed tail is full. A leader without its no-op must not lead (it could
            # let a membership change through before committing in its term): stay a
            # follower of this term (our vote here is spent) and let the flush run; a later
            # election timeout tries again.
            self._become_follower(self.term, None)
            return
        self.leader.noop_offset = noop.base_offset
        self._maybe_commit()

    def _new_progress(self, node_id: int) -> FollowerProgress:
        pr = FollowerProgress(node_id, next_index=self.log.dirty_offset + 1,
                              learner=node_id in self.config.learners)
        pr.recent_active = True
        return pr

    # ------------------------------------------------------------------ output helpers
    def _send(self, msg: m.Message) -> None:
        self._messages.append(msg)

    def _hand_off(self, work: StorageWork, *then: Callable[[], object]) -> None:
        """Ask the driver for a durable change of the log (it fsyncs: the driver runs it off
        its event loop); `then` runs once it is done (stored()). Until then nothing else
        changes the log: appends wait (_waits_for_storage) and the node does not campaign."""
        if self._storage_running is not None:
            raise InvariantViolation(f"node {self.node_id}: storage work {work.op.value} asked "
                                     f"for while {self._storage_running.op.value} runs")
        self._storage_out = self._storage_running = work
        self._after_storage = then

    def _waits_for_storage(self, msg: m.AppendEntries) -> bool:
        """True when storage work runs: `msg` is handled again once it is done."""
        if self._storage_running is None:
            return False
        self._resume = msg
        return True

    def _next_seq_peek(self) -> int:
        self._seq += 1
        return self._seq

    def _answer(self, request_id: int, error: ErrorCode, *, base_offset: int = -1,
                last_offset: int = -1, leader_id: int | None = None, duplicate: bool = False,
                message: str = "", visible_end: int = -1) -> None:
        if request_id == INTERNAL_REQUEST:
            return
        self._answers.append(ProduceAnswer(request_id, error, base_offset, last_offset,
                                           leader_id, duplicate, message, visible_end))


__all__ = ["INTERNAL_REQUEST", "InvariantViolation", "RaftConfig", "RaftCore", "Rng",
           "StorageError"]
