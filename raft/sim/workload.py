"""Simulated producers and their bookkeeping: every answer is remembered with its ack level so
the checkers can hold the cluster to it. Each client is a sequential idempotent producer (one
request outstanding); after an error or silence it retries the same sequence elsewhere."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft.core.ready import ProduceAnswer
from raft.sim.retrying_producers import RetryingProducers
from raft.sim.world import World
from raft.core.types import Acks, ErrorCode
from storage.batch import Batch
from storage.records import encode_values


@dataclass
class Client:
    cid: int
    producer_id: int
    sequence: int = 0
    hint: int | None = None
    acks: Acks = Acks.QUORUM
    outstanding: int | None = None  # request id
    attempts: int = 0


@dataclass
class Workload(RetryingProducers):
    sim: World
    rng: random.Random
    clients: list[Client] = field(default_factory=list)
    requests: dict[int, tuple[Client, int, Acks, bytes]] = field(default_factory=dict)
    next_rid: int = 1
    acked: dict[bytes, tuple[Acks, int]] = field(default_factory=dict)  # value -> (acks, base)
    quorum_acked: dict[bytes, int] = field(default_factory=dict)
    sent: int = 0
    stopped: bool = False
    # Simulated time a client waits after an answer before its next write (min, max): short
    # keeps groups busy; long lets them quiesce between writes while faults go on.
    think_us: tuple[int, int] = (500, 10_000)

    def start(self, n_clients: int, plain: int = 0) -> None:
        """`n_clients` idempotent producers and `plain` clients without a producer id."""
        for c in range(n_clients + plain):
            client = Client(c, producer_id=1000 + c if c < n_clients else 0)
            self.clients.append(client)
            self.sim.loop.after(self.rng.randint(0, 20_000), lambda cl=client: self._next(cl))

    def _value(self, c: Client, rid: int) -> bytes:
        if not c.producer_id:  # no retry is ever recognised: every attempt is a new write
            return f"c{c.cid}-r{rid}".encode()
        return f"c{c.cid}-s{c.sequence}".encode()

    def _send(self, c: Client) -> None:
        if self.stopped:
            return  # (a retry scheduled before the workload stopped)
        nodes = self.sim.nodes
        target = c.hint if c.hint in nodes and self.rng.random() < 0.9 else \
            self.rng.choice(sorted(nodes))
        rid = self.next_rid
        self.next_rid += 1
        value = self._value(c, rid)
        c.attempts += 1
        self.requests[rid] = (c, c.sequence, c.acks, value)
        batch = Batch.create(encode_values([value]), 1, producer_id=c.producer_id,
                             sequence=c.sequence if c.producer_id else -1,
                             timestamp_ms=self.sim.loop.now // 1000)
        delay = self.rng.randint(100, 2_000)
        node = nodes[target]

        def arrive() -> None:
            if not node.propose(rid, batch, c.acks):
                return  # down or paused: the client times out and retries
            self.sent += 1

        self.sim.loop.after(delay, arrive)
        self._expect(c, rid)

    def on_answer(self, node_id: int, a: ProduceAnswer) -> None:
        req = self._claim(a)
        if req is None:
            return
        c, seq, acks, value = req
        if a.error == ErrorCode.OK:
            prev = self.acked.get(value)
            if prev is not None and prev[1] != a.base_offset:
                self.sim.checkers.fail(self.sim.loop.now, "idempotent retry",
                                       f"{value!r} acknowledged at {prev[1]} and again at "
                                       f"{a.base_offset}")
            self.acked[value] = (acks, a.base_offset)
            if acks == Acks.QUORUM:
                self.quorum_acked[value] = a.base_offset
            c.sequence += 1
            c.attempts = 0
        self._follow(c, node_id, a)
