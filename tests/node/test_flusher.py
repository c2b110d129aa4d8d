"""The node's flusher (raft/node/flusher.py): group commit across the node's groups.

Fake groups stand in for RaftGroup (what the flusher calls on them is FlushClient); the logs are
real, in one MemoryStore or one LmdbStore, and the store's commit counter shows the fsyncs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from raft.node.flusher import DISK_FULL_RETRY_S, NodeFlusher
from raft.node.metrics import NodeMetrics
from storage import open_store
from storage.api import DiskFull, StorageIOError
from storage.batch import Batch


class FakeGroup:
    def __init__(self, log: Any) -> None:
        self.log = log
        self.flushed: list[int] = []
        self.full: list[DiskFull] = []
        self.failed: list[tuple[BaseException, str]] = []
        self.heard_flushed = trio.Event()

    def on_flushed(self, flushed: int) -> None:
        self.flushed.append(flushed)  # as told: each group must hear exactly its own offset
        self.heard_flushed.set()

    def on_flush_disk_full(self, e: DiskFull) -> None:
        self.full.append(e)

    def fail(self, exc: BaseException, where: str) -> None:
        self.failed.append((exc, where))


def append(log: Any, n: int) -> None:
    base = log.dirty_offset + 1
    log.append([Batch.create(b"r" * 16, 1).placed(base + i, 1) for i in range(n)])


def run(body: Any) -> None:
    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


async def all_flushed(groups: list[FakeGroup], within_s: float = 30.0) -> None:
    """Until every group has heard its flush (woken by the flusher, no polling), failing
    after `within_s` (trio's clock: virtual under MockClock) instead of hanging the suite."""
    with trio.fail_after(within_s):
        for g in groups:
            await g.heard_flushed.wait()


@pytest.fixture(params=["memory", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    s = open_store(None if request.param == "memory" else tmp_path)
    yield s
    s.close()


@pytest.mark.parametrize("n", [1, 8, 64])
def test_groups_asking_together_share_one_fsync(store: Any, n: int) -> None:
    groups = [FakeGroup(store.open_log(g)) for g in range(n)]
    metrics = NodeMetrics()
    flusher = NodeFlusher(metrics)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            for i, g in enumerate(groups):
                append(g.log, 1 + i % 4)
                flusher.request(g)
                flusher.request(g)  # idempotent while pending
            before = store.commits
            nursery.start_soon(flusher.run)
            await all_flushed(groups)
            assert store.commits - before == 1 and flusher.flushes == 1
            nursery.cancel_scope.cancel()

    # The real clock: the LMDB store flushes in a worker thread, and a mock clock would jump
    # to the deadline while the loop waits for it.
    trio.run(body)
    assert [g.flushed for g in groups] == [[g.log.dirty_offset] for g in groups]
    assert all(g.log.unflushed_bytes == 0 for g in groups)
    assert metrics.fsyncs._value.get() == store.commits  # every commit counted once
    assert metrics.flush_records._sum.get() == sum(1 + i % 4 for i in range(n))


def test_a_full_disk_is_retried_and_the_groups_refuse_writes_meanwhile() -> None:
    store = open_store(None)
    groups = [FakeGroup(store.open_log(g)) for g in (0, 1)]
    flusher = NodeFlusher()
    groups[1].log.fail_next("flush", DiskFull, times=2)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flusher.run)
            for g in groups:
                append(g.log, 2)
                flusher.request(g)
            started = trio.current_time()
            await all_flushed(groups)  # the memory store flushes inline: virtual time is safe
            # Two refusals, each waited out before the retry; nothing written meanwhile.
            assert trio.current_time() - started >= 2 * DISK_FULL_RETRY_S
            nursery.cancel_scope.cancel()

    run(body)
    assert [len(g.full) for g in groups] == [2, 2]
    assert [g.flushed for g in groups] == [[1], [1]] and not any(g.failed for g in groups)


def test_any_other_failure_fails_every_asking_group_and_stops_the_flusher() -> None:
    store = open_store(None)
    groups = [FakeGroup(store.open_log(g)) for g in (0, 1, 2)]
    flusher = NodeFlusher()
    groups[0].log.fail_next("flush", StorageIOError)

    async def body() -> None:
        for g in groups[:2]:
            append(g.log, 1)
            flusher.request(g)
        with trio.fail_after(5):
            await flusher.run()  # returns: fail-stop

    run(body)
    assert [len(g.failed) for g in groups] == [1, 1, 0]
    assert all(where == "flush" for g in groups for _, where in g.failed)
    assert [g.log.flushed_offset for g in groups] == [-1, -1, -1]
    assert isinstance(flusher.failure, StorageIOError)


def test_appends_made_while_a_flush_runs_wait_for_the_next(tmp_path: Path) -> None:
    """A group that asks while a flush is in a worker thread is taken by the next flush, and
    each group is told only what the flush that wrote it held."""
    store = open_store(tmp_path)
    a, b = FakeGroup(store.open_log(0)), FakeGroup(store.open_log(1))
    flusher = NodeFlusher()

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flusher.run)
            append(a.log, 3)
            flusher.request(a)
            await trio.testing.wait_all_tasks_blocked()
            append(b.log, 2)
            flusher.request(b)
            await all_flushed([a, b])
            nursery.cancel_scope.cancel()

    trio.run(body)
    assert a.flushed == [2] and b.flushed == [1]
    store.close()
