"""`LogStorage.read_heads`: the indexes' read of every committed batch (issue 28).

Batches of a kind the caller does not ask for in full come back from disk as their header
alone (offsets, kind, count, size: what the load and subscription indexes use of them), the
kinds asked for as whole batches; what the header says is what `read` says. A header that fails
its own checksum is damage as for `read`; a damaged payload is not the header read's to find.
"""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from storage import lmdb_format as fmt
from storage.batch import HEADER_SIZE, Batch, BatchHead, BatchKind, CorruptBatch
from storage.lmdb_log import LmdbLog
from storage.memory import MemoryLog

KINDS = [BatchKind.DATA, BatchKind.CONTROL, BatchKind.STAGED, BatchKind.DATA, BatchKind.NOOP]
FULL = frozenset((BatchKind.CONTROL,))


def mixed(log: LmdbLog | MemoryLog, flush_first: int) -> list[Batch]:
    """Batches of KINDS (two offsets each); the first `flush_first` flushed, the rest dirty."""
    got = [Batch.create(bytes([65 + i]) * (10 + i), 2, kind=k).placed(2 * i, 1)
           for i, k in enumerate(KINDS)]
    for i, b in enumerate(got):
        log.append([b])
        if i < flush_first:
            log.flush()
    return got


def fields(b: Batch | BatchHead) -> tuple:
    return (b.base_offset, b.last_offset, b.count, b.term, b.kind, b.size)


def rot(log: LmdbLog, base: int, at: int, heads_too: bool = False) -> None:
    """Flip a bit of the record under `base` (and, with `heads_too`, of its head's copy of the
    header: storage/lmdb_heads.py)."""
    def flip(txn: lmdb.Transaction) -> None:
        for db in (log._log_db, log._space.heads_db) if heads_too else (log._log_db,):
            raw = bytearray(txn.get(fmt.key(base), db=db))
            raw[at] ^= 0x01
            txn.put(fmt.key(base), bytes(raw), db=db)

    with log._write_lock:
        log._write("rot (test)", flip)


@pytest.mark.parametrize("from_disk", [False, True])  # the recent headers held, or LMDB's
def test_stored_batches_of_other_kinds_come_back_as_their_headers(tmp_path: Path,
                                                                  from_disk: bool) -> None:
    log = LmdbLog(tmp_path)
    try:
        got = mixed(log, flush_first=4)
        if from_disk:
            log._recent.clear()
        heads = log.read_heads(0, 1 << 20, None, FULL)
        assert [fields(h) for h in heads] == [fields(b) for b in got]
        assert [type(h) for h in heads[:4]] == [BatchHead, Batch, BatchHead, BatchHead]
        assert heads[1] == got[1]  # asked for in full: the whole batch, payload included
        assert heads[4] == got[4]  # still in memory: as appended
        # The bounds hold as for read: by batches, and by bytes (at least one batch).
        assert [fields(h) for h in log.read_heads(2, 1 << 20, 2, FULL)] == \
            [fields(b) for b in got[1:3]]
        assert len(log.read_heads(0, 1, None, FULL)) == 1
    finally:
        log.close()


def test_an_in_memory_log_returns_whole_batches(tmp_path: Path) -> None:
    log = MemoryLog()
    got = mixed(log, flush_first=3)
    assert log.read_heads(0, 1 << 20, None, FULL) == got


def test_a_damaged_payload_leaves_the_header_readable(tmp_path: Path) -> None:
    """The header has its own checksum: the index may count the batch; the reads that serve
    its payload (and the scrubber) find the damage."""
    log = LmdbLog(tmp_path, verify_tail_bytes=0)
    try:
        got = mixed(log, flush_first=5)
        rot(log, 0, HEADER_SIZE + 1)
        assert [fields(h) for h in log.read_heads(0, 1 << 20, None, FULL)] == \
            [fields(b) for b in got]
        with pytest.raises(CorruptBatch):
            log.read(0, 1 << 20)
    finally:
        log.close()


@pytest.mark.parametrize("base", [0, 2])  # a header-only kind, and a kind read in full
def test_a_damaged_header_is_damage_as_for_read(tmp_path: Path, base: int) -> None:
    log = LmdbLog(tmp_path, verify_tail_bytes=0)
    try:
        got = mixed(log, flush_first=5)
        # A byte of the stored term (only the header checksum covers it), in both copies of
        # the header: with the head's copy intact, a header-only read serves that copy
        # (tests/storage/test_lmdb_heads.py: the full reads and the scrubber find the record's).
        rot(log, base, 12, heads_too=True)
        # The newest flushed headers are also held in memory (storage/recent_heads.py) and
        # served as they were flushed; this is about what a read of the disk finds.
        log._recent.clear()
        with pytest.raises(CorruptBatch):
            log.read_heads(base, 1 << 20, None, FULL)
        assert [(d.first, d.last) for d in log.damaged()] == [(base, base + 1)]
        if base:  # a read from before it stops short of it
            before = log.read_heads(0, 1 << 20, None, FULL)
            assert [fields(h) for h in before] == [fields(b) for b in got[:base // 2]]
    finally:
        log.close()


def test_the_recent_headers_follow_cuts_new_starts_and_resets(tmp_path: Path) -> None:
    """What the flush leaves in memory (storage/recent_heads.py) is exactly the log: a suffix
    cut, a new start and a reset take from it what they take from the log, and a kind asked
    for in full of which only the header is held is read from LMDB."""
    log = LmdbLog(tmp_path)
    try:
        got = mixed(log, flush_first=5)
        staged_full = frozenset((BatchKind.CONTROL, BatchKind.STAGED))
        assert log.read_heads(0, 1 << 20, None, staged_full)[2] == got[2]  # its payload: LMDB
        log.truncate_suffix(5)  # flushed: the disk and the recent headers both lose 6..9
        assert [fields(h) for h in log.read_heads(0, 1 << 20, None, FULL)] == \
            [fields(b) for b in got[:3]]
        new = [Batch.create(b"n", 2).placed(6, 2)]
        log.append(new)
        log.flush()
        assert [fields(h) for h in log.read_heads(4, 1 << 20, None, FULL)] == \
            [fields(got[2]), fields(new[0])]
        log.advance_start(4, None)
        assert [fields(h) for h in log.read_heads(4, 1 << 20, None, FULL)] == \
            [fields(got[2]), fields(new[0])]
        log.reset(20, 3)
        log.append([Batch.create(b"r", 1).placed(20, 3)])
        log.flush()
        assert [(h.base_offset, h.term) for h in log.read_heads(20, 1 << 20, None, FULL)] == \
            [(20, 3)]
    finally:
        log.close()
