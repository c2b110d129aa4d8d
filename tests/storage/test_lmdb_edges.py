"""LmdbLog behaviour the model-based suite cannot reach: on-disk corruption, map growth, a full
map, and a flush running in a worker thread while appends, reads and truncations continue."""

from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest

from storage import open_log
from storage.api import DiskFull
from storage.batch import HEADER_SIZE, Batch, CorruptBatch
from storage.lmdb_log import LmdbLog


def batches(start: int, n: int, size: int = 100, term: int = 1, count: int = 2) -> list[Batch]:
    return [Batch.create(bytes([i % 256]) * size, count).placed(start + i * count, term)
            for i in range(n)]


def test_open_log_none_is_memory_and_path_is_lmdb(tmp_path: Path) -> None:
    from storage.memory import MemoryLog
    assert isinstance(open_log(None), MemoryLog)
    log = open_log(tmp_path / "x")
    assert isinstance(log, LmdbLog)
    log.close()
    log.close()  # idempotent


def test_corrupt_byte_on_disk_raises_naming_the_offset(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    log.append(batches(0, 10))
    log.flush()
    log.close()
    env = lmdb.open(str(tmp_path), subdir=True, max_dbs=4)
    db = env.open_db(b"log")
    key = (6).to_bytes(8, "big")  # the 4th batch, offsets 6..7
    with env.begin(write=True, db=db) as txn:
        raw = bytearray(txn.get(key))
        raw[HEADER_SIZE + 10] ^= 0xFF
        txn.put(key, bytes(raw))
    env.close()
    log = LmdbLog(tmp_path)
    try:
        two = 2 * (HEADER_SIZE + 100)  # exactly the first two batches
        assert [b.base_offset for b in log.read(0, two)] == [0, 2]  # before the damage: fine
        # A read stops before the damaged batch, and raises when it is the first one asked for.
        assert [b.base_offset for b in log.read(0, 1 << 20)] == [0, 2, 4]
        with pytest.raises(CorruptBatch) as err:
            log.read(6, 1 << 20)
        assert err.value.offset == 6 and "offset 6" in str(err.value)
        assert [(d.first, d.last) for d in log.damaged()] == [(6, 7)]
        with pytest.raises(CorruptBatch):
            log.read(7, 1)
        assert log.read(8, 1)[0].base_offset == 8
    finally:
        log.close()


def test_map_grows_past_a_tiny_initial_size(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path, map_size=64 << 10)
    for i in range(40):  # ~4 MiB through a 64 KiB initial map
        log.append(batches(i * 20, 10, size=10_000))
        log.flush()
    assert log.flushed_offset == 799
    log.close()
    log = LmdbLog(tmp_path, map_size=64 << 10)
    try:
        got = log.read(0, 1 << 30)
        assert len(got) == 400 and got[-1].last_offset == 799
    finally:
        log.close()


def test_full_map_is_disk_full_and_log_stays_readable(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path, map_size=256 << 10, max_map_size=512 << 10)
    log.append(batches(0, 5, size=1000))
    log.flush()
    log.append(batches(10, 100, size=10_000))
    with pytest.raises(DiskFull) as err:
        log.flush()
    msg = str(err.value)
    assert "max_map_size" in msg and "unflushed batches stay in memory" in msg
    # Nothing flushed before is lost; the unflushed tail is still readable; metadata still works.
    assert log.flushed_offset == 9 and log.dirty_offset == 209
    assert len(log.read(0, 1 << 30)) == 105
    # Retention frees room: drop the flushed prefix, cut the tail, and flushing works again.
    log.truncate_suffix(59)
    assert log.flush() == 59
    log.close()


def test_flush_in_thread_snapshots_the_tail(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    log.append(batches(0, 10))
    started, go = threading.Event(), threading.Event()
    real_write = log._write

    def gated_write(what, body):  # hold the flush inside its transaction until told to go
        started.set()
        assert go.wait(30)
        return real_write(what, body)

    log._write = gated_write  # type: ignore[method-assign]
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(log.flush()))
    t.start()
    assert started.wait(30)
    # While the flush is in flight: appends, reads and term lookups go on.
    log.append(batches(20, 5, term=2))
    assert log.dirty_offset == 29 and log.flushed_offset == -1
    assert len(log.read(0, 1 << 20)) == 15 and log.term_at(25) == 2
    go.set()
    t.join(30)
    log._write = real_write  # type: ignore[method-assign]
    assert result == [19]
    assert log.flushed_offset == 19 and log.dirty_offset == 29
    assert log.unflushed_bytes == sum(b.size for b in batches(20, 5))
    assert [b.base_offset for b in log.read(0, 1 << 20)] == list(range(0, 30, 2))
    log.close()
    log = LmdbLog(tmp_path)  # the later appends were never flushed: gone after a "crash"
    assert log.dirty_offset == 19
    log.close()


def test_truncate_waits_for_an_inflight_flush(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    log.append(batches(0, 10))
    started, go = threading.Event(), threading.Event()
    real_write = log._write
    calls: list[str] = []

    def gated_write(what, body):
        calls.append(what)
        if what.startswith("flush"):
            started.set()
            assert go.wait(30)
        return real_write(what, body)

    log._write = gated_write  # type: ignore[method-assign]
    flusher = threading.Thread(target=log.flush)
    flusher.start()
    assert started.wait(30)
    truncater = threading.Thread(target=log.truncate_suffix, args=(9,))
    truncater.start()
    go.set()
    flusher.join(30)
    truncater.join(30)
    # The truncation ran after the flush committed, so it cut the flushed batches on disk too.
    assert calls[0].startswith("flush") and calls[1].startswith("suffix truncation")
    assert log.flushed_offset == 9 and log.dirty_offset == 9
    log.close()
    log = LmdbLog(tmp_path)
    assert log.dirty_offset == 9 and len(log.read(0, 1 << 20)) == 5
    log.close()


def test_meta_survives_reopen(tmp_path: Path) -> None:
    from storage.api import Meta
    log = LmdbLog(tmp_path)
    meta = Meta(term=7, voted_for=3, config={"voters": [1, 2, 3], "addresses": {1: "a:1"}},
                extra={"k": b"v"})
    log.save_meta(meta)
    inc = log.incarnation
    log.close()
    log = LmdbLog(tmp_path)
    meta.incarnation = inc
    assert log.load_meta() == meta and log.incarnation == inc
    log.close()


class _SignallingLock:
    """The log's lock, saying when a thread starts to wait for it."""

    def __init__(self, lock: threading.RLock, waiting: threading.Event) -> None:
        self._lock, self._waiting = lock, waiting

    def __enter__(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            self._waiting.set()
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)


def test_the_last_term_is_read_with_its_dirty_offset_across_a_truncation(tmp_path: Path) -> None:
    """A follower's truncate_suffix runs on a worker thread while the event loop builds a
    reply: the last term must be looked up for the dirty offset as it is then, not for one
    read before the truncation (the node failed-stop with OffsetOutOfRange)."""
    log = open_log(tmp_path)
    log.append(batches(0, 5))  # offsets 0..9
    log.flush()
    real, waiting = log._lock, threading.Event()
    log._lock = _SignallingLock(real, waiting)  # type: ignore[assignment]
    got: list[object] = []
    with real:  # the truncating thread holds the log
        reader = threading.Thread(target=lambda: got.append(_try(log.last_term)))
        reader.start()
        assert waiting.wait(30), "the reader never asked for the lock"
        log.truncate_suffix(3)
    reader.join(30)
    log._lock = real  # type: ignore[assignment]
    assert got == [1] and log.dirty_offset == 3, got
    log.close()


def _try(fn):  # noqa: ANN001, ANN202
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the test reports it
        return e
