"""A tiny synchronous driver for table-driven core tests: in-memory logs, a FIFO network that
tests can filter, and flushes that run when the core asks (or only when a test says so).
The full fault-injecting simulation lives in raft/sim; this one keeps unit tests readable."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from raft.core import messages as m
from raft.core.raft import RaftConfig, RaftCore
from raft.core.ready import ProduceAnswer
from raft.core.types import Acks, Role
from storage.api import Meta
from storage.batch import Batch
from storage.memory import MemoryLog
from storage.records import encode_values


class Cluster:
    def __init__(self, n: int = 3, *, seed: int = 1, recovery: Any = None,
                 new_log: Callable[[int], Any] | None = None, **knobs: Any) -> None:
        self.ids = list(range(1, n + 1))
        self.knobs = knobs
        self.recovery = recovery  # a recovery.budget.GroupRecovery every core shares, or None
        self.seed = seed
        # One log per node: in memory unless `new_log(node_id)` opens another (an LMDB store's).
        self.logs = {i: MemoryLog() if new_log is None else new_log(i) for i in self.ids}
        self.cores: dict[int, RaftCore] = {}
        for i in self.ids:
            self.cores[i] = self._new_core(i)
        self.net: deque[m.Message] = deque()
        self.answers: dict[int, ProduceAnswer] = {}
        self.auto_flush = {i: True for i in self.ids}
        self.down: set[int] = set()
        # Return False to drop a message.
        self.filter: Callable[[m.Message], bool] = lambda msg: True
        self.sent: list[m.Message] = []
        self._rid = 0
        # A brand-new cluster's first start: every node finds out the others are new too
        # (raft/core/incarnation.py's BootstrapProbe) before anything else happens.
        self.deliver()

    def _new_core(self, i: int, voters: list[int] | None = None) -> RaftCore:
        cfg = RaftConfig(node_id=i, voters=voters or self.ids, **self.knobs)
        return RaftCore(cfg, self.logs[i], random.Random(self.seed * 1000 + i),
                        recovery=self.recovery)

    # -- driving ---------------------------------------------------------------------------
    def process(self, i: int) -> None:
        core, log = self.cores[i], self.logs[i]
        for _ in range(100):
            rd = core.ready()
            if rd.empty():
                return
            if rd.hard_state is not None:
                log.save_meta(Meta(rd.hard_state.term, rd.hard_state.voted_for,
                                   rd.hard_state.config))
            for msg in rd.messages:
                self.sent.append(msg)
                if self.filter(msg):
                    self.net.append(msg)
            for a in rd.answers:
                self.answers[a.request_id] = a
            if rd.storage is not None:
                rd.storage.run(log)
                core.stored()
            if rd.flush and self.auto_flush[i]:
                core.flushed(log.flush())
        raise AssertionError(f"node {i} never went quiet")

    def deliver(self, max_messages: int = 100_000) -> None:
        for i in self.ids:
            if i not in self.down:
                self.process(i)
        n = 0
        while self.net and n < max_messages:
            msg = self.net.popleft()
            n += 1
            if msg.dst in self.down or msg.src in self.down:
                continue
            self.cores[msg.dst].step(msg)
            self.process(msg.dst)

    def tick(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            for i in self.ids:
                if i not in self.down:
                    self.cores[i].tick()
            self.deliver()

    def flush(self, i: int) -> None:
        self.cores[i].flushed(self.logs[i].flush())
        self.process(i)

    def elect(self, max_ticks: int = 200) -> int:
        for _ in range(max_ticks):
            self.tick()
            leaders = [i for i in self.ids if i not in self.down
                       and self.cores[i].role == Role.LEADER]
            if leaders:
                return leaders[0]
        raise AssertionError("no leader elected")

    def leader(self) -> int | None:
        live = [i for i in self.ids if i not in self.down and self.cores[i].role == Role.LEADER]
        return max(live, key=lambda i: self.cores[i].term) if live else None

    def crash(self, i: int) -> None:
        self.logs[i].crash()
        self.cores[i] = self._new_core(i)

    # -- clients ---------------------------------------------------------------------------
    def propose(self, leader: int, values: list[bytes], acks: Acks = Acks.QUORUM, *,
                producer_id: int = 0, sequence: int = -1) -> int:
        self._rid += 1
        batch = Batch.create(encode_values(values), len(values), producer_id=producer_id,
                             sequence=sequence)
        self.cores[leader].propose(self._rid, batch, acks)
        self.process(leader)
        return self._rid
