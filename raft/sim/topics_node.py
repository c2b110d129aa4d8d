"""One simulated node process that runs many Raft groups: the controller (group 0) and the data
partitions the controller's metadata assigns to it (issue 26, the `topics` profile).

What the runtime is to do, modelled here with the real pieces:
- one MemoryStore per node; every group's log is `store.open_log(group)`, a crash is
  `store.crash()` (every log loses exactly its own unflushed part);
- every group is a GroupReplica: a SimNode (the real RaftCore, the Ready loop exactly as for one
  group) whose log comes from the store, whose messages leave in (group, message) envelopes and
  whose flushes go to the node's one flusher;
- one flusher per node: every group that asked while a flush was on its way is written by the
  next `store.flush(logs)` (one commit for all of them), and each group hears `flushed()` with
  exactly its own log's flushed offset;
- group 0's committed entries are applied with MetadataFollower, then the node reconciles
  (raft/controller/reconcile.py): it starts the replicas assigned to it, stops the ones no
  longer assigned, and stops and drops (store.drop_log) the groups of deleted topics;
- node liveness (raft/sim/liveness.py) is per node pair and feeds every running group;
- a storage fault in any group stops the whole process (fail-stop), which restarts later.
A crash, pause or restart is the whole process's: every group goes down together and, on
restart, the node starts group 0, replays the controller log and starts its groups again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from raft.controller.bootstrap import bootstrap_commands
from raft.controller.commands import decode_control, encode_command
from raft.controller import section as controller_section
from raft.controller.follower import MetadataFollower
import raft.controller.reconcile as reconciler
from raft.core import messages as m
from raft.core.raft import RaftConfig
from raft.core.retention import Hold, RetentionPolicy
from raft.core.types import Acks
from raft.sim.node import DiskModel, SimNode
from recovery.budget import GroupRecovery, RecoveryBudget
from storage.api import StorageError
from storage.batch import Batch, BatchKind, CorruptBatch
from storage.memory import MemoryLog, MemoryStore

# raft.sim.topics_runner.TopicsSimulation, which builds on this module (so not imported here).
TopicsSimulation = Any

FAIL_STOP_RESTART_US = 50_000
CONTROLLER = 0


@dataclass
class GroupReplica(SimNode):
    """One group's replica on a many-group node: SimNode's Ready loop over a log of the node's
    store, flushing through the node's flusher. Crashes and fail-stops are the node's."""

    group: int = CONTROLLER
    host: "TopicsNode | None" = None
    shard: int = 0  # the shard index of its node it runs on (the metadata's Partition.shard)

    def _open_log(self) -> MemoryLog:
        assert self.host is not None
        return self.host.store.open_log(self.group)

    def _lose_unflushed(self) -> None:
        """Nothing per group: TopicsNode.crash crashes the store once for every group."""

    def recovery(self) -> GroupRecovery | None:
        """The node's recovery budget, shared by its groups as the runtime shares it."""
        return self.host.recovery.for_group(self.group) if self.host is not None else None

    def retention_holds(self) -> list[Hold]:
        """The controller's log is never cut past what its node has applied (as the runtime's
        `metadata` hold: raft/node/controller.py)."""
        holds = super().retention_holds()
        follower = self.host.follower if self.host is not None else None
        if self.group == CONTROLLER and follower is not None:
            holds.append(Hold("metadata", follower.position, False))
        return holds

    def fail_stop(self, error: StorageError) -> None:
        assert self.host is not None
        self.host.fail_stop(error)

    def _start_flush(self) -> None:
        assert self.host is not None
        self.flushing = True
        self.flush_again = False
        self.host.want_flush(self)

    def flush_complete(self, flushed: int) -> None:
        """The node's flush that held this group's tail committed; `flushed` is what that
        commit held for this group's log (MemoryStore.flush's answer for it)."""
        if not self.up:
            return
        self.flushing = False
        if self.paused:
            self.flush_again = True
            return
        assert self.core is not None
        self.core.flushed(flushed)
        self.on_event(self, "flushed")
        self.process()
        if self.up and self.flush_again and not self.flushing:
            self._start_flush()


class TopicsNode:
    """A node process: a store, group 0 and the partitions its applied metadata assigns it."""

    def __init__(self, node_id: int, sim: "TopicsSimulation", rng: random.Random,
                 founders: list[int], knobs: dict[str, Any], tick_us: int,
                 disk: DiskModel | None = None) -> None:
        self.node_id = node_id
        self.sim = sim
        self.loop = sim.loop
        self.rng = rng
        self.founders = founders
        self.knobs = knobs
        self.tick_us = tick_us
        self.disk = disk or DiskModel()
        self.store = MemoryStore(max_tail_bytes=64 << 20)
        # One recovery budget per node (a few slots: the schedules make them contended).
        self.recovery = RecoveryBudget(sim.cfg.recovery_streams,
                                       clock=lambda: self.loop.now // self.tick_us)
        cut = sim.cfg.controller_retention
        self.controller_retention = None if cut is None else RetentionPolicy(**cut).validate()
        self.replicas: dict[int, GroupReplica] = {}
        self.follower: MetadataFollower | None = None
        self.up = False
        self.paused = False
        self.epoch = 0
        self.restarts = 0
        self.fail_stops = 0
        self.flushing = False
        self.flush_wanted: dict[int, GroupReplica] = {}
        self.flush_rounds = 0
        self.flushed_groups = 0  # groups written by those rounds (group commit: > rounds)
        self.sync_pending = False
        self.boot_term = -1  # the controller term this node last proposed bootstrap in
        self.metadata_restores = 0  # metadata taken from a cut controller log's start
        self.start()

    # -- what the nemesis and liveness see -------------------------------------------------
    @property
    def controller(self) -> GroupReplica:
        return self.replicas[CONTROLLER]

    @property
    def log(self) -> MemoryLog:
        return self.controller.log

    @property
    def core(self):  # noqa: ANN201 (the controller's core)
        return self.controller.core

    @property
    def is_leader(self) -> bool:
        """Leads the controller (what `crash_leader` aims at)."""
        return self.up and self.controller.is_leader

    @property
    def metadata(self):  # noqa: ANN201
        return self.follower.metadata if self.follower is not None else None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.up = True
        self.paused = False
        self.epoch += 1
        self.flushing = False
        self.flush_wanted.clear()
        self.boot_term = -1
        self._start_replica(CONTROLLER, tuple(self.founders))
        self.follower = MetadataFollower(self.controller.log)
        self.sim.on_node_event(self, "start")
        self.request_sync()

    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.paused = False
        self.epoch += 1
        for r in self.replicas.values():
            r.crash()
        self.store.crash()
        self.follower = None
        self.flushing = False
        self.flush_wanted.clear()
        self.restarts += 1
        self.sim.on_node_event(self, "crash")

    def fail_stop(self, error: StorageError) -> None:
        self.fail_stops += 1
        self.sim.on_node_event(self, f"fail-stop {type(error).__name__}")
        self.crash()
        epoch = self.epoch

        def restart() -> None:
            if self.epoch == epoch and not self.up:
                self.start()

        self.loop.after(FAIL_STOP_RESTART_US, restart)

    def pause(self) -> None:
        if self.up:
            self.paused = True
            for r in list(self.replicas.values()):
                r.pause()

    def resume(self) -> None:
        if self.up and self.paused:
            self.paused = False
            for r in list(self.replicas.values()):
                if self.up:
                    r.resume()
            self.request_sync()

    # -- inputs ----------------------------------------------------------------------------
    def receive(self, group: int, msg: m.Message) -> None:
        """A message of `group` from the node's one peer link. A group this node does not run
        (not assigned yet as far as it knows, or deleted) drops it: the sender retries."""
        if not self.up:
            return
        replica = self.replicas.get(group)
        if replica is None or not replica.up:
            self.sim.unrouted += 1
            return
        replica.receive(msg)

    def peer_down(self, peer: int) -> None:
        for r in list(self.replicas.values()):
            if self.up:
                r.peer_down(peer)

    def peer_up(self, peer: int) -> None:
        for r in list(self.replicas.values()):
            if self.up:
                r.peer_up(peer)

    def propose(self, group: int, request_id: int, batch: Batch, acks: Acks) -> bool:
        """A client request for `group`; False when it cannot be taken here now (down, paused,
        or a group this node does not run): the client times out and retries elsewhere."""
        replica = self.replicas.get(group)
        if not self.up or self.paused or replica is None or not replica.up:
            return False
        return replica.propose(request_id, batch, acks)

    # -- one flusher for every group -------------------------------------------------------
    def want_flush(self, replica: GroupReplica) -> None:
        self.flush_wanted[replica.group] = replica
        if not self.flushing:
            self._start_round()

    def _start_round(self) -> None:
        self.flushing = True
        epoch = self.epoch
        delay = self.rng.randint(self.disk.min_flush_us, self.disk.max_flush_us)
        self.loop.after(delay, lambda: self._round_done(epoch))

    def _round_done(self, epoch: int) -> None:
        if epoch != self.epoch or not self.up:
            return
        wanted, self.flush_wanted = self.flush_wanted, {}
        live = [r for g, r in sorted(wanted.items()) if r.up and self.replicas.get(g) is r]
        try:
            flushed = self.store.flush([r.log for r in live])
        except StorageError as e:
            self.fail_stop(e)
            return
        self.flushing = False
        self.flush_rounds += 1
        self.flushed_groups += len(live)
        for r in live:
            if not self.up:
                return
            r.flush_complete(flushed[r.group])
        if self.up and self.flush_wanted and not self.flushing:
            self._start_round()

    # -- the controller: apply, bootstrap, reconcile ---------------------------------------
    def request_sync(self) -> None:
        """Apply the controller log and reconcile soon (not inside a group's Ready)."""
        if self.sync_pending:
            return
        self.sync_pending = True
        epoch = self.epoch

        def run() -> None:
            self.sync_pending = False
            if epoch == self.epoch:
                self.sync()

        self.loop.after(0, run)

    def sync(self) -> None:
        if not self.up or self.paused or self.follower is None:
            return
        core = self.controller.core
        if core is None:
            return
        if self.controller.is_leader and self.boot_term != core.term:
            self.boot_term = core.term
            self._propose_bootstrap()
            if not self.up or self.controller.core is not core:
                return  # the proposal stopped the node (a storage fault)
        while True:  # one batch at a time: the metadata is checked after every entry
            before = self.follower.position
            if before < self.controller.log.start_offset:
                self.metadata_restores += 1  # a state transfer moved the start past it
            for a in self.follower.catch_up(core.commit_index, max_batches=1):
                self.sim.on_applied(self, a)
            if self.follower.position == before:
                break  # at the commit index, or at a damaged entry it waits to see repaired
        self._reconcile()

    def _propose_bootstrap(self) -> None:
        """The controller's leader proposes the founding commands its log does not hold yet
        (the first leader: all of them; a later one, those a crash lost before they
        committed). A duplicate that commits twice is refused the second time on every node
        alike."""
        log = self.controller.log
        have = set()
        off = log.start_offset
        while off <= log.dirty_offset:
            try:
                batches = log.read(off, 1 << 22)
            except CorruptBatch:
                return
            for b in batches:
                if b.kind == BatchKind.CONTROL:
                    try:
                        cmd = decode_control(b.payload)
                    except ValueError:
                        cmd = None
                    if cmd is not None:
                        have.add(cmd)
            off = batches[-1].last_offset + 1
        founders = {n: f"sim:{n}" for n in self.founders}
        for cmd in bootstrap_commands(founders, shards=self.sim.cfg.shards):
            if cmd in have:
                continue
            batch = Batch.create(encode_command(cmd), 1, kind=BatchKind.CONTROL,
                                 timestamp_ms=self.loop.now // 1000)
            self.sim.admin_proposed += 1
            self.controller.propose(self.sim.next_admin_rid(), batch, Acks.QUORUM)
            if not self.up:
                return

    def _reconcile(self) -> None:
        assert self.follower is not None
        meta = self.follower.metadata
        running = [g for g, r in self.replicas.items() if g != CONTROLLER and r.up]
        on_disk = [g for g in self.store.group_ids() if g != CONTROLLER]
        plan = reconciler.reconcile(meta, self.node_id, running, on_disk)
        for p in plan.start:
            self._start_replica(p.group, p.founders or p.replicas, p.shard)
            if not self.up:
                return
        for g in plan.stop:
            self._stop_replica(g)
        for g in plan.delete:
            self._stop_replica(g)
            replica = self.replicas.pop(g, None)
            self.store.drop_log(g)
            if replica is not None:
                self.sim.on_dropped(self, g, replica)

    def _start_replica(self, group: int, voters: tuple[int, ...], shard: int = 0) -> None:
        knobs = self.knobs
        sections = (controller_section.SECTION,) if group == CONTROLLER else ()
        replica = self.replicas.get(group)
        if replica is None:
            replica = GroupReplica(
                self.node_id, self.loop, random.Random(self.rng.getrandbits(64)),
                lambda nid: RaftConfig(node_id=nid, voters=list(voters), **knobs,
                                       snapshot_sections=sections),
                lambda msg, g=group: self.sim.send(g, msg),
                lambda nid, a, g=group: self.sim.on_answer(g, nid, a),
                self.sim.on_replica_event, tick_us=self.tick_us, disk=self.disk,
                persist_hard_state=self.sim.cfg.persist_hard_state,
                retention=self.controller_retention if group == CONTROLLER else None,
                group=group, host=self, shard=shard)  # SimNode.__post_init__ opens the
            self.replicas[group] = replica  # log and starts
        else:
            if replica.shard != shard:
                self.sim.fail(group, "shard to shard", f"node {self.node_id} restarts group "
                              f"{group} on shard {shard}; it ran on shard {replica.shard}")
            reopened = self.store.open_log(group)
            assert reopened is replica.log, "the store handed back another log for the group"
            replica.start()
        for peer in self.sim.reported_down_by(self.node_id):
            if replica.up:
                replica.peer_down(peer)

    def _stop_replica(self, group: int) -> None:
        replica = self.replicas.get(group)
        if replica is None or not replica.up:
            return
        replica.crash()  # its core stops; the log's durable state stays in the store
        replica.log.close()
        self.flush_wanted.pop(group, None)
