"""The durable log: LMDB for flushed batches, a bounded in-memory tail for dirty ones.

Why this shape: LMDB's no-sync modes (MDB_NOSYNC, MDB_NOMETASYNC, MDB_MAPASYNC) can corrupt the
whole database on a power cut, so dirty data never goes to LMDB. It lives in the in-memory tail
(etcd's "unstable" log) until `flush()` writes it in ONE write transaction committed with the
default fsync. A process crash therefore loses exactly what a power cut loses.

Threading rules (a flush runs in a worker thread while the owning thread appends and reads):
- `_lock` guards every in-memory field and every LMDB *read* transaction and map resize. It is held
  only briefly (snapshot, splice, one read), never across an fsync.
- `_write_lock` serialises everything that writes LMDB: flush, truncate_suffix, truncate_prefix,
  reset, save_meta. A truncation or reset issued while a flush is in flight therefore waits until
  that flush has committed (it then sees the flushed batches as durable and cuts them on disk too).
- A flush snapshots the tail prefix at its start; appends made while it runs stay in the tail.
- Writers that shrink the log update the in-memory view first (under `_lock`) and delete on disk
  afterwards, so a reader never follows the in-memory flushed offset into keys already deleted.

Layout: sub-db `log` maps the big-endian base offset (8 bytes) to `Batch.encode()`; sub-db `meta`
holds `meta` (term, vote, config, extra) and `start` ([start_offset, start_term]), msgpack-encoded.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import lmdb
import msgpack

from storage.api import (
    DEFAULT_MAX_TAIL_BYTES,
    DiskFull,
    LogStorage,
    Meta,
    OffsetOutOfRange,
    StorageError,
    TailFull,
)
from storage.batch import HEADER_SIZE, Batch, CorruptBatch

# BENCH ONLY: RAFTLOG_BENCH_FSYNC_DELAY_MS adds a fixed delay to every fsynced transaction, to
# show what deferred flushing buys on a slow (cloud) disk. Never set it in production.
_BENCH_FSYNC_DELAY_S = float(os.environ.get("RAFTLOG_BENCH_FSYNC_DELAY_MS", "0") or 0) / 1000

log = logging.getLogger(__name__)

DEFAULT_MAP_SIZE = 64 << 20
DEFAULT_MAX_MAP_SIZE = 1 << 40
PROGRESS_EVERY_S = 5.0

_KEY = struct.Struct(">Q")
# base_offset (q), count (I), term (q) at the head of every encoded batch (see storage.batch).
_HEAD = struct.Struct("<qIq")
_META_KEY = b"meta"
_START_KEY = b"start"

T = TypeVar("T")


def _key(offset: int) -> bytes:
    return _KEY.pack(offset)


class LmdbLog(LogStorage):
    """`storage.api.LogStorage` on LMDB. See the module docstring for the threading rules."""

    def __init__(self, path: str | os.PathLike[str], max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES,
                 map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE) -> None:
        self.path = os.fspath(path)
        self._max_tail_bytes = max_tail_bytes
        self._max_map_size = max(max_map_size, map_size)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False
        try:
            self._env = lmdb.open(self.path, subdir=True, max_dbs=4, map_size=map_size, lock=True,
                                  readahead=False, meminit=False)
        except lmdb.Error as e:
            raise StorageError(f"cannot open the LMDB log at {self.path}: {e}; check the path "
                               f"exists, is writable and is not on a full disk") from e
        self._log_db = self._env.open_db(b"log")
        self._meta_db = self._env.open_db(b"meta")
        # Dirty batches, oldest first; their bases for bisect.
        self._tail: list[Batch] = []
        self._tail_bases: list[int] = []
        self._unflushed = 0
        # (first offset, term) at every term change across the whole log, for term_at.
        self._term_firsts: list[int] = []
        self._term_terms: list[int] = []
        self._load()

    # -- opening -----------------------------------------------------------------------------
    def _load(self) -> None:
        started = time.monotonic()
        last_report = started
        with self._env.begin(buffers=True) as txn:
            raw = txn.get(_START_KEY, db=self._meta_db)
            start, start_term = msgpack.unpackb(bytes(raw)) if raw is not None else (0, 0)
            last = start - 1
            n = 0
            cur = txn.cursor(db=self._log_db)
            for k, v in cur:
                base, count, term = _HEAD.unpack_from(v, 0) if len(v) >= HEADER_SIZE else (
                    -1, 0, 0)
                key_base = _KEY.unpack(bytes(k))[0]
                if base != key_base or count < 1:
                    raise CorruptBatch(key_base, "batch header does not match its key while "
                                                 "opening the log")
                if not self._term_terms or self._term_terms[-1] != term:
                    self._term_firsts.append(base)
                    self._term_terms.append(term)
                last = base + count - 1
                n += 1
                if n % 4096 == 0:
                    now = time.monotonic()
                    if now - last_report >= PROGRESS_EVERY_S:
                        last_report = now
                        log.info("opening_log path=%s batches=%d last_offset=%d elapsed_s=%.0f",
                                 self.path, n, last, now - started)
        self._start, self._start_term = int(start), int(start_term)
        self._flushed = last
        self._dirty = last
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

    # -- LMDB write plumbing -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"the log at {self.path} is closed; reopen it with open_log()")

    def _write(self, what: str, body: Callable[[lmdb.Transaction], T]) -> T:
        """Run `body` in one write transaction committed with fsync; grow the map on
        MapFullError (doubling, up to max_map_size) and retry; map a full disk to DiskFull.
        Caller holds _write_lock."""
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
        if code == errno.ENOSPC or "No space" in text or isinstance(e, lmdb.Error):
            return DiskFull(
                f"{what}: writing {self.path} failed ({text}); free disk space or move the data "
                f"dir to a bigger disk, then retry. Nothing flushed before is lost; unflushed "
                f"batches stay in memory")
        return StorageError(f"{what}: {text}")

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
            if not snap:
                return self._flushed
            encoded = [(_key(b.base_offset), b.encode()) for b in snap]

            def put_all(txn: lmdb.Transaction) -> None:
                cur = txn.cursor(db=self._log_db)
                cur.putmulti(encoded, dupdata=False, overwrite=True)

            self._write(f"flush of offsets {snap[0].base_offset}..{snap[-1].last_offset}",
                        put_all)
            with self._lock:
                # Nothing else removes tail entries while _write_lock is held, so the snapshot is
                # still the tail's prefix.
                del self._tail[:n]
                del self._tail_bases[:n]
                self._unflushed -= sum(b.size for b in snap)
                self._flushed = snap[-1].last_offset
                return self._flushed

    def truncate_suffix(self, after_offset: int) -> None:
        self._check_open()
        with self._write_lock:
            with self._lock:
                if after_offset != self._start - 1:
                    if not (self._start <= after_offset <= self._dirty):
                        raise OffsetOutOfRange(after_offset, self._start, self._dirty)
                    if self._batch_containing_locked(after_offset)[1] != after_offset:
                        raise ValueError(f"suffix truncation after {after_offset} is not at a "
                                         f"batch boundary")
                if after_offset == self._dirty:
                    return
                i = bisect.bisect_right(self._tail_bases, after_offset)
                self._unflushed -= sum(b.size for b in self._tail[i:])
                del self._tail[i:]
                del self._tail_bases[i:]
                j = bisect.bisect_right(self._term_firsts, after_offset)
                del self._term_firsts[j:]
                del self._term_terms[j:]
                self._dirty = after_offset
                cut_disk = after_offset < self._flushed
                if cut_disk:
                    self._flushed = after_offset
            if cut_disk:
                def delete_after(txn: lmdb.Transaction) -> None:
                    cur = txn.cursor(db=self._log_db)
                    if cur.set_range(_key(after_offset + 1)):
                        while cur.delete():
                            pass

                self._write(f"suffix truncation after {after_offset}", delete_after)

    def truncate_prefix(self, offset: int) -> None:
        self._check_open()
        with self._write_lock:
            with self._lock:
                if offset <= self._start:
                    return
                if offset > self._flushed + 1:
                    raise ValueError(f"prefix truncation to {offset} passes the flushed offset "
                                     f"{self._flushed}; flush first")
                if offset != self._dirty + 1 and self._batch_containing_locked(offset)[0] != offset:
                    raise ValueError(f"prefix truncation to {offset} is not at a batch boundary")
                new_term = self._term_at_locked(offset - 1)
                self._start, self._start_term = offset, new_term
                j = bisect.bisect_right(self._term_firsts, offset) - 1
                if j > 0:
                    del self._term_firsts[:j]
                    del self._term_terms[:j]

            def delete_before(txn: lmdb.Transaction) -> None:
                txn.put(_START_KEY, msgpack.packb([offset, new_term]), db=self._meta_db)
                cur = txn.cursor(db=self._log_db)
                if cur.first():
                    while cur.key() and _KEY.unpack(cur.key())[0] < offset:
                        if not cur.delete():
                            break

            self._write(f"prefix truncation to {offset}", delete_before)

    def reset(self, start_offset: int, start_term: int) -> None:
        self._check_open()
        with self._write_lock:
            with self._lock:
                self._tail.clear()
                self._tail_bases.clear()
                self._unflushed = 0
                self._term_firsts.clear()
                self._term_terms.clear()
                self._start, self._start_term = start_offset, start_term
                self._dirty = self._flushed = start_offset - 1

            def wipe(txn: lmdb.Transaction) -> None:
                txn.drop(self._log_db, delete=False)
                txn.put(_START_KEY, msgpack.packb([start_offset, start_term]), db=self._meta_db)

            self._write(f"reset to offset {start_offset}", wipe)

    # -- reads -------------------------------------------------------------------------------
    def _batch_containing_locked(self, offset: int) -> tuple[int, int]:
        """(base, last) of the batch holding `offset` (in range)."""
        if offset > self._flushed:
            b = self._tail[bisect.bisect_right(self._tail_bases, offset) - 1]
            return b.base_offset, b.last_offset
        with self._env.begin(db=self._log_db, buffers=True) as txn:
            cur = txn.cursor()
            k, v = self._seek(cur, offset)
            base, count, _ = _HEAD.unpack_from(v, 0)
            return base, base + count - 1

    @staticmethod
    def _seek(cur: lmdb.Cursor, offset: int) -> tuple[bytes, memoryview]:
        """Position `cur` on the batch holding `offset` (largest key <= offset)."""
        want = _key(offset)
        if cur.set_range(want):
            if bytes(cur.key()) != want:
                cur.prev()
        else:
            cur.last()
        return bytes(cur.key()), cur.value()

    def read(self, offset: int, max_bytes: int) -> list[Batch]:
        self._check_open()
        with self._lock:
            if offset == self._dirty + 1:
                return []
            if not (self._start <= offset <= self._dirty):
                raise OffsetOutOfRange(offset, self._start, self._dirty)
            out: list[Batch] = []
            used = 0
            if offset <= self._flushed:
                with self._env.begin(db=self._log_db, buffers=True) as txn:
                    cur = txn.cursor()
                    k, v = self._seek(cur, offset)
                    while True:
                        base = _KEY.unpack(k)[0]
                        if base > self._flushed:
                            break
                        size = len(v)
                        if out and used + size > max_bytes:
                            return out
                        out.append(self._decode(base, v))
                        used += size
                        if not cur.next():
                            break
                        k, v = bytes(cur.key()), cur.value()
                i = 0
            else:
                i = bisect.bisect_right(self._tail_bases, offset) - 1
            for b in self._tail[i:]:
                if out and used + b.size > max_bytes:
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
            raw = txn.get(_META_KEY)
        if raw is None:
            return Meta()
        d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        return Meta(term=d["term"], voted_for=d["voted_for"], config=d["config"],
                    extra=d["extra"])

    def save_meta(self, meta: Meta) -> None:
        self._check_open()
        raw = msgpack.packb({"term": meta.term, "voted_for": meta.voted_for,
                             "config": meta.config, "extra": meta.extra}, use_bin_type=True)
        with self._write_lock:
            self._write("saving term/vote metadata",
                        lambda txn: txn.put(_META_KEY, raw, db=self._meta_db))

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Idempotent. Waits for an in-flight flush; unflushed batches are dropped."""
        with self._write_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._env.close()

    def __repr__(self) -> str:
        return (f"LmdbLog(path={self.path!r}, start={self._start}, flushed={self._flushed}, "
                f"dirty={self._dirty})")
