"""The flusher's one worker thread, fed by a queue (issue 28).

A store flush (one LMDB write transaction and its fsync) must run off the event loop. Trio's
`to_thread.run_sync` does that per call: a capacity-limiter slot, a thread taken from (or put
back into) its cache, a copied context and two wake-ups of the loop, ~4% of the leader's CPU at
64 closed-loop single-record writers, where the flushes run a few thousand times a second. The
node runs one flush at a time anyway (raft.node.flusher), so one long-lived thread serves them
all: the loop puts the job on a queue and parks the flushing task; the thread runs it and hands
the outcome back with one `run_sync_soon`.

Like `to_thread.run_sync`, a call cannot be cancelled half-way: a flush that started finishes
(its commit may already be on disk) and the waiting task is told its outcome; a cancellation
arrives at the task's next checkpoint.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, TypeVar

import outcome
import trio

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], Any, trio.lowlevel.TrioToken]


class FlushThread:
    """One worker thread; `run` awaits a call made there. `close` lets the thread end."""

    def __init__(self, name: str = "raftlog-flush") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.calls = 0  # jobs handed over (tests)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the worker thread; its result, or its exception raised here."""
        if self._thread is None:
            # A daemon: a process that stops without closing the flusher does not wait for it.
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self.calls += 1
        self._jobs.put((fn, args, trio.lowlevel.current_task(),
                        trio.lowlevel.current_trio_token()))
        return await trio.lowlevel.wait_task_rescheduled(_uncancellable)  # type: ignore[no-any-return]

    def close(self) -> None:
        """The thread ends after the jobs already queued (none: one flush at a time)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, task, token = job
            result = outcome.capture(fn, *args)
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:  # cannot happen while the task waits; nobody to tell
                pass


def _uncancellable(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED
