"""The subscription table kept current from a log, and what consumers lag by.

`SubscriptionIndex.catch_up(commit_index)` applies committed batches in log order to the table
(raft/core/subscription_table.py), in bounded steps, and reports the verdicts of our own entries to a
callback; after a restart it rebuilds the table by scanning the log from its start (or from the
table stored with the log start, once retention stores one: `restore`).

While it scans, it also counts the records and bytes of DATA, STAGED and MIRRORED batches (`DataCounter`),
so lag in records and bytes is a subtraction instead of a log scan: a boundary (offset, records
before it, bytes before it) is kept at every batch end; when more than `max_points` are kept,
every other one in the older half is dropped, so the recent past (where live consumers are) stays
exact and the distant past gets coarser (positions there are interpolated, and flagged inexact).
A position inside a batch counts that batch's records before it, and its bytes pro rata.

Pure: it reads the LogStorage it is handed (a MemoryLog in the simulation and unit tests).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from raft.core.subscription_table import SNAPSHOT_SECTION, Applied, SubscriptionTable
from storage.api import LogStorage, OffsetOutOfRange
from storage.batch import HEADER_SIZE, Batch, BatchHead, BatchKind, CorruptBatch

DEFAULT_MAX_POINTS = 1 << 16
_COUNTED = (BatchKind.DATA, BatchKind.STAGED, BatchKind.MIRRORED)
# What the table reads the payload of; of every other batch the header is enough (read_heads).
TABLE_KINDS = frozenset((BatchKind.CONTROL,))


def _nobody(src: tuple[int, ...]) -> bool:
    return False


class DataCounter:
    """Cumulative records and bytes of consumer data, at batch boundaries."""

    def __init__(self, start_offset: int, max_points: int = DEFAULT_MAX_POINTS) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.max_points = max_points
        self.offsets = array("q", [start_offset])
        self.records = array("q", [0])
        self.nbytes = array("q", [0])
        self.exact_from = start_offset  # boundaries at and above are every batch's

    @property
    def end(self) -> int:
        return self.offsets[-1]

    def add(self, batch: Batch | BatchHead) -> None:
        if batch.base_offset != self.end:
            # A gap (the log start moved past us): start counting afresh from here.
            self.__init__(batch.base_offset, self.max_points)  # type: ignore[misc]
        counted = batch.kind in _COUNTED
        self.offsets.append(batch.last_offset + 1)
        self.records.append(self.records[-1] + (batch.count if counted else 0))
        self.nbytes.append(self.nbytes[-1] + (batch.size - HEADER_SIZE if counted else 0))
        if len(self.offsets) > self.max_points:
            self._thin()

    def _thin(self) -> None:
        half = len(self.offsets) // 2
        keep = list(range(0, half, 2)) + list(range(half, len(self.offsets)))
        for name in ("offsets", "records", "nbytes"):
            old = getattr(self, name)
            setattr(self, name, array("q", (old[i] for i in keep)))
        # Boundaries from the first unthinned one on are still every batch's.
        self.exact_from = self.offsets[len(range(0, half, 2))]

    def at(self, offset: int) -> tuple[int, int, bool]:
        """(records, bytes) of consumer data before `offset`, and whether that is exact.
        Clamped to what the counter covers."""
        offs = self.offsets
        if offset <= offs[0]:
            return self.records[0], self.nbytes[0], offset == offs[0]
        if offset >= offs[-1]:
            return self.records[-1], self.nbytes[-1], offset == offs[-1]
        i = bisect.bisect_right(offs, offset) - 1
        lo, hi = offs[i], offs[i + 1]
        r0, r1 = self.records[i], self.records[i + 1]
        b0, b1 = self.nbytes[i], self.nbytes[i + 1]
        if offset == lo:
            return r0, b0, True
        span = hi - lo
        exact = lo >= self.exact_from  # one batch between the two boundaries
        if exact and r1 - r0 == 0:
            return r0, b0, True  # a control batch: nothing to count
        # One batch: its records are one per offset. Several (thinned): interpolate.
        frac = (offset - lo) / span
        return r0 + round((r1 - r0) * frac), b0 + round((b1 - b0) * frac), exact and \
            (r1 - r0) == span

    def lag(self, position: int, end: int) -> tuple[int, int, bool]:
        """(records, bytes, exact) of consumer data in [position, end)."""
        r_end, b_end, e1 = self.at(end)
        r_pos, b_pos, e2 = self.at(max(position, self.offsets[0]))
        exact = e1 and e2 and position >= self.offsets[0]
        return max(0, r_end - r_pos), max(0, b_end - b_pos), exact

    def drop_below(self, offset: int) -> None:
        """Retention moved the log start: forget boundaries below it (keeps the one at or
        before it so positions at the start still resolve)."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        if i > 0:
            for name in ("offsets", "records", "nbytes"):
                setattr(self, name, getattr(self, name)[i:])


@dataclass(slots=True, frozen=True)
class PendingRead:
    """A read `next_read` asked for: where it starts, and the commit index as of then. Only
    entries committed when the read began are applied from it. Why: the read runs elsewhere (a
    worker thread) while the log goes on; an entry past that commit index may be cut and
    replaced (a new leader) and the commit index pass its offset before the read comes back,
    so applying up to the commit index of the moment the read returns would apply the cut
    entry in place of the committed one."""

    start: int
    commit_index: int


class SubscriptionIndex:
    """A SubscriptionTable kept current from a LogStorage, plus the data counter for lag."""

    def __init__(self, log: LogStorage, max_points: int = DEFAULT_MAX_POINTS) -> None:
        self.log = log
        self.max_points = max_points
        self.table = SubscriptionTable(log.start_offset)
        self.counter = DataCounter(log.start_offset, max_points)
        self.restore()

    def restore(self) -> None:
        """Start from the table stored with the log start, when the log has one (retention and
        state transfers store it: issue 15's `LogStorage.snapshot`); otherwise from an empty
        table at the log start."""
        stored = self._stored_table()
        self.table = stored if stored is not None else SubscriptionTable(self.log.start_offset)
        self.counter = DataCounter(self.log.start_offset, self.max_points)

    def _stored_table(self) -> SubscriptionTable | None:
        snapshot = getattr(self.log, "snapshot", None)
        sections = snapshot.get("sections") if isinstance(snapshot, dict) else None
        raw = sections.get(SNAPSHOT_SECTION) if isinstance(sections, dict) else None
        if raw is None:
            return None
        table = SubscriptionTable.from_snapshot(raw)
        start = self.log.start_offset
        if table.applied + 1 != start:
            raise ValueError(f"the subscription table stored with the log start was applied "
                             f"up to {table.applied}, not to the log start {start} - 1")
        return table

    def catch_up(self, commit_index: int, max_bytes: int = 64 << 20,
                 on_applied: Callable[[Applied], None] | None = None,
                 mine: Callable[[tuple[int, ...]], bool] | None = None,
                 max_batches: int | None = None) -> bool:
        """Apply committed batches up to `commit_index`, reading at most about max_bytes
        (and, when given, max_batches batches), and hand the verdicts of our entries (those
        `mine` picks; all without it) to `on_applied`. True if fully caught up."""
        t = self.table
        budget = max_bytes
        left = max_batches if max_batches is not None else 1 << 62
        while t.applied < commit_index and budget > 0 and left > 0:
            start = self.log.start_offset
            if t.applied + 1 < start:
                # The start moved past what we applied: a state transfer (or retention) stores
                # the table as of the new start with it; without one, go on with what we have.
                stored = self._stored_table()
                if stored is not None:
                    self.table = t = stored
                else:
                    t.skip_to(start)
                self.counter.drop_below(start)
                continue
            if t.applied + 1 > self.log.dirty_offset:
                return False
            try:
                batches = self.log.read_heads(t.applied + 1, min(budget, 16 << 20),
                                              left if max_batches is not None else None,
                                              TABLE_KINDS)
            except CorruptBatch:
                return False  # damaged here (raft/core/repair.py fetches it again): wait for it
            except OffsetOutOfRange:
                return False  # a state transfer moved the start meanwhile (raft/core/loads.py)
            if not batches:
                return False
            done, used, n = self._apply(batches, commit_index, on_applied, mine)
            budget -= used
            left -= n
            if done is not None:
                return done
        return t.applied >= commit_index

    def next_read(self, commit_index: int) -> PendingRead | None:
        """The read `apply_read` takes next, or None when there is nothing to read or the
        table must first follow a moved log start (`catch_up` does that)."""
        nxt = self.table.applied + 1
        if nxt > commit_index or nxt < self.log.start_offset or nxt > self.log.dirty_offset:
            return None
        return PendingRead(nxt, commit_index)

    def apply_read(self, read: PendingRead, batches: list[Batch | BatchHead],
                   on_applied: Callable[[Applied], None] | None = None,
                   mine: Callable[[tuple[int, ...]], bool] | None = None) -> bool:
        """Apply batches `read_heads(read.start, ..., TABLE_KINDS)` returned, read elsewhere
        (a worker thread: the event loop never waits on the disk for them), up to the commit
        index as of the read (PendingRead says why). Nothing is applied if the table moved on
        meanwhile (the first batch no longer follows what it applied). True if caught up with
        that commit index."""
        done, _, _ = self._apply(batches, read.commit_index, on_applied, mine)
        return done if done is not None else self.table.applied >= read.commit_index

    def _apply(self, batches: list[Batch | BatchHead], commit_index: int,
               on_applied: Callable[[Applied], None] | None,
               mine: Callable[[tuple[int, ...]], bool] | None) -> tuple[bool | None, int, int]:
        """Apply `batches` in order up to `commit_index`: (the verdict when it had to stop
        early, else None; bytes and batches applied)."""
        t = self.table
        used = n = 0
        for b in batches:
            if b.last_offset > commit_index:
                return t.applied >= commit_index, used, n
            if b.base_offset != t.applied + 1:
                return False, used, n  # the log moved under us: the next call reads afresh
            applied = t.apply(b, mine if on_applied is not None else _nobody)
            self.counter.add(b)
            used += b.size
            n += 1
            if applied is not None and on_applied is not None:
                on_applied(applied)
        return None, used, n

    def lag(self, position: int, end: int) -> tuple[int, int, bool]:
        """(records, bytes, exact) a subscription at `position` lags `end` (exclusive) by."""
        return self.counter.lag(position, end)
