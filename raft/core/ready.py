"""What the sans-IO core hands its driver: the Ready batch, answers and status snapshots.

The driver (trio runtime or simulation) loops:
    1. feed inputs: core.tick(), core.step(msg), core.propose(...), core.flushed(offset);
    2. rd = core.ready();
    3. if rd.hard_state: storage.save_meta(...) durably BEFORE sending any of rd.messages
       (a vote or term must never be forgotten once someone may have seen it); a hard state
       that differs from the saved one only in the commit checkpoint (config["commit"]) may
       be saved after them (a hint: raft/node/meta_saver.py does so, never waiting for it);
    4. send rd.messages (any order; the network may drop/reorder them anyway);
    5. if rd.flush and no flush is running: run storage.flush() (worker thread / simulated disk
       delay) and when it completes call core.flushed(new_flushed_offset);
    6. if rd.storage: run rd.storage.run(storage) (worker thread / simulated disk delay: it is
       fsynced) and when it completes call core.stored(); an exception from it is fatal
       (fail-stop), as from any step of the core;
    7. deliver rd.answers to waiting clients.
The core appends to the storage object it was given directly (appends only touch the in-memory
tail, so they are not I/O); flushes, metadata writes and the durable changes of StorageWork
(truncations, a reset, repairs) are the driver's work. While a StorageWork runs the core
changes nothing in the log and hands out no other one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from raft.core.messages import Message
from raft.core.types import Acks, ErrorCode, Role

if TYPE_CHECKING:
    from storage.api import LogStorage
    from storage.batch import Batch


@dataclass(slots=True)
class HardState:
    term: int
    voted_for: int | None
    config: dict | None


@dataclass(slots=True)
class ProduceAnswer:
    request_id: int
    error: ErrorCode
    base_offset: int = -1  # set for OK answers at acks quorum/leader (and dedup hits)
    last_offset: int = -1
    leader_id: int | None = None  # set with NOT_LEADER when known
    duplicate: bool = False  # an idempotent retry: offsets are those of the original write
    message: str = ""  # for errors the caller shows as-is (what went wrong, what to do next)
    # With MIRROR_POSITION: the mirror's visible end, where the link resumes (raft/core/mirror.py).
    visible_end: int = -1


class StorageOp(Enum):
    TRUNCATE_SUFFIX = "truncate_suffix"  # a follower drops an old term's tail
    RESET = "reset"  # a follower restarts its log at the leader's start (state transfer)
    TRUNCATE_PREFIX = "truncate_prefix"  # a follower drops a damaged prefix the cluster deleted
    REPAIR = "repair"  # a follower writes good copies of damaged batches back


@dataclass(slots=True)
class StorageWork:
    """A durable change of the log the core needs before it goes on (each is one fsynced
    transaction, storage/api.py). The driver runs it off its event loop and then calls
    core.stored(); until then the core leaves the log as it is."""

    op: StorageOp
    offset: int = -1  # TRUNCATE_SUFFIX: the last offset kept; RESET, TRUNCATE_PREFIX: new start
    term: int = 0  # RESET: the term of the entry just before the new start
    snapshot: dict | None = None  # RESET, TRUNCATE_PREFIX: the state at the new start
    batches: Sequence["Batch"] = ()  # REPAIR

    @classmethod
    def truncate_suffix(cls, after: int) -> "StorageWork":
        return cls(StorageOp.TRUNCATE_SUFFIX, after)

    @classmethod
    def reset(cls, start: int, term: int, snapshot: dict | None = None) -> "StorageWork":
        return cls(StorageOp.RESET, start, term, snapshot)

    @classmethod
    def truncate_prefix(cls, start: int, snapshot: dict | None) -> "StorageWork":
        return cls(StorageOp.TRUNCATE_PREFIX, start, snapshot=snapshot)

    @classmethod
    def repair(cls, batches: Sequence["Batch"]) -> "StorageWork":
        return cls(StorageOp.REPAIR, batches=tuple(batches))

    def run(self, log: "LogStorage") -> None:
        """Carry it out (blocking: call it where the driver does its disk work)."""
        if self.op == StorageOp.TRUNCATE_SUFFIX:
            log.truncate_suffix(self.offset)
        elif self.op == StorageOp.RESET:
            log.reset(self.offset, self.term, self.snapshot)
        elif self.op == StorageOp.TRUNCATE_PREFIX:
            log.truncate_prefix(self.offset, self.snapshot)
        else:
            log.repair(self.batches)


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None
    messages: list[Message] = field(default_factory=list)
    flush: bool = False
    answers: list[ProduceAnswer] = field(default_factory=list)
    storage: StorageWork | None = None  # run it, then call core.stored()

    def empty(self) -> bool:
        return (self.hard_state is None and not self.messages and not self.flush
                and not self.answers and self.storage is None)


@dataclass(slots=True)
class FollowerStatus:
    node_id: int
    match_index: int
    next_index: int
    dirty_offset: int
    flushed_offset: int
    inflight: int
    inflight_bytes: int
    learner: bool
    recovering: bool
    last_heard_ticks: int  # ticks since we last heard from it
    incarnation: int = 0  # the data directory the leader takes it for (0: not known yet)
    rejoining: bool = False  # it lost its disk: being re-added as a learner, not counted
    repairing_from: int = -1  # it reported damage from here; the range is being resent


@dataclass(slots=True)
class Status:
    node_id: int
    role: Role
    term: int
    leader_id: int | None
    dirty_offset: int
    flushed_offset: int
    commit_index: int
    high_watermark: int
    start_offset: int
    voters: list[int]
    learners: list[int]
    followers: list[FollowerStatus] = field(default_factory=list)
    # Encoded bytes of the batches this node's log holds (what retention by size counts).
    retained_bytes: int = 0
    # The term of the entry just before the log start (from the state at the log start).
    start_term: int = 0
    incarnation: int = 0  # this node's data directory (raft/core/incarnation.py)
    # "member", or why it may not vote or count yet ("rejoining: lost its disk", ...).
    standing: str = "member"
    damaged: list[list[int]] = field(default_factory=list)  # [first, last] not served yet
    votes_refused: int = 0  # vote requests refused because it is not a member in good standing
    # A leader whose copy of a batch is damaged and that knows no voter holding it: the voters
    # it still waits to hear from before it may declare the batch lost (raft/core/repair.py).
    damage_waiting_for: list[int] = field(default_factory=list)
