"""The durable log: LMDB for flushed batches, a bounded in-memory tail for dirty ones.

Why this shape: LMDB's no-sync modes (MDB_NOSYNC, MDB_NOMETASYNC, MDB_MAPASYNC) can corrupt the
whole database on a power cut, so dirty data never goes to LMDB. It lives in the in-memory tail
(etcd's "unstable" log) until `flush()` writes it in ONE write transaction committed with the
default fsync. A process crash therefore loses exactly what a power cut loses.

Disk first, then memory: every mutation (flush, truncate_suffix, truncate_prefix, reset,
save_meta) commits its change to LMDB in one fsynced transaction and only then changes the
in-memory view. If the transaction raises, memory is untouched and the exception propagates, so
memory and disk never disagree (a failed cut that left memory lowered once let a later flush
write a new batch over a stale one and produced an overlapping log).

Threading rules (a flush runs in a worker thread while the owning thread appends and reads):
- `_lock` (re-entrant) guards every in-memory field and every LMDB *read* transaction and map
  resize. A flush holds it only briefly (snapshot, splice), never across its fsync, so appends and
  reads go on while a flush commits.
- `_write_lock` serialises everything that writes LMDB: flush, truncate_suffix, truncate_prefix,
  reset, save_meta. A truncation or reset issued while a flush is in flight therefore waits until
  that flush has committed (it then sees the flushed batches as durable and cuts them on disk too).
- A flush snapshots the tail prefix at its start; appends made while it runs stay in the tail.
- Writers that shrink the log from the end (truncate_suffix, reset) hold `_lock` across their
  transaction, so no reader sees keys deleted on disk that the in-memory view still counts as
  flushed. They are called from the owning thread, which waits for their fsync anyway.
- Retention shrinks it from the front in two steps: advance_start raises the readable start in
  memory (under `_lock`, cheap), then persist_start deletes the keys below it holding only
  `_write_lock`, so a long delete in a worker thread never blocks the owner's appends and reads
  (none of them reads below the start any more). Freed LMDB pages are reused by later flushes,
  so the file stops growing at the retained size.

One owner per directory: the log holds an exclusive flock on `<dir>/LOCK` (with the owner's pid
in it) while open; a second opener, in this process or another, gets DataDirLocked at once. The
kernel drops the lock when the owner dies, however it dies.

Opening checks that the stored batches are contiguous from the start record, with terms never
going backwards; anything else cannot come from a crash and raises LogInconsistent.

The layout on disk (keys, the start record and the state stored with it) is in
storage/lmdb_format.py.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

import lmdb
import msgpack

from storage.api import (
    DEFAULT_MAX_TAIL_BYTES,
    DataDirLocked,
    DiskFull,
    LogInconsistent,
    LogStorage,
    Meta,
    OffsetOutOfRange,
    StorageError,
    StorageIOError,
    TailFull,
)
from storage.batch import HEADER_SIZE, Batch, CorruptBatch
from storage.dirlock import LOCK_FILE, lock_dir, unlock_dir
from storage.lmdb_format import (
    HEAD,
    KEY,
    META_KEY,
    SNAPSHOT_KEY,
    START_KEY,
    check_next,
    decode_meta,
    decode_snapshot,
    decode_start,
    key,
)

# BENCH ONLY: RAFTLOG_BENCH_FSYNC_DELAY_MS adds a fixed delay to every fsynced transaction, to
# show what deferred flushing buys on a slow (cloud) disk. Never set it in production.
_BENCH_FSYNC_DELAY_S = float(os.environ.get("RAFTLOG_BENCH_FSYNC_DELAY_MS", "0") or 0) / 1000

log = logging.getLogger(__name__)

DEFAULT_MAP_SIZE = 64 << 20
DEFAULT_MAX_MAP_SIZE = 1 << 40
PROGRESS_EVERY_S = 5.0


T = TypeVar("T")


class LmdbLog(LogStorage):
    """`storage.api.LogStorage` on LMDB. See the module docstring for the threading rules."""

    def __init__(self, path: str | os.PathLike[str], max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES,
                 map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE) -> None:
        self.path = os.fspath(path)
        self._max_tail_bytes = max_tail_bytes
        self._max_map_size = max(max_map_size, map_size)
        self._lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._closed = False
        # Dirty batches, oldest first; their bases for bisect.
        self._tail: list[Batch] = []
        self._tail_bases: list[int] = []
        self._unflushed = 0
        # (first offset, term) at every term change across the whole log, for term_at.
        self._term_firsts: list[int] = []
        self._term_terms: list[int] = []
        # The directory lock comes first: a second opener must not even open the environment.
        fd = lock_dir(self.path)
        # Released by close(), or when this object is collected without close() (nothing can
        # write through an unreachable log), or by the kernel when the process dies.
        self._release_dir = weakref.finalize(self, unlock_dir, fd)
        try:
            try:
                self._env = lmdb.open(self.path, subdir=True, max_dbs=4, map_size=map_size,
                                      lock=True, readahead=False, meminit=False)
            except lmdb.Error as e:
                raise StorageError(f"cannot open the LMDB log at {self.path}: {e}; check the "
                                   f"path exists, is writable and is not on a full disk") from e
            try:
                self._log_db = self._env.open_db(b"log")
                self._meta_db = self._env.open_db(b"meta")
                self._load()
            except BaseException:
                self._env.close()
                raise
        except BaseException:
            self._release_dir()
            raise

    # -- opening -----------------------------------------------------------------------------
    def _load(self) -> None:
        started = time.monotonic()
        last_report = started
        with self._env.begin(buffers=True) as txn:
            raw = txn.get(START_KEY, db=self._meta_db)
            start, start_term = decode_start(self.path, raw)
            raw = txn.get(META_KEY, db=self._meta_db)
            if raw is not None:
                decode_meta(self.path, bytes(raw))  # undecodable metadata fails the open, not later
            self._snapshot = decode_snapshot(self.path, txn.get(SNAPSHOT_KEY, db=self._meta_db))
            nbytes = 0
            last = start - 1
            last_term = start_term
            n = 0
            cur = txn.cursor(db=self._log_db)
            for k, v in cur:
                base, count, term = HEAD.unpack_from(v, 0) if len(v) >= HEADER_SIZE else (
                    -1, 0, 0)
                key_base = KEY.unpack(bytes(k))[0]
                if base != key_base or count < 1:
                    raise CorruptBatch(key_base, "batch header does not match its key while "
                                                 "opening the log")
                check_next(self.path, start, last, last_term, base, count, term)
                if not self._term_terms or self._term_terms[-1] != term:
                    self._term_firsts.append(base)
                    self._term_terms.append(term)
                last = base + count - 1
                last_term = term
                n += 1
                nbytes += len(v)
                if n % 4096 == 0:
                    now = time.monotonic()
                    if now - last_report >= PROGRESS_EVERY_S:
                        last_report = now
                        log.info("opening_log path=%s batches=%d last_offset=%d elapsed_s=%.0f",
                                 self.path, n, last, now - started)
        self._start, self._start_term = int(start), int(start_term)
        self._durable_start = self._start
        self._flushed = last
        self._dirty = last
        self._bytes = nbytes
        if time.monotonic() - started >= PROGRESS_EVERY_S:
            log.info("opened_log path=%s batches=%d start=%d last_offset=%d elapsed_s=%.0f",
                     self.path, n, self._start, last, time.monotonic() - started)

    # -- positions ---------------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def start_term(self) -> int:
        return self._start_term

    @property
    def dirty_offset(self) -> int:
        return self._dirty

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def unflushed_bytes(self) -> int:
        return self._unflushed

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    @property
    def snapshot(self) -> dict | None:
        return self._snapshot

    # -- LMDB write plumbing -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"the log at {self.path} is closed; reopen it with open_log()")

    def _write(self, what: str, body: Callable[[lmdb.Transaction], T]) -> T:
        """Run `body` in one write transaction committed with fsync; grow the map on
        MapFullError (doubling, up to max_map_size) and retry; map a full disk to DiskFull and
        any other failure to StorageIOError. If it raises, the transaction was aborted and the
        disk is unchanged. Caller holds _write_lock (and _lock for writes that shrink the log;
        it is re-entrant, so _grow can take it again)."""
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    out = body(txn)
                if _BENCH_FSYNC_DELAY_S:
                    time.sleep(_BENCH_FSYNC_DELAY_S)  # bench-only emulated slow disk
                return out
            except lmdb.MapFullError:
                self._grow(what)
            except lmdb.Error as e:
                raise self._disk_error(what, e) from e
            except OSError as e:
                raise self._disk_error(what, e) from e

    def _grow(self, what: str) -> None:
        with self._lock:  # no read transaction may be open in this process while resizing
            cur = self._env.info()["map_size"]
            if cur >= self._max_map_size:
                raise DiskFull(
                    f"{what}: the LMDB map of {self.path} is full at its limit of "
                    f"{self._max_map_size} bytes; raise max_map_size, truncate the log prefix "
                    f"(retention) or move the data dir to a bigger disk. Nothing flushed before "
                    f"is lost; unflushed batches stay in memory")
            new = min(cur * 2, self._max_map_size)
            self._env.set_mapsize(new)
            log.info("lmdb_map_grown path=%s from=%d to=%d", self.path, cur, new)

    def _disk_error(self, what: str, e: BaseException) -> StorageError:
        code = getattr(e, "errno", None)
        text = str(e)
        if isinstance(e, lmdb.DiskError) or code == errno.ENOSPC or "No space" in text:
            return DiskFull(
                f"{what}: writing {self.path} failed ({text}); free disk space or move the data "
                f"dir to a bigger disk, then retry. Nothing flushed before is lost; unflushed "
                f"batches stay in memory")
        return StorageIOError(
            f"{what}: writing {self.path} failed ({text}); nothing was changed, on disk or in "
            f"memory. Check the disk (kernel log, SMART) before restarting the node: its "
            f"flushed log is as it was before this write")

    # -- writes ------------------------------------------------------------------------------
    def append(self, batches: Sequence[Batch]) -> None:
        if not batches:
            return
        self._check_open()
        with self._lock:
            expect = self._dirty + 1
            term = self._last_term_locked()
            size = 0
            for b in batches:
                if b.base_offset != expect:
                    raise ValueError(f"append at offset {b.base_offset}, expected {expect}")
                if b.term < term:
                    raise ValueError(f"term went backwards at offset {b.base_offset}: "
                                     f"{b.term} < {term}")
                expect, term = b.last_offset + 1, b.term
                size += b.size
            if self._unflushed and self._unflushed + size > self._max_tail_bytes:
                raise TailFull(self._unflushed + size, self._max_tail_bytes)
            for b in batches:
                self._tail.append(b)
                self._tail_bases.append(b.base_offset)
                if not self._term_terms or self._term_terms[-1] != b.term:
                    self._term_firsts.append(b.base_offset)
                    self._term_terms.append(b.term)
            self._unflushed += size
            self._bytes += size
            self._dirty = expect - 1

    def flush(self, upto: int | None = None) -> int:
        """Write the tail as of now (only batches ending at or before `upto`, if given) in one
        fsynced transaction. Batches appended while this runs stay in the tail."""
        self._check_open()
        with self._write_lock:
            with self._lock:
                n = len(self._tail)
                if upto is not None:
                    n = bisect.bisect_right(self._tail_bases, upto)
                    while n and self._tail[n - 1].last_offset > upto:
                        n -= 1
                snap = self._tail[:n]
                flushed = self._flushed  # only writers change it, and we hold _write_lock
            if not snap:
                return flushed
            encoded = [(key(b.base_offset), b.encode()) for b in snap]
            first, end = snap[0].base_offset, snap[-1].last_offset

            def put_all(txn: lmdb.Transaction) -> None:
                cur = txn.cursor(db=self._log_db)
                # Memory and disk must agree before we add to the disk: nothing stored past the
                # flushed offset, and the last stored batch ends at it. Two cursor moves; they
                # turn a disagreement into a refusal instead of an overlapping log.
                if cur.set_range(key(first)):
                    stale = KEY.unpack(bytes(cur.key()))[0]
                    raise LogInconsistent(
                        self.path, f"flushing offsets {first}..{end} found a stored batch at "
                                   f"offset {stale}, past the flushed offset {flushed}",
                        (first, end, stale))
                if cur.last():
                    base, count, _ = HEAD.unpack_from(cur.value(), 0)
                    if base + count - 1 != flushed:
                        raise LogInconsistent(
                            self.path, f"the last stored batch ends at offset {base + count - 1}"
                                       f", not at the flushed offset {flushed}",
                            (base + count - 1, flushed))
                elif flushed != self._start - 1:
                    raise LogInconsistent(
                        self.path, f"no batch is stored, yet offsets up to {flushed} count as "
                                   f"flushed", (flushed,))
                cur.putmulti(encoded, dupdata=False, overwrite=True)

            self._write(f"flush of offsets {first}..{end}", put_all)
            done = sum(b.size for b in snap)  # before the lock: readers wait on it
            with self._lock:
                # Nothing else removes tail entries while _write_lock is held, so the snapshot is
                # still the tail's prefix.
                del self._tail[:n]
                del self._tail_bases[:n]
                self._unflushed -= done
                self._flushed = snap[-1].last_offset
                return self._flushed

    def truncate_suffix(self, after_offset: int) -> None:
        self._check_open()
        with self._write_lock, self._lock:
            if after_offset != self._start - 1:
                if not (self._start <= after_offset <= self._dirty):
                    raise OffsetOutOfRange(after_offset, self._start, self._dirty)
                if self._batch_containing_locked(after_offset)[1] != after_offset:
                    raise ValueError(f"suffix truncation after {after_offset} is not at a "
                                     f"batch boundary")
            if after_offset == self._dirty:
                return
            if after_offset < self._flushed:
                # Disk first (under _lock: readers wait, see the module docstring). If this
                # raises, nothing below runs and memory still matches the untouched disk.
                def delete_after(txn: lmdb.Transaction) -> int:
                    cur = txn.cursor(db=self._log_db)
                    gone = 0
                    if cur.set_range(key(after_offset + 1)):
                        while True:
                            gone += len(cur.value())
                            if not cur.delete():
                                break
                    return gone

                self._bytes -= self._write(f"suffix truncation after {after_offset}",
                                           delete_after)
                self._flushed = after_offset
            i = bisect.bisect_right(self._tail_bases, after_offset)
            tail_gone = sum(b.size for b in self._tail[i:])
            self._unflushed -= tail_gone
            self._bytes -= tail_gone
            del self._tail[i:]
            del self._tail_bases[i:]
            j = bisect.bisect_right(self._term_firsts, after_offset)
            del self._term_firsts[j:]
            del self._term_terms[j:]
            self._dirty = after_offset

    def truncate_prefix(self, offset: int, snapshot: dict | None = None) -> None:
        self._check_open()
        with self._write_lock:
            with self._lock:
                if offset <= self._start:
                    return
                before = (self._start, self._start_term, self._snapshot, self._bytes,
                          list(self._term_firsts), list(self._term_terms))
                self._advance_locked(offset, snapshot)
            try:
                self._persist_start_locked()
            except BaseException:
                with self._lock:  # the disk is unchanged: so is the log, memory included
                    (self._start, self._start_term, self._snapshot, self._bytes,
                     self._term_firsts, self._term_terms) = before
                raise

    def advance_start(self, offset: int, snapshot: dict | None = None) -> None:
        self._check_open()
        with self._lock:
            if offset > self._start:
                self._advance_locked(offset, snapshot)

    def _advance_locked(self, offset: int, snapshot: dict | None) -> None:
        """Raise the readable start to `offset` (memory only). Readers check the start under
        _lock, so none reads below it afterwards, and the disk may then drop those keys without
        holding _lock (a long delete does not stall the owner's appends and reads)."""
        if offset > self._flushed + 1:
            raise ValueError(f"prefix truncation to {offset} passes the flushed offset "
                             f"{self._flushed}; flush first")
        if offset != self._dirty + 1 and self._batch_containing_locked(offset)[0] != offset:
            raise ValueError(f"prefix truncation to {offset} is not at a batch boundary")
        new_term = self._term_at_locked(offset - 1)
        gone = 0
        with self._env.begin(db=self._log_db, buffers=True) as txn:
            cur = txn.cursor()
            if cur.set_range(key(self._start)):
                for k, v in cur:
                    if KEY.unpack(k)[0] >= offset:
                        break
                    gone += len(v)
        self._start, self._start_term = offset, new_term
        self._snapshot = snapshot
        self._bytes -= gone
        j = bisect.bisect_right(self._term_firsts, offset) - 1
        if j > 0:
            del self._term_firsts[:j]
            del self._term_terms[:j]

    def persist_start(self) -> None:
        self._check_open()
        with self._write_lock:
            self._persist_start_locked()

    def _persist_start_locked(self) -> None:
        """Caller holds _write_lock (so nothing else writes, and flushes only add keys above
        the flushed offset). Deletes the keys below the in-memory start as of now."""
        with self._lock:
            start, term, snap = self._start, self._start_term, self._snapshot
        packed_snap = None if snap is None else msgpack.packb(snap, use_bin_type=True)

        def delete_before(txn: lmdb.Transaction) -> None:
            txn.put(START_KEY, msgpack.packb([start, term]), db=self._meta_db)
            if packed_snap is None:
                txn.delete(SNAPSHOT_KEY, db=self._meta_db)
            else:
                txn.put(SNAPSHOT_KEY, packed_snap, db=self._meta_db)
            cur = txn.cursor(db=self._log_db)
            if cur.first():
                while cur.key() and KEY.unpack(cur.key())[0] < start:
                    if not cur.delete():
                        break

        self._write(f"prefix truncation to {start}", delete_before)
        self._durable_start = start

    def reset(self, start_offset: int, start_term: int, snapshot: dict | None = None) -> None:
        self._check_open()
        packed_snap = None if snapshot is None else msgpack.packb(snapshot, use_bin_type=True)
        with self._write_lock, self._lock:
            def wipe(txn: lmdb.Transaction) -> None:
                txn.drop(self._log_db, delete=False)
                txn.put(START_KEY, msgpack.packb([start_offset, start_term]), db=self._meta_db)
                if packed_snap is None:
                    txn.delete(SNAPSHOT_KEY, db=self._meta_db)
                else:
                    txn.put(SNAPSHOT_KEY, packed_snap, db=self._meta_db)

            self._write(f"reset to offset {start_offset}", wipe)  # disk first
            self._tail.clear()
            self._tail_bases.clear()
            self._unflushed = 0
            self._bytes = 0
            self._term_firsts.clear()
            self._term_terms.clear()
            self._start, self._start_term = start_offset, start_term
            self._durable_start = start_offset
            self._snapshot = snapshot
            self._dirty = self._flushed = start_offset - 1

    # -- reads -------------------------------------------------------------------------------
    def _batch_containing_locked(self, offset: int) -> tuple[int, int]:
        """(base, last) of the batch holding `offset` (in range)."""
        if offset > self._flushed:
            b = self._tail[bisect.bisect_right(self._tail_bases, offset) - 1]
            return b.base_offset, b.last_offset
        with self._env.begin(db=self._log_db, buffers=True) as txn:
            cur = txn.cursor()
            k, v = self._seek(cur, offset)
            base, count, _ = HEAD.unpack_from(v, 0)
            return base, base + count - 1

    @staticmethod
    def _seek(cur: lmdb.Cursor, offset: int) -> tuple[bytes, memoryview]:
        """Position `cur` on the batch holding `offset` (largest key <= offset)."""
        want = key(offset)
        if cur.set_range(want):
            if bytes(cur.key()) != want:
                cur.prev()
        else:
            cur.last()
        return bytes(cur.key()), cur.value()

    def read(self, offset: int, max_bytes: int, max_batches: int | None = None) -> list[Batch]:
        self._check_open()
        limit = max_batches if max_batches is not None and max_batches > 0 else 1 << 62
        with self._lock:
            if offset == self._dirty + 1:
                return []
            if not (self._start <= offset <= self._dirty):
                raise OffsetOutOfRange(offset, self._start, self._dirty)
            out: list[Batch] = []
            used = 0
            if offset <= self._flushed:
                flushed = self._flushed
                with self._env.begin(db=self._log_db, buffers=True) as txn:
                    cur = txn.cursor()
                    self._seek(cur, offset)  # then iternext walks in C from there
                    for k, v in cur.iternext():
                        base = KEY.unpack(k)[0]
                        if base > flushed:
                            break
                        size = len(v)
                        if out and (used + size > max_bytes or len(out) >= limit):
                            return out
                        out.append(self._decode(base, v))
                        used += size
                i = 0
            else:
                i = bisect.bisect_right(self._tail_bases, offset) - 1
            for b in self._tail[i:]:
                if out and (used + b.size > max_bytes or len(out) >= limit):
                    break
                out.append(b)  # in memory since its checked append: see LogStorage.read
                used += b.size
            return out

    @staticmethod
    def _decode(base: int, raw: memoryview) -> Batch:
        try:
            b = Batch.decode(raw)
        except CorruptBatch as e:
            raise CorruptBatch(base, e.reason) from None
        if b.base_offset != base:
            raise CorruptBatch(base, f"stored header says base offset {b.base_offset}")
        return b

    def _term_at_locked(self, offset: int) -> int:
        if offset == self._start - 1:
            return self._start_term
        if not (self._start <= offset <= self._dirty):
            raise OffsetOutOfRange(offset, self._start, self._dirty)
        return self._term_terms[bisect.bisect_right(self._term_firsts, offset) - 1]

    def _last_term_locked(self) -> int:
        return self._term_at_locked(self._dirty)

    def term_at(self, offset: int) -> int:
        with self._lock:
            return self._term_at_locked(offset)

    # -- metadata ----------------------------------------------------------------------------
    def load_meta(self) -> Meta:
        self._check_open()
        with self._lock, self._env.begin(db=self._meta_db) as txn:
            raw = txn.get(META_KEY)
        if raw is None:
            return Meta()
        return decode_meta(self.path, raw)

    def save_meta(self, meta: Meta) -> None:
        self._check_open()
        raw = msgpack.packb({"term": meta.term, "voted_for": meta.voted_for,
                             "config": meta.config, "extra": meta.extra}, use_bin_type=True)
        with self._write_lock:
            self._write("saving term/vote metadata",
                        lambda txn: txn.put(META_KEY, raw, db=self._meta_db))

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Idempotent. Waits for an in-flight flush; unflushed batches are dropped."""
        with self._write_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._env.close()
            finally:
                self._release_dir()  # only after LMDB let go of the files

    def __repr__(self) -> str:
        return (f"LmdbLog(path={self.path!r}, start={self._start}, flushed={self._flushed}, "
                f"dirty={self._dirty})")
