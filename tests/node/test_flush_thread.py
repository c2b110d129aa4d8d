"""The flusher's worker thread (raft/node/flush_thread.py): one thread runs every flush handed
to it, results and errors come back to the awaiting task, and a flush that started finishes
before a cancelled caller goes on (its commit may be on disk: the caller must hear of it)."""

from __future__ import annotations

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
