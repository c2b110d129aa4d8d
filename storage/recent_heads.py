"""The headers of a log's newest flushed batches, kept in memory for `read_heads`.

Why: the load and subscription indexes read every committed batch back (`read_heads`, on the
event loop) just after a flush wrote it. From LMDB that is a read transaction, a seek, and
py-lmdb touching every page of the value it hands out (its preload), for a header of 48 bytes;
and once the logs outgrow the page cache, pages written a moment ago may already be gone, so the
loop itself waited on the disk (issue 28: 136-888 major faults in 2 s on the loop's thread in
the default `bench produce` run). The flush has the batches in hand: it leaves their headers
here, and whole batches of the small kinds the indexes read in full (CONFIG, CONTROL).

Bounded: the newest MAX_HEADS batches per log (about 120 bytes each), so a node of many
partitions holds at most a few tens of MB here. The owner keeps it in step with the log under
the log's lock: a suffix cut drops what it cut, a new start drops what is below it, a reset
clears it. A log with known damage does not use it (the damage set decides what is served).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from storage.batch import Batch, BatchHead, BatchKind

MAX_HEADS = 256
# Kept whole: small, and read in full by the indexes (a STAGED or MIRRORED batch may be large:
# only its header is kept, and a read that needs its payload goes to LMDB).
_WHOLE = frozenset((BatchKind.CONFIG, BatchKind.CONTROL))


class RecentHeads:
    """Contiguous headers (or small whole batches) ending at the log's flushed offset."""

    __slots__ = ("_items", "_bases")

    def __init__(self) -> None:
        self._items: list[Batch | BatchHead] = []
        self._bases: list[int] = []

    def __len__(self) -> int:
        return len(self._items)

    def flushed(self, batches: Sequence[Batch]) -> None:
        """`batches` were just flushed, right after what is held (the flush of a log's tail)."""
        items, bases = self._items, self._bases
        if items and batches and batches[0].base_offset != items[-1].last_offset + 1:
            self.clear()  # not contiguous (cannot happen in order; never serve a gap)
        for b in batches:
            items.append(b if b.kind in _WHOLE else
                         BatchHead(b.base_offset, b.count, b.term, b.kind, b.size,
                                   b.timestamp_ms, b.producer_id, b.sequence))
            bases.append(b.base_offset)
        if len(items) > 2 * MAX_HEADS:  # trim in steps: amortised, not per batch
            del items[:-MAX_HEADS]
            del bases[:-MAX_HEADS]

    def cut_after(self, offset: int) -> None:
        i = bisect.bisect_right(self._bases, offset)
        del self._items[i:]
        del self._bases[i:]

    def drop_below(self, offset: int) -> None:
        i = bisect.bisect_left(self._bases, offset)
        del self._items[:i]
        del self._bases[:i]

    def clear(self) -> None:
        self._items.clear()
        self._bases.clear()

    def serve(self, offset: int, out: list[Any], used: int, max_bytes: int, limit: int,
              full: frozenset[BatchKind]) -> tuple[int, int, bool]:
        """Append to `out` what is held from the batch holding `offset` on, within the limits,
        until a batch whose payload `full` asks for and only its header is held. Returns the
        next offset to read, the bytes used, and whether the limits stopped it."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0:
            return offset, used, False
        for e in self._items[i:]:
            if e.kind in full and type(e) is BatchHead:
                return e.base_offset, used, False
            if out and (used + e.size > max_bytes or len(out) >= limit):
                return offset, used, True
            out.append(e)
            used += e.size
            offset = e.last_offset + 1
        return offset, used, False
