"""recovery.stream: a chunk fills its byte budget with round-sized batches (issue 28: a hard
budget sent 3 client batches of 256 KiB per 1 MiB append and 1 per 512 KiB recovery chunk,
because each batch's framing and header put the next one a few bytes over), and never runs
more than an eighth over it."""

from __future__ import annotations

from recovery.stream import StreamLimits, next_chunk
from storage.batch import Batch
from storage.memory import MemoryLog

RECORDS = 256
PAYLOAD = b"\x00" * ((256 << 10) + 5 * RECORDS)  # 256 KiB of 1 KiB values, msgpack-framed


def _log(n: int) -> MemoryLog:
    log = MemoryLog()
    log.append([Batch.create(PAYLOAD, RECORDS).placed(i * RECORDS, 1) for i in range(n)])
    return log


def test_round_sized_batches_fill_an_append_and_a_recovery_chunk() -> None:
    log = _log(10)
    limits = StreamLimits(max_append_bytes=1 << 20, recovery_chunk_bytes=512 << 10)
    append = next_chunk(log, 0, replicating=True, recovering=False, limits=limits)
    assert append is not None and len(append.batches) == 4
    recovery = next_chunk(log, 0, replicating=True, recovering=True, limits=limits)
    assert recovery is not None and len(recovery.batches) == 2 and not recovery.flush


def test_a_chunk_never_runs_more_than_an_eighth_over_its_budget() -> None:
    log = _log(20)
    for budget in (300 << 10, 600 << 10, 1 << 20, 3 << 20):
        limits = StreamLimits(max_append_bytes=budget, recovery_chunk_bytes=budget)
        chunk = next_chunk(log, 0, replicating=True, recovering=False, limits=limits)
        assert chunk is not None
        assert chunk.nbytes <= budget + budget // 8
        # ... and is as full as that allows: one more batch would have run over it.
        assert chunk.nbytes + chunk.batches[0].size > budget + budget // 8


def test_one_batch_larger_than_the_budget_still_moves() -> None:
    log = _log(3)
    limits = StreamLimits(max_append_bytes=64 << 10, recovery_chunk_bytes=64 << 10)
    chunk = next_chunk(log, 0, replicating=True, recovering=True, limits=limits)
    assert chunk is not None and len(chunk.batches) == 1
