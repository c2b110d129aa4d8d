"""The heads DB: a copy of every stored batch record's header, so retention reads no payload.

Why: py-lmdb touches (preloads) every page of a value whenever a cursor is positioned on it or
hands it out. At the retention limit of a log larger than the page cache, retention's plan
(`read_heads`) and the prefix delete (a cursor walk of the log DB) each read every byte they
dropped from disk: ~20k major faults and 200-330 ms of CPU per 2 s per node (issue 28). With the
headers stored apart, the plan reads only them and the delete walks them, deleting each record
with `txn.delete(key, db=log_db)` (mdb_del touches the first page of an overflow value, never
its other pages).

Layout: DB `heads` for LEGACY_GROUP's keys (empty prefix), `gheads` for every other group's
(prefixed keys), the key exactly the record's key in `log`/`glog` (storage/lmdb_space.py's
KeySpace, so a cursor move stays inside the log's own keys). The value, for a record of
`HEADER_SIZE + plen + trailer` bytes as every good record is (`trailer` is the format 2 header
CRC, 4 bytes; none in format 1):
- `record[:HEADER_SIZE] + record[-trailer:]`: the header and, in format 2, its own CRC. The
  record's length is the header's `plen` plus the fixed parts (so it costs no extra bytes and is
  covered by the header's checksum);
- any other length (a damaged record): `u32 little-endian record length` alone (4 bytes). Such a
  head is never served; the record is read instead, which says what is wrong.

Invariant: every write transaction that puts or deletes a log key puts or deletes its head in
the same transaction (crash-atomic by LMDB's own atomicity): the heads DB holds exactly one entry
per stored log key, equal to `entry(record)`. `check(txn, space, fmt)` asserts it (tests).

The records are the truth and the heads derived: an open compares them while its scan reads
every header anyway, and rebuilds this log's heads in its write transaction when they differ
(a log written before the heads DB existed, or by an older raftlog after a downgrade); a head
damaged on disk is served by nobody (its checksum fails: the record is read instead) and the
scrubber reports a head that differs from its record as damage, which `repair` rewrites.
"""

from __future__ import annotations

import logging
import struct
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import lmdb

from storage.batch import HEADER_SIZE, BatchHead, head_of
from storage.lmdb_space import KeySpace

log = logging.getLogger("raftlog.storage")

_LEN = struct.Struct("<I")
_PLEN = struct.Struct("<I")  # the payload length, the last field of a batch header
_PLEN_AT = HEADER_SIZE - _PLEN.size
_CRC = struct.Struct("<I")
TRAILER = 4  # the format 2 header CRC at a record's end (storage/lmdb_format.py)
PROGRESS_EVERY_S = 5.0


def _trailer(fmt: int) -> int:
    return TRAILER if fmt >= 2 else 0


def entry(record: memoryview | bytes, fmt: int) -> bytes:
    """The head stored for `record` (see the module docstring for the layout)."""
    n, t = len(record), _trailer(fmt)
    if n >= HEADER_SIZE + t and n == HEADER_SIZE + _PLEN.unpack_from(record, _PLEN_AT)[0] + t:
        return bytes(record[:HEADER_SIZE]) + bytes(record[n - t:n])
    return _LEN.pack(n)


def record_size(head: memoryview | bytes, fmt: int) -> int:
    """The length of the record `head` was made from."""
    if len(head) == _LEN.size:
        return int(_LEN.unpack_from(head, 0)[0])
    return HEADER_SIZE + int(_PLEN.unpack_from(head, _PLEN_AT)[0]) + _trailer(fmt)


def decode(base: int, head: memoryview | bytes, fmt: int) -> BatchHead | None:
    """The batch header a good format 2 head holds for the record under `base`; None when it
    cannot be trusted by itself (format 1 has no header checksum; a damaged record or head):
    then read the record, which says what is wrong."""
    if fmt < 2 or len(head) != HEADER_SIZE + TRAILER:
        return None
    (crc,) = _CRC.unpack_from(head, HEADER_SIZE)
    if zlib.crc32(memoryview(head)[:HEADER_SIZE]) != crc:
        return None
    return head_of(base, head, HEADER_SIZE + int(_PLEN.unpack_from(head, _PLEN_AT)[0]))


# -- writes (always in the caller's write transaction, beside the records') ---------------------
def put_all(txn: lmdb.Transaction, space: KeySpace, records: Iterable[tuple[bytes, bytes]],
            fmt: int) -> None:
    """The heads of `records` ((key, record) as put into the log DB)."""
    txn.cursor(db=space.heads_db).putmulti([(k, entry(v, fmt)) for k, v in records],
                                           dupdata=False, overwrite=True)


def delete_range(txn: lmdb.Transaction, space: KeySpace, lo: int, hi: int | None,
                 fmt: int) -> int:
    """Delete the records with keys in [lo, hi) (hi None: to the log's end) and their heads,
    found by walking the heads: no record value is touched. Returns the bytes the records
    counted as (each less the trailer)."""
    gone, t = 0, _trailer(fmt)
    cur = txn.cursor(db=space.heads_db)
    if not space.at_or_after(cur, lo):
        return 0
    while (k := cur.key()) and (off := space.offset(k)) is not None and (hi is None or off < hi):
        gone += record_size(cur.value(), fmt) - t
        txn.delete(bytes(k), db=space.log_db)
        if not cur.delete():
            break
    return gone


def stored_bytes(cur: lmdb.Cursor, space: KeySpace, lo: int, hi: int, fmt: int) -> int:
    """What the records with keys in [lo, hi) count as, from their heads (`cur` on the heads
    DB, in any transaction)."""
    gone, t = 0, _trailer(fmt)
    if space.at_or_after(cur, lo):
        for base, h in space.items(cur):
            if base >= hi:
                break
            gone += record_size(h, fmt) - t
    return gone


def rebuild(txn: lmdb.Transaction, space: KeySpace, fmt: int, where: str) -> int:
    """Make this log's heads those of its records (the open's write transaction). Reads every
    record once more (their headers; py-lmdb reads the pages of each): a warning line every
    few seconds says how far it got. Returns how many heads it wrote."""
    hcur = txn.cursor(db=space.heads_db)
    if space.first(hcur):
        while hcur.key() and space.offset(hcur.key()) is not None:
            if not hcur.delete():
                break
    cur = txn.cursor(db=space.log_db)
    started = last = time.monotonic()
    n = done = 0
    batch: list[tuple[bytes, bytes]] = []
    for base, v in (space.items(cur) if space.first(cur) else ()):
        batch.append((space.key(base), entry(v, fmt)))
        n += 1
        done += len(v)
        if len(batch) >= 4096:
            hcur.putmulti(batch, dupdata=False, overwrite=True)
            batch.clear()
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                log.warning("building_log_heads path=%s batches=%d bytes_done=%d elapsed_s=%.0f",
                            where, n, done, last - started)
    if batch:
        hcur.putmulti(batch, dupdata=False, overwrite=True)
    log.warning("built_log_heads path=%s batches=%d bytes=%d elapsed_s=%.1f", where, n, done,
                time.monotonic() - started)
    return n


# -- the open's comparison and the tests' check ---------------------------------------------------
@dataclass(slots=True)
class HeadsCheck:
    """Walks the heads beside the open's scan of the records (which reads every header anyway)
    and notes whether they differ. `see` each record in key order, then `finish`."""

    space: KeySpace
    fmt: int
    cur: Any = None
    on: bool = False
    stale: bool = False

    @classmethod
    def start(cls, txn: lmdb.Transaction, space: KeySpace, fmt: int) -> HeadsCheck:
        c = cls(space, fmt)
        c.cur = txn.cursor(db=space.heads_db)
        c.on = space.first(c.cur)
        return c

    def see(self, base: int, record: memoryview | bytes) -> None:
        if self.stale:
            return
        if (not self.on or self.space.offset(self.cur.key()) != base
                or bytes(self.cur.value()) != entry(record, self.fmt)):
            self.stale = True
            return
        self.on = self.space.next(self.cur)

    def finish(self, cut_from: int | None) -> bool:
        """True when the heads differ from the records the scan saw (those from `cut_from` on
        are cut with their heads)."""
        if not self.stale and self.on:
            off = self.space.offset(self.cur.key())
            self.stale = cut_from is None or off is None or off < cut_from
        return self.stale


def check(txn: lmdb.Transaction, space: KeySpace, fmt: int) -> None:
    """Assert the invariant for one log: its heads are exactly the heads of its records."""
    def walk(db: Any, make: Any) -> list[tuple[int, bytes]]:
        cur = txn.cursor(db=db)
        return [(b, make(v)) for b, v in (space.items(cur) if space.first(cur) else ())]

    want = walk(space.log_db, lambda v: entry(v, fmt))
    have = walk(space.heads_db, bytes)
    assert have == want, f"heads of group {space.group_id} differ from its records: " \
                         f"{have!r} != {want!r}"
