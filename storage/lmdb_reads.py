"""LmdbLog's reads of flushed batches, done without holding the log's lock.

Why: once the logs outgrow the page cache, a read of flushed batches reads the disk page by page
(a catch-up from an old offset, retention's plan at the log front, the scrubber). A reader that
held the log's `_lock` through that held up every event-loop step that looked at the log, and
the leader lost its leadership in the default `bench produce` run (issue 28,
docs/PERFORMANCE.md). So a read holds `_lock` only to look at the in-memory view and open a read
transaction, whose MVCC snapshot matches that view (every writer that changes what the view
counts as flushed either holds `_lock` across its transaction or changes the view only after its
commit: storage/lmdb_log.py's threading rules), then reads in the store's read gate
(storage/read_gate.py) with no lock held, and takes `_lock` again only to record damage it found
or to go on into the in-memory tail.

A read that goes on past its first pass (into the tail, or into batches flushed meanwhile)
returns what it has instead if the log's end was cut between the passes (`_cuts` moved): what it
returns is always a prefix of the log as it was at some moment, never a mix of two logs.

A part of LmdbLog kept in its own file; it relies on the log's fields and locks.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable
from typing import Any

import lmdb

from storage import lmdb_format as fmt
from storage import lmdb_heads as heads
from storage.api import LogInconsistent, OffsetOutOfRange, StorageError
from storage.batch import Batch, BatchHead, BatchKind, CorruptBatch
from storage.damage import Damage, DamageSet
from storage.lmdb_space import KeySpace
from storage.read_gate import ReadGate
from storage.recent_heads import RecentHeads

log = logging.getLogger("raftlog.storage")

# What a pass over stored batches stopped at: a damaged batch (base, last, reason), or None.
Bad = tuple[int, int, str] | None


class Snapshot:
    """A read transaction, held only here: `_end_snapshot` drops it. Why: py-lmdb frees an
    aborted read transaction's reader slot only when the Transaction object dies, and the
    frames of an exception's traceback keep their locals alive (until the cyclic collector
    runs, when a worker thread's outcome ties them into a cycle). A damaged batch read in a
    worker thread 64 times a second held one slot per read that way, and the node stopped on
    MDB_READERS_FULL (126 slots) in seconds. Frames hold this holder and cursors (a cursor lets
    go of its transaction when the transaction ends), never the transaction itself."""

    __slots__ = ("txn",)

    def __init__(self, txn: lmdb.Transaction) -> None:
        self.txn: lmdb.Transaction | None = txn

    def cursor(self, db: Any = None) -> lmdb.Cursor:
        """A cursor on `db` (the log DB when None)."""
        assert self.txn is not None, "a read of an ended snapshot"
        return self.txn.cursor() if db is None else self.txn.cursor(db=db)

    def get(self, key: bytes, db: Any) -> memoryview | None:
        assert self.txn is not None, "a read of an ended snapshot"
        return self.txn.get(key, db=db)


class LmdbReads:
    """read / read_heads and the snapshot plumbing the scrubber shares (mixed into LmdbLog)."""

    _lock: threading.RLock
    _gate: ReadGate
    _env: lmdb.Environment
    _log_db: Any
    _space: KeySpace
    _where: str
    _fmt: int
    _trailer: int
    _closed: bool
    _start: int
    _flushed: int
    _dirty: int
    _cuts: int
    _tail: list[Batch]
    _tail_bases: list[int]
    _damage: DamageSet
    _recent: RecentHeads
    _term_at_locked: Callable[[int], int]

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"the log at {self._where} is closed; reopen it with open_log()")

    # -- snapshots -------------------------------------------------------------------------
    def _snapshot_locked(self) -> Snapshot:
        """A read transaction matching the in-memory view as of now (caller holds `_lock`),
        inside the read gate; close it with `_end_snapshot`, with no lock needed."""
        self._check_open()  # under _lock: a close marks the log before it closes the store
        self._gate.enter()
        try:
            return Snapshot(self._env.begin(db=self._log_db, buffers=True))
        except BaseException:
            self._gate.leave()
            raise

    def _end_snapshot(self, snap: Snapshot) -> None:
        txn, snap.txn = snap.txn, None
        try:
            if txn is not None:
                txn.abort()
        finally:
            self._gate.leave()

    def _known_damage_locked(self) -> DamageSet | None:
        """A copy of the damage set for a pass without the lock (None: no damage, the usual)."""
        return self._damage.copy() if self._damage else None

    def _record_damage(self, bad: tuple[int, int, str], cuts: int, at: str) -> Damage | None:
        """Record damage a pass without the lock found (unless the log changed since); the new
        entry, or None when it was known or no longer in the log."""
        base, last, reason = bad
        with self._lock:
            if self._cuts != cuts or not (self._start <= base <= self._flushed):
                return None
            damage = Damage(base, min(last, self._flushed), self._term_at_locked(base), reason)
            if not self._damage.add(damage):
                return None
        log.warning("log_damage_found path=%s at=%s: damaged batch at %s", self._where, at,
                    damage.describe())
        return damage

    def _seek(self, cur: lmdb.Cursor, offset: int) -> tuple[int, memoryview]:
        """Position `cur` on the batch holding `offset` (largest key <= offset, which a
        flushed offset in range always has); (its base offset, its record)."""
        found = self._space.seek_le(cur, offset)
        base = self._space.offset(cur.key()) if found else None
        if base is None:
            raise LogInconsistent(self._where, f"no stored batch holds flushed offset {offset}",
                                  (offset,))
        return base, cur.value()

    def _damaged_last(self, cur: lmdb.Cursor, base: int, value: memoryview,
                      flushed: int) -> int:
        """The last offset of the damaged batch at `base`: its header's, or where the next
        stored batch starts. Leaves `cur` on `base`."""
        h = fmt.head(value, self._fmt)
        if h is not None:
            return h[0] + h[1] - 1
        last = flushed
        if self._space.next(cur):
            last = min(last, self._space.offset(cur.key()) - 1)
        cur.set_key(self._space.key(base))
        return last

    def _starts_batch_locked(self, offset: int) -> bool:
        """Whether a batch starts at `offset` (in range), from the heads' keys alone:
        retention's cut on the event loop must not read the batch there (py-lmdb reads every
        page of a value a cursor is positioned on; at the cold front of a large log that is the
        disk; a head is a few dozen bytes: storage/lmdb_heads.py)."""
        if offset > self._flushed:
            i = bisect.bisect_left(self._tail_bases, offset)
            return i < len(self._tail_bases) and self._tail_bases[i] == offset
        snap = self._snapshot_locked()
        try:
            return bool(snap.cursor(self._space.heads_db).set_key(self._space.key(offset)))
        finally:
            self._end_snapshot(snap)

    def _batch_containing_locked(self, offset: int) -> tuple[int, int]:
        """(base, last) of the batch holding `offset` (in range). One seek, under `_lock`."""
        if offset > self._flushed:
            b = self._tail[bisect.bisect_right(self._tail_bases, offset) - 1]
            return b.base_offset, b.last_offset
        known = self._damage.find(offset)
        if known is not None:
            return known.first, known.last
        snap = self._snapshot_locked()
        try:  # from its head when that can be trusted by itself (storage/lmdb_heads.py)
            base, hv = self._seek(snap.cursor(self._space.heads_db), offset)
            good = heads.decode(base, hv, self._fmt)
            if good is not None:
                return good.base_offset, good.last_offset
            v = snap.get(self._space.key(base), self._log_db)
            h = fmt.head(v, self._fmt) if v is not None else None
            if h is None:
                raise CorruptBatch(base, "its header fails its checksum")
            return h[0], h[0] + h[1] - 1
        finally:
            self._end_snapshot(snap)

    # -- reads -----------------------------------------------------------------------------
    def read_heads(self, offset: int, max_bytes: int, max_batches: int | None,
                   full: frozenset[BatchKind]) -> list[Batch | BatchHead]:
        """LogStorage.read_heads: a stored batch of a kind not in `full` whose header passes
        its own checksum comes back as its header, its payload neither copied nor hashed."""
        return self.read(offset, max_bytes, max_batches, full)  # type: ignore[arg-type]

    def read(self, offset: int, max_bytes: int, max_batches: int | None = None,
             full: frozenset[BatchKind] | None = None) -> list[Batch]:
        self._check_open()
        limit = max_batches if max_batches is not None and max_batches > 0 else 1 << 62
        out: list[Any] = []
        used = 0
        cuts = None
        while True:
            with self._lock:
                if cuts is not None and cuts != self._cuts:
                    return out  # the end was cut since the last pass: a prefix of the old log
                if offset == self._dirty + 1:
                    return out
                if not (self._start <= offset <= self._dirty):
                    if out:  # retention moved the start past what this read has returned
                        return out
                    raise OffsetOutOfRange(offset, self._start, self._dirty)
                cuts = self._cuts
                if full is not None and offset <= self._flushed and not self._damage:
                    # The indexes' read-back of what was just flushed: from memory.
                    offset, used, done = self._recent.serve(offset, out, used, max_bytes,
                                                            limit, full)
                    if done or offset == self._dirty + 1:
                        return out
                if offset > self._flushed:
                    i = bisect.bisect_right(self._tail_bases, offset) - 1
                    for b in self._tail[i:]:
                        if out and (used + b.size > max_bytes or len(out) >= limit):
                            break
                        out.append(b)  # in memory since its checked append (LogStorage.read)
                        used += b.size
                    return out
                flushed = self._flushed
                known = self._known_damage_locked()
                snap = self._snapshot_locked()
            try:
                used, more, bad = self._read_stored(snap, offset, flushed, out, used, max_bytes,
                                                    limit, full, known)
            finally:
                self._end_snapshot(snap)
            if bad is not None:
                if known is None or known.find(bad[0]) is None:
                    self._record_damage(bad, cuts, "read")
                if out:
                    return out
                raise CorruptBatch(bad[0], bad[2])  # damaged: never served (LogStorage.read)
            if not more:
                return out
            offset = out[-1].last_offset + 1

    def _read_stored(self, snap: Snapshot, offset: int, flushed: int, out: list[Any],
                     used: int, max_bytes: int, limit: int, full: frozenset[BatchKind] | None,
                     known: DamageSet | None) -> tuple[int, bool, Bad]:
        """Append the stored batches from the one holding `offset` up to `flushed` to `out`,
        within the limits; no lock held (see the module docstring). Returns the bytes used,
        whether the read may go on past `flushed`, and the damaged batch it stopped at."""
        if full is not None and self._fmt >= 2:
            return self._read_heads_stored(snap, offset, flushed, out, used, max_bytes, limit,
                                           full, known)
        cur = snap.cursor()
        base, v = self._seek(cur, offset)
        trailer = self._trailer
        while base <= flushed:
            size = len(v) - trailer  # what the batch counts as
            if out and (used + size > max_bytes or len(out) >= limit):
                return used, False, None
            d = known.find(base) if known is not None else None
            if d is not None:
                return used, False, (d.first, d.last, d.reason)
            b, bad = self._decoded(cur, base, v, flushed, full)
            if bad is not None:
                return used, False, bad
            out.append(b)
            used += size
            if not self._space.next(cur):
                break
            base, v = self._space.offset(cur.key()), cur.value()
        return used, True, None

    def _decoded(self, cur: lmdb.Cursor, base: int, v: memoryview, flushed: int,
                 full: frozenset[BatchKind] | None) -> tuple[Any, Bad]:
        """The record `v` stored at `base` as the reads serve it: its header when a header read
        (`full` given) does not want its kind whole and the header passes its checksum, else
        the whole batch; or, instead, the damage found ((None, bad)). `cur` stands on `base`
        (in the log DB or the heads DB: the keys are the same)."""
        if full is not None:
            h = fmt.decode_head(base, v, self._fmt)
            if h is not None and h.kind not in full:
                return h, None
        try:
            return fmt.decode_value(base, v, self._fmt), None
        except CorruptBatch as e:
            return None, (base, self._damaged_last(cur, base, v, flushed), e.reason)

    def _read_heads_stored(self, snap: Snapshot, offset: int, flushed: int, out: list[Any],
                           used: int, max_bytes: int, limit: int, full: frozenset[BatchKind],
                           known: DamageSet | None) -> tuple[int, bool, Bad]:
        """`_read_stored` for read_heads: walks the heads DB (storage/lmdb_heads.py), so a batch
        of a kind not in `full` whose head passes its checksum is served without touching its
        record (py-lmdb would read every page of it: retention's plan at the cold front of a
        large log, issue 28). The kinds in `full`, and any batch whose head cannot be trusted
        by itself, are read from the log DB as `_read_stored` reads them (damage as before)."""
        space, trailer, version = self._space, self._trailer, self._fmt
        cur = snap.cursor(space.heads_db)
        base, hv = self._seek(cur, offset)
        while base <= flushed:
            size = heads.record_size(hv, version) - trailer
            if out and (used + size > max_bytes or len(out) >= limit):
                return used, False, None
            d = known.find(base) if known is not None else None
            if d is not None:
                return used, False, (d.first, d.last, d.reason)
            b: Any = heads.decode(base, hv, version)
            if b is None or b.kind in full:
                v = snap.get(space.key(base), space.log_db)
                if v is None:
                    raise LogInconsistent(self._where, f"the head of offset {base} has no "
                                                       f"stored batch", (base,))
                b, bad = self._decoded(cur, base, v, flushed, full)
                if bad is not None:
                    return used, False, bad
            out.append(b)
            used += size
            if not space.next(cur):
                break
            base, hv = space.offset(cur.key()), cur.value()
        return used, True, None
