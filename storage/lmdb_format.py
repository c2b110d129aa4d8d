"""How LmdbLog lays its records out, and what it checks when it opens a log.

Sub-db `log` maps the big-endian base offset (8 bytes) to a batch record: `Batch.encode()` and,
since format 2, a 4-byte CRC of the batch header. The batch's own CRC covers what a producer
decides (payload, count, producer, sequence) but not the base offset and term the leader assigns;
a flipped bit in the term would silently change which entry this is, so the header gets its own
checksum on disk. Sub-db `meta` holds sealed records (msgpack behind a magic and a CRC, so a
flipped bit is found instead of read as a different term or vote):
- `meta`: term, vote, configuration, extra, and the directory's incarnation;
- `start`: [log start offset, term before it];
- `snapshot`: the state at the log start (storage.api.LogStorage.snapshot), written in the same
  transaction as `start`; a damaged one is treated like a damaged `start` (the log is cut whole
  and the node fetches the state from the leader);
- `tail`: [last flushed offset, its term], written in the same transaction as every change to the
  flushed log, so an open can tell a log that lost batches at its end from a shorter one;
- `floor`: [offset, term] of the last entry this log once held flushed, when it lost flushed
  batches after it (storage.api.LogStorage.lost_position);
- `format`: 2. A log written before format 2 (no `format` record but data) keeps format 1 for
  its batch records (no header CRC) and reads its unsealed records as they are.

Many logs in one environment (storage/lmdb_store.py; the store layout, introduced with
issue 26): group LEGACY_GROUP (1, the default topic's partition) is the log described above, in
DBs `log` and `meta`, byte for byte (a directory written by a single-log node IS a store holding
that group; it opens without migration, and its records and metadata are not rewritten: its
first open only adds the heads DB, storage/lmdb_heads.py). Every other group (the
controller, group 0, and partitions >= 2) lives in two more DBs, `glog` and `gmeta`, created with the first of
them: the same records under keys prefixed with the group's 8-byte big-endian id (`glog`:
prefix + base offset; `gmeta`: prefix + record name). Each such log records its own `format`
(2): the record format does not change, so no version is bumped; the store layout is told by
the DBs present (no `glog`: one log). A raftlog from before the store opens such a directory as
its legacy group only and ignores the other groups: do not downgrade a node that holds partitions.
Why prefixed keys and not a named DB per group: LMDB's own documentation of
mdb_env_set_maxdbs says a moderate number of named DBs is cheap but a huge number gets
expensive (every transaction costs 7-120 words per slot, every mdb_dbi_open searches the opened
slots linearly), and `max_dbs` is fixed when the environment opens, so a node could not add
partitions past it without reopening. A prefix costs 8 bytes per key and keeps one B-tree per
kind of record; one log's keys stay contiguous, so its scans, cuts and drops are range
operations (storage/lmdb_space.py bounds every cursor move to them).

Why an open cuts instead of refusing: a missing batch (a gap, or the log ending before its
recorded tail) or a batch header that fails its CRC is what a damaged disk leaves; the open cuts
the log before it (those batches are re-fetched from the leader like a crashed node's tail),
records the floor so the node never votes as if it had not held them, and reports what it found.
Overlapping batches or terms going backwards with every checksum intact are a software bug:
LogInconsistent, as before.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgpack

from storage.api import DiskFull, LogInconsistent, Meta, StorageError, StorageIOError
from storage.batch import HEADER_SIZE, Batch, BatchHead, CorruptBatch, check_encoding, head_of
from storage.damage import Damage
from storage import lmdb_heads as heads
from storage.lmdb_space import KeySpace

log = logging.getLogger("raftlog.storage")

KEY = struct.Struct(">Q")
# base_offset (q), count (I), term (q) at the head of every encoded batch (see storage.batch).
HEAD = struct.Struct("<qIq")
_CRC = struct.Struct("<I")
_BASE = struct.Struct("<q")
TRAILER = _CRC.size
assert TRAILER == heads.TRAILER
META_KEY, START_KEY, TAIL_KEY, FLOOR_KEY, FORMAT_KEY = (b"meta", b"start", b"tail", b"floor",
                                                         b"format")
SNAPSHOT_KEY = b"snapshot"  # the state at the log start (LogStorage.snapshot)
FORMAT = 2
_SEAL = b"RLS2"  # never the first byte of a msgpack map or array (the unsealed format 1 records)
PROGRESS_EVERY_S = 5.0


def key(offset: int) -> bytes:
    return KEY.pack(offset)


def new_incarnation() -> int:
    """A random, non-zero 63-bit identity for a data directory."""
    return (int.from_bytes(os.urandom(8), "big") >> 1) or 1


# Below this much free space, an I/O error from a write is taken for a full disk: LMDB reports a
# short write (part of a page fitted) as EIO, not ENOSPC.
NEARLY_FULL_BYTES = 8 << 20


def _nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < NEARLY_FULL_BYTES


def disk_error(path: str, what: str, e: BaseException) -> StorageError:
    """An LMDB or OS error while writing, as the storage error the runtime acts on."""
    code = getattr(e, "errno", None)
    text = str(e)
    short_write = (code == errno.EIO or "Input/output error" in text) and _nearly_full(path)
    if (isinstance(e, lmdb.DiskError) or code == errno.ENOSPC or "No space" in text
            or short_write):
        return DiskFull(
            f"{what}: writing {path} failed ({text}); free disk space or move the data "
            f"dir to a bigger disk, then retry. Nothing flushed before is lost; unflushed "
            f"batches stay in memory")
    return StorageIOError(
        f"{what}: writing {path} failed ({text}); nothing was changed, on disk or in "
        f"memory. Check the disk (kernel log, SMART) before restarting the node: its "
        f"flushed log is as it was before this write")


# -- batch records ------------------------------------------------------------------------------
def encode_value(batch: Batch, fmt: int = FORMAT) -> bytes:
    """The stored record: header, payload and (format 2) the header's own CRC. One join, so
    the payload is copied once (a flush of large batches spent as long in a second copy as in
    LMDB's own write of them)."""
    hdr = batch.header()
    if fmt < 2:
        return b"".join((hdr, batch.payload))
    return b"".join((hdr, batch.payload, _CRC.pack(zlib.crc32(hdr))))


def head(value: memoryview | bytes, fmt: int) -> tuple[int, int, int] | None:
    """(base, count, term) of a stored record, or None when its header is damaged."""
    need = HEADER_SIZE + (TRAILER if fmt >= 2 else 0)
    if len(value) < need:
        return None
    if fmt >= 2:
        (crc,) = _CRC.unpack_from(value, len(value) - TRAILER)
        if zlib.crc32(memoryview(value)[:HEADER_SIZE]) != crc:
            return None
    base, count, term = HEAD.unpack_from(value, 0)
    return (base, count, term) if count >= 1 else None


def decode_head(base: int, value: memoryview | bytes, fmt: int) -> BatchHead | None:
    """The header alone of the batch stored under `base` (LogStorage.read_heads), or None
    when it cannot be trusted by itself (a format 1 record has no header checksum; a damaged
    or mismatched header): then decode the whole value, which says what is wrong."""
    size = len(value) - TRAILER
    if fmt < 2 or size < HEADER_SIZE:
        return None
    (crc,) = _CRC.unpack_from(value, size)
    if zlib.crc32(memoryview(value)[:HEADER_SIZE]) != crc:
        return None
    return head_of(base, value, size)


def decode_value(base: int, value: memoryview | bytes, fmt: int) -> Batch:
    """The batch stored under `base`, every checksum checked; CorruptBatch names the offset."""
    with memoryview(value) as view:
        body = view[:len(value) - TRAILER] if fmt >= 2 else view
        _verify(base, body, value, fmt)  # on the map, before the copy: batch.check_encoding
        # One copy of header and payload together, the payload a view of it (keep): the copy
        # is then the batch's whole encoding, which Batch.encode hands out as it is, so a
        # leader sending what it read (recovery, issue 28) does not copy every byte again.
        raw = bytes(body)
        body.release()
    return Batch.decode(raw, keep=True, verify=False)


def verify_value(base: int, value: memoryview | bytes, fmt: int) -> int:
    """The last offset of the batch stored under `base`, every checksum checked where it lies
    (nothing copied: the scrubber's read); CorruptBatch names the offset."""
    with memoryview(value) as view:
        body = view[:len(value) - TRAILER] if fmt >= 2 else view
        count = _verify(base, body, value, fmt)
        body.release()
    return base + count - 1


def _verify(base: int, body: memoryview, value: memoryview | bytes, fmt: int) -> int:
    if head(value, fmt) is None:
        raise CorruptBatch(base, "its header fails its checksum")
    try:
        count = check_encoding(body)
    except CorruptBatch as e:
        raise CorruptBatch(base, e.reason) from None
    (stored,) = _BASE.unpack_from(body, 0)
    if stored != base:
        raise CorruptBatch(base, f"stored header says base offset {stored}")
    return count


# -- sealed records ------------------------------------------------------------------------------
def seal(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return _SEAL + _CRC.pack(zlib.crc32(body)) + body


def unseal(raw: bytes | memoryview, *, legacy: bool) -> Any:
    """The object in a sealed record (or, with `legacy`, an unsealed format 1 record).
    ValueError says what is wrong with a damaged one."""
    raw = bytes(raw)
    if raw.startswith(_SEAL):
        (crc,) = _CRC.unpack_from(raw, len(_SEAL))
        body = raw[len(_SEAL) + TRAILER:]
        if zlib.crc32(body) != crc:
            raise ValueError("it fails its checksum")
    elif legacy:
        body = raw
    else:
        raise ValueError("it is not a sealed record")
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 (msgpack raises several unrelated types)
        raise ValueError(f"it cannot be decoded ({type(e).__name__}: {e})") from None


def meta_to_record(meta: Meta, incarnation: int) -> dict[str, Any]:
    return {"term": meta.term, "voted_for": meta.voted_for, "config": meta.config,
            "extra": meta.extra, "incarnation": incarnation}


def meta_from_record(d: Any) -> Meta:
    try:
        return Meta(term=int(d["term"]), voted_for=d["voted_for"], config=d["config"],
                    extra=d["extra"], incarnation=int(d.get("incarnation") or 0))
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise ValueError(f"it has the wrong shape ({e!r})") from None


def _snapshot(d: Any) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"it is a {type(d).__name__}, not a map")
    return d


def write_start(txn: lmdb.Transaction, space: KeySpace, start: int, term: int,
                snapshot: dict | None) -> None:
    """The log start and the state there, in the caller's transaction (they change together)."""
    txn.put(space.meta_key(START_KEY), seal([start, term]), db=space.meta_db)
    if snapshot is None:
        txn.delete(space.meta_key(SNAPSHOT_KEY), db=space.meta_db)
    else:
        txn.put(space.meta_key(SNAPSHOT_KEY), seal(snapshot), db=space.meta_db)


def _position(d: Any) -> tuple[int, int]:
    try:
        offset, term = d
        return int(offset), int(term)
    except (TypeError, ValueError) as e:
        raise ValueError(f"it has the wrong shape ({e!r})") from None


# -- the open-time scan ---------------------------------------------------------------------------
@dataclass(slots=True)
class Scan:
    """What an open found. The log applies `cut_from`, `floor`, the tail and a new identity (when
    `meta` is None) in one transaction before it serves anything."""

    fmt: int
    start: int = 0
    start_term: int = 0
    last: int = -1
    last_term: int = 0
    term_firsts: list[int] = field(default_factory=list)
    term_terms: list[int] = field(default_factory=list)
    meta: Meta | None = None  # None: missing or damaged (the node forgot its term and vote)
    start_lost: bool = False  # the start record was damaged: the whole log is cut
    cut_from: int | None = None  # stored batches from this key on are dropped
    tail: tuple[int, int] | None = None
    floor: tuple[int, int] | None = None
    floor_changed: bool = False
    identity_lost: bool = False  # what this log held is not known: it must rejoin as new
    findings: list[str] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)
    batches: int = 0
    nbytes: int = 0  # encoded size of the batches kept (LogStorage.retained_bytes)
    snapshot: dict | None = None
    new: bool = False  # a brand-new environment
    heads_stale: bool = False  # the heads DB differs from the records: rebuilt by the open

    @property
    def needs_write(self) -> bool:
        return (self.new or self.meta is None or self.meta.incarnation == 0 or self.heads_stale
                or self.cut_from is not None or self.floor_changed or self.start_lost
                or self.tail != (self.last, self.last_term))


def scan(txn: lmdb.Transaction, space: KeySpace, path: str, verify_tail_bytes: int) -> Scan:
    """Read the metadata records and every batch header (checked, contiguous from the start,
    terms never going backwards), and fully verify the last `verify_tail_bytes` of batches."""
    cur = txn.cursor(db=space.log_db)
    meta_db = space.meta_db
    raw_fmt = txn.get(space.meta_key(FORMAT_KEY), db=meta_db)
    has_data = space.first(cur) or txn.get(space.meta_key(META_KEY), db=meta_db) is not None
    if raw_fmt is not None:
        try:
            fmt = int(unseal(raw_fmt, legacy=False))
        except (ValueError, TypeError):
            fmt = FORMAT  # only format 2 writes this record
    else:
        fmt = 1 if has_data else FORMAT
    s = Scan(fmt=fmt, new=raw_fmt is None and not has_data)
    legacy = fmt < 2

    def record(name: str, what: str, convert: Any) -> Any:
        raw = txn.get(space.meta_key(name), db=meta_db)
        if raw is None:
            return None
        try:
            return convert(unseal(raw, legacy=legacy))
        except ValueError as e:
            s.findings.append(f"the {what} record is damaged ({e})")
            return ValueError

    meta = record(META_KEY, "term/vote metadata", meta_from_record)
    s.meta = None if meta is ValueError else meta
    start = record(START_KEY, "log start", _position)
    tail = record(TAIL_KEY, "flushed tail", _position)
    floor = record(FLOOR_KEY, "lost position", _position)
    s.identity_lost = tail is ValueError or floor is ValueError
    s.tail = None if tail is ValueError else tail
    s.floor = None if floor is ValueError else floor
    snapshot = record(SNAPSHOT_KEY, "state at the log start", _snapshot)
    if start is ValueError or snapshot is ValueError:
        s.start_lost = True
        start = snapshot = None
    s.snapshot = snapshot
    s.start, s.start_term = start or (0, 0)
    check = heads.HeadsCheck.start(txn, space, fmt)
    _scan_batches(s, cur, space, path, check)
    s.heads_stale = check.finish(s.cut_from)
    _check_tail(s, cur, space, path)
    _verify_recent(s, cur, space, verify_tail_bytes)
    return s


def _scan_batches(s: Scan, cur: lmdb.Cursor, space: KeySpace, path: str,
                  check: heads.HeadsCheck) -> None:
    started = last_report = time.monotonic()
    last, last_term = s.start - 1, s.start_term
    if s.start_lost:
        s.cut_from = space.offset(cur.key()) if space.first(cur) else None
        s.start, s.start_term, last, last_term = 0, 0, -1, 0
    else:
        for key_base, v in (space.items(cur) if space.first(cur) else ()):
            h = head(v, s.fmt)
            if h is None or h[0] != key_base:
                s.cut_from = key_base
                s.findings.append(f"the batch header at offset {key_base} is damaged")
                break
            check.see(key_base, v)
            base, count, term = h
            end = base + count - 1
            if base > last + 1:
                s.cut_from = key_base
                s.findings.append(f"offsets {last + 1}..{base - 1} are missing")
                break
            if base < s.start:
                raise LogInconsistent(
                    path, f"the batch at offsets {base}..{end} lies before the log start "
                          f"offset {s.start} recorded with it", (base, end, s.start))
            if base <= last:
                raise LogInconsistent(
                    path, f"the batch at offsets {base}..{end} (term {term}) overlaps the batch "
                          f"ending at offset {last} (term {last_term})", (base, end, last))
            if term < last_term:
                raise LogInconsistent(
                    path, f"the term goes backwards at offset {base}: {term} after {last_term} "
                          f"(at offset {last})", (base, last))
            if not s.term_terms or s.term_terms[-1] != term:
                s.term_firsts.append(base)
                s.term_terms.append(term)
            last, last_term = end, term
            s.batches += 1
            s.nbytes += len(v) - (TRAILER if s.fmt >= 2 else 0)
            if s.batches % 4096 == 0 and time.monotonic() - last_report >= PROGRESS_EVERY_S:
                last_report = time.monotonic()
                log.info("opening_log path=%s batches=%d last_offset=%d elapsed_s=%.0f",
                         path, s.batches, last, last_report - started)
    s.last, s.last_term = last, last_term


def _check_tail(s: Scan, cur: lmdb.Cursor, space: KeySpace, path: str) -> None:
    """Metadata and log must agree: the stored log ends at the recorded flushed tail."""
    had: tuple[int, int] | None = None
    if s.cut_from is not None or s.start_lost:
        # (A cut past the recorded tail removes junk that was never flushed: nothing is lost.)
        had = s.tail if s.tail is None or s.tail[0] > s.last else None
        if s.tail is None and space.last(cur):  # format 1: what the last stored batch says
            h = head(cur.value(), s.fmt)
            had = (h[0] + h[1] - 1, h[2]) if h else None
        if had is None and s.tail is None and s.cut_from is not None:
            s.identity_lost = True  # it lost flushed entries and cannot tell which
    elif s.tail is not None and s.tail[0] > s.last:
        s.findings.append(f"offsets {s.last + 1}..{s.tail[0]} are missing: the log ends "
                          f"before the flushed offset {s.tail[0]} recorded with it")
        had = s.tail
    elif s.tail is not None and (s.tail[0] < s.last
                                 or (s.tail[0] == s.last and s.tail[1] != s.last_term)):
        raise LogInconsistent(
            path, f"the stored log ends at offset {s.last} (term {s.last_term}) but its "
                  f"metadata records offset {s.tail[0]} (term {s.tail[1]}) as the last flushed",
            (s.last, s.tail[0]))
    if had is not None and (s.floor is None or (had[1], had[0]) > (s.floor[1], s.floor[0])):
        s.floor, s.floor_changed = had, True


def _verify_recent(s: Scan, cur: lmdb.Cursor, space: KeySpace, budget: int) -> None:
    """Fully verify the newest flushed batches (those most likely still counted toward a commit
    in progress); older ones are the scrubber's."""
    if budget <= 0 or not space.last(cur):
        return
    used = 0
    while used < budget:
        base = space.offset(cur.key())
        assert base is not None  # (the cursor never leaves the log's keys)
        if s.cut_from is not None and base >= s.cut_from:
            if not space.prev(cur):
                return
            continue
        value = cur.value()
        used += len(value)
        try:
            decode_value(base, value, s.fmt)
        except CorruptBatch as e:
            h = head(value, s.fmt)
            assert h is not None  # the header passed the scan
            s.damaged.append(Damage(base, base + h[1] - 1, h[2], e.reason))
        if not space.prev(cur):
            return


def write_open_repairs(txn: lmdb.Transaction, space: KeySpace, s: Scan, meta: Meta,
                       where: str) -> None:
    """Cut what the open found lost, rebuild the heads when they differ from the records, and
    record the tail, the floor and the identity, in the open's one write transaction."""
    if s.cut_from is not None:  # both DBs walked: the heads may be the stale ones
        space.delete_from(txn.cursor(db=space.log_db), s.cut_from)
        space.delete_from(txn.cursor(db=space.heads_db), s.cut_from)
    if s.heads_stale:
        heads.rebuild(txn, space, s.fmt, where)
    meta_db, mk = space.meta_db, space.meta_key
    if s.new:
        txn.put(mk(FORMAT_KEY), seal(FORMAT), db=meta_db)
    if s.start_lost:
        write_start(txn, space, 0, 0, None)
    txn.put(mk(TAIL_KEY), seal([s.last, s.last_term]), db=meta_db)
    if s.floor is not None:
        txn.put(mk(FLOOR_KEY), seal(list(s.floor)), db=meta_db)
    txn.put(mk(META_KEY), seal(meta_to_record(meta, meta.incarnation)), db=meta_db)
