"""MemoryLog.fail_next: disk faults the simulation injects, with LmdbLog's disk-first semantics
(the contract suite's `failed_op` rule checks "a failed op changes nothing" for both logs; these
pin down when a fault fires and what a crash after it keeps)."""

from __future__ import annotations

import pytest

from storage import DiskFull, Meta, StorageIOError
from storage.batch import Batch
from storage.memory import MemoryLog


def batch(base: int, count: int, term: int = 1) -> Batch:
    return Batch.create(b"m" * 16, count).placed(base, term)


def flushed_log() -> MemoryLog:
    log = MemoryLog()
    log.append([batch(0, 1), batch(1, 5), batch(6, 5)])
    log.flush()
    return log


def test_the_scripted_truncation_fault_keeps_the_log_and_a_crash_keeps_the_disk() -> None:
    log = flushed_log()
    log.fail_next("truncate_suffix")
    with pytest.raises(StorageIOError) as err:
        log.truncate_suffix(0)
    assert "truncate_suffix" in str(err.value)
    assert (log.dirty_offset, log.flushed_offset, log.term_at(8)) == (10, 10, 1)
    with pytest.raises(ValueError):  # the new leader's batch cannot go over the stale one
        log.append([batch(1, 20, 2)])
    log.crash()
    assert [b.base_offset for b in log.read(0, 1 << 20)] == [0, 1, 6]
    log.truncate_suffix(0)  # the fault fired once; the retry works
    log.append([batch(1, 20, 2)])
    log.flush()
    log.crash()
    assert log.term_at(8) == 2 and log.dirty_offset == 20


def test_a_fault_waits_for_a_call_that_writes_the_disk() -> None:
    log = flushed_log()
    log.fail_next("flush", DiskFull)
    assert log.flush() == 10  # nothing to write: no disk step, the fault stays armed
    log.fail_next("truncate_suffix")
    log.append([batch(11, 2), batch(13, 2)])
    log.truncate_suffix(12)  # a cut inside the unflushed tail writes nothing durable
    log.fail_next("truncate_prefix")
    log.truncate_prefix(0)  # at the start: nothing to do
    assert log.pending_faults() == {"flush": 1, "truncate_suffix": 1, "truncate_prefix": 1}
    with pytest.raises(DiskFull):
        log.flush()
    assert (log.flushed_offset, log.dirty_offset, log.unflushed_bytes) == (
        10, 12, batch(11, 2).size)
    assert log.flush() == 12  # space is back
    log.clear_faults()
    assert log.pending_faults() == {}


def test_faults_fire_in_order_and_times() -> None:
    log = MemoryLog()
    first = DiskFull("first")
    log.fail_next("save_meta", first)
    log.fail_next("save_meta", StorageIOError, times=2)
    raised = []
    for _ in range(3):
        with pytest.raises((DiskFull, StorageIOError)) as err:
            log.save_meta(Meta(term=5))
        raised.append(err.value)
    assert raised[0] is first and all(type(e) is StorageIOError for e in raised[1:])
    assert log.load_meta() == Meta(incarnation=log.incarnation)
    log.save_meta(Meta(term=5))
    assert log.load_meta() == Meta(term=5, incarnation=log.incarnation)


def test_failed_reset_and_prefix_truncation_survive_a_crash_unchanged() -> None:
    log = flushed_log()
    log.append([batch(11, 2)])
    for op, call in [("reset", lambda: log.reset(40, 3)),
                     ("truncate_prefix", lambda: log.truncate_prefix(6))]:
        log.fail_next(op)
        with pytest.raises(StorageIOError):
            call()
        assert (log.start_offset, log.dirty_offset, log.flushed_offset) == (0, 12, 10)
    log.crash()
    assert (log.start_offset, log.dirty_offset) == (0, 10)


def test_bad_fault_requests_are_refused() -> None:
    log = MemoryLog()
    with pytest.raises(ValueError, match="unknown storage op 'append'"):
        log.fail_next("append")
    with pytest.raises(TypeError):
        log.fail_next("flush", OSError)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        log.fail_next("flush", times=0)
