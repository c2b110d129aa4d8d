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
- `_lock` (re-entrant) guards every in-memory field and the opening of every LMDB read
  transaction, so a read's snapshot matches the in-memory view; the read itself runs without it,
  in the store's read gate (storage/lmdb_reads.py, storage/read_gate.py: a cold read must not
  hold up the owner). A flush holds `_lock` only briefly (snapshot, splice), never across its
  fsync, so appends and reads go on while a flush commits.
- `_write_lock` serialises everything that writes LMDB: flush, truncate_suffix, truncate_prefix,
  reset, save_meta. A truncation or reset issued while a flush is in flight therefore waits until
  that flush has committed (it then sees the flushed batches as durable and cuts them on disk too).
- A flush snapshots the tail prefix at its start; appends made while it runs stay in the tail.
- Writers that shrink the log from the end (truncate_suffix, reset) hold `_lock` across their
  transaction, so no reader opens a snapshot without keys the in-memory view still counts as
  flushed, and move `_cuts`, so a read that began before does not go on into the new end. They
  are called from the owning thread, which waits for their fsync anyway.
- Retention shrinks it from the front in two steps: advance_start raises the readable start in
  memory (under `_lock`, cheap: the plan that read the dropped batches says their size), then
  persist_start deletes the keys below it holding only `_write_lock`, so a long delete in a
  worker thread never blocks the owner's appends and reads (none of them reads below the start
  any more). Freed LMDB pages are reused by later flushes,
  so the file stops growing at the retained size.

One owner per directory: an exclusive flock on `<dir>/LOCK` while open (storage/dirlock.py).

Many logs per directory: a log lives in its store's environment (storage/lmdb_store.py), in a key
space of its own (storage/lmdb_space.py: LEGACY_GROUP (1) in DBs `log`/`meta`, other groups under a key
prefix in `glog`/`gmeta`). `_write_lock` is the store's; every cursor move goes through the key
space, so a log never reads, cuts or counts another log's keys. `LmdbLog(path)` opens a store
holding LEGACY_GROUP and owns it (closing the log closes the store). A flush is the one-log case of
the store flush, split in three steps the store runs for many logs at once: `_flush_take`
(snapshot the tail), `_flush_put` (inside the shared transaction), `_flush_apply` (after its
commit: drop the written prefix of the tail, move the flushed offset to exactly its end).

Opening checks every batch header and the metadata records against their checksums, that the
batches run contiguously from the start record with terms never going backwards, that the log
ends at the flushed tail recorded with it, and fully verifies the newest batches; what a damaged
disk leaves (missing batches, a damaged header or record) is cut or replaced and reported
(storage/lmdb_format.py), anything else raises LogInconsistent. Damaged batches found later (the
scrubber, a read) are not served and are written back by `repair()` (storage/damage.py).

Layout and record formats: storage/lmdb_format.py; every record's header is also kept in the heads
DB, written in the same transactions (storage/lmdb_heads.py: retention reads and deletes from it).
"""

from __future__ import annotations

import bisect
import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import lmdb

from storage import lmdb_format as fmt
from storage import lmdb_heads as heads
from storage.api import (
    DEFAULT_MAX_TAIL_BYTES,
    CountsTail,
    LEGACY_GROUP,
    IoMode,
    LogInconsistent,
    LogStorage,
    Meta,
    OffsetOutOfRange,
    TailFull,
)
from storage.batch import Batch
from storage.damage import DamageSet
from storage.lmdb_damage import LmdbDamage
from storage.recent_heads import RecentHeads
from storage.dirlock import LOCK_FILE  # (LOCK_FILE: for the CLI's up)
from storage.lmdb_space import KeySpace
from storage.lmdb_store import (
    DEFAULT_MAP_SIZE,
    DEFAULT_MAX_MAP_SIZE,
    DEFAULT_VERIFY_TAIL_BYTES,
    LmdbStore,
)

log = logging.getLogger("raftlog.storage")  # under the runtime's "raftlog" handler

T = TypeVar("T")
__all__ = ["DEFAULT_MAP_SIZE", "DEFAULT_MAX_MAP_SIZE", "LOCK_FILE", "LmdbLog"]


@dataclass(slots=True)
class FlushPart:
    """One log's share of a store flush: the tail prefix it writes, encoded, and what it
    checks against the disk (the flushed offset as of the snapshot)."""

    log: LmdbLog
    n: int  # how many tail batches
    encoded: list[tuple[bytes, bytes]]
    first: int
    end: int
    end_term: int
    flushed: int  # the flushed offset before
    nbytes: int


class LmdbLog(LmdbDamage, CountsTail, LogStorage):
    """`storage.api.LogStorage` on LMDB. See the module docstring for the threading rules."""

    def __init__(self, path: str | os.PathLike[str], max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES,
                 map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE,
                 verify_tail_bytes: int = DEFAULT_VERIFY_TAIL_BYTES) -> None:
        """Open (or create) the single-log directory `path`: a store holding LEGACY_GROUP (the
        default topic's partition, in the legacy key space), owned by this log."""
        store = LmdbStore(path, max_tail_bytes=max_tail_bytes, map_size=map_size,
                          max_map_size=max_map_size, verify_tail_bytes=verify_tail_bytes,
                          log_type=type(self))
        try:
            store._attach_log(self, LEGACY_GROUP)
        except BaseException:
            store.close()
            raise
        self._owns_store = True

    def _attach(self, store: LmdbStore, space: KeySpace, max_tail_bytes: int,
                verify_tail_bytes: int) -> None:
        """Load this log from `space` of `store` (the store holds its write lock)."""
        self._store = store
        self._owns_store = False
        self._space = space
        self.group_id = space.group_id
        self.path = store.path
        self._env = store.env  # (tests wrap this reference to inject write faults)
        self._log_db, self._meta_db = space.log_db, space.meta_db
        self._release_dir = store._release_dir
        self._max_tail_bytes = max_tail_bytes
        self._lock = threading.RLock()
        self._write_lock = store._write_lock
        self._gate = store.read_gate
        self._cuts = 0  # moves when the end is cut (truncate_suffix, reset): storage/lmdb_reads.py
        self._closed = False
        # Dirty batches, oldest first; their bases for bisect.
        self._tail: list[Batch] = []
        self._tail_bases: list[int] = []
        self._tail_share = store.tail_budget.share(self)  # `_unflushed`, counted node-wide
        # (first offset, term) at every term change across the whole log, for term_at.
        self._term_firsts: list[int] = []
        self._term_terms: list[int] = []
        self._bytes = 0  # encoded size of every batch held (retained_bytes)
        self._snapshot: dict | None = None  # the state at the log start
        self._damage = DamageSet()
        self._recent = RecentHeads()  # the newest flushed batches' headers (read_heads)
        # What the open found wrong and repaired or cut (for the runtime's log and status).
        self.open_findings: list[str] = []
        self._load(verify_tail_bytes)

    @property
    def store(self) -> LmdbStore:
        """The store this log lives in (its flush is the store's, for one log)."""
        return self._store

    # -- opening -----------------------------------------------------------------------------
    def _load(self, verify_tail_bytes: int) -> None:
        started = time.monotonic()
        with self._env.begin(buffers=True) as txn:
            s = fmt.scan(txn, self._space, self._where, verify_tail_bytes)
        self._fmt = s.fmt
        self._trailer = fmt.TRAILER if s.fmt >= 2 else 0
        meta = s.meta
        if meta is None or s.identity_lost:
            # A new directory, or one that forgot its term and vote (or what it held): a new
            # identity, so the cluster takes it for the new member it is (raft/core/incarnation.py).
            if not s.new:
                s.findings.append("its term and vote are lost: it gets a new identity and "
                                  "rejoins the cluster as a new member")
            meta = Meta(incarnation=fmt.new_incarnation())
        elif meta.incarnation == 0:  # written before incarnations existed
            meta.incarnation = fmt.new_incarnation()
        if s.needs_write or s.identity_lost:  # before anything is served (write lock: held)
            self._write("recording what the open found",
                        lambda txn: fmt.write_open_repairs(txn, self._space, s, meta,
                                                           self._where))
        self._meta = meta
        self._start, self._start_term = s.start, s.start_term
        self._snapshot, self._bytes = s.snapshot, s.nbytes
        self._flushed = self._dirty = s.last
        self._term_firsts, self._term_terms = s.term_firsts, s.term_terms
        self._floor = s.floor
        for d in s.damaged:
            self._damage.add(d)
            s.findings.append(f"damaged batch at {d.describe()}")
        self.open_findings = s.findings
        for finding in s.findings:
            log.warning("log_damage_found path=%s at=open: %s", self._where, finding)
        if time.monotonic() - started >= fmt.PROGRESS_EVERY_S:
            log.info("opened_log path=%s batches=%d start=%d last_offset=%d elapsed_s=%.0f",
                     self._where, s.batches, self._start, s.last, time.monotonic() - started)

    @property
    def _where(self) -> str:
        """The path, and the group when it is not 0 (for messages and logs)."""
        return self.path if not self.group_id else f"{self.path} (group {self.group_id})"

    # -- positions ---------------------------------------------------------------------------
    @property
    def io_mode(self) -> IoMode:
        """Flushes and other disk work block on fsync; the locks above let them run in a worker
        thread while the owner appends and reads."""
        return IoMode.WORKER_THREAD

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def start_term(self) -> int:
        return self._start_term

    dirty_offset = property(lambda self: self._dirty)
    flushed_offset = property(lambda self: self._flushed)
    unflushed_bytes = property(lambda self: self._unflushed)

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    @property
    def snapshot(self) -> dict | None:
        return self._snapshot

    # -- LMDB write plumbing -------------------------------------------------------------------
    def _write(self, what: str, body: Callable[[lmdb.Transaction], T]) -> T:
        """Run `body` in one fsynced write transaction of the store (LmdbStore._write_locked:
        map growth, DiskFull, StorageIOError; if it raises, the disk is unchanged). Caller holds
        _write_lock (and _lock for writes that shrink the log; it is re-entrant, so the map
        growth can take it again)."""
        if self.group_id:
            what = f"{what} (group {self.group_id})"
        return self._store._write_locked(what, body, self._env)

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
            self._tail_share.budget.check(size)
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
        return self._store._flush([(self, upto)])[self.group_id]

    def _flush_take(self, upto: int | None) -> FlushPart | None:
        """The tail prefix a flush writes, encoded (None: nothing to write). Caller holds
        _write_lock, so the flushed offset and the tail's prefix stay as they are until
        `_flush_apply`."""
        self._check_open()
        with self._lock:
            n = len(self._tail)
            if upto is not None:
                n = bisect.bisect_right(self._tail_bases, upto)
                while n and self._tail[n - 1].last_offset > upto:
                    n -= 1
            snap = self._tail[:n]
            flushed = self._flushed  # only writers change it, and the caller holds _write_lock
        if not snap:
            return None
        key = self._space.key
        return FlushPart(self, n, [(key(b.base_offset), fmt.encode_value(b, self._fmt))
                                   for b in snap],
                         snap[0].base_offset, snap[-1].last_offset, snap[-1].term, flushed,
                         sum(b.size for b in snap))

    def _flush_put(self, txn: lmdb.Transaction, part: FlushPart) -> None:
        """This log's share of the store flush's transaction: its batches and its tail record."""
        space, first, end, flushed = self._space, part.first, part.end, part.flushed
        cur = txn.cursor(db=space.log_db)
        # Memory and disk must agree before we add to the disk: nothing stored past the
        # flushed offset, and the last stored batch ends at it. Two cursor moves; they
        # turn a disagreement into a refusal instead of an overlapping log.
        if space.at_or_after(cur, first):
            stale = space.offset(cur.key())
            raise LogInconsistent(
                self._where, f"flushing offsets {first}..{end} found a stored batch at "
                             f"offset {stale}, past the flushed offset {flushed}",
                (first, end, stale))
        if space.last(cur):
            h = fmt.head(cur.value(), self._fmt)
            if h is not None:  # (a damaged header is the damage set's business)
                base, count, _ = h
                if base + count - 1 != flushed:
                    raise LogInconsistent(
                        self._where, f"the last stored batch ends at offset "
                                     f"{base + count - 1}, not at the flushed offset {flushed}",
                        (base + count - 1, flushed))
        elif flushed != self._start - 1:
            raise LogInconsistent(
                self._where, f"no batch is stored, yet offsets up to {flushed} count as "
                             f"flushed", (flushed,))
        cur.putmulti(part.encoded, dupdata=False, overwrite=True)
        heads.put_all(txn, space, part.encoded, self._fmt)  # same transaction: crash-atomic
        txn.put(space.meta_key(fmt.TAIL_KEY), fmt.seal([end, part.end_term]),
                db=space.meta_db)

    def _flush_apply(self, part: FlushPart) -> int:
        """After the commit that held `part`: the written prefix leaves the tail and the flushed
        offset moves to exactly its end. Caller still holds _write_lock."""
        with self._lock:
            # Nothing else removes tail entries while _write_lock is held, so the snapshot is
            # still the tail's prefix.
            self._recent.flushed(self._tail[:part.n])
            del self._tail[:part.n]
            del self._tail_bases[:part.n]
            self._unflushed -= part.nbytes
            self._flushed = part.end
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
                tail = fmt.seal([after_offset, self._term_at_locked(after_offset)])
                space = self._space

                def delete_after(txn: lmdb.Transaction) -> int:
                    gone = heads.delete_range(txn, space, after_offset + 1, None, self._fmt)
                    txn.put(space.meta_key(fmt.TAIL_KEY), tail, db=space.meta_db)
                    return gone

                self._bytes -= self._write(f"suffix truncation after {after_offset}",
                                           delete_after)
                self._flushed = after_offset
                self._damage.drop_after(after_offset)
                self._recent.cut_after(after_offset)
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
            self._cuts += 1

    def truncate_prefix(self, offset: int, snapshot: dict | None = None) -> None:
        self._check_open()
        with self._write_lock:
            with self._lock:
                if offset <= self._start:
                    return
                before = (self._start, self._start_term, self._snapshot, self._bytes,
                          list(self._term_firsts), list(self._term_terms), self._damage.all())
                self._advance_locked(offset, snapshot)
            try:
                self._persist_start_locked()
            except BaseException:
                with self._lock:  # the disk is unchanged: so is the log, memory included
                    (self._start, self._start_term, self._snapshot, self._bytes,
                     self._term_firsts, self._term_terms, damaged) = before
                    for d in damaged:
                        self._damage.add(d)
                raise

    def advance_start(self, offset: int, snapshot: dict | None = None,
                      dropped_bytes: int | None = None) -> None:
        self._check_open()
        with self._lock:
            if offset > self._start:
                self._advance_locked(offset, snapshot, dropped_bytes)

    def _advance_locked(self, offset: int, snapshot: dict | None,
                        dropped_bytes: int | None = None) -> None:
        """Raise the readable start to `offset` (memory only). Readers check the start under
        _lock, so none reads below it afterwards, and the disk may then drop those keys without
        holding _lock (a long delete does not stall the owner's appends and reads).
        `dropped_bytes` (LogStorage.advance_start): the caller read the dropped batches and says
        their size, so the owner's thread does not walk the cold front of the log to count it."""
        if offset > self._flushed + 1:
            raise ValueError(f"prefix truncation to {offset} passes the flushed offset "
                             f"{self._flushed}; flush first")
        if offset != self._dirty + 1 and not self._starts_batch_locked(offset):
            raise ValueError(f"prefix truncation to {offset} is not at a batch boundary")
        new_term = self._term_at_locked(offset - 1)
        gone = dropped_bytes if dropped_bytes is not None else self._stored_bytes_below(offset)
        if not 0 <= gone <= self._bytes - self._unflushed:
            raise ValueError(f"prefix truncation to {offset} drops {gone} bytes of the "
                             f"{self._bytes - self._unflushed} flushed")
        self._start, self._start_term = offset, new_term
        self._snapshot = snapshot
        self._bytes -= gone
        self._damage.drop_before(offset)
        self._recent.drop_below(offset)
        j = bisect.bisect_right(self._term_firsts, offset) - 1
        if j > 0:
            del self._term_firsts[:j]
            del self._term_terms[:j]

    def _stored_bytes_below(self, offset: int) -> int:
        """What the stored batches from the start up to `offset` count as (caller holds _lock):
        from their heads, no record read (storage/lmdb_heads.py)."""
        snap = self._snapshot_locked()
        try:
            return heads.stored_bytes(snap.cursor(self._space.heads_db), self._space,
                                      self._start, offset, self._fmt)
        finally:
            self._end_snapshot(snap)

    def persist_start(self) -> None:
        self._check_open()
        with self._write_lock:
            self._persist_start_locked()

    def _persist_start_locked(self) -> None:
        """Caller holds _write_lock (so nothing else writes, and flushes only add keys above
        the flushed offset). Deletes the keys below the in-memory start as of now, found by
        walking their heads: no record is read (storage/lmdb_heads.py, issue 28)."""
        with self._lock:
            start, term, snap = self._start, self._start_term, self._snapshot

        def delete_before(txn: lmdb.Transaction) -> None:
            fmt.write_start(txn, self._space, start, term, snap)
            heads.delete_range(txn, self._space, 0, start, self._fmt)

        self._write(f"prefix truncation to {start}", delete_before)

    def reset(self, start_offset: int, start_term: int, snapshot: dict | None = None) -> None:
        self._check_open()
        with self._write_lock, self._lock:
            def wipe(txn: lmdb.Transaction) -> None:
                self._space.clear_log(txn)
                fmt.write_start(txn, self._space, start_offset, start_term, snapshot)
                txn.put(self._space.meta_key(fmt.TAIL_KEY),
                        fmt.seal([start_offset - 1, start_term]), db=self._meta_db)

            self._write(f"reset to offset {start_offset}", wipe)  # disk first
            self._tail.clear()
            self._tail_bases.clear()
            self._unflushed = self._bytes = 0
            self._damage.clear()
            self._recent.clear()
            self._term_firsts.clear()
            self._term_terms.clear()
            self._start, self._start_term = start_offset, start_term
            self._snapshot = snapshot
            self._dirty = self._flushed = start_offset - 1
            self._cuts += 1

    # -- reads (the flushed batches: storage/lmdb_reads.py) ----------------------------------
    def _term_at_locked(self, offset: int) -> int:
        if offset == self._start - 1:
            return self._start_term
        if not (self._start <= offset <= self._dirty):
            raise OffsetOutOfRange(offset, self._start, self._dirty)
        return self._term_terms[bisect.bisect_right(self._term_firsts, offset) - 1]

    def _last_term_locked(self) -> int:
        return self._term_at_locked(self._dirty)

    def last_term(self) -> int:  # one lock: a worker's truncate_suffix may lower _dirty between
        with self._lock:  # reading dirty_offset and looking up its term (a fail-stop, bench produce)
            return self._last_term_locked()

    def term_at(self, offset: int) -> int:
        with self._lock:
            return self._term_at_locked(offset)

    # -- metadata ----------------------------------------------------------------------------
    def load_meta(self) -> Meta:
        self._check_open()
        with self._lock:
            return copy.deepcopy(self._meta)

    def save_meta(self, meta: Meta) -> None:
        self._check_open()
        keep = Meta(meta.term, meta.voted_for, meta.config, meta.extra, self._meta.incarnation)
        raw = fmt.seal(fmt.meta_to_record(keep, keep.incarnation))
        with self._write_lock:
            self._write("saving term/vote metadata",
                        lambda txn: txn.put(self._space.meta_key(fmt.META_KEY), raw,
                                            db=self._meta_db))
            with self._lock:
                self._meta = copy.deepcopy(keep)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Idempotent. Waits for an in-flight flush; unflushed batches are dropped. A log that
        owns its store (LmdbLog(path)) closes the store too."""
        if self._owns_store:
            self._store.close()
            return
        with self._write_lock:
            self._closed_by_store()
            self._store._forget(self.group_id)

    def _closed_by_store(self) -> None:
        """Closed (the store closed or dropped it, or close()). Caller holds _write_lock."""
        with self._lock:
            self._closed = True
            self._tail_share.release()  # its unflushed batches are dropped

    def __repr__(self) -> str:
        return (f"LmdbLog(path={self.path!r}, group={self.group_id}, start={self._start}, "
                f"flushed={self._flushed}, dirty={self._dirty})")
