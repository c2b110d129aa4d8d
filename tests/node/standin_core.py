"""A stand-in consensus core for node tests while (or where) the real raft/raft.py is absent.

It keeps the driver contract of raft/ready.py but is deliberately minimal: the lowest node id
leads forever (term 1, no elections), the leader sends each follower everything past its match
index every tick, followers append and flush before replying, and the commit index is the
majority's flushed offset. That is enough to exercise the runtime (framing, peer links, the
Ready loop, flushes, produce/fetch/status) end to end; everything about elections, failover and
idempotency is tested only against the real core.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft import messages as m
from raft.ready import FollowerStatus, HardState, ProduceAnswer, Ready, Status
from raft.types import Acks, ErrorCode, Role
from storage.api import LogStorage
from storage.batch import Batch


@dataclass(slots=True)
class StandinConfig:
    node_id: int
    voters: list[int]
    learners: list[int] = field(default_factory=list)
    election_ticks: int = 10
    heartbeat_ticks: int = 1


class StandinCore:
    def __init__(self, cfg: StandinConfig, log: LogStorage, rng: random.Random) -> None:
        self.cfg, self.log = cfg, log
        self.node_id = cfg.node_id
        self.term = 1
        self.leader_id = min(cfg.voters)
        self.role = Role.LEADER if cfg.node_id == self.leader_id else Role.FOLLOWER
        self.commit_index = -1
        self._hard_state: HardState | None = HardState(1, self.leader_id, None)
        self._answers: list[ProduceAnswer] = []
        self._messages: list[m.Message] = []
        self._waiting: list[tuple[int, Batch]] = []
        self._flush = False
        self._match = {v: -1 for v in cfg.voters}
        self._seq = 0

    @property
    def high_watermark(self) -> int:
        return self.commit_index

    def tick(self) -> None:
        if self.role != Role.LEADER:
            return
        for peer in self.cfg.voters:
            if peer == self.node_id:
                continue
            nxt = self._match[peer] + 1
            batches = self.log.read(nxt, 1 << 20) if nxt <= self.log.dirty_offset else []
            prev = batches[0].base_offset - 1 if batches else self.log.dirty_offset
            self._seq += 1
            self._messages.append(m.AppendEntries(
                self.node_id, peer, self.term, prev, self.log.term_at(prev), batches,
                self.commit_index, True, self._seq))

    def step(self, msg: m.Message) -> None:
        if isinstance(msg, m.AppendEntries):
            ok = msg.prev_offset <= self.log.dirty_offset
            if ok:
                if msg.prev_offset < self.log.dirty_offset:
                    self.log.truncate_suffix(max(msg.prev_offset, self.commit_index))
                fresh = [b for b in msg.batches if b.base_offset > self.log.dirty_offset]
                self.log.append(fresh)
                self.log.flush()
                self.commit_index = max(self.commit_index,
                                        min(msg.commit_index, self.log.flushed_offset))
            self._messages.append(m.AppendEntriesReply(
                self.node_id, msg.src, self.term, msg.seq, ok,
                self.log.dirty_offset if ok else -1, self.log.dirty_offset, self.term,
                self.log.flushed_offset, self.term))
        elif isinstance(msg, m.AppendEntriesReply) and self.role == Role.LEADER:
            if msg.success:
                self._match[msg.src] = max(self._match[msg.src], msg.flushed_offset)
            else:
                self._match[msg.src] = min(self._match[msg.src], msg.dirty_offset)
            self._advance()

    def _advance(self) -> None:
        self._match[self.node_id] = self.log.flushed_offset
        ranked = sorted(self._match.values(), reverse=True)
        self.commit_index = max(self.commit_index, ranked[len(ranked) // 2])
        keep = []
        for rid, b in self._waiting:
            if b.last_offset <= self.commit_index:
                self._answers.append(ProduceAnswer(rid, ErrorCode.OK, b.base_offset,
                                                   b.last_offset))
            else:
                keep.append((rid, b))
        self._waiting = keep

    def propose(self, request_id: int, batch: Batch, acks: Acks) -> None:
        if self.role != Role.LEADER:
            self._answers.append(ProduceAnswer(request_id, ErrorCode.NOT_LEADER,
                                               leader_id=self.leader_id))
            return
        placed = batch.placed(self.log.dirty_offset + 1, self.term)
        self.log.append([placed])
        self._flush = True
        if acks == Acks.QUORUM:
            self._waiting.append((request_id, placed))
        else:
            self._answers.append(ProduceAnswer(request_id, ErrorCode.OK, placed.base_offset,
                                               placed.last_offset))

    def flushed(self, offset: int) -> None:
        if self.role == Role.LEADER:
            self._advance()

    def transfer_leadership(self, to: int | None = None) -> None:
        raise ValueError("the stand-in core cannot transfer leadership")

    def ready(self) -> Ready:
        rd = Ready(self._hard_state, self._messages, self._flush, self._answers)
        self._hard_state, self._messages, self._flush, self._answers = None, [], False, []
        return rd

    def status(self) -> Status:
        followers = [FollowerStatus(v, self._match[v], self._match[v] + 1, self._match[v],
                                    self._match[v], 0, 0, False, False, 0)
                     for v in self.cfg.voters if v != self.node_id]
        return Status(self.node_id, self.role, self.term, self.leader_id, self.log.dirty_offset,
                      self.log.flushed_offset, self.commit_index, self.commit_index,
                      self.log.start_offset, list(self.cfg.voters), [],
                      followers if self.role == Role.LEADER else [])
