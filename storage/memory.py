"""The in-memory twin of the LMDB log, for deterministic simulation.

It keeps the same contract and adds crash(): everything past the flushed offset is gone, exactly
what a process crash or power cut does to the real log. The "durable" part is modelled by a
second list that only flush()/truncate/reset/save_meta touch.

Disk faults for the simulation: `fail_next(op, exc)` makes the next call of `op` (flush,
truncate_suffix, truncate_prefix, reset, save_meta) that would write the durable state raise
`exc` (StorageIOError by default, or DiskFull) instead, changing nothing, exactly as the LMDB
log does when its transaction fails (disk first, then memory). The caller decides when: there is
no randomness in here. A call that writes nothing durable (nothing to flush, a cut inside the
unflushed tail, a prefix truncation at or below the start) neither fails nor uses up the fault.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Sequence

from storage.api import (
    DEFAULT_MAX_TAIL_BYTES,
    LogStorage,
    Meta,
    OffsetOutOfRange,
    StorageError,
    StorageIOError,
    TailFull,
)
from storage.batch import Batch

# The operations that write durable state, hence the ones a disk fault can hit.
FAULT_OPS = ("flush", "truncate_suffix", "truncate_prefix", "reset", "save_meta")


class MemoryLog(LogStorage):
    def __init__(self, max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES) -> None:
        self._max_tail_bytes = max_tail_bytes
        # Durable state: what survives crash().
        self._d_batches: list[Batch] = []
        self._d_start = 0
        self._d_start_term = 0
        self._d_snapshot: dict | None = None
        self._d_meta = Meta()
        # op -> exceptions to raise, in order, at its next durable writes (see fail_next).
        self._faults: dict[str, list[StorageError]] = {}
        self._load_durable()

    # -- fault injection (simulation) -----------------------------------------------------------
    def fail_next(self, op: str, exc: StorageError | type[StorageError] | None = None, *,
                  times: int = 1) -> None:
        """Make the next `times` calls of `op` that write durable state raise `exc` (an
        instance, or a StorageError subclass built with a message naming the op; default
        StorageIOError) and change nothing. Faults for one op fire in the order given."""
        if op not in FAULT_OPS:
            raise ValueError(f"unknown storage op {op!r} for a fault; one of {', '.join(FAULT_OPS)}")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        if exc is None:
            exc = StorageIOError
        if isinstance(exc, type):
            if not issubclass(exc, StorageError):
                raise TypeError(f"a storage fault must be a StorageError, got {exc.__name__}")
            made = [exc(f"{op}: injected disk fault; nothing was changed") for _ in range(times)]
        else:
            if not isinstance(exc, StorageError):
                raise TypeError(f"a storage fault must be a StorageError, got {exc!r}")
            made = [exc] * times
        self._faults.setdefault(op, []).extend(made)

    def pending_faults(self) -> dict[str, int]:
        """op -> how many injected faults have not fired yet."""
        return {op: len(q) for op, q in self._faults.items() if q}

    def clear_faults(self) -> None:
        self._faults.clear()

    def _disk_write(self, op: str) -> None:
        """Called just before `op` changes durable state: raise an injected fault, if any,
        before anything (durable or live) has changed."""
        queue = self._faults.get(op)
        if queue:
            raise queue.pop(0)

    # -- durable <-> live --------------------------------------------------------------------
    def _load_durable(self) -> None:
        self._batches: list[Batch] = list(self._d_batches)
        self._bases: list[int] = [b.base_offset for b in self._batches]
        self._start = self._d_start
        self._start_term = self._d_start_term
        self._snapshot = copy.deepcopy(self._d_snapshot)
        self._flushed = self._batches[-1].last_offset if self._batches else self._start - 1
        self._unflushed_bytes = 0
        self._bytes = sum(b.size for b in self._batches)

    def crash(self) -> None:
        """Lose everything past the flushed offset, as a power cut would."""
        self._load_durable()

    # -- positions -----------------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def start_term(self) -> int:
        return self._start_term

    @property
    def dirty_offset(self) -> int:
        return self._batches[-1].last_offset if self._batches else self._start - 1

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def unflushed_bytes(self) -> int:
        return self._unflushed_bytes

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    @property
    def snapshot(self) -> dict | None:
        return self._snapshot

    # -- writes ----------------------------------------------------------------------------------
    def append(self, batches: Sequence[Batch]) -> None:
        if not batches:
            return
        expect = self.dirty_offset + 1
        term = self.last_term()
        size = 0
        for b in batches:
            if b.base_offset != expect:
                raise ValueError(f"append at offset {b.base_offset}, expected {expect}")
            if b.term < term:
                raise ValueError(f"term went backwards at offset {b.base_offset}: "
                                 f"{b.term} < {term}")
            expect, term = b.last_offset + 1, b.term
            size += b.size
        if self._unflushed_bytes and self._unflushed_bytes + size > self._max_tail_bytes:
            raise TailFull(self._unflushed_bytes + size, self._max_tail_bytes)
        for b in batches:
            self._batches.append(b)
            self._bases.append(b.base_offset)
        self._unflushed_bytes += size
        self._bytes += size

    def flush(self, upto: int | None = None) -> int:
        # Invariant: the durable list holds exactly the live batches up to the flushed offset.
        i = bisect.bisect_right(self._bases, self._flushed)
        j = len(self._batches)
        if upto is not None:
            j = bisect.bisect_right(self._bases, upto)
            while j > i and self._batches[j - 1].last_offset > upto:
                j -= 1
        if j <= i:
            return self._flushed
        self._disk_write("flush")
        new = self._batches[i:j]
        self._d_batches.extend(new)
        self._flushed = new[-1].last_offset
        self._unflushed_bytes -= sum(b.size for b in new)
        return self._flushed

    def truncate_suffix(self, after_offset: int) -> None:
        i = self._index_after(after_offset)
        if after_offset < self._flushed:
            self._disk_write("truncate_suffix")
        self._bytes -= sum(b.size for b in self._batches[i:])
        del self._batches[i:]
        del self._bases[i:]
        if after_offset < self._flushed:
            # Everything left is at or below after_offset < flushed, so all of it was durable.
            self._d_batches = list(self._batches)
            self._flushed = after_offset
        self._unflushed_bytes = sum(b.size for b in self._batches if b.last_offset > self._flushed)

    def truncate_prefix(self, offset: int, snapshot: dict | None = None) -> None:
        if offset <= self._start:
            return
        i = self._prefix_index(offset)
        self._disk_write("truncate_prefix")
        self._cut_live(i, offset, snapshot)
        self._persist()

    def advance_start(self, offset: int, snapshot: dict | None = None) -> None:
        if offset <= self._start:
            return
        self._cut_live(self._prefix_index(offset), offset, snapshot)

    def persist_start(self) -> None:
        if (self._d_start, self._d_start_term) == (self._start, self._start_term) and \
                self._d_snapshot == self._snapshot:
            return
        self._disk_write("truncate_prefix")  # the same disk step as a prefix truncation
        self._persist()

    def _prefix_index(self, offset: int) -> int:
        """Index of the first batch kept by a prefix truncation to `offset` (checked)."""
        if offset > self._flushed + 1:
            raise ValueError(f"prefix truncation to {offset} passes the flushed offset "
                             f"{self._flushed}; flush first")
        if offset == self.dirty_offset + 1:
            return len(self._batches)
        i = bisect.bisect_left(self._bases, offset)
        if i >= len(self._bases) or self._bases[i] != offset:
            raise ValueError(f"prefix truncation to {offset} is not at a batch boundary")
        return i

    def _cut_live(self, i: int, offset: int, snapshot: dict | None) -> None:
        new_start_term = self._batches[i - 1].term
        self._bytes -= sum(b.size for b in self._batches[:i])
        del self._batches[:i]
        del self._bases[:i]
        self._start, self._start_term = offset, new_start_term
        self._snapshot = copy.deepcopy(snapshot)

    def _persist(self) -> None:
        """The durable prefix follows the live start (everything below it was flushed)."""
        self._d_batches = [b for b in self._d_batches if b.base_offset >= self._start]
        self._d_start, self._d_start_term = self._start, self._start_term
        self._d_snapshot = copy.deepcopy(self._snapshot)

    def reset(self, start_offset: int, start_term: int, snapshot: dict | None = None) -> None:
        self._disk_write("reset")
        self._d_batches = []
        self._d_start, self._d_start_term = start_offset, start_term
        self._d_snapshot = copy.deepcopy(snapshot)
        self._load_durable()

    # -- reads -----------------------------------------------------------------------------------
    def _index_of(self, offset: int) -> int:
        """Index of the batch containing offset (offset must be in range)."""
        return bisect.bisect_right(self._bases, offset) - 1

    def _index_after(self, after_offset: int) -> int:
        if after_offset == self._start - 1:
            return 0
        if not (self._start <= after_offset <= self.dirty_offset):
            raise OffsetOutOfRange(after_offset, self._start, self.dirty_offset)
        i = self._index_of(after_offset)
        if self._batches[i].last_offset != after_offset:
            raise ValueError(f"suffix truncation after {after_offset} is not at a batch boundary")
        return i + 1

    def read(self, offset: int, max_bytes: int, max_batches: int | None = None) -> list[Batch]:
        dirty = self.dirty_offset
        if offset == dirty + 1:
            return []
        if not (self._start <= offset <= dirty):
            raise OffsetOutOfRange(offset, self._start, dirty)
        limit = max_batches if max_batches is not None and max_batches > 0 else 1 << 62
        out: list[Batch] = []
        used = 0
        for b in self._batches[self._index_of(offset):]:
            if out and (used + b.size > max_bytes or len(out) >= limit):
                break
            b.verify()
            out.append(b)
            used += b.size
        return out

    def term_at(self, offset: int) -> int:
        if offset == self._start - 1:
            return self._start_term
        if not (self._start <= offset <= self.dirty_offset):
            raise OffsetOutOfRange(offset, self._start, self.dirty_offset)
        return self._batches[self._index_of(offset)].term

    # -- metadata --------------------------------------------------------------------------------
    def load_meta(self) -> Meta:
        return copy.deepcopy(self._d_meta)

    def save_meta(self, meta: Meta) -> None:
        self._disk_write("save_meta")
        self._d_meta = copy.deepcopy(meta)

    def close(self) -> None:
        pass
