"""A suffix truncation while the start is advanced but not yet persisted (advance_start without
persist_start, or a two-step prefix truncation whose disk half failed): the disk still holds the
flushed batches below the live start, and a crash must bring them back with the durable start.

MemoryLog once rewrote its durable list as "the live batches" on a durable suffix cut, which
dropped those retired batches: the restart then found the durable start with no batches after
it (or a gap) and reported flushed data as lost. The contract suite found it on
memory-store-g0; the first test replays its saved example step by step, the second checks the
rule on every implementation, for a cut at the live start and one inside the live log.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from storage import open_store
from storage.api import StorageIOError
from storage.batch import Batch, BatchKind
from storage.memory import MemoryLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmdb_inject  # noqa: E402


def batch(off: int) -> Batch:
    """As the contract suite's `append` makes them (empty payload, count 1, term 1)."""
    return Batch.create(b"", 1, kind=BatchKind.DATA, timestamp_ms=off, producer_id=off % 3,
                        sequence=off).placed(off, 1)


def test_the_contract_example_keeps_the_flushed_batch_below_an_unpersisted_start() -> None:
    store: Any = open_store(None, max_tail_bytes=6000)
    log = store.open_log(0)
    b0, b1 = batch(0), batch(1)
    log.append([b0, b1])
    assert log.flush(upto=1) == 1
    # The two-step prefix truncation: the live start moves, the disk half fails.
    log.advance_start(1, {"at": 1})
    log.fail_next("truncate_prefix", StorageIOError)
    with pytest.raises(StorageIOError):
        log.persist_start()
    assert (log.start_offset, log.dirty_offset, log.flushed_offset) == (1, 1, 1)
    # The flushed batch at 1 rots, a scrub finds it, a good copy repairs it.
    log.flip_bits(1)
    got = log.scrub(log.start_offset, 1)
    assert [(d.first, d.last) for d in got.damaged] == [(1, 1)]
    log.repair([b1])
    assert log.damaged() == [] and log.read(1, 1 << 20) == [b1]
    # A durable cut at the live start: offset 0 stays flushed (on disk, below the live start).
    log.truncate_suffix(0)
    assert (log.start_offset, log.dirty_offset, log.flushed_offset) == (1, 0, 0)
    store.crash()
    log = store.open_log(0)
    assert (log.start_offset, log.start_term, log.snapshot) == (0, 0, None)
    assert (log.dirty_offset, log.flushed_offset) == (0, 0)
    assert log.read(0, 1 << 20) == [b0]
    assert log.lost_position is None and log.open_findings == []


@pytest.mark.parametrize("after", [0, 1], ids=["at-the-live-start", "inside-the-live-log"])
@pytest.mark.parametrize("impl", ["memory", "memory-store", "lmdb-store"])
def test_a_durable_suffix_cut_keeps_what_an_unpersisted_start_retired(
        impl: str, after: int, tmp_path: Path) -> None:
    if impl == "memory":
        store, log = None, MemoryLog()
    else:
        store = open_store(None if impl == "memory-store" else tmp_path, map_size=1 << 20)
        log = store.open_log(0)
    batches = [batch(o) for o in range(4)]
    log.append(batches)
    log.flush()
    log.advance_start(1, {"at": 1})
    # The disk half of the prefix truncation fails: the disk keeps its start, 0.
    if impl == "lmdb-store":
        with lmdb_inject.inject(log, lmdb_inject.io_error(), at="write"), \
                pytest.raises(StorageIOError):
            log.persist_start()
    else:
        log.fail_next("truncate_prefix")
        with pytest.raises(StorageIOError):
            log.persist_start()
    log.truncate_suffix(after)
    assert (log.start_offset, log.dirty_offset, log.flushed_offset) == (1, after, after)
    if impl == "memory":
        log.crash()
    elif impl == "memory-store":
        store.crash()
        log = store.open_log(0)
    else:
        store.close()  # no flush: as a process crash
        store = open_store(tmp_path, map_size=1 << 20)
        log = store.open_log(0)
    assert (log.start_offset, log.start_term, log.snapshot) == (0, 0, None)
    assert (log.dirty_offset, log.flushed_offset) == (after, after)
    assert log.read(0, 1 << 20) == batches[:after + 1]
    assert log.lost_position is None and log.open_findings == []
    if store is not None:
        store.close()
