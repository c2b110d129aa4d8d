"""One Raft group's driver: feeds the sans-IO core and carries out what its Ready asks.

Tasks (started by `start` into the group's own nursery, which the node's group registry,
raft.node.registry, runs under the node and can stop on its own):
- no tick task: the node's one ticker (raft.node.registry) calls `tick` for every group at once,
  so the heartbeats of all the groups a node leads leave in one frame per peer;
- the loads task: now and then the leader applies committed load entries (a budget per round,
  in bounded slices) and aborts idle staged loads;
- the Ready loop, woken by an event whenever an input reached the core (no polling);
- flushing is the node's (raft.node.flusher.NodeFlusher, given as `flusher`): the group asks, the
  node's one flush writes every asking group's tail in one transaction and one fsync (group
  commit across groups), then calls `on_flushed` with this group's own flushed offset;
- the catch-up sampler (raft.node.catchup) behind `status`;
- no scrub task: the group's scrubber (raft.node.scrubber) keeps its place in the log, and the
  node's one scrub scheduler (raft.node.scrub_scheduler, given as `scrub_scheduler`) visits it
  (a group started without one scrubs on its own).

Driver contract (raft/core/ready.py), in the order the Ready loop applies it: persist `hard_state`
(fsync) BEFORE enqueueing `messages`; request a flush when `flush` is set; route `answers` to the
client requests waiting for them. Quorum acks come from the core only once the commit index covers
the batch, and the commit index counts only flushed offsets, so a SIGKILL at any moment loses
nothing quorum-acked.

Messages leave through the group's own `GroupOutbox` (raft.node.outbox: the rules about this
group's stream to each peer, tagged with the group id) onto the node's peer links, which all of
its groups share; the group never sees a connection. The core does not know its group id: only
the driver and the envelope on the wire do. When the configuration in force changes, the group
tells the node (`on_membership_change`), which keeps links to what all of its groups need.

Blocking storage work runs as the log says (`LogStorage.io_mode`): in a worker thread for LMDB,
inline for the in-memory log. Process-wide tuning (GC, the GIL switch interval) is serve's.

Group 0 is the node's own group (the one a single-group node runs): it keeps the cluster identity
in its metadata. Other groups (`Node.add_group`) are given their voters and their log; a mirror
partition's API is raft.node.mirror_group's. With no log passed in, the group opens
`<data_dir>/node-<id>/` (storage.open_log); in-process tests pass a MemoryLog or LmdbLog.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from raft.core.membership import ClusterConfig
from raft.core.messages import Message
from raft.node.catchup import CatchupTracker
from raft.node.config import ConfigError, NodeConfig
from raft.node.errors import NodeFailed
from raft.node.flusher import NodeFlusher
from raft.node.identity import ClusterIdentity
from raft.node.load_service import LoadService
from raft.node.log_open import open_log_with_progress
from raft.node.meta_saver import MetaSaver
from raft.node.mirror_group import MirrorGroup
from raft.node.outbox import GroupOutbox, Links
from raft.node.pending import PendingAnswers
from raft.node.propose_then import ProposeThen
from raft.node.retention import RetentionTask
from raft.core.retention import RetentionPolicy
from raft.node.scrub_scheduler import NodeScrubber
from raft.node.scrubber import Scrubber
from raft.node.subscription_service import SubscriptionService
from raft.node import trace
from raft.core.incarnation import Standing
from raft.core.raft import RaftConfig, RaftCore
from raft.core.ready import ProduceAnswer, StorageWork
from raft.core.types import Acks, ErrorCode, Role
from storage.api import DiskFull, IoMode, LogStorage, Meta, StorageError
from storage.batch import Batch

if TYPE_CHECKING:
    from raft.node.metrics import NodeMetrics
    from raft.node.topic_settings import GroupSettings

log = logging.getLogger("raftlog.node")

# With a full disk, a flush (or a metadata save) is retried this often until space returns.
DISK_FULL_RETRY_S = 1.0
LOAD_CHECK_TICKS = 20  # how often (in ticks) the leader looks for timed-out staged loads
LOAD_CATCH_UP_BYTES = 8 << 20  # committed bytes the leader's load index applies per round
DELIVER_SLICE_S = 0.002  # a peer frame's messages are stepped in slices of about this long


class RaftGroup(MirrorGroup, ProposeThen):
    def __init__(self, config: NodeConfig, links: Links, *, log_storage: LogStorage | None,
                 rng: random.Random, group_id: int = 0,
                 voters: list[int] | None = None) -> None:
        self.config = config
        self.node_id = config.node_id
        self.group_id = group_id
        # The group whose metadata keeps the cluster id (the node sets it: the default topic's,
        # which owns the legacy key space, so data directories from before topics keep theirs).
        self.keeps_identity = False
        # Whether retention cuts this group's log (its policy: settings_of, else the node's
        # flags). Snapshot sections only this group carries (the controller's metadata).
        self.retained = True
        self.snapshot_sections: tuple[Any, ...] = ()
        # The node's recovery budget shared by its groups (recovery/budget.py); None: the
        # group's own throttle (a group run on its own, as in tests).
        self.recovery_budget: Any = None
        # Where a partition reads its topic's settings (raft.node.topic_settings; set by the
        # node's TopicRuntime before the core starts); None: the node's flags, fixed.
        self.settings_of: Callable[[], GroupSettings] | None = None
        # The founding voters of a group other than 0 (group 0's come from --peers).
        self._voters = None if voters is None else sorted(voters)
        self._outbox = GroupOutbox(links, group_id)
        self.log: LogStorage | None = log_storage
        self.owns_log = log_storage is None
        self._io_mode = IoMode.WORKER_THREAD  # the log's own, once it is open
        self._rng = rng
        # The following exist once the core runs (start_core).
        self.core: RaftCore | None = None
        self.loads: LoadService | None = None
        self.retention: RetentionTask | None = None  # its `holders` take hooks
        self.subs: SubscriptionService | None = None
        # The node keeps its peer links to what its groups' configurations name (Node).
        self.on_membership_change: Callable[[], None] = lambda: None
        # Role, term or leader changed (the registry passes it on: a link's new leader pulls).
        self.on_state_change: Callable[[], None] = lambda: None
        self._known_config: ClusterConfig | None = None
        self.catchup = CatchupTracker(self)
        self.scrubber = Scrubber(self, config.scrub_rate, config.scrub_slice_kib * 1024)
        # The node's one scrub scheduler (Node sets it; the registry adds the scrubber to it).
        self.scrub_scheduler: NodeScrubber | None = None
        self.closing = False
        self._meta = Meta()
        self._wake = trio.Event()
        # Called on every input that reaches the core (`kick`): the registry puts the group
        # back among the ones its ticker visits (raft.node.registry, quiesced groups skipped).
        self.on_input: Callable[[], None] = lambda: None
        # Set by every input (`kick`): what the group's periodic tasks wait on while the core
        # is quiesced (`until_input`), so a quiet group costs no timer wake-ups either.
        self._input = trio.Event()
        self.inputs = 0  # inputs so far (`until_input`)
        # The node's flusher (Node sets it; a group started without one runs its own).
        self.flusher: NodeFlusher | None = None
        self._hw_changed = trio.Event()
        self._state_changed = trio.Event()
        self._last_hw = -1
        self._last_state: tuple[Any, ...] = ()
        self._pending = PendingAnswers()  # produce waiters, timed out by one timer
        self._request_ids = itertools.count(1)
        # Fail-stop: the first fatal error, and who stops the node on it (Node.abort).
        self.failure: BaseException | None = None
        self.on_fatal: Callable[[], None] = lambda: None
        # Operations ("flush", "save_meta") whose last attempt found the disk full; each is
        # cleared by its own next success (a small metadata save can succeed in LMDB's free
        # pages while flushes still fail).
        self._full_ops: set[str] = set()
        # Flush and election counters, when the node has metrics.
        self.metrics: NodeMetrics | None = None
        # The cluster id (raft/node/identity.py), kept in the metadata's extra map; the node
        # shares it with its peer links.
        self.identity = ClusterIdentity(config.node_id)
        # Metadata saves in order; commit checkpoints off the Ready loop (raft.node.meta_saver).
        self.meta_saver = MetaSaver(self._write_meta, self.fail)
        self._identity_changed = False  # the next save carries a new cluster id: urgent

    def fail(self, exc: BaseException, where: str) -> None:
        """Stop the node now: it can no longer trust its state. Nothing is flushed on the way
        out (a half-applied step must not reach the disk); a restart recovers from the log."""
        if self.failure is None:
            self.failure = exc
            self.closing = True
            # With the traceback: a fail-stop is rare and must be diagnosable from the log.
            log.critical("node_failed node=%d group=%d where=%s error=%s: %s; stopping without "
                         "a final flush. Restart the node: it recovers from its flushed log (if "
                         "it fails again, see docs/STORAGE-SAFETY.md)", self.node_id,
                         self.group_id, where, type(exc).__name__, exc, exc_info=exc)
            self.on_fatal()

    # -- opening and closing -----------------------------------------------------------------------
    async def open_log(self) -> None:
        """Open the durable log unless one was passed in."""
        if self.log is None:
            self.log = await open_log_with_progress(self.config)
        self._io_mode = self.log.io_mode

    def start_core(self) -> None:
        """Load the metadata and build the core and the load service on the open log."""
        assert self.log is not None
        self._meta = self.log.load_meta()
        voters = sorted(self.config.peers)
        if self._voters is not None:
            voters = self._voters
        elif self.config.join:
            # Not a member until the cluster adds it: the others decide, via the log.
            voters = sorted(p for p in self.config.peers if p != self.node_id)
        if self.keeps_identity:  # the cluster id lives in this group's metadata
            self.identity.load(self._meta.extra, fresh=self._meta.is_empty(),
                               founder=None if self.config.join else min(voters),
                               save=self._save_identity)
        try:
            # Quiescence is on by default (RaftConfig.quiesce_ticks): the node's failure
            # detector (raft.node.liveness) feeds peer_down / peer_up, so a quiesced follower
            # notices its leader's node dying; `--raft quiesce_ticks=0` turns it off.
            raft_cfg = RaftConfig(node_id=self.node_id, voters=voters, learners=[],
                                  **self.config.raft_kwargs(), translated=self.translated,
                                  snapshot_sections=self.snapshot_sections)
            budget = self.recovery_budget
            self.core = RaftCore(raft_cfg, self.log, self._rng, recovery=None if budget is None
                                 else budget.for_group(self.group_id))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"raft settings: {e}; check --raft KEY=VALUE options and "
                              f"the [raft] table of the config file") from None
        self.loads = LoadService(self.log)
        self.subs = SubscriptionService(
            self, expiry_ms=self.config.subscription_expiry_ms,
            respect_retention=self.config.retention_respect_subscriptions)
        self._last_hw = self.core.high_watermark
        self._known_config = self.core.config
        settings_of = self.settings_of
        self.retention = RetentionTask(
            self, (lambda: settings_of().retention) if settings_of is not None and self.retained
            else self.config.retention_policy() if self.retained else RetentionPolicy())
        self.subs.attach_retention(self.retention)  # before retention's first pass

    def _save_identity(self) -> None:
        """The cluster id changed (in self._meta.extra): the next Ready saves the metadata."""
        if self.core is not None:
            self._identity_changed = True
            self.core.request_meta_save()
            self.kick()

    def membership(self) -> ClusterConfig:
        """The configuration in force (the core must be running)."""
        assert self.core is not None
        return self.core.config

    def start(self, nursery: trio.Nursery) -> None:
        """Start the driver tasks; cancelling `nursery` stops them (a running save_meta/flush
        thread is waited for, not abandoned)."""
        nursery.start_soon(self.catchup.run_sampler)
        nursery.start_soon(self._ready_loop)
        nursery.start_soon(self.meta_saver.run)
        nursery.start_soon(self._pending.run_timer)
        if self.flusher is None:
            self.flusher = NodeFlusher(self.metrics)
            nursery.start_soon(self.flusher.run)
        nursery.start_soon(self._loads_loop)
        nursery.start_soon(self.retention.run)  # idle (an event wait) while it keeps all
        if self.scrub_scheduler is None:
            nursery.start_soon(self.scrubber.run)
        nursery.start_soon(self.subs.run)

    async def hand_over_leadership(self) -> None:
        """On a graceful stop, a leader hands leadership over (bounded by shutdown_transfer_ms)."""
        if (self.core.role == Role.LEADER and self.config.shutdown_transfer_ms > 0
                and len(self.config.peers) > 1):
            with trio.move_on_after(self.config.shutdown_transfer_ms / 1000):
                try:
                    self.core.transfer_leadership(None)
                except Exception:  # a refusal must not block shutdown
                    log.exception("transfer_on_shutdown_failed node=%d", self.node_id)
                else:
                    self.kick()
                    while self.core.role == Role.LEADER:
                        await self.wait_state_change()

    def begin_shutdown(self) -> None:
        """Graceful stop: refuse new work, answer waiters (SHUTTING_DOWN, by their handlers),
        and return long polls and transfer_leader waits now."""
        self.closing = True
        self._pending.wake_all()  # answered SHUTTING_DOWN by their handlers
        self._hw_changed.set()  # long polls return now
        self._state_changed.set()  # so do transfer_leader waits

    def mark_closed(self) -> None:
        """The node stopped (gracefully or not): wake whoever still waits for an answer."""
        self.closing = True
        self._pending.wake_all()

    async def final_flush(self) -> None:
        """Make everything appended durable and persist metadata before closing the log."""
        rd = self.core.ready()
        try:
            if rd.hard_state is not None:
                await self.meta_saver.save(rd.hard_state)
            await self.meta_saver.flush_pending()
            flushed = await self._run_io(self.log.flush)
        except StorageError as e:  # a full disk too: the stop cannot be clean
            log.error("final_flush_failed node=%d error=%s: the unflushed tail (offsets %d..%d) "
                      "is lost with this stop, as after a crash (quorum-acknowledged data is "
                      "safe on a majority)", self.node_id, e, self.log.flushed_offset + 1,
                      self.log.dirty_offset)
            raise NodeFailed(f"the final flush failed: {e}") from None
        self.core.flushed(min(flushed, self.log.flushed_offset))
        log.info("final_flush node=%d flushed=%d", self.node_id, flushed)

    # -- inputs ------------------------------------------------------------------------------------
    def kick(self) -> None:
        """An input reached the core: let the Ready loop run, and the ticker tick it (an input
        may have woken a quiesced core)."""
        self._wake.set()
        self.inputs += 1
        self._input.set()
        self.on_input()

    @property
    def quiet(self) -> bool:
        """The core is quiesced (raft/core/quiesce.py): nothing moves until an input."""
        return self.core is not None and self.core.quiesced and not self.closing

    async def until_input(self, seen: int) -> int:
        """Wait, while the core is quiesced, until an input newer than `seen` (a value of
        `inputs` this returned before; -1 at first) reached the group; return at once when
        the core is awake or such an input came already. Returns `inputs` now. The group's
        periodic tasks (the catch-up sampler, the loads and subscriptions upkeep) call this
        between rounds, so 1,000 quiet groups do not wake up 1,000 timers a second, and an
        input that came while a task slept (the commit a quiescing heartbeat carried) still
        gets its round."""
        while self.quiet and self.inputs == seen:
            if self._input.is_set():
                self._input = trio.Event()
            await self._input.wait()
        return self.inputs

    def peer_state(self, node_id: int, up: bool) -> None:
        """The node's failure detector reports `node_id`'s node up or down (raft.node.liveness):
        the core's liveness input (raft/core/quiesce.py)."""
        if self.core is None or self.failure is not None:
            return
        try:
            if up:
                self.core.peer_up(node_id)
            else:
                self.core.peer_down(node_id)
        except Exception as e:
            self.fail(e, "peer_up" if up else "peer_down")
            return
        self.kick()

    def wake(self) -> None:
        """Something outside the core changed that it must look at (the scrubber recorded
        damage): a quiesced core goes back to ticking."""
        if self.core is None or self.failure is not None:
            return
        try:
            self.core.wake()
        except Exception as e:
            self.fail(e, "wake")
            return
        self.kick()

    def deliver(self, msgs: list[Message], *, from_peer: int) -> None:
        for msg in msgs:
            if msg.dst != self.node_id or msg.src != from_peer:
                log.warning("misaddressed_message node=%d from=%d src=%d dst=%d", self.node_id,
                            from_peer, msg.src, msg.dst)
                continue
            try:
                self.core.step(msg)
            except Exception as e:  # InvariantViolation, a storage fault: fail-stop
                self.fail(e, "step")
                return
        self.kick()

    async def deliver_frame(self, msgs: list[Message], *, from_peer: int) -> None:
        """`deliver` one frame's messages, yielding to the event loop whenever they have taken
        DELIVER_SLICE_S: on a leader each reply in a frame may refill that follower's window
        (a chunk read from the log), and a follower that queued many replies sends them in
        one frame."""
        started = time.perf_counter()
        for i, msg in enumerate(msgs):
            self.deliver([msg], from_peer=from_peer)
            if i + 1 < len(msgs) and time.perf_counter() - started > DELIVER_SLICE_S:
                await trio.lowlevel.checkpoint()
                if self.closing:
                    return
                started = time.perf_counter()

    def is_leader(self) -> bool:
        return self.core is not None and self.core.role == Role.LEADER and not self.closing

    async def propose_and_wait(self, batch: Batch, acks: Acks, timeout_s: float) -> ProduceAnswer:
        """Propose a batch and wait for the core's answer (TIMEOUT/SHUTTING_DOWN answers are
        synthesised when none comes)."""
        if self.closing:
            return ProduceAnswer(-1, ErrorCode.SHUTTING_DOWN)
        core_id, answer = await self.call_core(
            lambda request_id: self.core.propose(request_id, batch, acks), timeout_s)
        if answer is not None:
            return answer
        return ProduceAnswer(core_id, ErrorCode.SHUTTING_DOWN if self.closing
                             else ErrorCode.TIMEOUT)

    async def call_core(self, propose: Callable[[int], Any],
                        timeout_s: float) -> tuple[int, ProduceAnswer | None]:
        """`propose(request_id)` into the core, then wait up to `timeout_s` for the answer a
        later Ready carries for that id. Returns (request_id, answer or None: no answer in time,
        or the group is closing)."""
        core_id = next(self._request_ids)
        pending = self._pending.add(core_id, timeout_s)
        try:
            try:
                propose(core_id)
            except ValueError:
                raise  # the request's shape was refused: the caller answers BAD_REQUEST
            except Exception as e:
                self.fail(e, "propose")
                return core_id, None
            self.kick()
            if trace.ENABLED:
                trace.request_hop("propose")
            await pending.event.wait()  # answered, timed out (run_timer) or shutting down
            if trace.ENABLED:
                trace.request_hop("woken")
        finally:
            self._pending.discard(core_id)
        return core_id, pending.answer

    async def wait_state_change(self) -> None:
        """Until role, term or leader changes (or the group begins shutting down)."""
        await self._state_changed.wait()

    async def wait_hw_change(self) -> None:
        """Until the high watermark moves (or the group begins shutting down)."""
        await self._hw_changed.wait()

    # -- the driver loops --------------------------------------------------------------------------
    async def run_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking storage work as the log's io_mode says: in a worker thread, or inline
        (the in-memory log)."""
        return await self._run_io(fn, *args)

    async def _run_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._io_mode is IoMode.INLINE:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)

    def tick(self) -> None:
        """One Raft tick. The node's ticker (raft.node.registry) calls this for all of its
        groups in one go, so what they send in a tick leaves in one frame per peer."""
        if self.core is None or self.failure is not None:
            return
        try:
            self.core.tick()
        except Exception as e:
            self.fail(e, "tick")
            return
        if self.keeps_identity and self.core.standing() is Standing.MEMBER:
            self.identity.became_member()
        self.kick()

    async def _loads_loop(self) -> None:
        """The leader keeps its load index applied (at most LOAD_CATCH_UP_BYTES per round, a
        bounded slice per step) and aborts staged loads idle past the load timeout."""
        seen = -1
        while True:
            await trio.sleep(LOAD_CHECK_TICKS * self.config.tick_ms / 1000)
            if not self.loads.index.table.open_loads():
                # Nothing to expire; nothing newly committed while quiet and untouched.
                seen = await self.until_input(seen)
            if self.is_leader():
                await self.loads.catch_up(self.core.commit_index, LOAD_CATCH_UP_BYTES)
            self._expire_loads()

    async def _ready_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self._process_ready()
            except Exception as e:
                self.fail(e, "ready")
                return

    async def _write_meta(self, hard_state: Any) -> None:
        """Persist term, vote and configuration (self.meta_saver calls it, one at a time). On a
        full disk, a new term or vote holds the Ready (its messages depend on it) and is
        retried until space returns; a save that only moves the commit checkpoint or the
        configuration history does not hold it (neither must be durable first: configurations
        are in the log, and the checkpoint only spares a restart some catch-up), and the core
        asks again at its next checkpoint. Any other failure is fatal."""
        meta = Meta(term=hard_state.term, voted_for=hard_state.voted_for,
                    config=hard_state.config, extra=self._meta.extra)
        while True:
            try:
                await self._run_io(self.log.save_meta, meta)
            except DiskFull as e:
                self._note_disk_full(e, "save_meta")
                if (meta.term, meta.voted_for) == (self._meta.term, self._meta.voted_for):
                    return
                await trio.sleep(DISK_FULL_RETRY_S)
                continue
            self._note_disk_ok("save_meta")
            self._meta = meta
            return

    @property
    def disk_full(self) -> bool:
        """The disk refused our last flush or metadata save: the leader refuses writes."""
        return bool(self._full_ops)

    def _note_disk_full(self, e: Exception, what: str) -> None:
        if not self.disk_full:
            log.error("disk_full node=%d op=%s error=%s: refusing writes (DISK_FULL), serving "
                      "reads; retrying every %.0f s. Free space under the data directory (or "
                      "set retention)", self.node_id, what, e, DISK_FULL_RETRY_S)
        self._full_ops.add(what)

    def _note_disk_ok(self, what: str) -> None:
        if what in self._full_ops:
            self._full_ops.discard(what)
            if not self._full_ops:
                log.warning("disk_space_returned node=%d: taking writes again", self.node_id)

    async def _process_ready(self) -> None:
        rd = self.core.ready()
        if trace.ENABLED:
            trace.event("commit", self.group_id, self.core.commit_index)
        if rd.hard_state is not None:
            # A term or vote is durable before any message that depends on it leaves; a commit
            # checkpoint is not waited for (raft.node.meta_saver: it would wait for a flush).
            urgent, self._identity_changed = self._identity_changed, False
            await self.meta_saver.put(rd.hard_state, self._meta, urgent)
        for msg in rd.messages:
            self._outbox.send(msg)
        if rd.flush:
            self.flusher.request(self)
        for answer in rd.answers:
            self._pending.answer(answer)
        if rd.storage is not None:
            await self._run_storage(rd.storage)
        self._notify_changes()

    async def _run_storage(self, work: StorageWork) -> None:
        """A durable log change the core asked for (a truncation, a reset, a repair): fsynced
        in a worker thread like a flush, then the core goes on. Any failure is fatal: the core
        cannot go on without it, and the log is as before it (storage changes disk first)."""
        try:
            await self._run_io(work.run, self.log)
            self.core.stored()
        except Exception as e:
            self.fail(e, f"storage {work.op.value}")
            raise
        self.kick()  # the append that waited for it is answered in the next Ready

    def _notify_changes(self) -> None:
        cfg = self.core.config
        if cfg is not self._known_config and cfg != self._known_config:
            self._known_config = cfg
            self.on_membership_change()
        hw = self.core.high_watermark
        if hw != self._last_hw:
            self._last_hw = hw
            self._hw_changed.set()
            self._hw_changed = trio.Event()
        state = (self.core.role, self.core.term, self.core.leader_id)
        if state != self._last_state:
            if self._last_state:
                log.info("state_changed node=%d group=%d role=%s term=%d leader=%s",
                         self.node_id, self.group_id, state[0].value, state[1], state[2])
            self._last_state = state
            if self.metrics is not None:
                self.metrics.observe_state(self.node_id, *state, self.core.voted_for)
            self._state_changed.set()
            self._state_changed = trio.Event()
            self.on_state_change()

    # -- what the node's flusher reports (raft.node.flusher) --------------------------------------
    def on_flushed(self, flushed: int) -> None:
        """The node's flush made this group's log durable up to `flushed` (a truncation may
        have raced the flush: never report more than the log holds)."""
        self._note_disk_ok("flush")
        try:
            self.core.flushed(min(flushed, self.log.flushed_offset))
        except Exception as e:
            self.fail(e, "flushed")
            return
        self.kick()
        if self.retention is not None:  # a log past its size limit: a round now
            self.retention.on_flushed()

    def on_flush_disk_full(self, e: DiskFull) -> None:
        """Nothing was written (storage changes the disk first): the tail is still in memory
        and the flusher's retry takes it. Not a crash: the leader refuses writes meanwhile."""
        self._note_disk_full(e, "flush")

    def _expire_loads(self) -> None:
        try:
            batches = self.loads.expired(self.is_leader(), self.core.commit_index,
                                         int(time.time() * 1000))
        except Exception:
            log.exception("load_expiry_failed node=%d", self.node_id)
            return
        for batch in batches:  # fire and forget: a lost abort is retried a minute later
            try:
                self.core.propose(next(self._request_ids), batch, Acks.QUORUM)
            except Exception as e:
                self.fail(e, "propose")
                return
        if batches:
            self.kick()
