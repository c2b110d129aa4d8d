"""Idempotent producers: the last few (producer id, sequence) -> offsets, derived from the log.

Every node keeps the table, built from the batches it appends (each DATA batch carries its
producer id and sequence), so a new leader already knows what the old one accepted: the state
lives in the replicated log, not in one leader's memory (Kafka keeps it the same way). A retry of
a remembered sequence gets the original offsets back instead of a second copy.

A table built from a log that holds a damaged batch (storage/damage.py: unreadable until it is
repaired from another copy) is missing whatever that batch wrote, and nobody can tell which
producer it was. Until the batch is repaired (or cut away with the log around it) the table
answers UNKNOWN for every write it does not find: a leader that took such a write as new could
commit a retry a second time (simulation seed 7131584, issue 24). A repaired batch goes back
into its place in log order, as the start-up rebuild would have put it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from enum import Enum

from storage.batch import NO_PRODUCER, Batch, BatchKind

# Batches whose producer id / sequence the table remembers (a client produce to a promoted
# mirror is converted to MIRRORED by the leader, raft/core/mirror.py).
_RECORDED = frozenset({BatchKind.DATA, BatchKind.MIRRORED})


class Verdict(Enum):
    NEW = "new"  # not seen: append it
    DUPLICATE = "duplicate"  # seen: answer with the original offsets
    TOO_OLD = "too_old"  # older than the remembered window: cannot tell, refuse
    # Not found, but the table could not read some batches of the log (damaged): it may be one
    # of them. Refuse for now; the answer is known once they are repaired.
    UNKNOWN = "unknown"


@dataclass(slots=True, frozen=True)
class Written:
    sequence: int
    base_offset: int
    last_offset: int


class ProducerTable:
    def __init__(self, window: int = 8, max_producers: int = 100_000) -> None:
        if window < 1 or max_producers < 1:
            raise ValueError("producer window and max_producers must be >= 1")
        self.window = window
        self.max_producers = max_producers
        # Least recently written first, so the oldest producer is evicted at the bound.
        self._by_pid: OrderedDict[int, deque[Written]] = OrderedDict()
        # Batches of the log this table could not read (base offset -> last offset).
        self._unread: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._by_pid)

    def lookup(self, producer_id: int, sequence: int) -> tuple[Verdict, Written | None]:
        seen = self._by_pid.get(producer_id) or deque()
        for w in reversed(seen):
            if w.sequence == sequence:
                return Verdict.DUPLICATE, w
        if self._unread:
            return Verdict.UNKNOWN, None  # it may be in a batch we could not read
        # Older than everything remembered while the window is full: it may have been written
        # and forgotten. Anything else not found was never written (a request overtaken by a
        # later one, then retried) and is new.
        if seen and sequence < seen[0].sequence and len(seen) >= self.window:
            return Verdict.TOO_OLD, None
        return Verdict.NEW, None

    @property
    def unread(self) -> list[tuple[int, int]]:
        """[(first, last)] of the log's batches this table could not read (damaged)."""
        return sorted(self._unread.items())

    def mark_unread(self, first: int, last: int) -> None:
        """The log holds a batch at `first`..`last` that could not be read: until `record`
        gets it (repaired) or the log drops it, lookups that miss answer UNKNOWN."""
        self._unread[first] = last

    def record(self, batch: Batch) -> None:
        """A batch of the log, normally the newest; an older one (a damaged batch repaired)
        goes into its place in log order, and only if it is within the remembered window."""
        self._unread.pop(batch.base_offset, None)
        if batch.producer_id == NO_PRODUCER or batch.kind not in _RECORDED:
            return
        w = Written(batch.sequence, batch.base_offset, batch.last_offset)
        seen = self._by_pid.get(batch.producer_id)
        if seen is None:
            seen = deque(maxlen=self.window)
            self._by_pid[batch.producer_id] = seen
            if len(self._by_pid) > self.max_producers:
                self._by_pid.popitem(last=False)
        elif seen and w.base_offset <= seen[-1].base_offset:
            if any(x.base_offset == w.base_offset for x in seen):
                return  # recorded already (read before the damage was found)
            if len(seen) >= self.window and w.base_offset < seen[0].base_offset:
                return  # older than everything remembered: the rebuild would have dropped it
            in_order = sorted([*seen, w], key=lambda x: x.base_offset)
            seen.clear()
            seen.extend(in_order)  # (the deque's bound drops the oldest)
            return
        else:
            self._by_pid.move_to_end(batch.producer_id)
        seen.append(w)

    def truncate_after(self, offset: int) -> None:
        """Forget writes past `offset` (the log dropped them)."""
        self._unread = {b: e for b, e in self._unread.items() if b <= offset}
        for pid in list(self._by_pid):
            seen = self._by_pid[pid]
            while seen and seen[-1].base_offset > offset:
                seen.pop()
            if not seen:
                del self._by_pid[pid]

    def clear(self) -> None:
        self._by_pid.clear()
        self._unread.clear()

    # -- the state at a log start (raft/core/snapshot.py) -------------------------------------------
    def dump(self) -> list[list]:
        """[[producer id, [[sequence, base, last], ...]], ...], least recently written first:
        what a node that no longer holds these batches needs to answer retries with the
        original offsets."""
        return [[pid, [[w.sequence, w.base_offset, w.last_offset] for w in seen]]
                for pid, seen in self._by_pid.items()]

    def load(self, rows: list) -> None:
        """Replace the table with a dump(); ValueError if it is malformed."""
        by_pid: OrderedDict[int, deque[Written]] = OrderedDict()
        try:
            for pid, seen in rows:
                by_pid[int(pid)] = deque((Written(int(s), int(b), int(e)) for s, b, e in seen),
                                         maxlen=self.window)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the producer table in the state at the log start is malformed "
                             f"({e})") from None
        while len(by_pid) > self.max_producers:
            by_pid.popitem(last=False)
        self._by_pid = by_pid
        self._unread = {}
