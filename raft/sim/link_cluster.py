"""One simulated cluster of the `link` profile (raft/sim/link_runner.py): a few many-group nodes
with a fixed set of partition groups and no controller, their own network, failure detector,
nemesis and per-group checkers, on the simulation's one event loop and clock.

The two clusters of a link run take disjoint node ids (the source 1..3, the sink 101..103), so a
trace line, a checker's message or a nemesis note names one node of one cluster. Each cluster
has its own Network: a partition the nemesis draws inside one cluster says nothing of the other,
and the link between them (raft/sim/link_actor.py) has faults of its own.

The nodes are the topics profile's TopicsNode (one store, one flusher, one recovery budget per
node; a crash, pause or fail-stop is the whole process's) with the controller left out: the
partitions are known from the start (which groups a link mirrors is the controller's concern,
simulated by the topics profile). A source cluster's groups have a retention policy (small
limits: a slow link sees the source delete past its position and must bootstrap); a sink
cluster's groups are mirrors: `translated` (REPL-DESIGN.md), so every visible batch is
MIRRORED and the core applies the position rule to the link's proposals.
"""

from __future__ import annotations

import random
from typing import Any

from raft.core import messages as m
from raft.core.raft import RaftConfig
from raft.core.ready import ProduceAnswer
from raft.core.retention import RetentionPolicy
from raft.core.types import Acks
from raft.sim.checkers import Checkers
from raft.sim.link_contract import translated_config
from raft.sim.liveness import NodeLiveness
from raft.sim.nemesis import Nemesis
from raft.sim.network import Network
from raft.sim.topics_node import GroupReplica, TopicsNode
from raft.sim.topics_runner import Envelope, TopicsSimulation
from raft.sim.topics_workload import TopicClient, TopicsWorkload
from storage.batch import Batch

# raft.sim.link_runner.LinkSimulation, which builds on this module (so not imported here).
LinkSimulation = Any


class ClusterNode(TopicsNode):
    """A TopicsNode whose groups are fixed: no controller, no reconciler. Its `is_leader`
    (what the nemesis's `crash_leader` aims at) is "leads the cluster's first partition", the
    one the link mirrors first."""

    def __init__(self, node_id: int, cluster: "SimCluster", rng: random.Random,
                 members: list[int], knobs: dict[str, Any], tick_us: int) -> None:
        self.cluster = cluster
        super().__init__(node_id, cluster, rng, members, knobs, tick_us)

    @property
    def controller(self) -> GroupReplica:
        """The first partition's replica (the nemesis's disk faults would aim at its log)."""
        return self.replicas[self.cluster.groups[0]]

    @property
    def is_leader(self) -> bool:
        return self.up and self.controller.is_leader

    @property
    def metadata(self) -> None:
        return None

    def propose(self, group: int, request_id: int, batch: Batch, acks: Acks) -> bool:
        """As TopicsNode's, and every proposal taken is reported (the link admin's checks)."""
        taken = super().propose(group, request_id, batch, acks)
        if taken:
            self.cluster.sim.on_proposed(self.cluster, self.node_id, group, batch)
        return taken

    def start(self) -> None:
        self.up = True
        self.paused = False
        self.epoch += 1
        self.flushing = False
        self.flush_wanted.clear()
        for g in self.cluster.groups:
            self._start_replica(g, tuple(self.founders))
            if not self.up:
                return
        self.sim.on_node_event(self, "start")

    def request_sync(self) -> None:
        """No controller to apply."""

    def sync(self) -> None:
        """No controller to apply."""

    def _start_replica(self, group: int, voters: tuple[int, ...]) -> None:
        cluster = self.cluster
        replica = self.replicas.get(group)
        if replica is None:
            extra = translated_config(cluster.translated)
            replica = GroupReplica(
                self.node_id, self.loop, random.Random(self.rng.getrandbits(64)),
                lambda nid: RaftConfig(node_id=nid, voters=list(voters), **self.knobs,
                                       **extra),
                lambda msg, g=group: cluster.send(g, msg),
                lambda nid, a, g=group: cluster.on_answer(g, nid, a),
                cluster.on_replica_event, tick_us=self.tick_us, disk=self.disk,
                persist_hard_state=cluster.cfg.persist_hard_state,
                retention=cluster.retention, group=group, host=self)
            self.replicas[group] = replica
        else:
            reopened = self.store.open_log(group)
            assert reopened is replica.log, "the store handed back another log for the group"
            replica.start()
        for peer in cluster.reported_down_by(self.node_id):
            if replica.up:
                replica.peer_down(peer)


class ClusterProducers(TopicsWorkload):
    """The topics profile's idempotent producers on a fixed set of partitions (no admin)."""

    def start(self, n_clients: int) -> None:
        for c in range(n_clients):
            client = TopicClient(c, producer_id=1000 + c)
            self.clients.append(client)
            self.sim.loop.after(self.rng.randint(0, 20_000), lambda cl=client: self._next(cl))


class SimCluster:
    """One cluster: what its nodes, nemesis, liveness and producers ask of "the simulation"
    (the subset of TopicsSimulation's interface they use), with per-group checkers."""

    def __init__(self, sim: "LinkSimulation", name: str, ids: list[int], groups: list[int],
                 knobs: dict[str, Any], *, retention: RetentionPolicy | None,
                 translated: bool, faults: tuple[str, ...], mean_fault_gap_us: int) -> None:
        self.sim = sim
        self.name = name
        self.cfg = sim.cfg
        self.loop = sim.loop
        self.groups = groups
        self.retention = retention
        self.translated = translated
        rng = random.Random(sim.rng.getrandbits(64))
        self.group_checkers: dict[int, Checkers] = {}
        self.checkers = self._checkers(groups[0])  # the nemesis reports here
        self.network = Network(self.loop, random.Random(rng.getrandbits(64)),
                               self._deliver)  # type: ignore[arg-type]
        self.trace_tail = sim.trace_tail
        self.unrouted = 0
        self.admin_proposed = 0
        self.dropped: dict[int, dict[int, GroupReplica]] = {}
        self.nodes: dict[int, ClusterNode] = {}
        self.liveness = NodeLiveness(self.loop, self.network, self.nodes,  # type: ignore[arg-type]
                                     random.Random(rng.getrandbits(64)),
                                     self.cfg.liveness_ping_us, self.cfg.liveness_down_us,
                                     restart_is_down=True)
        for i in ids:
            self.nodes[i] = ClusterNode(i, self, random.Random(rng.getrandbits(64)), ids,
                                        knobs, self.cfg.tick_us)
        self.producers = ClusterProducers(self, random.Random(rng.getrandbits(64)),
                                          think_us=self.cfg.client_think_us)
        self.nemesis = Nemesis(self, random.Random(rng.getrandbits(64)),  # type: ignore[arg-type]
                               mean_gap_us=mean_fault_gap_us, kinds=faults, log=self.trace_tail)

    # -- bookkeeping (as TopicsSimulation's) -------------------------------------------------
    def _checkers(self, group: int) -> Checkers:
        c = self.group_checkers.get(group)
        if c is None:
            c = self.group_checkers[group] = Checkers(
                check_flushed_majority=self.cfg.check_flushed_majority)
        return c

    def fail(self, group: int, prop: str, detail: str) -> None:
        self._checkers(group).fail(self.loop.now, f"{self.name}: {prop}", detail)

    def next_request_id(self) -> int:
        return self.sim.next_request_id()

    def reported_down_by(self, node_id: int) -> list[int]:
        return self.liveness.reported_down_by(node_id)

    def members(self, group: int) -> dict[int, GroupReplica]:
        return {i: n.replicas[group] for i, n in self.nodes.items() if group in n.replicas}

    def checked_members(self, group: int) -> dict[int, GroupReplica]:
        return self.members(group)

    def live_groups(self) -> list[int]:
        return list(self.groups)

    def replicas_of(self, group: int) -> list[int]:
        return sorted(self.nodes)

    def leader_of(self, group: int) -> GroupReplica | None:
        """The one replica of `group` that leads and can take a proposal now (up, not
        paused); None when there is none or more than one think they lead."""
        leads = [r for r in self.members(group).values()
                 if r.is_leader and r.host is not None and r.host.up and not r.host.paused]
        return leads[0] if len(leads) == 1 else None

    # -- what the nemesis asks -----------------------------------------------------------------
    def leaders(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.is_leader]

    def voters(self) -> list[int]:
        return sorted(self.nodes)

    def note_new_identity(self, node_id: int, incarnation: int) -> None:
        self.checkers.forgot[node_id] = incarnation

    # -- wiring --------------------------------------------------------------------------------
    def send(self, group: int, msg: m.Message) -> None:
        self._checkers(group).on_send(self.loop.now, msg, self.checked_members(group))  # type: ignore[arg-type]
        self.network.send(Envelope(group, msg))  # type: ignore[arg-type]

    def _deliver(self, env: Envelope) -> None:
        msg = env.msg
        self.sim.trace.update(f"{self.loop.now}:{env.group}:{type(msg).__name__}:{msg.src}>"
                              f"{msg.dst}:{msg.term}".encode())
        self.liveness.heard(msg.dst, msg.src)
        self.nodes[msg.dst].receive(env.group, msg)

    def on_answer(self, group: int, node_id: int, a: ProduceAnswer) -> None:
        self.sim.trace.update(f"{self.loop.now}:ans:{group}:{node_id}:{a.request_id}:"
                              f"{a.error.name}:{a.base_offset}".encode())
        if self.producers.owns(a.request_id):
            self.producers.on_answer(group, node_id, a)
        else:
            self.sim.link.on_answer(group, node_id, a)

    def on_replica_event(self, replica: GroupReplica, what: str) -> None:
        group = replica.group
        c = self._checkers(group)
        if what == "ready":
            if replica.core is not None:
                c.on_ready(self.loop.now, replica,  # type: ignore[arg-type]
                           self.checked_members(group))
                self.sim.on_ready(self, replica)
        elif what == "start":
            if replica.core is not None:
                c.on_restart(replica)  # type: ignore[arg-type]
        elif what == "retention":
            c.on_retention(replica)  # type: ignore[arg-type]
        elif what == "retention-plan":
            assert replica.planned is not None and replica.retention is not None
            self.sim.on_retention_plan(self, replica)
            c.on_retention_plan(self.loop.now, replica,  # type: ignore[arg-type]
                                replica.retention, replica.planned)

    def on_node_event(self, node: TopicsNode, what: str) -> None:
        if what == "start":
            self.liveness.on_start(node.node_id)
            if node.restarts:
                self.trace_tail.append(f"{self.loop.now:>10} us  {self.name} node "
                                       f"{node.node_id} started")
        else:
            self.trace_tail.append(f"{self.loop.now:>10} us  {self.name} node {node.node_id} "
                                   f"{what}")
        if len(self.trace_tail) > 300:
            del self.trace_tail[:150]

    def on_dropped(self, node: TopicsNode, group: int, replica: GroupReplica) -> None:
        raise AssertionError("a link run's clusters never drop a group")

    # -- convergence and the final checks ------------------------------------------------------
    def converged(self) -> bool:
        if not all(n.up and not n.paused for n in self.nodes.values()):
            return False
        return all(TopicsSimulation._group_converged(self, g, sorted(self.nodes))  # type: ignore[arg-type]
                   for g in self.groups)

    def states(self) -> str:
        out = []
        for g in self.groups:
            reps = self.members(g)
            lead = [i for i, r in reps.items() if r.is_leader]
            out.append(f"{self.name} g{g}:lead={lead}:" + ",".join(
                f"{i}={r.log.dirty_offset}/{r.log.flushed_offset}/"
                f"{r.core.commit_index if r.core else 'down'}" for i, r in sorted(reps.items())))
        return "; ".join(out)

    def final_checks(self, *, check_data: bool) -> None:
        """The per-group Raft checks; with `check_data` (the source: DATA batches written by
        the producers) also exactly-once, per-key order and quorum-acked records kept, as the
        topics profile checks its partitions."""
        now = self.loop.now
        for g in sorted(self.group_checkers):
            members = self.checked_members(g)
            c = self._checkers(g)
            c.check_log_matching(now, members)  # type: ignore[arg-type]
            c.check_above_log_starts(now, members)  # type: ignore[arg-type]
        if not check_data:
            return
        converged = self.converged()
        # The topics profile's partition checks, over this cluster (the same duck-typed view:
        # members, fail, loop, and the producers as its workload).
        self.workload = self.producers
        for g in self.groups:
            TopicsSimulation._check_partition(self, g, sorted(self.nodes), converged)  # type: ignore[arg-type]

    def violations(self) -> list[tuple[int, Any]]:
        return [(g, v) for g, c in sorted(self.group_checkers.items()) for v in c.violations]
