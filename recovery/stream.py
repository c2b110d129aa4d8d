"""Planning what the leader sends a follower next: the RFC's recovery stream.

A follower at the leader's tail, or lacking only entries not yet committed (the write pipeline),
is in step: it gets normal AppendEntries (up to `max_append_bytes`, asking for a flush, so quorum
writes commit quickly). A follower that lacks committed entries is *recovering*: it gets
chunks of `recovery_chunk_bytes` sent with `flush=False`, so it appends them to its in-memory
tail without an fsync per chunk and flushes on its own schedule (`deferred_flush`); the chunk
that reaches the leader's tail asks for a flush again. A follower behind the leader's log start
is reset to it (`log_start_reset`).

The chunk is never smaller than one batch, whatever its size, so a large batch still moves.
It is also bounded in batches (`max_batches`): the leader reads (and on flushed data
CRC-checks) every batch of a chunk, encodes it, and the follower decodes and appends it, each
in one step of its event loop. With small batches a byte budget alone meant tens of thousands
of batches per step, enough to hold a leader's loop past an election timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.api import LogStorage
from storage.batch import Batch

# A chunk may carry up to budget >> OVERSHOOT_SHIFT bytes beyond its byte budget.
OVERSHOOT_SHIFT = 3


@dataclass(slots=True, frozen=True)
class StreamLimits:
    max_append_bytes: int
    recovery_chunk_bytes: int
    # Benchmark baseline only: every chunk asks for a flush (the behaviour the RFC replaces).
    flush_per_chunk: bool = False
    # Batches per request, normal or recovery (at least one).
    max_batches: int = 1024


@dataclass(slots=True)
class Chunk:
    prev_offset: int  # the offset just before the first batch (the log-matching check)
    batches: list[Batch]
    last_offset: int  # the last offset the chunk carries (prev_offset when empty: a probe)
    at_tail: bool  # it reaches the leader's dirty offset: the follower is caught up after it
    # After it the follower lacks at most entries not yet committed (the write pipeline): it
    # is in step (flushed per append), not recovering.
    in_step: bool
    flush: bool  # the follower must flush before it answers
    log_start_reset: bool  # the follower is behind our log start: reset it there

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.batches)


def next_chunk(log: LogStorage, next_index: int, *, replicating: bool, recovering: bool,
               limits: StreamLimits, commit_index: int | None = None) -> Chunk | None:
    """The next request for a follower whose next index is `next_index`, or None when a
    replicating follower already has everything (heartbeats carry the commit index then).
    A probing follower always gets a request, empty if need be."""
    nxt = next_index
    reset = False
    if nxt < log.start_offset:
        nxt, reset = log.start_offset, log.start_offset > 0
    if nxt > log.dirty_offset + 1:
        nxt = log.dirty_offset + 1
    if replicating and nxt > log.dirty_offset:
        return None
    budget = limits.recovery_chunk_bytes if recovering else limits.max_append_bytes
    # Budgets are round sizes, and so are clients' batches (256 KiB of records, a little
    # more with their framing and the batch header): a hard budget sent 3 such batches per
    # 1 MiB append and 1 per 512 KiB recovery chunk, a third to a half more frames, each
    # decoded, appended, flushed and answered. A chunk may run up to an eighth over.
    budget += budget >> OVERSHOOT_SHIFT
    cap = limits.max_batches
    batches = log.read(nxt, budget, cap) if nxt <= log.dirty_offset else []
    prev = batches[0].base_offset - 1 if batches else nxt - 1
    if prev < log.start_offset - 1:
        batches = log.read(log.start_offset, budget, cap)
        prev = log.start_offset - 1
    reset = reset or (prev == log.start_offset - 1 and log.start_offset > 0)
    last = batches[-1].last_offset if batches else prev
    at_tail = last >= log.dirty_offset
    # A chunk after which the follower lacks only entries not yet committed (the write
    # pipeline) asks for a flush like one reaching the tail: the quorum may be waiting for it.
    # Only a chunk that leaves it short of committed entries defers its flush.
    in_step = at_tail or (commit_index is not None and last >= commit_index)
    return Chunk(prev, batches, last, at_tail, in_step, in_step or limits.flush_per_chunk, reset)
