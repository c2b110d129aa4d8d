"""The flusher's worker thread (raft/node/flush_thread.py): one thread runs every flush handed
to it, results and errors come back to the awaiting task, and a flush that started finishes
before a cancelled caller goes on (its commit may be on disk: the caller must hear of it)."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import trio
import trio.testing

from raft.node.flush_thread import FlushThread


def test_one_thread_runs_every_call_and_hands_back_results_and_errors() -> None:
    worker = FlushThread()
    seen: dict[str, object] = {}

    def fails() -> None:
        raise OSError("EIO")

    async def main() -> None:
        idents = {await worker.run(threading.get_ident) for _ in range(50)}
        seen["idents"] = idents
        seen["sum"] = await worker.run(sum, [1, 2, 3])
        with pytest.raises(OSError, match="EIO"):
            await worker.run(fails)
        seen["after_error"] = await worker.run(threading.get_ident)
        thread = worker._thread
        worker.close()
        assert thread is not None
        thread.join(timeout=30)
        seen["ended"] = not thread.is_alive()

    trio.run(main)
    idents = seen["idents"]
    assert isinstance(idents, set) and len(idents) == 1, idents  # one thread, not one per call
    assert threading.get_ident() not in idents  # off the loop's thread
    assert seen["sum"] == 6 and seen["after_error"] in idents
    assert seen["ended"] and worker.calls == 53


def test_a_cancelled_caller_waits_for_the_call_it_started() -> None:
    worker = FlushThread()
    release, running = threading.Event(), threading.Event()
    order: list[str] = []

    def flush() -> int:
        running.set()
        release.wait(timeout=30)
        order.append("flushed")
        return 7

    async def caller(scope: trio.CancelScope) -> None:
        with scope:
            got = await worker.run(flush)
            order.append(f"heard {got}")
            await trio.lowlevel.checkpoint()
            order.append("not cancelled")  # never: the cancel arrives at this checkpoint
        order.append("cancelled" if scope.cancelled_caught else "done")

    async def main() -> None:
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller, scope)
            await trio.to_thread.run_sync(running.wait)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            order.append("cancel asked")
            release.set()
        worker.close()

    trio.run(main)
    assert order == ["cancel asked", "flushed", "heard 7", "cancelled"], order


def test_a_second_concurrent_call_is_refused_and_the_first_is_answered() -> None:
    """The flusher runs one flush at a time; the thread's one result slot and socket are for
    one waiting task, so a second caller while one waits is an error, not a mixed-up answer."""
    worker = FlushThread()
    release, running = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def flush() -> int:
        running.set()
        release.wait(timeout=30)
        return 7

    async def first() -> None:
        seen["first"] = await worker.run(flush)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.to_thread.run_sync(running.wait)
            with pytest.raises(RuntimeError, match="one call at a time"):
                await worker.run(sum, [1])
            release.set()
        seen["after"] = await worker.run(sum, [1, 2])
        worker.close()

    trio.run(main)
    assert seen == {"first": 7, "after": 3}


def test_closing_ends_the_thread_and_releases_its_sockets() -> None:
    """A node opens and closes flushers (tests, shards, restarts): each close ends its thread
    and closes both ends of its socket pair, also when it comes while a call waits (that call
    still gets its answer)."""
    for earlier in threading.enumerate():  # other tests' closed workers close their ends too
        if earlier.name == "raftlog-flush":
            earlier.join(timeout=30)
    fds_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    threads: list[threading.Thread] = []
    workers: list[FlushThread] = []  # kept alive: a garbage-collected socket closes itself
    release, running = threading.Event(), threading.Event()
    answers: list[int] = []

    def slow() -> int:
        running.set()
        release.wait(timeout=30)
        return 5

    async def main() -> None:
        for _ in range(20):
            worker = FlushThread()
            workers.append(worker)
            assert await worker.run(sum, [2, 3]) == 5
            assert worker._thread is not None
            threads.append(worker._thread)
            worker.close()
        worker = FlushThread()
        workers.append(worker)

        async def waits() -> None:
            answers.append(await worker.run(slow))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waits)
            await trio.to_thread.run_sync(running.wait)
            assert worker._thread is not None
            threads.append(worker._thread)
            worker.close()  # while the call waits: it is still answered
            release.set()

    trio.run(main)
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert answers == [5]
    if fds_before is not None:
        assert len(os.listdir("/proc/self/fd")) == fds_before
    assert len(workers) == 21



def test_a_thread_that_dies_without_answering_is_an_error_not_a_hang(monkeypatch) -> None:
    """If the worker thread itself ends without answering (not the call it runs: that call's
    outcome, exceptions included, is handed back), the waiting flusher hears it at once: the
    flush's outcome is unknown, which stops the node (raft.node.flusher: any failure but a
    full disk is fatal) instead of waiting forever in a shielded wait."""

    def dies(self: FlushThread, jobs: object, done: socket.socket) -> None:
        done.close()  # as a thread killed by a bug would leave it: its end closed, no answer

    monkeypatch.setattr(FlushThread, "_work", dies)
    seen: list[BaseException] = []

    async def main() -> None:
        worker = FlushThread()
        try:
            await worker.run(sum, [1])
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            seen.append(e)
        worker.close()

    # In its own thread, so that a wait that never ends fails this test instead of hanging it.
    runner = threading.Thread(target=trio.run, args=(main,), daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the flusher still waits for a thread that is gone"
    assert len(seen) == 1 and isinstance(seen[0], RuntimeError), seen
    assert "ended without answering" in str(seen[0])
