"""LmdbLog's damaged batches: found by a read, an open or the scrubber, never served, and written
back by repair() with a good copy from another member (storage/damage.py, docs/DISK-LOSS.md).

A part of LmdbLog kept in its own file (the log is long enough without it); it relies on the
log's fields and locks, described in storage/lmdb_log.py's docstring.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import lmdb

from storage import lmdb_format as fmt
from storage import lmdb_heads as heads
from storage.api import Meta, ScrubSlice
from storage.batch import Batch, CorruptBatch
from storage.damage import DamageSet
from storage.lmdb_reads import LmdbReads, Snapshot
from storage.lmdb_space import KeySpace

log = logging.getLogger("raftlog.storage")


class LmdbDamage(LmdbReads):
    """The damage set and what reads, scrubs and repairs do with it (mixed into LmdbLog)."""

    path: str
    _lock: threading.RLock
    _write_lock: threading.Lock
    _env: lmdb.Environment
    _log_db: Any
    _space: KeySpace
    _where: str
    _fmt: int
    _start: int
    _flushed: int
    _damage: DamageSet
    _meta: Meta
    _floor: tuple[int, int] | None
    _write: Callable[..., Any]

    # -- damage and repair -------------------------------------------------------------------
    @property
    def incarnation(self) -> int:
        return self._meta.incarnation

    @property
    def lost_position(self) -> tuple[int, int] | None:
        return self._floor

    @property
    def damage_version(self) -> int:
        return self._damage.version

    def damaged(self) -> list[Damage]:
        with self._lock:
            return self._damage.all()

    def first_damaged(self) -> int | None:
        return self._damage.first()  # on every reply: no lock (one read of a list head)

    def scrub(self, offset: int, max_bytes: int) -> ScrubSlice:
        """Every checksum of the stored batches from `offset`, checked where they lie (nothing
        copied), with no lock held while it reads (storage/lmdb_reads.py: a pass over a log
        larger than the page cache reads the disk)."""
        self._check_open()
        with self._lock:
            if self._flushed < self._start:
                return ScrubSlice(self._start, 0, (), True)
            offset = min(max(offset, self._start), self._flushed)
            flushed, cuts = self._flushed, self._cuts
            known = self._known_damage_locked()
            snap = self._snapshot_locked()
        try:
            used, nxt, bad = self._scrub_pass(snap, offset, flushed, max_bytes, known)
        finally:
            self._end_snapshot(snap)
        found = [d for d in (self._record_damage(b, cuts, "scrub") for b in bad) if d is not None]
        wrapped = nxt > flushed
        return ScrubSlice(self._start if wrapped else nxt, used, tuple(found), wrapped)

    def _scrub_pass(self, snap: Snapshot, offset: int, flushed: int, max_bytes: int,
                    known: DamageSet | None) -> tuple[int, int, list[tuple[int, int, str]]]:
        """Check the stored batches from `offset` (no lock held); (bytes checked, the next
        offset, the damaged batches found as (base, last, reason))."""
        bad: list[tuple[int, int, str]] = []
        used, nxt = 0, offset
        cur = snap.cursor()
        base, v = self._seek(cur, offset)
        while used < max_bytes and base <= flushed:
            used += len(v)
            d = known.find(base) if known is not None else None
            if d is not None:
                nxt = d.last + 1
            else:
                try:
                    nxt = fmt.verify_value(base, v, self._fmt) + 1
                    hv = snap.get(self._space.key(base), self._space.heads_db)
                    if hv is None or bytes(hv) != heads.entry(v, self._fmt):
                        # A good record whose stored head differs (damaged, or written by
                        # nobody: storage/lmdb_heads.py): repair() rewrites both.
                        bad.append((base, nxt - 1, "its stored header copy does not match it"))
                except CorruptBatch as e:
                    last = self._damaged_last(cur, base, v, flushed)
                    bad.append((base, last, e.reason))
                    nxt = last + 1
            if not self._space.next(cur):
                break
            base, v = self._space.offset(cur.key()), cur.value()
        return used, nxt, bad

    def repair(self, batches: Sequence[Batch]) -> None:
        self._check_open()
        for b in batches:
            b.verify()  # raises CorruptBatch: never write a bad copy over a bad copy
        with self._write_lock, self._lock:
            for b in batches:
                d = self._damage.find(b.base_offset)
                if d is None or (d.first, d.last, d.term) != (b.base_offset, b.last_offset,
                                                               b.term):
                    raise ValueError(f"offsets {b.base_offset}..{b.last_offset} (term {b.term}) "
                                     f"are not a damaged batch; nothing was written")
            values = [(self._space.key(b.base_offset), fmt.encode_value(b, self._fmt))
                      for b in batches]
            def put(txn: lmdb.Transaction) -> None:
                txn.cursor(db=self._log_db).putmulti(values)
                heads.put_all(txn, self._space, values, self._fmt)  # same transaction

            self._write(f"repair of {len(values)} damaged batches", put)
            for b in batches:
                self._damage.remove(b.base_offset)
                log.warning("log_damage_repaired path=%s offsets=%d..%d", self._where,
                            b.base_offset, b.last_offset)

