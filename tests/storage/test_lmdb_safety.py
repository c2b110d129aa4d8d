"""LmdbLog safety: a failed disk step changes nothing (disk first, then memory), a broken log is
refused at open, flush never writes over a stored batch it does not know about, and a full disk
is not corruption.

The first test is the scripted reproduction of the bug that motivated this: truncate_suffix used
to lower the in-memory offsets before its on-disk delete, so when the delete failed, a term-2
batch 1..20 was later flushed over the stale term-1 batch 6..10, and the restarted node held
(0,t1) (1..20,t2) (6..10,t1) with term_at(8) == 1.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import lmdb
import msgpack
import pytest

from storage import open_log
from storage.api import DiskFull, LogInconsistent, Meta, StorageIOError
from storage.batch import Batch, CorruptBatch
from storage.lmdb_log import LmdbLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lmdb_inject import enospc, inject, io_error  # noqa: E402

SAFE_ADVICE = ("docs/DISK-LOSS.md",)


def batch(base: int, count: int, term: int, fill: bytes = b"x", size: int = 64) -> Batch:
    return Batch.create(fill * size, count).placed(base, term)


def scripted_term1(log: LmdbLog) -> list[Batch]:
    """Flush term-1 batches 0 | 1..5 | 6..10, one flush each."""
    got = [batch(0, 1, 1, b"a"), batch(1, 5, 1, b"b"), batch(6, 5, 1, b"c")]
    for b in got:
        log.append([b])
        log.flush()
    assert log.flushed_offset == 10
    return got


def write_raw(path: Path, batches: list[Batch], start: tuple[int, int] | None = None,
              meta: bytes | None = None) -> None:
    """Store batches (and a start record / raw metadata) directly, as a buggy writer might."""
    env = lmdb.open(str(path), subdir=True, max_dbs=4)
    log_db, meta_db = env.open_db(b"log"), env.open_db(b"meta")
    with env.begin(write=True) as txn:
        for b in batches:
            txn.put(b.base_offset.to_bytes(8, "big"), b.encode(), db=log_db)
        if start is not None:
            txn.put(b"start", msgpack.packb(list(start)), db=meta_db)
        if meta is not None:
            txn.put(b"meta", meta, db=meta_db)
    env.close()


def assert_safe_advice(text: str) -> None:
    """Every storage error points to the disk-loss page; since a node that lost its disk
    rejoins by itself (raft/core/incarnation.py), restarting one on an empty directory is what the
    advice says for a broken log, never "remove it first"."""
    for phrase in SAFE_ADVICE:
        assert phrase in text, (phrase, text)
    assert "remove-node" not in text


# -- the scripted reproduction --------------------------------------------------------------
def test_failed_suffix_truncation_changes_nothing_and_cannot_leave_a_stale_log(
        tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    term1 = scripted_term1(log)
    # The on-disk delete of the truncation to 0 fails (after it really deleted one key inside
    # its transaction, which the abort undoes).
    with inject(log, io_error(), at="delete") as fault, pytest.raises(StorageIOError) as err:
        log.truncate_suffix(0)
    assert fault.fired == 1
    assert "suffix truncation after 0" in str(err.value)
    # Memory still matches the untouched disk: nothing was lowered.
    assert (log.start_offset, log.dirty_offset, log.flushed_offset) == (0, 10, 10)
    assert log.unflushed_bytes == 0
    assert log.term_at(8) == 1 and log.last_term() == 1
    assert log.read(0, 1 << 20) == term1
    # So the new leader's term-2 batch at offset 1 cannot be appended over the stale one...
    term2 = batch(1, 20, 2, b"d")
    with pytest.raises(ValueError):
        log.append([term2])
    assert log.flush() == 10  # ...and a flush has nothing to write over it.
    log.close()

    # Restart (the runtime fail-stops on StorageIOError): the disk holds the term-1 log intact.
    log = LmdbLog(tmp_path)
    assert (log.dirty_offset, log.flushed_offset) == (10, 10)
    assert log.read(0, 1 << 20) == term1
    # The retried truncation succeeds, and the term-2 batch replaces the cut suffix for good.
    log.truncate_suffix(0)
    assert (log.dirty_offset, log.flushed_offset) == (0, 0)
    log.append([term2])
    assert log.flush() == 20
    log.close()
    log = LmdbLog(tmp_path)
    try:
        assert log.read(0, 1 << 20) == [term1[0], term2]
        assert log.term_at(8) == 2 and log.dirty_offset == 20 and log.flushed_offset == 20
    finally:
        log.close()


def test_the_stale_log_the_bug_left_is_refused_at_open(tmp_path: Path) -> None:
    """What the old ordering left on disk, (0,t1) (1..20,t2) (6..10,t1), is refused."""
    write_raw(tmp_path, [batch(0, 1, 1), batch(1, 20, 2), batch(6, 5, 1)])
    with pytest.raises(LogInconsistent) as err:
        LmdbLog(tmp_path)
    msg = str(err.value)
    assert "offsets 6..10" in msg and "ending at offset 20" in msg and str(tmp_path) in msg
    assert err.value.offsets == (6, 10, 20)
    assert_safe_advice(msg)


def test_failed_prefix_truncation_reset_and_meta_change_nothing(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    term1 = scripted_term1(log)
    log.append([batch(11, 2, 1)])  # an unflushed tail that must survive every failure
    meta = Meta(term=3, voted_for=2, config={"voters": [1, 2, 3]}, incarnation=log.incarnation)
    log.save_meta(meta)
    for what, call in [("prefix truncation", lambda: log.truncate_prefix(6)),
                       ("reset", lambda: log.reset(50, 4)),
                       ("metadata", lambda: log.save_meta(Meta(term=9)))]:
        with inject(log, io_error("mdb_put"), at="write") as fault, \
                pytest.raises(StorageIOError) as err:
            call()
        assert fault.fired == 1 and what in str(err.value)
        assert (log.start_offset, log.start_term) == (0, 0)
        assert (log.dirty_offset, log.flushed_offset) == (12, 10)
        assert log.read(0, 1 << 20) == [*term1, batch(11, 2, 1)]
        assert log.load_meta() == meta
    log.close()
    log = LmdbLog(tmp_path)
    try:
        assert log.read(0, 1 << 20) == term1 and log.load_meta() == meta
    finally:
        log.close()


# -- open refuses a broken log --------------------------------------------------------------
@pytest.mark.parametrize("stored, start, expect, offsets", [
    ([batch(0, 2, 1), batch(1, 3, 1)], None,
     "the batch at offsets 1..3 (term 1) overlaps the batch ending at offset 1", (1, 3, 1)),
    ([batch(4, 2, 1), batch(6, 2, 1)], (7, 1),
     "the batch at offsets 4..5 lies before the log start offset 7", (4, 5, 7)),
    ([batch(0, 2, 3), batch(2, 2, 2)], None,
     "the term goes backwards at offset 2: 2 after 3", (2, 1)),
    ([batch(5, 2, 1)], (5, 2), "the term goes backwards at offset 5: 1 after 2", (5, 4)),
], ids=["overlap", "before-start", "term-backwards", "below-start-term"])
def test_open_refuses_an_inconsistent_log(tmp_path: Path, stored: list[Batch],
                                          start: tuple[int, int] | None, expect: str,
                                          offsets: tuple[int, ...]) -> None:
    write_raw(tmp_path, stored, start)
    with pytest.raises(LogInconsistent) as err:
        open_log(tmp_path)
    assert expect in str(err.value)
    assert err.value.offsets == offsets
    assert_safe_advice(str(err.value))
    # The refused open released the directory: trying again refuses the same way (not locked).
    with pytest.raises(LogInconsistent):
        open_log(tmp_path)


# -- open repairs what a damaged disk leaves -------------------------------------------------
@pytest.mark.parametrize("stored, start, kept, lost, finding", [
    ([batch(0, 2, 1), batch(2, 3, 1), batch(7, 1, 2)], None, 4, (7, 2),
     "offsets 5..6 are missing"),
    ([batch(10, 2, 1)], (5, 1), 4, (11, 1), "offsets 5..9 are missing"),
], ids=["gap", "gap-after-start"])
def test_open_cuts_a_log_with_missing_batches_and_records_what_it_held(
        tmp_path: Path, stored: list[Batch], start: tuple[int, int] | None, kept: int,
        lost: tuple[int, int], finding: str) -> None:
    """Missing batches are what a damaged disk leaves: the log is cut before the gap (the
    leader sends the rest again) and the position it held is kept, so the node never votes as
    if it had not held those entries."""
    write_raw(tmp_path, stored, start)
    log = open_log(tmp_path)
    try:
        assert log.dirty_offset == log.flushed_offset == kept
        assert log.lost_position == lost
        assert any(finding in f for f in log.open_findings), log.open_findings
    finally:
        log.close()
    log = open_log(tmp_path)  # the cut and the lost position are durable
    try:
        assert log.dirty_offset == kept and log.lost_position == lost
        assert log.open_findings == []
    finally:
        log.close()


def test_open_gives_a_log_with_damaged_metadata_a_new_identity(tmp_path: Path) -> None:
    """Metadata that fails to decode is metadata lost: the node forgot its term and vote, so it
    gets a new identity (it rejoins as a new member); its batches stay."""
    log = open_log(tmp_path)
    old = log.incarnation
    log.append([batch(0, 1, 1)])
    log.flush()
    log.save_meta(Meta(term=4, voted_for=2))
    log._env.close()  # type: ignore[attr-defined]
    log._release_dir()  # type: ignore[attr-defined]
    write_raw(tmp_path, [], meta=b"RLS2\x00\x00\x00\x00 flipped bits")
    log = open_log(tmp_path)
    try:
        assert log.incarnation not in (0, old)
        assert log.load_meta() == Meta(incarnation=log.incarnation)
        assert log.read(0, 1 << 20) == [batch(0, 1, 1)]
        assert any("metadata record is damaged" in f for f in log.open_findings)
    finally:
        log.close()


def test_open_accepts_what_crashes_and_retention_leave(tmp_path: Path) -> None:
    """Contiguous from the start record, after a prefix truncation and a reset: opens fine."""
    log = LmdbLog(tmp_path)
    scripted_term1(log)
    log.truncate_prefix(6)
    log.append([batch(11, 4, 2)])
    log.flush()
    log.append([batch(15, 4, 2)])  # unflushed: a crash drops it
    log.close()
    log = LmdbLog(tmp_path)
    assert (log.start_offset, log.start_term, log.dirty_offset) == (6, 1, 14)
    log.reset(100, 3)
    log.close()
    log = LmdbLog(tmp_path)
    try:
        assert (log.start_offset, log.start_term, log.dirty_offset) == (100, 3, 99)
    finally:
        log.close()


def test_corrupt_batch_advice_points_to_the_disk_loss_page() -> None:
    assert_safe_advice(str(CorruptBatch(7, "crc mismatch")))


# -- flush refuses to write over a stored batch it does not know about ----------------------
def test_flush_refuses_when_the_disk_holds_batches_past_the_flushed_offset(
        tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    term1 = scripted_term1(log)
    # Make the disk disagree with memory (what the old truncation ordering could leave): a stale
    # stored batch past the flushed offset.
    with log._env.begin(write=True, db=log._log_db) as txn:
        txn.put((30).to_bytes(8, "big"), batch(30, 2, 1).encode())
    log.append([batch(11, 4, 2)])
    with pytest.raises(LogInconsistent) as err:
        log.flush()
    assert "found a stored batch at offset 30, past the flushed offset 10" in str(err.value)
    # Refused, not written: memory unchanged, the tail still there.
    assert (log.dirty_offset, log.flushed_offset) == (14, 10)
    assert log.read(0, 1 << 20) == [*term1, batch(11, 4, 2)]
    log.close()
    log = LmdbLog(tmp_path)  # the stale batch was never flushed (past the recorded tail): cut
    try:
        assert log.read(0, 1 << 20) == term1 and log.lost_position is None
        assert log.open_findings
    finally:
        log.close()


# -- a full disk is not corruption ----------------------------------------------------------
def test_enospc_flush_keeps_the_tail_and_a_later_flush_succeeds(tmp_path: Path) -> None:
    """The filesystem runs out of space during a flush running in a worker thread while the
    owning thread appends; once space is back the next flush writes everything."""
    log = LmdbLog(tmp_path)
    term1 = scripted_term1(log)
    log.append([batch(11, 4, 1)])
    unflushed = log.unflushed_bytes
    started, go = threading.Event(), threading.Event()
    real_write = log._write

    def gated_write(what, body):  # hold the flush until the appends below were made
        started.set()
        assert go.wait(30)
        return real_write(what, body)

    log._write = gated_write  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            log.flush()
        except BaseException as e:  # noqa: BLE001  (handed to the test thread)
            errors.append(e)

    with inject(log, enospc(), at="commit") as fault:
        t = threading.Thread(target=flush)
        t.start()
        assert started.wait(30)
        log.append([batch(15, 2, 2)])  # appends go on during the flush
        go.set()
        t.join(30)
    log._write = real_write  # type: ignore[method-assign]
    assert fault.fired == 1
    assert len(errors) == 1 and isinstance(errors[0], DiskFull), errors
    assert "unflushed batches stay in memory" in str(errors[0])
    # Consistent: flushed offset unchanged, the whole tail (both appends) still in memory.
    assert (log.flushed_offset, log.dirty_offset) == (10, 16)
    assert log.unflushed_bytes == unflushed + batch(15, 2, 2).size
    assert log.read(0, 1 << 20) == [*term1, batch(11, 4, 1), batch(15, 2, 2)]
    # Space is back: the next flush writes all of it.
    assert log.flush() == 16 and log.unflushed_bytes == 0
    log.close()
    log = LmdbLog(tmp_path)
    try:
        assert log.read(0, 1 << 20) == [*term1, batch(11, 4, 1), batch(15, 2, 2)]
    finally:
        log.close()


def test_full_map_flush_fails_then_succeeds_once_retention_frees_room(tmp_path: Path) -> None:
    limit = 256 << 10
    log = LmdbLog(tmp_path, map_size=limit, max_map_size=limit)
    flushed = [batch(i * 2, 2, 1, bytes([i]), 10_000) for i in range(10)]
    log.append(flushed)
    assert log.flush() == 19
    tail = [batch(20 + i * 2, 2, 1, bytes([i]), 10_000) for i in range(10)]
    log.append(tail)
    for _ in range(2):  # as often as it fails, it stays consistent
        with pytest.raises(DiskFull) as err:
            log.flush()
        assert "max_map_size" in str(err.value)
        assert (log.flushed_offset, log.dirty_offset) == (19, 39)
        assert log.unflushed_bytes == sum(b.size for b in tail)
        assert log.read(0, 1 << 30) == flushed + tail
    # Retention gives space back: LMDB reuses the pages a commit frees from the commit after
    # next, so one more durable write (metadata) makes them available to the flush.
    log.truncate_prefix(20)
    log.save_meta(Meta(term=1))
    assert log.flush() == 39
    log.close()
    log = LmdbLog(tmp_path, map_size=limit, max_map_size=limit)
    try:
        assert (log.start_offset, log.dirty_offset) == (20, 39)
        assert log.read(20, 1 << 30) == tail
    finally:
        log.close()


def test_io_error_is_not_reported_as_a_full_disk(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    log.append([batch(0, 1, 1)])
    with inject(log, io_error("mdb_txn_commit"), at="commit"), \
            pytest.raises(StorageIOError) as err:
        log.flush()
    assert not isinstance(err.value, DiskFull)
    assert "nothing was changed" in str(err.value)
    assert log.flush() == 0
    log.close()
