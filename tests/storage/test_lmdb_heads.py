"""The heads DB (storage/lmdb_heads.py, issue 28): a copy of every stored record's header, kept
exactly in step with the records, so retention's plan and its prefix delete read no value.

- After every kind of write (flush, suffix cut, new start, reset, repair, a drop of another
  group), the heads of each log are exactly the heads of its records: legacy and prefixed key
  spaces, in one store. The writes put both in the same transaction (the code says so; here the
  invariant is checked after each operation and after a reopen).
- Retention's plan (read_heads) and the prefix delete never read a record of a kind not asked
  for in full: the log DB is wrapped to refuse (tests/storage/lmdb_untouched.py).
- A log written without heads (before this change) gets them at its first open, and reads,
  retention and truncation then work on it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from storage import lmdb_format as fmt
from storage import lmdb_heads as heads
from storage import open_store
from storage.api import LEGACY_GROUP
from storage.batch import HEADER_SIZE, Batch, BatchHead, BatchKind, CorruptBatch
from storage.lmdb_log import LmdbLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lmdb_untouched import Touched, values_untouched  # noqa: E402

FULL = frozenset((BatchKind.CONTROL,))


def batch(base: int, count: int = 2, term: int = 1, fill: bytes = b"x", size: int = 300,
          kind: BatchKind = BatchKind.DATA) -> Batch:
    return Batch.create(fill * size, count, kind=kind).placed(base, term)


def fill(log: Any, n: int, term: int = 1, fill_byte: bytes = b"x") -> list[Batch]:
    """n batches of two offsets each after the log's end, flushed."""
    out = []
    for _ in range(n):
        b = batch(log.dirty_offset + 1, term=term, fill=fill_byte)
        log.append([b])
        out.append(b)
    log.flush()
    return out


def assert_heads(*logs: Any) -> None:
    """The invariant, for every given log: its heads are exactly its records' heads."""
    for log in logs:
        with log._env.begin(buffers=True) as txn:
            heads.check(txn, log._space, log._fmt)


def rot(log: Any, base: int, at: int, db: Any = None) -> None:
    """Flip a bit of the record (or, with `db`, the head) stored under `base`."""
    db = db if db is not None else log._log_db
    key = log._space.key(base)

    def flip(txn: lmdb.Transaction) -> None:
        raw = bytearray(txn.get(key, db=db))
        raw[at] ^= 0x01
        txn.put(key, bytes(raw), db=db)

    with log._write_lock:
        log._write("rot (test)", flip)


def walk(log: Any, group: int) -> None:
    """Every write a log makes, the invariant checked after each."""
    logs = [log]
    got = fill(log, 6, fill_byte=bytes([97 + group % 26]))
    assert_heads(*logs)
    log.truncate_suffix(got[3].last_offset)  # flushed batches cut: their heads go too
    assert_heads(*logs)
    got = got[:4] + fill(log, 3, term=2)
    assert_heads(*logs)
    log.advance_start(got[2].base_offset)  # the plan's two steps
    log.persist_start()
    assert_heads(*logs)
    log.truncate_prefix(got[3].base_offset)
    assert_heads(*logs)
    rot(log, got[5].base_offset, HEADER_SIZE + 3)  # a payload bit: found, then repaired
    log.scrub(log.start_offset, 1 << 30)
    assert [d.first for d in log.damaged()] == [got[5].base_offset]
    log.repair([got[5]])
    assert_heads(*logs)
    log.reset(100, 3)
    assert_heads(*logs)
    fill(log, 2, term=3)
    assert_heads(*logs)


def test_the_heads_follow_every_write_of_a_single_log(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    try:
        walk(log, LEGACY_GROUP)
    finally:
        log.close()
    log = LmdbLog(tmp_path)  # nothing to rebuild: the open found them equal
    try:
        assert log.open_findings == []
        assert_heads(log)
        assert [b.base_offset for b in log.read(100, 1 << 20)] == [100, 102]
    finally:
        log.close()


def test_the_heads_of_many_logs_in_one_store_stay_apart(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        logs = {g: store.open_log(g) for g in (0, LEGACY_GROUP, 2, 3)}
        for g in (0, LEGACY_GROUP, 3):
            fill(logs[g], 3, fill_byte=b"n")
        walk(logs[2], 2)  # group 2's writes, between neighbours on both sides
        assert_heads(*logs.values())
        store.flush([logs[0], logs[3]])
        store.drop_log(3)
        assert_heads(logs[0], logs[LEGACY_GROUP], logs[2])
        with store.env.begin() as txn:  # the dropped group left no head behind
            cur = txn.cursor(db=store._gheads_db)
            assert {bytes(k)[:8] for k, _ in cur} == {(0).to_bytes(8, "big"),
                                                      (2).to_bytes(8, "big")}
    finally:
        store.close()
    store = open_store(tmp_path)
    try:
        logs = {g: store.open_log(g) for g in (0, LEGACY_GROUP, 2)}
        assert all(one.open_findings == [] for one in logs.values())
        assert_heads(*logs.values())
    finally:
        store.close()


def test_a_cut_at_open_cuts_the_heads_with_the_records(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path, verify_tail_bytes=0)
    try:
        got = fill(log, 5)
        rot(log, got[3].base_offset, 12)  # a bit of the stored term: the record's header
        # (the head still holds the good copy until the open finds the record damaged)
    finally:
        log.close()
    log = LmdbLog(tmp_path)
    try:
        assert log.dirty_offset == got[2].last_offset
        assert any("damaged" in f for f in log.open_findings)
        assert_heads(log)
    finally:
        log.close()


# -- no record read by retention ---------------------------------------------------------------
def cold(path: Path) -> LmdbLog:
    """The log reopened: nothing held in memory (storage/recent_heads.py), as at the cold front
    of a log larger than the page cache."""
    return LmdbLog(path, verify_tail_bytes=0)


@pytest.mark.parametrize("group", [LEGACY_GROUP, 5])
def test_the_plan_and_the_prefix_delete_read_no_record(tmp_path: Path, group: int) -> None:
    store = open_store(tmp_path)
    try:
        log = store.open_log(group)
        got = [batch(0, kind=BatchKind.DATA), batch(2, kind=BatchKind.CONTROL),
               batch(4, kind=BatchKind.NOOP, size=0), batch(6), batch(8)]
        log.append(got)
        log.flush()
    finally:
        store.close()
    store = open_store(tmp_path, verify_tail_bytes=0)
    try:
        log = store.open_log(group)
        with values_untouched(log, allowed={2}) as seen:
            out = log.read_heads(0, 1 << 20, None, FULL)
            assert [type(b) for b in out] == [BatchHead, Batch, BatchHead, BatchHead, BatchHead]
            assert [(b.base_offset, b.size) for b in out] == [(b.base_offset, b.size)
                                                             for b in got]
            assert out[1] == got[1]
            assert seen.gets == [2]  # the one kind asked for in full
            retained = log.retained_bytes
            log.advance_start(6)  # counted from the heads (no dropped_bytes given)
            assert log.retained_bytes == retained - sum(b.size for b in got[:3])
            log.persist_start()
            with pytest.raises(Touched):
                log.read(6, 1 << 20)  # the wrapper does refuse a read of a record
            log.truncate_suffix(7)  # (a cut of the end reads none either)
            log.truncate_prefix(8, None)
        assert log.read(8, 1 << 20) == []
        assert_heads(log)
    finally:
        store.close()


# -- damage in one copy of a header -------------------------------------------------------------
def test_a_header_damaged_in_one_copy_is_found_by_the_scrubber_and_repaired(
        tmp_path: Path) -> None:
    """The records are the truth: read_heads serves a head whose own checksum passes (its
    record may be damaged elsewhere: the full reads and the scrubber find that, as they find a
    damaged payload); a head failing its checksum is not served, its record is read instead.
    The scrubber reports a record whose head differs, and repair writes both."""
    log = LmdbLog(tmp_path, verify_tail_bytes=0)
    try:
        got = fill(log, 4)
        log._recent.clear()
        rot(log, got[0].base_offset, 12)  # the record's header (term)
        rot(log, got[2].base_offset, 12, db=log._space.heads_db)  # the head's
        out = log.read_heads(0, 1 << 20, None, FULL)
        assert [(b.base_offset, b.term, b.size) for b in out] == \
            [(b.base_offset, b.term, b.size) for b in got]
        assert isinstance(out[0], BatchHead) and isinstance(out[2], BatchHead)
        with pytest.raises(CorruptBatch):
            log.read(0, 1 << 20)
        found = log.scrub(0, 1 << 30)  # (the read found the first already)
        assert [(d.first, d.last) for d in found.damaged] == [
            (got[2].base_offset, got[2].last_offset)]
        assert [(d.first, d.last) for d in log.damaged()] == [
            (got[0].base_offset, got[0].last_offset), (got[2].base_offset, got[2].last_offset)]
        log.repair([got[0], got[2]])
        assert_heads(log)
        assert log.read(0, 1 << 20) == got
    finally:
        log.close()


# -- a log written before the heads ---------------------------------------------------------------
def written_without_heads(path: Path, group: int, n: int) -> list[Batch]:
    """A log written by this raftlog with the heads' writes patched out, then its heads DB
    emptied: what a directory from before the heads DB holds (the heads DB apart)."""
    real = heads.put_all
    heads.put_all = lambda *a, **kw: None  # type: ignore[assignment]
    try:
        store = open_store(path)
        try:
            log = store.open_log(group)
            got = [batch(2 * i, term=1 + i // 3) for i in range(n)]
            log.append(got)
            log.flush()
        finally:
            store.close()
    finally:
        heads.put_all = real  # type: ignore[assignment]
    return got


@pytest.mark.parametrize("group", [LEGACY_GROUP, 4])
def test_a_log_written_without_heads_gets_them_at_its_open(tmp_path: Path, group: int,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    got = written_without_heads(tmp_path, group, 8)
    env = lmdb.open(str(tmp_path), subdir=True, max_dbs=6)
    try:
        with env.begin() as txn:
            name = b"heads" if group == LEGACY_GROUP else b"gheads"
            assert txn.stat(env.open_db(name, txn=txn))["entries"] == 0
    finally:
        env.close()
    store = open_store(tmp_path, verify_tail_bytes=0)
    try:
        log = store.open_log(group)
        assert "built_log_heads" in caplog.text
        assert_heads(log)
        with values_untouched(log):
            assert [(b.base_offset, b.size) for b in log.read_heads(0, 1 << 20, None, FULL)] \
                == [(b.base_offset, b.size) for b in got]
            log.advance_start(6)
            log.persist_start()
            log.truncate_suffix(11)
        assert log.read(0 + 6, 1 << 20) == got[3:6]
        assert_heads(log)
    finally:
        store.close()


def test_a_log_written_before_format_2_gets_heads_and_reads_its_records(tmp_path: Path) -> None:
    """Format 1 (no header CRC, raw LMDB as test_lmdb_damage writes it): the heads are built,
    and the header reads still read the records (a head cannot be trusted by itself there)."""
    from test_lmdb_damage import write_format_1

    old = [batch(0), batch(2), batch(4)]
    write_format_1(tmp_path, old)
    log = LmdbLog(tmp_path)
    try:
        assert log._fmt == 1
        assert_heads(log)
        assert log.read_heads(0, 1 << 20, None, FULL) == old
        log.truncate_prefix(2)
        log.truncate_suffix(3)
        assert log.read(0 + 2, 1 << 20) == [old[1]] and log.retained_bytes == old[1].size
        assert_heads(log)
    finally:
        log.close()
