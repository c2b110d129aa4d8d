"""Reads of flushed batches hold no lock of the log while they read LMDB (storage/lmdb_reads.py).

Why: once the logs outgrow the page cache, a read of old batches (a catch-up, retention's plan,
the scrubber) waits on the disk page by page. It once held the log's lock through that, and the
event loop's term lookups waited on it: the leader's loop stalled 0.4-1.1 s and lost leadership
in the default `bench produce` run (issue 28). Each test parks a reader inside its LMDB read (in
the decode or checksum of a stored batch) and checks what the owner can do meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from storage import lmdb_format
from storage.batch import HEADER_SIZE, Batch, BatchKind, CorruptBatch
from storage.lmdb_log import LmdbLog
from storage.memory import MemoryLog
from storage.read_gate import ReadGate
from test_read_heads import rot


def batch(off: int, term: int = 1, size: int = 64) -> Batch:
    return Batch.create(bytes([off % 251]) * size, 1, kind=BatchKind.DATA, timestamp_ms=off,
                        producer_id=0, sequence=-1).placed(off, term)


class Parked:
    """Within `with`, `lmdb_format.<name>`'s first call waits until `go` is set (always set on
    the way out, so a failing check never leaves a reader parked)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inside = threading.Event()
        self.go = threading.Event()
        self.real: Callable[..., Any] = getattr(lmdb_format, name)

    def _parked(self, *args: Any) -> Any:
        if not self.inside.is_set():
            self.inside.set()
            assert self.go.wait(30), "the test never released the parked reader"
        return self.real(*args)

    def __enter__(self) -> Parked:
        setattr(lmdb_format, self.name, self._parked)
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        setattr(lmdb_format, self.name, self.real)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


@contextmanager
def ten_flushed(tmp_path: Path) -> Iterator[LmdbLog]:
    lg = LmdbLog(tmp_path / "log")
    try:
        lg.append([batch(i) for i in range(10)])
        lg.flush()
        yield lg
    finally:
        lg.close()


def owner_meanwhile(tmp_path: Path, parked_in: str, call: Callable[[LmdbLog], Any]) -> Any:
    """Run `call` in a thread until it is parked inside its LMDB read (in `parked_in`), check
    that the owner's lock is free and its lookups and appends go on, then let it finish."""
    with ten_flushed(tmp_path) as log:
        with Parked(parked_in) as park:
            t, out = in_thread(lambda: call(log))
            assert park.inside.wait(30)
            assert log._lock.acquire(blocking=False)
            log._lock.release()
            assert log.term_at(9) == 1 and log.last_term() == 1
            log.append([batch(10)])
        t.join(30)
        return out[0]


def test_a_read_of_flushed_batches_leaves_the_log_free_while_it_reads(tmp_path: Path) -> None:
    got = owner_meanwhile(tmp_path, "decode_value", lambda log: log.read(2, 1 << 20))
    assert [b.base_offset for b in got] == list(range(2, 11))


def test_a_scrub_leaves_the_log_free_while_it_checks(tmp_path: Path) -> None:
    got = owner_meanwhile(tmp_path, "verify_value", lambda log: log.scrub(0, 1 << 20))
    assert got.damaged == () and got.wrapped


def test_a_read_begun_before_a_suffix_cut_returns_a_prefix_of_the_old_log(
        tmp_path: Path) -> None:
    with ten_flushed(tmp_path) as log:
        with Parked("decode_value") as park:
            t, out = in_thread(lambda: log.read(5, 1 << 20))
            assert park.inside.wait(30)
            # Meanwhile a new leader's log replaces the end: cut after 6, append 7..14 in term 2.
            log.truncate_suffix(6)
            log.append([batch(i, term=2) for i in range(7, 15)])
        t.join(30)
        # What the read's snapshot held (5..9 of term 1), and nothing of the new end after it:
        # 5..9 then 10..14 would be a log that never existed.
        assert [(b.base_offset, b.term) for b in out[0]] == [(i, 1) for i in range(5, 10)]


def test_map_growth_waits_for_the_readers_inside_and_new_readers_wait_for_it() -> None:
    gate = ReadGate()
    gate.enter()
    grown = threading.Event()

    def grow() -> None:
        with gate:
            grown.set()

    t = threading.Thread(target=grow, daemon=True)
    t.start()
    while not gate._exclusive:  # the grower is waiting for the reader inside
        t.join(0.001)
    assert not grown.is_set()
    entered = threading.Event()
    r = threading.Thread(target=lambda: (gate.enter(), entered.set(), gate.leave()),
                         daemon=True)
    r.start()
    assert not entered.is_set() or grown.is_set()
    gate.leave()  # the reader inside leaves: the growth runs, then the waiting reader
    t.join(30)
    r.join(30)
    assert grown.is_set() and entered.is_set() and gate.readers == 0


def test_a_wrong_figure_of_dropped_bytes_is_refused(tmp_path: Path) -> None:
    with ten_flushed(tmp_path) as log:
        check_dropped_bytes(log)


def check_dropped_bytes(log: LmdbLog) -> None:
    mem = MemoryLog()
    mem.append([batch(i) for i in range(10)])
    mem.flush()
    exact = sum(batch(i).size for i in range(4))
    mem.advance_start(4, None, exact + 1)  # the in-memory log counts for itself
    assert mem.retained_bytes == sum(batch(i).size for i in range(4, 10))
    with pytest.raises(ValueError, match="drops"):  # more than the log holds flushed
        log.advance_start(4, None, 1 << 30)
    log.advance_start(4, None, exact)
    assert log.retained_bytes == mem.retained_bytes and log.start_offset == 4


def test_a_new_start_inside_a_batch_is_refused_from_the_keys_alone(tmp_path: Path) -> None:
    """Retention's cut checks the batch boundary on the event loop from the keys, without
    reading the batch there (`_starts_batch_locked`); inside a batch it is still refused."""
    lg = LmdbLog(tmp_path / "log")
    try:
        lg.append([Batch.create(b"ab", 2).placed(2 * i, 1) for i in range(4)])  # 0-1 .. 6-7
        lg.flush()
        with pytest.raises(ValueError, match="batch boundary"):
            lg.advance_start(3, None)
        lg.advance_start(4, None)
        assert lg.start_offset == 4 and lg.read(4, 1 << 20)[0].base_offset == 4
    finally:
        lg.close()


def readers_in_use(log: LmdbLog) -> int:
    """Slots of LMDB's reader table taken (by an open or a reset transaction)."""
    return len(log._env.readers().splitlines()) - 1  # (a header line, then one per slot)


def test_a_failed_read_kept_alive_holds_no_reader_slot(tmp_path: Path) -> None:
    """A read that fails (a damaged batch, here) returns its LMDB reader slot at once, even
    while its exception, and with it the frames of the read, stays alive. Why: py-lmdb frees an
    aborted transaction's slot only when the Transaction object dies; a worker thread's failed
    reads, kept alive by a reference cycle until the cyclic collector ran, took all 126 slots
    in seconds and stopped the node on MDB_READERS_FULL (storage/lmdb_reads.py, Snapshot)."""
    lg = LmdbLog(tmp_path / "log")
    kept: list[BaseException] = []
    try:
        lg.append([batch(i) for i in range(10)])
        lg.flush()
        rot(lg, 4, HEADER_SIZE + 1)  # its payload: the header still reads
        for _ in range(200):  # more than the table's 126 slots
            for call in (lambda: lg.read(4, 1 << 20), lambda: lg.scrub(4, 1 << 20),
                         lambda: lg.read_heads(4, 1 << 20, None, frozenset(BatchKind))):
                try:
                    call()
                except CorruptBatch as e:
                    kept.append(e)
        assert kept, "the damaged batch was never refused"
        assert readers_in_use(lg) <= 1  # (py-lmdb keeps one reset transaction for reuse)
        assert [b.base_offset for b in lg.read(0, 1 << 20)] == [0, 1, 2, 3]
    finally:
        kept.clear()
        lg.close()
