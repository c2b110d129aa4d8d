"""The `topics` profile's clients: an admin that creates, grows and deletes topics through the
controller's leader while faults run, and producers that write to partitions.

The admin plans each command as the controller's leader would (raft/controller/placement.py
over the nodes that leader sees live) and proposes it as a CONTROL batch to the node leading
group 0; a command planned on a state that changed before it applied is refused at apply, the
same way on every node. Producers are sequential idempotent producers, each writing to one
partition for a while (its records keyed by the producer: per-key order is checked), with one
sequence per (producer, partition) as the core's producer table dedups per group; a client
whose partition was deleted moves to another one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from raft.controller.commands import DeleteTopic, encode_command
from raft.controller.placement import PlacementError, plan_create_topic, plan_grow_topic
from raft.controller.state import DEFAULT_TOPIC, ClusterMetadata
from raft.core.ready import ProduceAnswer
from raft.core.types import Acks, ErrorCode
from raft.sim.retrying_producers import RetryingProducers
from storage.batch import Batch, BatchKind
from storage.records import encode_values

# raft.sim.topics_runner.TopicsSimulation, which builds on this module (so not imported here).
TopicsSimulation = Any


@dataclass
class TopicClient:
    cid: int
    producer_id: int
    group: int | None = None
    sequences: dict[int, int] = field(default_factory=dict)  # group -> next sequence
    hint: int | None = None
    acks: Acks = Acks.QUORUM
    outstanding: int | None = None


@dataclass
class TopicsWorkload(RetryingProducers):
    sim: "TopicsSimulation"
    rng: random.Random
    think_us: tuple[int, int] = (500, 10_000)
    admin_gap_us: tuple[int, int] = (60_000, 250_000)
    min_partitions: int = 10
    max_partitions: int = 50
    clients: list[TopicClient] = field(default_factory=list)
    requests: dict[int, tuple[TopicClient, int, int, Acks, bytes]] = field(default_factory=dict)
    acked: dict[tuple[int, bytes], tuple[Acks, int]] = field(default_factory=dict)
    quorum_acked: dict[int, dict[bytes, int]] = field(default_factory=dict)  # group -> value
    sent: int = 0
    stopped: bool = False
    creates: int = 0
    deletes: int = 0
    grows: int = 0
    next_topic: int = 0

    def start(self, n_clients: int) -> None:
        for c in range(n_clients):
            client = TopicClient(c, producer_id=1000 + c)
            self.clients.append(client)
            self.sim.loop.after(self.rng.randint(0, 20_000), lambda cl=client: self._next(cl))
        self.sim.loop.after(self.rng.randint(20_000, 60_000), self._admin)

    # -- the admin -------------------------------------------------------------------------
    def _admin(self) -> None:
        if self.stopped:
            return
        self.sim.loop.after(self.rng.randint(*self.admin_gap_us), self._admin)
        leaders = [n for n in self.sim.nodes.values() if n.is_leader and not n.paused]
        if len(leaders) != 1 or leaders[0].metadata is None:
            return
        node = leaders[0]
        meta: ClusterMetadata = node.metadata
        if not meta.nodes:
            return  # not bootstrapped yet
        live = [node.node_id] + [p for p in sorted(self.sim.nodes) if p != node.node_id
                                 and p not in self.sim.reported_down_by(node.node_id)]
        count = sum(len(t.partitions) for t in meta.topics.values())
        extra = [t for t in sorted(meta.topics) if t != DEFAULT_TOPIC]
        rf = min(3, len(self.sim.nodes))
        r = self.rng.random()
        try:
            if count < self.min_partitions or (r < 0.45 and count < self.max_partitions - 2):
                self.next_topic += 1
                n = self.rng.randint(2, max(2, min(8, self.max_partitions - count)))
                cmd = plan_create_topic(meta, f"t{self.next_topic}", n, rf, live=live)
                self.creates += 1
            elif r < 0.75 and extra:
                cmd = DeleteTopic(self.rng.choice(extra))
                self.deletes += 1
            elif extra and count < self.max_partitions - 1:
                name = self.rng.choice(extra)
                grow = self.rng.randint(1, min(3, self.max_partitions - count))
                cmd = plan_grow_topic(meta, name, len(meta.topics[name].partitions) + grow,
                                      live=live)
                self.grows += 1
            else:
                return
        except PlacementError:
            return  # too few live nodes for the replicas: the admin tries again later
        batch = Batch.create(encode_command(cmd), 1, kind=BatchKind.CONTROL,
                             timestamp_ms=self.sim.loop.now // 1000)
        self.sim.admin_proposed += 1
        self.sim.trace_tail.append(f"{self.sim.loop.now:>10} us  admin via {node.node_id}: "
                                   f"{type(cmd).__name__} {getattr(cmd, 'name', '')}")
        node.propose(0, self.sim.next_admin_rid(), batch, Acks.QUORUM)

    # -- producers -------------------------------------------------------------------------
    def _pick_group(self, c: TopicClient) -> int | None:
        groups = self.sim.live_groups()
        if not groups:
            return None
        if c.group in groups and self.rng.random() < 0.9:
            return c.group
        return self.rng.choice(sorted(groups))

    def _send(self, c: TopicClient) -> None:
        if self.stopped:
            return
        group = self._pick_group(c)
        if group is None:
            self._retry(c)
            return
        if group != c.group:
            c.group, c.hint = group, None
        nodes = self.sim.nodes
        replicas = self.sim.replicas_of(group)
        target = c.hint if c.hint in nodes and self.rng.random() < 0.9 else \
            self.rng.choice(replicas or sorted(nodes))
        seq = c.sequences.setdefault(group, 0)
        rid = self.sim.next_request_id()
        value = f"g{group}-c{c.cid}-s{seq}".encode()
        self.requests[rid] = (c, group, seq, c.acks, value)
        batch = Batch.create(encode_values([value]), 1, producer_id=c.producer_id,
                             sequence=seq, timestamp_ms=self.sim.loop.now // 1000)
        node = nodes[target]

        def arrive() -> None:
            if node.propose(group, rid, batch, c.acks):
                self.sent += 1

        self.sim.loop.after(self.rng.randint(100, 2_000), arrive)
        self._expect(c, rid)

    def owns(self, rid: int) -> bool:
        return rid in self.requests

    def on_answer(self, group: int, node_id: int, a: ProduceAnswer) -> None:
        req = self._claim(a)
        if req is None:
            return
        c, g, seq, acks, value = req
        if a.error == ErrorCode.OK:
            prev = self.acked.get((g, value))
            if prev is not None and prev[1] != a.base_offset:
                self.sim.fail(g, "idempotent retry", f"{value!r} acknowledged at {prev[1]} "
                                                     f"and again at {a.base_offset}")
            self.acked[(g, value)] = (acks, a.base_offset)
            if acks == Acks.QUORUM:
                self.quorum_acked.setdefault(g, {})[value] = a.base_offset
            c.sequences[g] = seq + 1
        self._follow(c, node_id, a)
