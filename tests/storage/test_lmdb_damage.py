"""What LmdbLog's open does with a damaged disk, and repair across reopens (docs/DISK-LOSS.md).

Each test damages a closed log the way a disk can (a flipped bit in a batch header, in a
payload, in the metadata; batches missing at the end or in the middle) and checks the open:
nothing damaged is served, what was lost is cut and its position kept (so the node never votes
as if it had not held it), lost metadata gets a new identity, and a repaired batch stays
repaired after a reopen.
"""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from storage import lmdb_format as fmt
from storage.api import DiskFull, Meta, StorageIOError
from storage.batch import HEADER_SIZE, Batch, CorruptBatch
from storage.lmdb_log import LmdbLog


def batch(base: int, count: int, term: int, fill: bytes = b"x", size: int = 64) -> Batch:
    return Batch.create(fill * size, count).placed(base, term)


def filled(path: Path, n: int = 6) -> list[Batch]:
    """A closed log of n flushed batches of two offsets each, terms 1 then 2."""
    log = LmdbLog(path)
    got = [batch(2 * i, 2, 1 if i < n // 2 else 2, bytes([65 + i])) for i in range(n)]
    for b in got:
        log.append([b])
        log.flush()
    log.save_meta(Meta(term=2, voted_for=1))
    log.close()
    return got


def poke(path: Path, key: bytes, at: int, db: bytes = b"log") -> None:
    """Flip a byte of a stored record (at a negative index: from its end)."""
    env = lmdb.open(str(path), subdir=True, max_dbs=4)
    d = env.open_db(db)
    with env.begin(write=True, db=d) as txn:
        raw = bytearray(txn.get(key))
        raw[at] ^= 0x10
        txn.put(key, bytes(raw))
    env.close()


def drop_keys(path: Path, bases: list[int]) -> None:
    env = lmdb.open(str(path), subdir=True, max_dbs=4)
    d = env.open_db(b"log")
    with env.begin(write=True, db=d) as txn:
        for b in bases:
            txn.delete(fmt.key(b))
    env.close()


def test_a_flipped_header_bit_cuts_the_log_and_keeps_the_position_held(tmp_path: Path) -> None:
    """The term of a batch is not covered by the batch's own CRC: the stored header CRC finds
    the flip, and the log is cut before that batch (its term is not known any more)."""
    got = filled(tmp_path)
    poke(tmp_path, fmt.key(6), 12)  # a byte of the stored term of the batch at offset 6
    log = LmdbLog(tmp_path)
    try:
        assert log.dirty_offset == log.flushed_offset == 5
        assert log.read(0, 1 << 20) == got[:3]
        assert log.lost_position == (11, 2)  # the flushed tail it held
        assert log.load_meta().term == 2  # its term and vote are intact: same identity
        assert any("header at offset 6 is damaged" in f for f in log.open_findings)
    finally:
        log.close()


def test_a_flipped_payload_bit_in_the_newest_batches_is_found_at_open(tmp_path: Path) -> None:
    got = filled(tmp_path)
    poke(tmp_path, fmt.key(8), HEADER_SIZE + 3)
    log = LmdbLog(tmp_path)
    try:
        assert [(d.first, d.last, d.term) for d in log.damaged()] == [(8, 9, 2)]
        assert log.flushed_offset == 11 and log.lost_position is None  # not cut: repairable
        assert log.read(0, 1 << 20) == got[:4]  # stops before the damage
        with pytest.raises(CorruptBatch):
            log.read(8, 1)
        log.repair([got[4]])
        assert log.read(0, 1 << 20) == got
    finally:
        log.close()
    log = LmdbLog(tmp_path)  # the repair is durable
    try:
        assert log.damaged() == [] and log.read(0, 1 << 20) == got
    finally:
        log.close()


def test_batches_missing_at_the_end_are_found_against_the_recorded_tail(tmp_path: Path) -> None:
    """Metadata and log must agree: a log ending before its recorded flushed tail lost
    batches (a truncated file), so the position it held is kept."""
    got = filled(tmp_path)
    drop_keys(tmp_path, [8, 10])
    log = LmdbLog(tmp_path)
    try:
        assert log.dirty_offset == 7 and log.read(0, 1 << 20) == got[:4]
        assert log.lost_position == (11, 2)
        assert any("offsets 8..11 are missing" in f for f in log.open_findings)
        log.append([batch(8, 2, 3)])  # and it takes new entries as usual
        log.flush()
    finally:
        log.close()
    log = LmdbLog(tmp_path)
    try:
        assert log.dirty_offset == 9 and log.lost_position == (11, 2) and not log.open_findings
    finally:
        log.close()


def test_damaged_metadata_is_lost_metadata_a_new_identity(tmp_path: Path) -> None:
    filled(tmp_path)
    log = LmdbLog(tmp_path)
    old = log.incarnation
    log.close()
    poke(tmp_path, b"meta", -2, db=b"meta")  # a bit of the term/vote record's msgpack body
    log = LmdbLog(tmp_path)
    try:
        assert log.incarnation not in (0, old)
        assert log.load_meta().is_empty()
        assert log.dirty_offset == 11  # the batches are kept: the leader decides what stays
    finally:
        log.close()
    log = LmdbLog(tmp_path)
    try:
        assert log.incarnation not in (0, old) and not log.open_findings  # stable from now on
    finally:
        log.close()


def test_a_damaged_batch_found_by_the_scrubber_under_a_running_log(tmp_path: Path) -> None:
    """Rot after the open (and its check of the newest batches): a scrub slice finds it."""
    got = filled(tmp_path)
    log = LmdbLog(tmp_path, verify_tail_bytes=0)
    try:
        poke_running(log, 2)
        seen = log.scrub(0, 1 << 20)
        assert seen.wrapped and [(d.first, d.last) for d in seen.damaged] == [(2, 3)]
        assert log.scrub(0, 1 << 20).damaged == ()  # reported once
        log.repair([got[1]])
        assert log.scrub(0, 1 << 20).damaged == () and log.damaged() == []
    finally:
        log.close()


def poke_running(log: LmdbLog, base: int) -> None:
    def rot(txn: lmdb.Transaction) -> None:
        raw = bytearray(txn.get(fmt.key(base), db=log._log_db))
        raw[HEADER_SIZE + 1] ^= 0x01
        txn.put(fmt.key(base), bytes(raw), db=log._log_db)

    with log._write_lock:
        log._write("rot (test)", rot)


def write_format_1(path: Path, batches: list[Batch]) -> None:
    """A log as raftlog wrote it before format 2, in raw LMDB: no format record, unsealed
    records, batches without a header CRC."""
    import msgpack

    env = lmdb.open(str(path), subdir=True, max_dbs=4)
    log_db, meta_db = env.open_db(b"log"), env.open_db(b"meta")
    with env.begin(write=True) as txn:
        for b in batches:
            txn.put(fmt.key(b.base_offset), b.encode(), db=log_db)
        txn.put(b"meta", msgpack.packb({"term": 1, "voted_for": 2, "config": None,
                                        "extra": {}}), db=meta_db)
    env.close()


def test_a_log_written_before_format_2_still_opens(tmp_path: Path) -> None:
    """No format record, unsealed records, batches without a header CRC: read as they are."""
    old = [batch(0, 1, 1), batch(1, 3, 1)]
    write_format_1(tmp_path, old)
    log = LmdbLog(tmp_path)
    try:
        assert log.read(0, 1 << 20) == old
        assert log.load_meta().term == 1 and log.incarnation != 0
        log.append([batch(4, 1, 1)])
        log.flush()
        assert log.read(0, 1 << 20) == [*old, batch(4, 1, 1)]
    finally:
        log.close()


def test_a_short_write_on_a_nearly_full_disk_is_a_full_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LMDB reports a page that only partly fitted as EIO: with the disk nearly full that is a
    full disk (retried), not an I/O error (fail-stop)."""
    eio = lmdb.Error("mdb_txn_commit: Input/output error")
    assert isinstance(fmt.disk_error(str(tmp_path), "flush", eio), StorageIOError)
    monkeypatch.setattr(fmt, "_nearly_full", lambda path: True)
    assert isinstance(fmt.disk_error(str(tmp_path), "flush", eio), DiskFull)
