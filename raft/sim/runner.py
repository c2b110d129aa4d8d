"""One simulated run: build the cluster, let the workload and the nemesis loose for the fault
window, heal, then require convergence within a bound and check every property."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from raft.core import messages as m
from raft.core.raft import RaftConfig
from raft.core.ready import ProduceAnswer
from raft.core.retention import RetentionPolicy
from raft.sim.checkers import Checkers, Violation, data_records
from raft.sim.link_runner import LinkSimulation
from raft.sim.liveness import NodeLiveness
from raft.sim.loop import EventLoop
from raft.sim.nemesis import DISK, DISK_LOSS, KINDS, Nemesis
from raft.sim.network import Network
from raft.sim.node import SimNode
from raft.sim.topics_runner import TopicsSimulation
from raft.sim.subscription_model import SimSubscriptions, SubscriptionConsumers
from raft.sim.settings import SimConfig, SimResult
from raft.sim.workload import Workload
from raft.core.types import Acks, Role


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.loop = EventLoop()
        self.checkers = Checkers(check_flushed_majority=cfg.check_flushed_majority)
        self.network = Network(self.loop, random.Random(self.rng.getrandbits(64)),
                               self._deliver)
        self.trace = hashlib.blake2b(digest_size=16)
        self.trace_tail: list[str] = []
        ids = list(range(1, cfg.nodes + 1))
        self.bootstrap_voters = ids
        all_ids = list(range(1, cfg.nodes + cfg.spare_nodes + 1))
        knobs = {"election_ticks": 10, "heartbeat_ticks": 1, "max_append_bytes": 4096,
                 "recovery_chunk_bytes": 2048, "follower_flush_bytes": 8192,
                 **({} if cfg.quiesce else {"quiesce_ticks": 0}), **cfg.raft}
        retention = (RetentionPolicy(**cfg.retention).validate() if cfg.retention is not None
                     else None)
        self.nodes: dict[int, SimNode] = {}
        self.subs = SimSubscriptions(self)
        for i in all_ids:
            self.nodes[i] = SimNode(
                i, self.loop, random.Random(self.rng.getrandbits(64)),
                lambda nid: RaftConfig(node_id=nid, voters=ids, **knobs),
                self._send, self._answer, self._node_event, tick_us=cfg.tick_us,
                persist_hard_state=cfg.persist_hard_state, retention=retention,
                propose_ready_us=cfg.propose_ready_us)
        self.workload = Workload(self, random.Random(self.rng.getrandbits(64)),
                                 think_us=cfg.client_think_us)
        self.nemesis = Nemesis(self, random.Random(self.rng.getrandbits(64)),
                               mean_gap_us=cfg.mean_fault_gap_us, kinds=cfg.faults,
                               log=self.trace_tail)
        self.consumers = SubscriptionConsumers(self, self.subs,
                                               random.Random(self.rng.getrandbits(64)))
        self.liveness: NodeLiveness | None = None
        if cfg.quiesce:
            self.liveness = NodeLiveness(self.loop, self.network, self.nodes,
                                         random.Random(self.rng.getrandbits(64)),
                                         cfg.liveness_ping_us, cfg.liveness_down_us)
        self.quiet_stats: dict[str, Any] = {}
        self.sent_between: dict[tuple[int, int], int] = {}  # Raft messages per (src, dst)
        self.quiesced_count = 0  # times a node's core went quiet (during faults too)
        self._was_quiet: set[int] = set()
        self._quiet_members: set[int] = set()

    # -- wiring ----------------------------------------------------------------------------
    def _send(self, msg: m.Message) -> None:
        self.checkers.on_send(self.loop.now, msg, self.nodes)
        pair = (msg.src, msg.dst)
        self.sent_between[pair] = self.sent_between.get(pair, 0) + 1
        self.network.send(msg)

    def note_new_identity(self, node_id: int, incarnation: int) -> None:
        self.checkers.forgot[node_id] = incarnation

    def _deliver(self, msg: m.Message) -> None:
        self.trace.update(f"{self.loop.now}:{type(msg).__name__}:{msg.src}>{msg.dst}:"
                          f"{msg.term}".encode())
        if self.liveness is not None:
            self.liveness.heard(msg.dst, msg.src)
        self.nodes[msg.dst].receive(msg)

    def _answer(self, node_id: int, a: ProduceAnswer) -> None:
        self.trace.update(f"{self.loop.now}:ans:{node_id}:{a.request_id}:{a.error.name}:"
                          f"{a.base_offset}".encode())
        if self.subs.owns(a.request_id):
            self.subs.on_answer(node_id, a)
        else:
            self.workload.on_answer(node_id, a)

    def _node_event(self, node: SimNode, what: str) -> None:
        if what == "ready":
            if node.core is not None:
                if node.core.quiesced and node.node_id not in self._was_quiet:
                    self.quiesced_count += 1
                    self._was_quiet.add(node.node_id)
                elif not node.core.quiesced:
                    self._was_quiet.discard(node.node_id)
                self.checkers.on_ready(self.loop.now, node, self.nodes)
                self.subs.on_ready(node)
        elif what == "start":
            if getattr(self, "liveness", None) is not None:  # (not yet while building)
                self.liveness.on_start(node.node_id)
            self.subs.on_start(node)
            self.checkers.on_restart(node) if self.loop.now else None
            if node.restarts:
                self.trace_tail.append(f"{self.loop.now:>10} us  node {node.node_id} started")
        elif what == "retention":
            self.checkers.on_retention(node)
        elif what == "retention-plan":
            assert node.planned is not None and node.retention is not None
            self.checkers.on_retention_plan(self.loop.now, node, node.retention, node.planned)
        elif what == "crash":
            self.subs.on_crash(node)
            self.trace_tail.append(f"{self.loop.now:>10} us  node {node.node_id} crashed "
                                   f"(flushed {node.log.flushed_offset})")
        if len(self.trace_tail) > 200:
            del self.trace_tail[:100]

    # -- the run ---------------------------------------------------------------------------
    def leaders(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.is_leader]

    def voters(self) -> list[int]:
        """The voters of the configuration in force on the leader, or else on the node with
        the most up-to-date log."""
        leaders = self.leaders()
        if len(leaders) == 1:
            core = self.nodes[leaders[0]].core
            assert core is not None
            return list(core.config.voters)
        up = [n for n in self.nodes.values() if n.core is not None]
        if not up:
            return list(self.bootstrap_voters)
        best = max(up, key=lambda n: (n.log.last_term(), n.log.dirty_offset))
        assert best.core is not None
        return list(best.core.config.voters)

    def members(self) -> list[int]:
        """The configuration in force on the leader (all nodes when there is none)."""
        leaders = self.leaders()
        if len(leaders) == 1:
            core = self.nodes[leaders[0]].core
            assert core is not None
            return list(core.config.members)
        return sorted(self.nodes)

    def converged(self) -> bool:
        if not all(n.up and not n.paused and n.core is not None for n in self.nodes.values()):
            return False
        leaders = self.leaders()
        if len(leaders) != 1:
            return False
        lead = self.nodes[leaders[0]]
        assert lead.core is not None
        nodes = [self.nodes[i] for i in lead.core.config.members]
        top = lead.log.dirty_offset
        return all(n.log.dirty_offset == top and n.log.flushed_offset == top
                   and n.core.commit_index == top and n.core.leader_id == leaders[0]
                   and not n.log.damaged() and n.core.may_vote()
                   for n in nodes if n.core is not None)

    def run(self) -> SimResult:
        cfg = self.cfg
        self.workload.start(cfg.clients, cfg.plain_clients)
        self.consumers.start(cfg.subscriptions)
        self.nemesis.schedule(0, cfg.fault_time_us)
        if self.liveness is not None:
            self.liveness.start()
        try:
            self.loop.run_until(cfg.fault_time_us)
            self.workload.stopped = True
            self.consumers.stopped = True
            healed_at = self.loop.now
            # Let in-flight requests finish, then demand convergence within the bound.
            self.loop.run_until(healed_at + cfg.converge_within_us, stop=self.converged)
            if self.converged() and cfg.quiet_phase:
                self._quiet_phase()
        except Exception as e:  # noqa: BLE001 (a core invariant failure is a finding, not a crash)
            self.checkers.fail(self.loop.now, "core raised",
                               f"{type(e).__name__}: {e}")
            return self._result()
        if not self.converged():
            self.checkers.fail(self.loop.now, "liveness",
                               f"no single leader with every node converged "
                               f"{cfg.converge_within_us} us after healing: {self._states()}")
        self._final_checks()
        return self._result()

    def _states(self) -> dict[int, tuple]:
        return {i: (n.core.role.value if n.core else "down", n.core.term if n.core else -1,
                    n.log.dirty_offset, n.log.flushed_offset,
                    n.core.commit_index if n.core else -1,
                    "quiesced" if n.core is not None and n.core.quiesced else "")
                for i, n in self.nodes.items()}

    def _all_quiesced(self) -> bool:
        """Every member of the configuration in force is quiesced (spare nodes never added and
        removed nodes are no part of the group)."""
        return all(n.core is not None and n.core.quiesced
                   for i, n in self.nodes.items() if i in self._quiet_members)

    def _member_messages(self) -> int:
        return sum(n for (src, dst), n in self.sent_between.items()
                   if src in self._quiet_members and dst in self._quiet_members)

    def _quiet_phase(self) -> None:
        """The cluster converged and nothing more comes in. (a) With quiescence on, every node
        quiesces within a bound and then sends no Raft message at all (the node-level pings
        go on). (b) The leader's node crashes while its group is quiet: the others must elect
        a leader within a bound, told only by node liveness (quiescence on) or by their
        election timers (off). Then it restarts and the cluster must converge again."""
        cfg, loop, q = self.cfg, self.loop, self.quiet_stats
        self._quiet_members = set(self.members())
        if cfg.quiesce:
            start = loop.now
            bound = start + cfg.quiesce_within_ticks * cfg.tick_us
            loop.run_until(bound, stop=self._all_quiesced)
            if not self._all_quiesced():
                self.checkers.fail(loop.now, "idle groups quiesce",
                                   f"not every node quiesced within {cfg.quiesce_within_ticks} "
                                   f"ticks of converging: {self._states()}")
                return
            q["quiesce_ms"] = (loop.now - start) / 1000
            # Requests already on their way when the last member went quiet (a quiescing
            # heartbeat resent while the first answer was slow) are still answered: count from
            # when the longest network delay has passed.
            faults = self.network.faults
            settle = faults.max_delay_us + faults.slow_delay_us + cfg.liveness_ping_us
            loop.run_until(loop.now + settle)
            # A documented wake may still come after the last member went quiet: a node the
            # failure detector had reported down is heard again (its ping, within a ping
            # interval of the heal) and its leader checks it. Count from when every member is
            # quiet again with no such wake pending (still within the quiescing bound).
            while not self._all_quiesced() and loop.now < bound:
                loop.run_until(bound, stop=self._all_quiesced)
                loop.run_until(loop.now + settle)
            sent = self._member_messages()
            loop.run_until(loop.now + cfg.quiet_window_us)
            q["quiet_messages"] = self._member_messages() - sent
            if q["quiet_messages"] or not self._all_quiesced():
                self.checkers.fail(loop.now, "quiesced groups send nothing",
                                   f"{q['quiet_messages']} Raft messages between members in "
                                   f"{cfg.quiet_window_us} us of quiet; {self._states()}")
                return
        (leader,) = self.leaders()
        old = self.nodes[leader]
        assert old.core is not None
        term = old.core.term
        old.crash()
        self.trace_tail.append(f"{loop.now:>10} us  quiet phase: crash leader {leader}")
        crashed_at = loop.now

        def new_leader() -> bool:
            return any(n.core is not None and n.core.term > term
                       for i, n in self.nodes.items() if n.is_leader and i in self._quiet_members)

        loop.run_until(crashed_at + cfg.failover_within_us, stop=new_leader)
        if not new_leader():
            self.checkers.fail(loop.now, "a quiet group's leader crash is noticed",
                               f"no new leader {cfg.failover_within_us} us after the quiet "
                               f"leader {leader} crashed: {self._states()}")
            return
        q["failover_ms"] = (loop.now - crashed_at) / 1000
        old.start()
        loop.run_until(loop.now + cfg.converge_within_us, stop=self.converged)

    def _result(self) -> SimResult:
        cfg = self.cfg
        stats = {"nodes": cfg.nodes, "sim_ms": self.loop.now // 1000,
                 "events": self.loop.events_run, "messages": self.network.sent,
                 "dropped": self.network.dropped, "requests": self.workload.sent,
                 "acked": len(self.workload.acked),
                 "quorum_acked": len(self.workload.quorum_acked),
                 "commit": max((n.core.commit_index for n in self.nodes.values() if n.core),
                               default=-1),
                 "terms": max(self.checkers.leaders, default=0),
                 "restarts": sum(n.restarts for n in self.nodes.values()),
                 "fail_stops": sum(n.fail_stops for n in self.nodes.values()),
                 "retention_cuts": sum(n.retention_cuts for n in self.nodes.values()),
                 "retention_checked": self.checkers.retention_checked,
                 "state_transfers": self.checkers.state_transfers,
                 "disk_losses": self.nemesis.disk_losses,
                 "sub_entries": self.subs.entries, **self.consumers.stats(),
                 **self.quiet_stats}
        if self.liveness is not None:
            stats.update(pings=self.liveness.pings, peer_down=self.liveness.reported_down,
                         quiesced=self.quiesced_count,
                         quiet_ticks=sum(n.quiet_ticks for n in self.nodes.values()))
        if cfg.plain_clients:
            stats["merged_batches"] = self._merged_batches()
        return SimResult(cfg.seed, list(self.checkers.violations), self.trace.hexdigest(),
                         stats, list(self.trace_tail), cfg.profile, cfg.quiesce)

    def _merged_batches(self) -> int:
        """Committed DATA batches of more than one write (each write is one record here) on
        the node that committed most: the merging the plain clients' writes met."""
        live = [n for n in self.nodes.values() if n.core is not None]
        if not live:
            return 0
        node = max(live, key=lambda n: n.core.commit_index)  # type: ignore[union-attr]
        from storage.records import check_records
        return sum(1 for _, payload in data_records(node, node.core.commit_index)  # type: ignore[union-attr]
                   if check_records(payload, None) > 1)

    def _final_checks(self) -> None:
        now = self.loop.now
        self.checkers.check_log_matching(now, self.nodes)
        self.checkers.check_above_log_starts(now, self.nodes)
        self.subs.check_tables_agree(now)
        if self.converged():
            self.consumers.check_final(self.nodes[self.leaders()[0]])
        for node in self.nodes.values():
            if node.core is None:
                continue
            records = data_records(node, node.core.commit_index)
            by_value: dict[bytes, list[int]] = {}
            from storage.records import decode_records
            for base, payload in records:
                # A record's offset is its batch's base plus its place in it (the leader
                # merges writes into one batch: raft/core/merging.py).
                for k, r in enumerate(decode_records(payload)):
                    by_value.setdefault(r.value, []).append(base + k)
            for value, offsets in by_value.items():
                if len(offsets) > 1:
                    self.checkers.fail(now, "exactly once",
                                       f"node {node.node_id}: {value!r} committed at {offsets}")
            if not self.converged() or node.node_id not in self.members():
                continue  # acked-record presence is checked on a converged cluster's members
            for value, base in self.workload.quorum_acked.items():
                if base < node.log.start_offset:
                    continue  # retention removed it (the checkers saw it committed before)
                got = by_value.get(value)
                if got != [base]:
                    self.checkers.fail(now, "quorum-acked record kept",
                                       f"node {node.node_id}: {value!r} acked at {base} "
                                       f"with acks=quorum, committed log has it at {got}")


# Named fault mixes; tests and `python -m raft.sim --profile` use the same names.
PROFILES: dict[str, dict[str, Any]] = {
    # Everything at a moderate rate.
    "mixed": {},
    # Crashes and leader kills while followers flush rarely: the unflushed tails that crashes
    # drop are large, so a commit rule that counted dirty offsets loses acknowledged data.
    # Retention with small limits: a crashed follower is held for until the age valve opens,
    # then it comes back behind the log start and gets a state transfer.
    "crashy": {"clients": 6, "mean_fault_gap_us": 60_000,
               "faults": ("crash", "crash_leader", "crash", "partition"),
               "raft": {"follower_flush_ticks": 30, "follower_flush_bytes": 1 << 30,
                        "max_append_bytes": 64, "recovery_chunk_bytes": 64},
               "retention": {"max_bytes": 700, "valve_age_ms": 120, "slice_batches": 8}},
    # Network trouble only: partitions, one-way links, loss, duplication, reordering.
    "network": {"faults": ("partition", "one_way", "loss", "duplicate", "partition")},
    # Membership changes (add learner, promote, remove) interleaved with every fault.
    # New learners start behind the leader's log start: they join through a state transfer.
    "membership": {"spare_nodes": 2, "faults": KINDS + ("member",) * 4,
                   "retention": {"max_bytes": 3000, "max_age_ms": 300, "valve_age_ms": 200}},
    # Storage faults (I/O errors: fail-stop; a full disk: retried) among crashes and
    # partitions; followers flush rarely so failed flushes leave large unflushed tails.
    "disk": {"mean_fault_gap_us": 80_000,
             "faults": ("disk", "disk", "disk", "crash", "crash_leader", "partition"),
             "raft": {"follower_flush_ticks": 10}},
    # Disk loss: wiped, truncated, holed and bit-flipped logs and metadata on a minority of
    # nodes between crash and restart, among crashes, leader kills and partitions. Retention
    # with small limits: damage found in a range the cluster has since deleted is dropped with
    # the prefix (raft/core/repair.py, _drop_damaged_prefix), wiped nodes rejoin behind the start.
    "diskloss": {"mean_fault_gap_us": 100_000,
                 "faults": (DISK_LOSS, DISK_LOSS, DISK_LOSS, "crash", "crash_leader",
                            "partition", "pause"),
                 "retention": {"max_bytes": 3000, "max_age_ms": 300, "valve_age_ms": 200}},
    # Sparse writes (a client pauses 50-400 ms between writes) among every fault: groups go
    # quiet between writes and again and again meet crashes, leader kills, partitions, pauses
    # and loss while quiet, so every wake-up path and node liveness are exercised mid-run.
    "idle": {"clients": 2, "subscriptions": 1, "client_think_us": (50_000, 400_000),
             "mean_fault_gap_us": 120_000},
    # The mixed profile without quiescence or node liveness (the core's timers alone), as
    # every profile ran before them; `--no-quiesce` does the same for any profile.
    "noquiesce": {"quiesce": False},
    # Clients without a producer id beside the idempotent ones, and Ready passes that take
    # several proposals: concurrent writes are appended as one batch (raft/core/merging.py)
    # among every fault, and each acknowledged write must be found at its own answered offset
    # (the final checks read every record's offset, not its batch's).
    "merging": {"clients": 2, "plain_clients": 6, "client_think_us": (200, 2_000),
                "propose_ready_us": 400},
    # A controller (group 0) and 10-50 partition groups on every node, one store, one flusher,
    # one peer link and one failure detector per node; the admin creates, grows and deletes
    # topics through the controller's leader while nodes crash, pause and are partitioned,
    # and a minority's controller log is damaged or wiped (the diskloss profile's damage, on
    # group 0's log in the node's store) (raft/sim/topics_runner.py has what is checked, per
    # group and across them).
    "topics": {"topics": True, "clients": 4, "mean_fault_gap_us": 150_000,
               "faults": ("partition", "one_way", "crash", "crash_leader", "pause", "loss",
                          "duplicate", DISK_LOSS),
               "quiet_phase": False,
               # The controller log is cut small (its metadata travels with the log start),
               # and the valve lets a member that is down fall behind the start, so restarted
               # and wiped nodes get the metadata by state transfer.
               "controller_retention": {"max_bytes": 1200, "valve_age_ms": 150},
               # Small appends, so nodes back from a crash or a partition recover in many
               # chunks and queue for their node's two recovery slots (recovery/budget.py).
               "raft": {"max_append_bytes": 256, "recovery_chunk_bytes": 128}},
    # Two clusters and a link (issue 30, raft/sim/link_runner.py): a source cluster with
    # producers and small retention, a sink cluster whose partitions are mirrors, and a link
    # that pulls committed batches from the source leaders into the sink leaders; faults on
    # both clusters (storage faults on a node's first partition too: fail-stops, full disks)
    # and on the link (cuts, loss, duplication, slow paths), and long cuts now and then let
    # the source delete past the link, which bootstraps (a recorded gap).
    "link": {"link": True, "clients": 3, "mean_fault_gap_us": 200_000,
             "faults": ("partition", "one_way", "crash", "crash_leader", "pause", "loss",
                        "duplicate", DISK),
             "quiet_phase": False,
             "retention": {"max_bytes": 4000, "valve_age_ms": 150},
             # The mirrors are cut too (their visible end travels in the `mirror` section):
             # a sink node behind the start gets it by state transfer and may lead next.
             "sink_retention": {"max_bytes": 2500, "max_age_ms": 300, "valve_age_ms": 100},
             "raft": {"max_append_bytes": 1024, "recovery_chunk_bytes": 512}},
}


def profile_config(seed: int, nodes: int, profile: str, **overrides: Any) -> SimConfig:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    return SimConfig(seed=seed, nodes=nodes, profile=profile,
                     **{**PROFILES[profile], **overrides})


def run_simulation(cfg: SimConfig) -> SimResult:
    if cfg.topics:
        return TopicsSimulation(cfg).run()
    if cfg.link:
        return LinkSimulation(cfg).run()
    return Simulation(cfg).run()


__all__ = ["Acks", "Role", "SimConfig", "SimResult", "Simulation", "run_simulation"]
