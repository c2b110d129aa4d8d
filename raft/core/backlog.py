"""How far a leader's log runs ahead of its commit index, in bytes, and the rule that bounds it
for the writes that do not wait for a quorum (acks=leader, acks=none).

Why. A quorum write waits for the commit index, so its client's window bounds what it leaves
behind. A leader or none write is answered once the leader appended it: nothing stopped a
producer from filling the leader's log as fast as the leader could append, far faster than the
followers replicate. Measured (issue 28, docs/PERFORMANCE.md): eight acks=none producers of
16 KiB records put the leader 85,000 records (1.4 GB) ahead of its followers in 8 s; its
flushes carried 100-150 MB each (1.5-2.3 s of the store's one writer), the followers caught up
in recovery for 12-14 s after the flood, and every later point of the bench paid for it.
With the bound, once the bytes the leader appended past its commit index reach
`RaftConfig.max_uncommitted_bytes`, a leader or none write waits (is parked, unanswered) until
the commit index has moved far enough; so does every write proposed after it, quorum ones too,
so writes still enter the log in the order they came (a client's pipelined requests land in
the order sent). The flood is paced by replication, and the leader's unflushed tail, so its
flushes, stay bounded too. Waiting, not refusing: a refusal (BACKPRESSURE) costs the leader the
whole request (read, decoded, checked) and the client a backoff and a resend; measured, it cut
acks=none throughput to a third of what the same cluster committed at quorum. A parked write
answers the client later, so its connection's in-flight limit stops the node reading more from
it (TCP backpressure). What may wait is bounded too (PARKED_FACTOR times the bound in bytes,
and max_pending_produce writes); past that a write is refused BACKPRESSURE (nothing written):
the waiting room must hold what producers keep in flight (the bench: 8 x 8 x 256 KiB = 16 MiB),
or a small bound turns into refusals (measured at 8 MiB with a room of 8 MiB: ~8,000
BACKPRESSURE answers a point and acks=none at 22 MB/s; with a room of 32 MiB, none). A
parked write is answered NOT_LEADER (nothing written) if leadership goes first; one whose
client gave up (TIMEOUT, from the runtime's timer) may still be written later, as TIMEOUT says.

Counted: the bytes of batches this leader appended in its term (what older terms left
uncommitted is not its backlog and commits with its no-op), less those at or below the commit
index. One mark per appended batch, dropped as the commit index passes it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from raft.core.types import Acks

# What may wait for room, in bytes, is this many times max_uncommitted_bytes.
PARKED_FACTOR = 4

if TYPE_CHECKING:
    from storage.batch import Batch


class Backlog:
    """The leader's appended-but-uncommitted bytes (see the module docstring)."""

    __slots__ = ("_marks", "_appended", "_committed", "parked", "parked_bytes")

    def __init__(self) -> None:
        # Writes waiting for room, in the order proposed: (request id, batch, acks).
        self.parked: deque[tuple[int, Batch, Acks]] = deque()
        self.parked_bytes = 0
        # (last offset of a batch, bytes appended up to and including it), in offset order.
        self._marks: deque[tuple[int, int]] = deque()
        self._appended = 0
        self._committed = 0  # bytes appended up to the commit index

    def appended(self, last_offset: int, nbytes: int) -> None:
        self._appended += nbytes
        self._marks.append((last_offset, self._appended))

    def committed(self, commit_index: int) -> None:
        marks = self._marks
        while marks and marks[0][0] <= commit_index:
            self._committed = marks.popleft()[1]

    @property
    def bytes(self) -> int:
        return self._appended - self._committed

    def full(self, limit: int) -> bool:
        """Whether a write that does not wait for the quorum must wait (0: no limit)."""
        return limit > 0 and self.bytes >= limit

    def must_wait(self, acks: Acks, limit: int) -> bool:
        """Whether a write proposed now waits: one is waiting already (order), or it does not
        wait for the quorum and the backlog is full."""
        return bool(self.parked) or (acks != Acks.QUORUM and self.full(limit))

    def park(self, request_id: int, batch: Batch, acks: Acks, limit: int,
             max_writes: int) -> bool:
        """Keep the write until there is room; False when the waiting ones are at their bound
        (bytes: `limit`, writes: `max_writes`) and it must be refused instead."""
        if self.parked and (len(self.parked) >= max_writes
                            or (limit > 0 and self.parked_bytes + batch.size > limit)):
            return False
        self.parked.append((request_id, batch, acks))
        self.parked_bytes += batch.size
        return True

    def next_admitted(self, limit: int) -> tuple[int, Batch, Acks] | None:
        """The oldest waiting write if it may go in now (the backlog has room, or it waits
        for the quorum anyway), taken off the queue; else None."""
        if not self.parked:
            return None
        acks = self.parked[0][2]
        if acks != Acks.QUORUM and self.full(limit):
            return None
        item = self.parked.popleft()
        self.parked_bytes -= item[1].size
        return item

    def take_parked(self) -> list[tuple[int, Batch, Acks]]:
        """Every waiting write (leadership ends: each is answered, none written)."""
        out = list(self.parked)
        self.parked.clear()
        self.parked_bytes = 0
        return out
