"""The background scrubber (raft/node/scrubber.py), on an in-memory log under trio's mock clock:
it finds a batch that rotted under it and wakes the core, keeps to its byte rate, and does not
re-read a small log in a tight loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from raft.node.scrubber import MIN_PASS_S, Scrubber
from storage.batch import Batch
from storage.memory import MemoryLog


class Host:
    def __init__(self, log: MemoryLog) -> None:
        self.node_id = 1
        self.closing = False
        self.log = log
        self.kicks = 0
        self.wakes = 0
        self.failure: BaseException | None = None
        self.calls = 0

    async def run_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls += 1
        return fn(*args)

    def fail(self, exc: BaseException, where: str) -> None:
        self.failure = exc

    def kick(self) -> None:
        self.kicks += 1

    def wake(self) -> None:
        """RaftGroup.wake: core.wake() (a quiesced core is not ticked) and a kick."""
        self.wakes += 1


def flushed_log(batches: int, size: int) -> MemoryLog:
    log = MemoryLog()
    for i in range(batches):
        log.append([Batch.create(bytes([i % 251]) * size, 1).placed(i, 1)])
    log.flush()
    return log


def run_for(host: Host, scrubber: Scrubber, seconds: float) -> None:
    async def main() -> None:
        with trio.move_on_after(seconds):
            await scrubber.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_finds_a_batch_that_rots_under_it_and_wakes_the_core() -> None:
    log = flushed_log(64, 4096)
    log.flip_bits(40)
    host = Host(log)
    scrubber = Scrubber(host, rate_mib_s=1.0, slice_bytes=16 << 10)
    run_for(host, scrubber, 5.0)
    assert [(d.first, d.last) for d in log.damaged()] == [(40, 40)]
    assert scrubber.stats.found == 1 and host.wakes == 1 and host.failure is None
    assert "offsets 40..40" in scrubber.status()["last_found"]
    assert scrubber.stats.passes >= 1


def test_keeps_to_its_byte_rate() -> None:
    log = flushed_log(256, 4096)  # about 1 MiB
    host = Host(log)
    scrubber = Scrubber(host, rate_mib_s=0.25, slice_bytes=64 << 10)
    run_for(host, scrubber, 2.0)
    # 2 s at 0.25 MiB/s: half a MiB (plus the slice that started the last sleep)
    assert 0.5 * (1 << 20) <= scrubber.stats.bytes_read <= 0.5 * (1 << 20) + (64 << 10) + 4200
    assert scrubber.stats.passes == 0


def test_a_small_log_is_not_reread_in_a_tight_loop() -> None:
    host = Host(flushed_log(2, 10))
    scrubber = Scrubber(host, rate_mib_s=64.0, slice_bytes=256 << 10)
    run_for(host, scrubber, 10.0)
    assert host.calls <= 10.0 / MIN_PASS_S + 1


def test_off_at_rate_zero_and_bad_settings_refused() -> None:
    host = Host(flushed_log(2, 10))
    run_for(host, Scrubber(host, rate_mib_s=0, slice_bytes=1024), 5.0)
    assert host.calls == 0
    with pytest.raises(ValueError):
        Scrubber(host, rate_mib_s=-1, slice_bytes=1024)
