"""The `topics` profile: a controller and many partition groups on every node (issue 26).

Every node (raft/sim/topics_node.py) runs group 0, the controller, and the partitions its
applied metadata assigns it; one network carries (group, message) envelopes; one node-pair
failure detector feeds every group; one flusher per node commits every group that asked. The
admin creates, grows and deletes topics while the nemesis crashes, partitions and pauses nodes
and the producers write to partitions (raft/sim/topics_workload.py).

Checked, per group id (each group has its own Checkers, raft/sim/checkers.py): election safety
(no two nodes lead one group in one term), commit monotonic and on batch boundaries, the
committed prefix identical on every node forever, commit needs a flushed majority, log
matching, committed data above the log starts, exactly-once of idempotent records; per
partition: quorum-acked records kept and per-key (per-producer) order. Across groups: the
controller's applied metadata is identical on every node at the same applied offset; a deleted
topic's groups stop on every node and their logs are dropped from every live node's store; and
after the faults heal, within a bound, the controller and every live partition have one leader
with every replica converged (`converged`), so acked writes are readable.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import msgpack

from raft.controller.follower import Applied
from raft.controller.state import ClusterMetadata
from raft.core import messages as m
from raft.core.ready import ProduceAnswer
from raft.sim.checkers import Checkers, Violation, data_records
from raft.sim.liveness import NodeLiveness
from raft.sim.loop import EventLoop
from raft.sim.nemesis import Nemesis
from raft.sim.network import Network
from raft.sim.topics_node import CONTROLLER, GroupReplica, TopicsNode
from raft.sim.settings import SimConfig, SimResult
from raft.sim.topics_workload import TopicsWorkload
from storage.records import decode_records

# How often (simulated) the convergence predicate is evaluated while waiting for it: it walks
# every group, too costly after every event.
CONVERGE_POLL_US = 5_000


@dataclass(slots=True, frozen=True)
class Envelope:
    """One Raft message of one group on the node pair's shared link."""

    group: int
    msg: m.Message
    shard: int = 0  # the shard index of the sending replica (docs/SHARDS.md)

    @property
    def src(self) -> int:
        return self.msg.src

    @property
    def dst(self) -> int:
        return self.msg.dst


class TopicsSimulation:
    def __init__(self, cfg: "SimConfig") -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.loop = EventLoop()
        self.group_checkers: dict[int, Checkers] = {}
        self.checkers = self._checkers(CONTROLLER)  # the nemesis and workload report here too
        self.network = Network(self.loop, random.Random(self.rng.getrandbits(64)),
                               self._deliver)  # type: ignore[arg-type]
        self.trace = hashlib.blake2b(digest_size=16)
        self.trace_tail: list[str] = []
        self.unrouted = 0
        self.shard_messages = 0  # messages between replicas on a shard other than 0
        self.admin_proposed = 0
        self._rid = 0
        self._admin_rid = -1
        self.metadata_at: dict[int, tuple[bytes, int]] = {}  # applied offset -> (digest, node)
        self.metadata_checked = 0
        self.dropped_logs = 0
        # group -> node -> the replica whose log the node dropped (a deleted topic's): what
        # it held flushed then still counts for the commits others make from its reports.
        self.dropped: dict[int, dict[int, GroupReplica]] = {}
        ids = list(range(1, cfg.nodes + 1))
        knobs = {"election_ticks": 10, "heartbeat_ticks": 1, "max_append_bytes": 4096,
                 "recovery_chunk_bytes": 2048, "follower_flush_bytes": 8192,
                 **({} if cfg.quiesce else {"quiesce_ticks": 0}), **cfg.raft}
        self.liveness: NodeLiveness | None = None
        self.nodes: dict[int, TopicsNode] = {}
        for i in ids:
            self.nodes[i] = TopicsNode(i, self, random.Random(self.rng.getrandbits(64)), ids,
                                       knobs, cfg.tick_us)
        self.workload = TopicsWorkload(self, random.Random(self.rng.getrandbits(64)),
                                       think_us=cfg.client_think_us,
                                       min_partitions=cfg.partitions[0],
                                       max_partitions=cfg.partitions[1])
        self.nemesis = Nemesis(self, random.Random(self.rng.getrandbits(64)),  # type: ignore[arg-type]
                               mean_gap_us=cfg.mean_fault_gap_us, kinds=cfg.faults,
                               log=self.trace_tail)
        if cfg.quiesce:
            self.liveness = NodeLiveness(self.loop, self.network, self.nodes,  # type: ignore[arg-type]
                                         random.Random(self.rng.getrandbits(64)),
                                         cfg.liveness_ping_us, cfg.liveness_down_us,
                                         restart_is_down=True)
        self._last_poll = -CONVERGE_POLL_US
        self._last_verdict = False

    # -- bookkeeping -----------------------------------------------------------------------
    def _checkers(self, group: int) -> Checkers:
        c = self.group_checkers.get(group)
        if c is None:
            c = self.group_checkers[group] = Checkers(
                check_flushed_majority=self.cfg.check_flushed_majority)
        return c

    def fail(self, group: int, prop: str, detail: str) -> None:
        self._checkers(group).fail(self.loop.now, prop, detail)

    def next_request_id(self) -> int:
        self._rid += 1
        return self._rid

    def next_admin_rid(self) -> int:
        self._admin_rid -= 1
        return self._admin_rid  # nobody waits for these answers

    def reported_down_by(self, node_id: int) -> list[int]:
        return self.liveness.reported_down_by(node_id) if self.liveness is not None else []

    def members(self, group: int) -> dict[int, GroupReplica]:
        """The replicas of `group` that exist now (on a node that runs or holds it)."""
        return {i: n.replicas[group] for i, n in self.nodes.items() if group in n.replicas}

    def checked_members(self, group: int) -> dict[int, GroupReplica]:
        """What the group's checkers look at: the replicas that exist, and the logs dropped
        since (as they were when dropped). A leader that has not applied the delete yet may
        still commit from reports its followers sent before they dropped the group, and the
        data they held still obeys log matching."""
        return {**self.dropped.get(group, {}), **self.members(group)}

    def oracle(self) -> ClusterMetadata | None:
        """The most advanced metadata any up node holds (what a client's metadata request
        would find, at best)."""
        metas = [n.metadata for n in self.nodes.values() if n.up and n.metadata is not None]
        return max(metas, key=lambda md: md.applied, default=None)

    def live_groups(self) -> list[int]:
        meta = self.oracle()
        return sorted(meta.groups) if meta is not None else []

    def replicas_of(self, group: int) -> list[int]:
        meta = self.oracle()
        p = meta.groups.get(group) if meta is not None else None
        return list(p.replicas) if p is not None else []

    # -- what the nemesis asks -------------------------------------------------------------
    def leaders(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.is_leader]

    def voters(self) -> list[int]:
        return sorted(self.nodes)

    def note_new_identity(self, node_id: int, incarnation: int) -> None:
        self.checkers.forgot[node_id] = incarnation

    # -- wiring ----------------------------------------------------------------------------
    def send(self, group: int, msg: m.Message) -> None:
        self._checkers(group).on_send(self.loop.now, msg, self.checked_members(group))  # type: ignore[arg-type]
        sender = self.nodes[msg.src].replicas.get(group)
        self.network.send(Envelope(group, msg, sender.shard if sender is not None else 0))  # type: ignore[arg-type]

    def _deliver(self, env: Envelope) -> None:
        msg = env.msg
        self.trace.update(f"{self.loop.now}:{env.group}:{type(msg).__name__}:{msg.src}>"
                          f"{msg.dst}:{msg.term}".encode())
        if self.liveness is not None:
            self.liveness.heard(msg.dst, msg.src)
        self._check_shard(env)
        self.nodes[msg.dst].receive(env.group, msg)

    def _check_shard(self, env: Envelope) -> None:
        """Traffic stays shard to shard: a group's message leaves the shard its sender runs
        the group on and reaches the same shard index of the receiver (docs/SHARDS.md: a
        partition lives on one shard index on every replica), and that is the shard the
        metadata places the partition on."""
        receiver = self.nodes[env.dst].replicas.get(env.group)
        if receiver is not None and receiver.shard != env.shard:
            self.fail(env.group, "shard to shard", f"group {env.group}: node {env.src} shard "
                      f"{env.shard} sent to node {env.dst}, which runs it on shard "
                      f"{receiver.shard}")
        meta = self.oracle()
        p = meta.groups.get(env.group) if meta is not None else None
        if p is not None and p.shard != env.shard:
            self.fail(env.group, "shard to shard", f"group {env.group} is placed on shard "
                      f"{p.shard}; node {env.src} runs it on shard {env.shard}")
        if env.shard:
            self.shard_messages += 1

    def on_answer(self, group: int, node_id: int, a: ProduceAnswer) -> None:
        self.trace.update(f"{self.loop.now}:ans:{group}:{node_id}:{a.request_id}:"
                          f"{a.error.name}:{a.base_offset}".encode())
        if self.workload.owns(a.request_id):
            self.workload.on_answer(group, node_id, a)

    def on_replica_event(self, replica: GroupReplica, what: str) -> None:
        group = replica.group
        if what == "ready":
            if replica.core is not None:
                self._checkers(group).on_ready(self.loop.now, replica,  # type: ignore[arg-type]
                                               self.checked_members(group))
            if group == CONTROLLER and replica.host is not None:
                replica.host.request_sync()
        elif what == "start":
            if replica.core is not None:
                self._checkers(group).on_restart(replica)  # type: ignore[arg-type]

    def on_node_event(self, node: TopicsNode, what: str) -> None:
        if what == "start":
            if self.liveness is not None:
                self.liveness.on_start(node.node_id)
            if node.restarts:
                self.trace_tail.append(f"{self.loop.now:>10} us  node {node.node_id} started")
        else:
            self.trace_tail.append(f"{self.loop.now:>10} us  node {node.node_id} {what}")
        if len(self.trace_tail) > 300:
            del self.trace_tail[:150]

    def on_applied(self, node: TopicsNode, a: Applied) -> None:
        """Checker: the metadata applied up to one offset is the same on every node."""
        meta = node.metadata
        assert meta is not None
        digest = hashlib.blake2b(msgpack.packb(meta.to_snapshot(), use_bin_type=True),
                                 digest_size=16).digest()
        self.metadata_checked += 1
        first = self.metadata_at.setdefault(meta.applied, (digest, node.node_id))
        if first[0] != digest:
            self.fail(CONTROLLER, "controller metadata identical at one applied offset",
                      f"node {node.node_id}'s metadata applied up to {meta.applied} differs "
                      f"from node {first[1]}'s at the same offset")

    def on_dropped(self, node: TopicsNode, group: int, replica: GroupReplica) -> None:
        self.dropped_logs += 1
        self.dropped.setdefault(group, {})[node.node_id] = replica
        self.trace_tail.append(f"{self.loop.now:>10} us  node {node.node_id} dropped group "
                               f"{group}")

    # -- convergence (liveness) ------------------------------------------------------------
    def _group_converged(self, group: int, voters: list[int]) -> bool:
        reps = []
        for i in voters:
            r = self.nodes[i].replicas.get(group)
            if r is None or not r.up or r.core is None:
                return False
            reps.append(r)
        leaders = [r for r in reps if r.is_leader]
        if len(leaders) != 1:
            return False
        lead = leaders[0]
        top = lead.log.dirty_offset
        return all(r.log.dirty_offset == top and r.log.flushed_offset == top
                   and r.core.commit_index == top and r.core.leader_id == lead.node_id
                   and not r.log.damaged() for r in reps)  # type: ignore[union-attr]

    def stray_groups(self, meta: ClusterMetadata) -> list[tuple[int, int]]:
        """(node, group) of deleted groups still running on a node or held in a live node's
        store."""
        out = []
        for i, n in self.nodes.items():
            held = set(g for g, r in n.replicas.items() if r.up)
            if n.up:
                held |= set(n.store.group_ids())
            out.extend((i, g) for g in sorted(held) if meta.is_deleted(g))
        return out

    def converged(self) -> bool:
        if not all(n.up and not n.paused for n in self.nodes.values()):
            return False
        if not self._group_converged(CONTROLLER, sorted(self.nodes)):
            return False
        metas = [n.metadata for n in self.nodes.values()]
        if any(md is None for md in metas) or len({md.applied for md in metas}) != 1:
            return False
        meta = metas[0]
        if not meta.nodes:
            return False  # never bootstrapped
        for g, p in meta.groups.items():
            if not self._group_converged(g, list(p.replicas)):
                return False
        return not self.stray_groups(meta)

    def _poll_converged(self) -> bool:
        if self.loop.now - self._last_poll >= CONVERGE_POLL_US:
            self._last_poll = self.loop.now
            self._last_verdict = self.converged()
        return self._last_verdict

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> "SimResult":
        cfg = self.cfg
        self.workload.start(cfg.clients)
        self.nemesis.schedule(0, cfg.fault_time_us)
        if self.liveness is not None:
            self.liveness.start()
        try:
            self.loop.run_until(cfg.fault_time_us)
            self.workload.stopped = True
            healed_at = self.loop.now
            self.loop.run_until(healed_at + cfg.converge_within_us, stop=self._poll_converged)
        except Exception as e:  # noqa: BLE001 (a core invariant failure is a finding)
            self.fail(CONTROLLER, "core raised", f"{type(e).__name__}: {e}")
            return self._result()
        if not self.converged():
            self.fail(CONTROLLER, "liveness", f"the controller and every partition not "
                      f"converged with one leader {cfg.converge_within_us} us after healing: "
                      f"{self._states()}")
        self._final_checks()
        return self._result()

    def _states(self) -> str:
        meta = self.oracle()
        out = []
        groups = [CONTROLLER] + (sorted(meta.groups) if meta is not None else [])
        for g in groups:
            reps = self.members(g)
            lead = [i for i, r in reps.items() if r.is_leader]
            out.append(f"g{g}:lead={lead}:" + ",".join(
                f"{i}={r.log.dirty_offset}/{r.log.flushed_offset}/"
                f"{r.core.commit_index if r.core else 'down'}" for i, r in sorted(reps.items())))
        if meta is not None:
            stray = self.stray_groups(meta)
            if stray:
                out.append(f"deleted groups still held (node, group): {stray}")
        applied = {i: (n.metadata.applied if n.metadata else None)
                   for i, n in self.nodes.items()}
        out.append(f"metadata applied {applied}")
        return "; ".join(out[:12] + (["..."] if len(out) > 12 else []) + out[-2:])

    def _final_checks(self) -> None:
        now = self.loop.now
        meta = self.oracle()
        groups = sorted(self.group_checkers)
        for g in groups:
            members = self.checked_members(g)
            c = self._checkers(g)
            c.check_log_matching(now, members)  # type: ignore[arg-type]
            c.check_above_log_starts(now, members)  # type: ignore[arg-type]
        if meta is None:
            return
        for i, g in self.stray_groups(meta):
            self.fail(g, "a deleted topic's groups stop and their logs are dropped",
                      f"node {i} still runs or stores group {g} of a deleted topic "
                      f"(metadata applied up to {meta.applied})")
        converged = self.converged()
        for g in sorted(meta.groups):
            self._check_partition(g, list(meta.groups[g].replicas), converged)

    def _check_partition(self, group: int, voters: list[int], converged: bool) -> None:
        now = self.loop.now
        acked = self.workload.quorum_acked.get(group, {})
        for i, replica in sorted(self.members(group).items()):
            if replica.core is None:
                continue
            by_value: dict[bytes, list[int]] = {}
            order: dict[str, list[int]] = {}
            for base, payload in data_records(replica, replica.core.commit_index):  # type: ignore[arg-type]
                for r in decode_records(payload):
                    by_value.setdefault(r.value, []).append(base)
                    _, cid, seq = r.value.decode().split("-")
                    order.setdefault(cid, []).append(int(seq[1:]))
            for value, offsets in by_value.items():
                if len(offsets) > 1:
                    self.fail(group, "exactly once", f"node {i}: {value!r} committed at "
                                                     f"{offsets}")
            for cid, seqs in order.items():
                if seqs != sorted(seqs):
                    self.fail(group, "per-key order", f"node {i}: producer {cid}'s records "
                                                      f"committed in the order {seqs}")
            if not converged or i not in voters:
                continue
            for value, base in acked.items():
                if base < replica.log.start_offset:
                    continue
                if by_value.get(value) != [base]:
                    self.fail(group, "quorum-acked record kept",
                              f"node {i}: {value!r} acked at {base} with acks=quorum, "
                              f"committed log has it at {by_value.get(value)}")

    def _result(self) -> "SimResult":
        cfg = self.cfg
        violations = [Violation(v.time_us, f"{v.prop} (group {g})", v.detail)
                      for g, c in sorted(self.group_checkers.items()) for v in c.violations]
        meta = self.oracle()
        stats = {"nodes": cfg.nodes, "sim_ms": self.loop.now // 1000,
                 "events": self.loop.events_run, "messages": self.network.sent,
                 "groups": len(self.group_checkers) - 1,
                 "live_partitions": len(meta.groups) if meta is not None else 0,
                 "shards": cfg.shards, "shard_messages": self.shard_messages,
                 "partitions_by_shard": _by_shard(meta, cfg.shards),
                 "topics": len(meta.topics) if meta is not None else 0,
                 "creates": self.workload.creates, "deletes": self.workload.deletes,
                 "grows": self.workload.grows, "admin_proposed": self.admin_proposed,
                 "dropped_logs": self.dropped_logs, "metadata_checked": self.metadata_checked,
                 "requests": self.workload.sent, "acked": len(self.workload.acked),
                 "quorum_acked": sum(len(v) for v in self.workload.quorum_acked.values()),
                 "unrouted": self.unrouted, "disk_losses": self.nemesis.disk_losses,
                 "restarts_seen": self.liveness.restarts_seen if self.liveness else 0,
                 "restarts": sum(n.restarts for n in self.nodes.values()),
                 "flush_rounds": sum(n.flush_rounds for n in self.nodes.values()),
                 "flushed_groups": sum(n.flushed_groups for n in self.nodes.values()),
                 "controller_cuts": sum(n.controller.retention_cuts for n in self.nodes.values()
                                        if CONTROLLER in n.replicas),
                 "metadata_restores": sum(n.metadata_restores for n in self.nodes.values()),
                 "recovery_granted": sum(n.recovery.granted for n in self.nodes.values()),
                 "recovery_denied": sum(n.recovery.denied for n in self.nodes.values())}
        return SimResult(cfg.seed, violations, self.trace.hexdigest(), stats,
                         list(self.trace_tail), cfg.profile, cfg.quiesce, cfg.shards)


def _by_shard(meta: ClusterMetadata | None, shards: int) -> list[int]:
    """How many live partitions the controller placed on each shard index."""
    out = [0] * shards
    for p in (meta.groups.values() if meta is not None else ()):
        out[p.shard] += 1
    return out
