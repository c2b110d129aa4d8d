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
from storage.api import Meta, ScrubSlice
from storage.batch import Batch, BatchHead, BatchKind, CorruptBatch
from storage.damage import Damage, DamageSet
from storage.lmdb_space import KeySpace

log = logging.getLogger("raftlog.storage")


class LmdbDamage:
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
    _check_open: Callable[[], None]
    _term_at_locked: Callable[[int], int]
    _seek: Callable[[lmdb.Cursor, int], tuple[int, memoryview]]
    _write: Callable[..., Any]

    def read_heads(self, offset: int, max_bytes: int, max_batches: int | None,
                   full: frozenset[BatchKind]) -> list[Batch | BatchHead]:
        """LogStorage.read_heads: a stored batch of a kind not in `full` whose header passes
        its own checksum comes back as its header, its payload neither copied nor hashed."""
        return self.read(offset, max_bytes, max_batches, full)  # type: ignore[attr-defined]

    def _checked_locked(self, cur: lmdb.Cursor, base: int, value: memoryview,
                        full: frozenset[BatchKind] | None = None) -> Batch | BatchHead | None:
        """The stored batch at `base`, or None when it is damaged (recorded as such). Leaves
        `cur` where it was. With `full` (read_heads), a batch of another kind whose header
        checks out is returned as its header."""
        if self._damage.find(base) is not None:
            return None
        if full is not None:
            h = fmt.decode_head(base, value, self._fmt)
            if h is not None and h.kind not in full:
                return h
        try:
            return fmt.decode_value(base, value, self._fmt)
        except CorruptBatch as e:
            h = fmt.head(value, self._fmt)
            if h is not None:
                last = h[0] + h[1] - 1
            else:  # the index knows where the next batch starts
                last = self._flushed
                if self._space.next(cur):
                    last = min(last, self._space.offset(cur.key()) - 1)
                cur.set_key(self._space.key(base))
            damage = Damage(base, last, self._term_at_locked(base), e.reason)
            if self._damage.add(damage):
                log.warning("log_damage_found path=%s at=read: damaged batch at %s",
                            self._where, damage.describe())
            return None

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
        self._check_open()
        with self._lock:
            if self._flushed < self._start:
                return ScrubSlice(self._start, 0, (), True)
            offset = min(max(offset, self._start), self._flushed)
            found: list[Damage] = []
            used, nxt = 0, offset
            with self._env.begin(db=self._log_db, buffers=True) as txn:
                cur = txn.cursor()
                base, v = self._seek(cur, offset)
                while used < max_bytes:
                    if base > self._flushed:
                        break
                    used += len(v)
                    known = self._damage.find(base) is not None
                    b = self._checked_locked(cur, base, v)
                    d = self._damage.find(base)
                    if b is None and d is not None and not known:
                        found.append(d)
                    nxt = (b.last_offset if b is not None else d.last if d else base) + 1
                    if not self._space.next(cur):
                        break
                    base, v = self._space.offset(cur.key()), cur.value()
            wrapped = nxt > self._flushed
            return ScrubSlice(self._start if wrapped else nxt, used, tuple(found), wrapped)

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
            self._write(f"repair of {len(values)} damaged batches",
                        lambda txn: txn.cursor(db=self._log_db).putmulti(values))
            for b in batches:
                self._damage.remove(b.base_offset)
                log.warning("log_damage_repaired path=%s offsets=%d..%d", self._where,
                            b.base_offset, b.last_offset)

