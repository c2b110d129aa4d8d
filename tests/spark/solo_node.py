"""The real trio Node (raft/node.py) with a one-voter stand-in core, for Spark tests.

Why: the Spark-side contract (load_* ops through the node's dispatch, the fetch filter and
stable offset hooks, the leader's load-timeout tick) should be exercised through the real
runtime and wire path even where no replication is involved. With one voter, Raft reduces to
"append, flush, commit = flushed", which `SoloCore` implements against the driver contract
(raft/ready.py). Replication and leader loss are test_spark_cluster.py's job (real core).

Run: python tests/spark/solo_node.py PORT   (RAFTLOG_LOAD_TIMEOUT_MS is honoured)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from raft.config import NodeConfig
from raft.node import Node
from raft.ready import HardState, ProduceAnswer, Ready, Status
from raft.types import Acks, ErrorCode, Role
from storage.api import LogStorage
from storage.memory import MemoryLog


class SoloConfig:
    def __init__(self, node_id: int, voters: list[int], learners: list[int], **_: Any) -> None:
        self.node_id, self.voters, self.learners = node_id, voters, learners


class SoloCore:
    """A single voter: always leader of term 1; commit index = flushed offset."""

    def __init__(self, cfg: SoloConfig, log: LogStorage, rng: Any) -> None:
        self.cfg, self.log = cfg, log
        self.node_id = cfg.node_id
        self.role, self.term, self.leader_id = Role.LEADER, 1, cfg.node_id
        self.commit_index = log.flushed_offset
        self._hard: HardState | None = HardState(1, cfg.node_id, None)
        self._flush = False
        self._answers: list[ProduceAnswer] = []
        self._waiting: list[ProduceAnswer] = []

    @property
    def high_watermark(self) -> int:
        return self.commit_index

    def tick(self) -> None:
        pass

    def step(self, msg: Any) -> None:
        pass

    def transfer_leadership(self, to: int | None = None) -> None:
        pass

    def propose(self, request_id: int, batch: Any, acks: Acks) -> None:
        base = self.log.dirty_offset + 1
        self.log.append([batch.placed(base, self.term)])
        ans = ProduceAnswer(request_id, ErrorCode.OK, base, base + batch.count - 1)
        (self._waiting if acks == Acks.QUORUM else self._answers).append(ans)
        self._flush = True

    def flushed(self, offset: int) -> None:
        self.commit_index = max(self.commit_index, offset)
        done = [a for a in self._waiting if a.last_offset <= offset]
        self._waiting = [a for a in self._waiting if a.last_offset > offset]
        self._answers.extend(done)

    def ready(self) -> Ready:
        rd = Ready(hard_state=self._hard, flush=self._flush, answers=self._answers)
        self._hard, self._flush, self._answers = None, False, []
        return rd

    def status(self) -> Status:
        return Status(self.node_id, self.role, self.term, self.leader_id, self.log.dirty_offset,
                      self.log.flushed_offset, self.commit_index, self.high_watermark,
                      self.log.start_offset, list(self.cfg.voters), [])


async def serve(port: int) -> None:
    addr = f"127.0.0.1:{port}"
    config = NodeConfig(node_id=1, data_dir=Path(tempfile.mkdtemp()), peers={1: addr},
                        listen=addr)
    node = Node(config, log_storage=MemoryLog())
    async with trio.open_nursery() as nursery:
        await nursery.start(node._run, SoloConfig, SoloCore)


if __name__ == "__main__":
    trio.run(serve, int(sys.argv[1]))
