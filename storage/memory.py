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

Damage to a stopped node's disk (the simulation's disk-loss faults, docs/DISK-LOSS.md): flip_bits,
flip_header, lose_batches, lose_batch, lose_meta and wipe change the durable state the way a
damaged disk would; the next crash() (the restart) then finds it exactly as LmdbLog's open does:
a damaged or missing batch cuts the log there and records the lost position, lost metadata gives
the directory a new incarnation, a batch that fails its checksum is recorded as damaged.
flip_bits also hits a running log's flushed copy (a bit that rots while the node runs).

Many logs: `MemoryStore` is the in-memory twin of storage/lmdb_store.py's LmdbStore (open_log,
drop_log, group_ids, flush of many logs as one commit, `commits`), with `crash()` for the whole
store: every log loses exactly what is past its own flushed offset. A MemoryLog made on its own
belongs to a one-log store of its own (LEGACY_GROUP, the default topic's partition), created when first asked for (`store`).
"""

from __future__ import annotations

import bisect
import copy
import itertools
from collections.abc import Iterable, Sequence

from storage.api import (
    DEFAULT_MAX_TAIL_BYTES,
    LEGACY_GROUP,
    IoMode,
    LogStorage,
    LogStore,
    Meta,
    OffsetOutOfRange,
    ScrubSlice,
    StorageError,
    StorageIOError,
    TailBudget,
    TailFull,
    TailShare,
)
from storage.batch import Batch, CorruptBatch
from storage.damage import Damage, DamageSet

# The operations that write durable state, hence the ones a disk fault can hit.
FAULT_OPS = ("flush", "truncate_suffix", "truncate_prefix", "reset", "save_meta")
# Identities for logs created without one: deterministic, distinct within a process.
_INCARNATIONS = itertools.count(0x5EED_0001)


class MemoryLog(LogStorage):
    def __init__(self, max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES,
                 incarnation: int | None = None, *, store: MemoryStore | None = None,
                 group_id: int = LEGACY_GROUP) -> None:
        self._store = store
        self.group_id = group_id
        self._max_tail_bytes = max_tail_bytes
        # Durable state: what survives crash().
        self._d_batches: list[Batch] = []
        self._d_start = 0
        self._d_start_term = 0
        self._d_snapshot: dict | None = None
        self._d_meta: Meta | None = Meta(incarnation=incarnation or next(_INCARNATIONS))
        self._d_tail = (-1, 0)  # the flushed tail recorded with every durable change
        self._d_floor: tuple[int, int] | None = None
        self._d_bad_headers: set[int] = set()
        self._d_new_incarnation = 0  # the identity a load gives a log whose metadata is lost
        self._damage = DamageSet()
        self.open_findings: list[str] = []
        # op -> exceptions to raise, in order, at its next durable writes (see fail_next).
        self._faults: dict[str, list[StorageError]] = {}
        # Unflushed bytes, counted in the store's node-wide TailBudget once there are any.
        self._ub = 0
        self._tail_share: TailShare | None = None
        self._load_durable()

    @property
    def _unflushed_bytes(self) -> int:
        return self._ub

    @_unflushed_bytes.setter
    def _unflushed_bytes(self, nbytes: int) -> None:
        self._ub = nbytes
        share = self._tail_share
        if share is None:
            if not nbytes:
                return
            share = self._tail_share = self.store.tail_budget.share(self)
        share.set(nbytes)

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
        self.store.commits += 1  # the "transaction" goes ahead: one fsync

    @property
    def store(self) -> MemoryStore:
        """The store this log lives in (a one-log store of its own when made on its own)."""
        if self._store is None:
            self._store = MemoryStore(self._max_tail_bytes)
            self._store._adopt(self)
        return self._store

    # -- durable <-> live --------------------------------------------------------------------
    def _load_durable(self) -> None:
        """What an open does (storage/lmdb_format.py): cut at a damaged header or a gap, record
        the lost position, give lost metadata a new identity, find damaged batches."""
        found: list[str] = []
        last, cut = (self._d_start - 1, self._d_start_term), None
        for i, b in enumerate(self._d_batches):
            if b.base_offset in self._d_bad_headers or b.base_offset > last[0] + 1:
                cut = i
                found.append(f"the batch at offset {b.base_offset} is damaged or missing")
                break
            last = (b.last_offset, b.term)
        had = self._d_tail if cut is not None or self._d_tail[0] > last[0] else None
        if cut is not None:
            del self._d_batches[cut:]
        self._d_bad_headers.clear()
        if had is not None:
            found.append(f"flushed offsets after {last[0]} up to {had[0]} are lost")
            if self._d_floor is None or (had[1], had[0]) > (self._d_floor[1], self._d_floor[0]):
                self._d_floor = had
        self._d_tail = last
        if self._d_meta is None:
            found.append("its term and vote are lost: it gets a new identity")
            self._d_meta = Meta(incarnation=self._d_new_incarnation or next(_INCARNATIONS))
        self._incarnation = self._d_meta.incarnation
        self._batches: list[Batch] = list(self._d_batches)
        self._bases: list[int] = [b.base_offset for b in self._batches]
        self._start = self._d_start
        self._start_term = self._d_start_term
        self._snapshot = copy.deepcopy(self._d_snapshot)
        self._flushed = self._batches[-1].last_offset if self._batches else self._start - 1
        self._unflushed_bytes = 0
        self._bytes = sum(b.size for b in self._batches)
        self._damage.clear()
        for b in self._batches:
            try:
                b.verify()
            except CorruptBatch as e:
                self._damage.add(Damage(b.base_offset, b.last_offset, b.term, e.reason))
                found.append(f"damaged batch at offsets {b.base_offset}..{b.last_offset}")
        self.open_findings = found

    # -- a damaged disk (simulation) --------------------------------------------------------------
    def _durable_index(self, offset: int) -> int:
        for i, b in enumerate(self._d_batches):
            if b.base_offset <= offset <= b.last_offset:
                return i
        raise OffsetOutOfRange(offset, self._d_start, self._d_tail[0])

    def flip_bits(self, offset: int) -> None:
        """The stored copy of the batch holding `offset` no longer matches its checksum (and so
        does the running log's, when it is flushed there)."""
        i = self._durable_index(offset)
        b = self._d_batches[i]
        bad = Batch(b.base_offset, b.count, b.term, b.kind, b.timestamp_ms, b.producer_id,
                    b.sequence, b.payload, b.crc ^ 0x5A5A)
        self._d_batches[i] = bad
        j = bisect.bisect_right(self._bases, b.base_offset) - 1
        if 0 <= j < len(self._batches) and self._batches[j] is b:
            self._batches[j] = bad

    def flip_header(self, offset: int) -> None:
        """The stored header of the batch holding `offset` is damaged (found at the next open)."""
        self._d_bad_headers.add(self._d_batches[self._durable_index(offset)].base_offset)

    def lose_batches(self, after_offset: int) -> None:
        """Stored batches after `after_offset` vanish (a truncated file), the tail record stays."""
        self._d_batches = [b for b in self._d_batches if b.base_offset <= after_offset]

    def lose_batch(self, offset: int) -> None:
        """The stored batch holding `offset` vanishes (a hole in the middle)."""
        del self._d_batches[self._durable_index(offset)]

    def lose_meta(self, new_incarnation: int) -> None:
        """The metadata is gone or damaged: the next open gives the log a new identity."""
        self._d_meta = None
        self._d_new_incarnation = new_incarnation

    def wipe(self, new_incarnation: int) -> None:
        """The whole data directory is gone: the next open finds a new, empty one."""
        self._d_batches, self._d_start, self._d_start_term = [], 0, 0
        self._d_tail, self._d_floor = (-1, 0), None
        self._d_bad_headers.clear()
        self._d_snapshot = None
        self._d_meta = Meta(incarnation=new_incarnation)

    def crash(self) -> None:
        """Lose everything past the flushed offset, as a power cut would."""
        self._load_durable()

    # -- positions -----------------------------------------------------------------------------
    @property
    def io_mode(self) -> IoMode:
        """Nothing here blocks, and nothing is locked: a driver calls it all on its own thread."""
        return IoMode.INLINE

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
        self.store.tail_budget.check(size)
        for b in batches:
            self._batches.append(b)
            self._bases.append(b.base_offset)
        self._unflushed_bytes += size
        self._bytes += size

    def flush(self, upto: int | None = None) -> int:
        plan = self._flush_plan(upto)
        if plan is None:
            return self._flushed
        self._disk_write("flush")
        return self._flush_apply(plan)

    def _flush_plan(self, upto: int | None) -> tuple[int, int] | None:
        """The live batches [i, j) a flush writes, or None when there is nothing to write."""
        # Invariant: the durable list holds the live batches up to the flushed offset, after
        # any a not yet persisted advance_start retired (below the live start).
        i = bisect.bisect_right(self._bases, self._flushed)
        j = len(self._batches)
        if upto is not None:
            j = bisect.bisect_right(self._bases, upto)
            while j > i and self._batches[j - 1].last_offset > upto:
                j -= 1
        return (i, j) if j > i else None

    def _flush_apply(self, plan: tuple[int, int]) -> int:
        """The planned batches are durable now; the flushed offset moves to exactly their end."""
        i, j = plan
        new = self._batches[i:j]
        self._d_batches.extend(new)
        self._d_tail = (new[-1].last_offset, new[-1].term)
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
            # The disk drops exactly the batches past after_offset, as LmdbLog's delete_from
            # does. Not "the live batches": below a live start that advance_start moved and
            # persist_start has not written yet, the disk still holds flushed batches the live
            # list no longer has, and a crash brings them back.
            self._d_batches = [b for b in self._d_batches if b.last_offset <= after_offset]
            self._d_tail = (after_offset, self.term_at(after_offset))
            self._flushed = after_offset
            self._damage.drop_after(after_offset)
        self._unflushed_bytes = sum(b.size for b in self._batches if b.last_offset > self._flushed)

    def truncate_prefix(self, offset: int, snapshot: dict | None = None) -> None:
        if offset <= self._start:
            return
        i = self._prefix_index(offset)
        self._disk_write("truncate_prefix")
        self._cut_live(i, offset, snapshot)
        self._persist()

    def advance_start(self, offset: int, snapshot: dict | None = None,
                      dropped_bytes: int | None = None) -> None:
        if offset <= self._start:
            return
        self._cut_live(self._prefix_index(offset), offset, snapshot)  # (counts for itself)

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
        self._damage.drop_before(offset)

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
        self._d_tail = (start_offset - 1, start_term)
        self._batches, self._bases = [], []
        self._start, self._start_term = start_offset, start_term
        self._flushed = start_offset - 1
        self._unflushed_bytes = 0
        self._damage.clear()
        self._snapshot = copy.deepcopy(snapshot)
        self._bytes = 0

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
        batches = self._batches
        for i in range(self._index_of(offset), len(batches)):  # no copy of the tail per read
            b = batches[i]
            if out and (used + b.size > max_bytes or len(out) >= limit):
                break
            if not self._checked(b):  # damaged: never served (see LogStorage.read)
                if out:
                    break
                d = self._damage.find(b.base_offset)
                raise CorruptBatch(b.base_offset, d.reason if d else "damaged")
            out.append(b)
            used += b.size
        return out

    def _checked(self, b: Batch) -> bool:
        """False when `b` is damaged (a flushed one is then recorded as such)."""
        if self._damage.find(b.base_offset) is not None:
            return False
        try:
            b.verify()
        except CorruptBatch as e:
            if b.last_offset > self._flushed:
                raise  # the unflushed tail was checked on its way in: a bug, not a disk
            self._damage.add(Damage(b.base_offset, b.last_offset, b.term, e.reason))
            return False
        return True

    def term_at(self, offset: int) -> int:
        if offset == self._start - 1:
            return self._start_term
        if not (self._start <= offset <= self.dirty_offset):
            raise OffsetOutOfRange(offset, self._start, self.dirty_offset)
        return self._batches[self._index_of(offset)].term

    # -- damage and repair -----------------------------------------------------------------------
    @property
    def incarnation(self) -> int:
        return self._incarnation  # as of the last open: a lost identity shows at the next

    @property
    def lost_position(self) -> tuple[int, int] | None:
        return self._d_floor

    @property
    def damage_version(self) -> int:
        return self._damage.version

    def damaged(self) -> list[Damage]:
        return self._damage.all()

    def first_damaged(self) -> int | None:
        return self._damage.first()

    def scrub(self, offset: int, max_bytes: int) -> ScrubSlice:
        if self._flushed < self._start:
            return ScrubSlice(self._start, 0, (), True)
        offset = min(max(offset, self._start), self._flushed)
        found: list[Damage] = []
        used, nxt = 0, offset
        for b in self._batches[self._index_of(offset):]:
            if b.base_offset > self._flushed or used >= max_bytes:
                break
            used += b.size
            known = self._damage.find(b.base_offset) is not None
            if not self._checked(b) and not known:
                found.append(self._damage.find(b.base_offset))
            nxt = b.last_offset + 1
        wrapped = nxt > self._flushed
        return ScrubSlice(self._start if wrapped else nxt, used, tuple(found), wrapped)

    def repair(self, batches: Sequence[Batch]) -> None:
        for b in batches:
            b.verify()
            d = self._damage.find(b.base_offset)
            if d is None or (d.first, d.last, d.term) != (b.base_offset, b.last_offset, b.term):
                raise ValueError(f"offsets {b.base_offset}..{b.last_offset} (term {b.term}) are "
                                 f"not a damaged batch; nothing was written")
        for b in batches:
            self._batches[self._index_of(b.base_offset)] = b
            self._d_batches[self._durable_index(b.base_offset)] = b
            self._damage.remove(b.base_offset)

    # -- metadata --------------------------------------------------------------------------------
    def load_meta(self) -> Meta:
        return copy.deepcopy(self._d_meta)

    def save_meta(self, meta: Meta) -> None:
        self._disk_write("save_meta")
        self._d_meta = Meta(meta.term, meta.voted_for, copy.deepcopy(meta.config),
                            copy.deepcopy(meta.extra), self._incarnation)

    def close(self) -> None:
        if self._store is not None:
            self._store._opened.discard(self.group_id)


class MemoryStore(LogStore):
    """Many MemoryLogs behind LmdbStore's API (see the module docstring). The logs themselves
    model their durable state; the store adds one commit for a flush of many logs, dropping a
    log durably, and a crash of everything at once."""

    def __init__(self, max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES) -> None:
        self._max_tail_bytes = max_tail_bytes
        # Every log's dirty tail together stays under max_tail_bytes (node-wide, not per log).
        self.tail_budget = TailBudget(max_tail_bytes)
        self._logs: dict[int, MemoryLog] = {}  # every log the "disk" holds
        self._opened: set[int] = set()
        self.commits = 0  # durable changes committed (each one fsync in the LMDB store)

    @property
    def io_mode(self) -> IoMode:
        return IoMode.INLINE

    def _adopt(self, log: MemoryLog) -> None:
        self._logs[log.group_id] = log
        self._opened.add(log.group_id)

    def open_log(self, group_id: int) -> MemoryLog:
        """Group `group_id`'s log, created empty if absent; refused while it is open."""
        if group_id < 0:
            raise ValueError(f"group id {group_id} is out of range")
        if group_id in self._opened:
            raise StorageError(f"the log of group {group_id} is already open; use the open one")
        log = self._logs.get(group_id)
        if log is None:
            log = MemoryLog(self._max_tail_bytes, store=self, group_id=group_id)
            self._logs[group_id] = log
        self._opened.add(group_id)
        return log

    def group_ids(self) -> list[int]:
        return sorted(self._logs)

    def drop_log(self, group_id: int) -> None:
        """Delete the group's log, data and metadata (one commit); a later open_log starts it
        empty with a new identity."""
        dropped = self._logs.pop(group_id, None)
        if dropped is not None:
            self.commits += 1
            dropped._unflushed_bytes = 0  # its tail goes with it
        self._opened.discard(group_id)

    def flush(self, logs: Iterable[MemoryLog]) -> dict[int, int]:  # type: ignore[override]
        """Every given log's dirty tail in one commit; each log's flushed offset by group id. A
        flush fault injected on any of them (MemoryLog.fail_next) fails the whole commit and
        changes no log, as the one LMDB transaction does."""
        out: dict[int, int] = {}
        plans: list[tuple[MemoryLog, tuple[int, int]]] = []
        for log in dict.fromkeys(logs):
            if self._logs.get(log.group_id) is not log:
                raise ValueError(f"group {log.group_id}'s log is not held by this store")
            plan = log._flush_plan(None)
            if plan is None:
                out[log.group_id] = log.flushed_offset
            else:
                plans.append((log, plan))
        if not plans:
            return out
        for log, _ in plans:
            queue = log._faults.get("flush")
            if queue:
                raise queue.pop(0)
        self.commits += 1
        for log, plan in plans:
            out[log.group_id] = log._flush_apply(plan)
        return out

    def crash(self) -> None:
        """A power cut: every log loses exactly what is past its own flushed offset."""
        for log in self._logs.values():
            log.crash()
        self._opened.clear()

    def close(self) -> None:
        self._opened.clear()
