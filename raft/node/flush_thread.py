"""The flusher's one worker thread, fed by a queue, answering through a socket (issue 28).

A store flush (one LMDB write transaction and its fsync) must run off the event loop. Trio's
`to_thread.run_sync` does that per call: a capacity-limiter slot, a thread taken from (or put
back into) its cache, a copied context and two wake-ups of the loop, ~4% of the leader's CPU at
64 closed-loop single-record writers, where the flushes run a few thousand times a second. The
node runs one flush at a time anyway (raft.node.flusher), so one long-lived thread serves them
all: the loop puts the job on a queue and the flushing task waits on its end of a socket pair;
the thread leaves the outcome in a slot and writes one byte to the other end.

Why a socket of its own and not `TrioToken.run_sync_soon`: that wakes trio's entry-queue task,
which then reschedules the waiting task, one scheduler pass later. Here the byte's readiness
wakes the flushing task itself, a pass sooner on the way from the fsync to the group's Ready
(the "hand-off out" stage of `raftlog bench trace`: docs/PERFORMANCE.md, "Issue 28: the flush
thread answers through its own socket"),
at the same system calls (one write in the thread, one read on the loop).

Like `to_thread.run_sync`, a call cannot be cancelled half-way: a flush that started finishes
(its commit may already be on disk) and the waiting task is told its outcome; a cancellation
arrives at the task's next checkpoint. One call at a time (the flusher's rule): a second
concurrent call is refused.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any, Callable, TypeVar

import outcome
import trio

T = TypeVar("T")


class FlushThread:
    """One worker thread; `run` awaits a call made there. `close` lets the thread end."""

    def __init__(self, name: str = "raftlog-flush") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._thread: threading.Thread | None = None
        self._wake: socket.socket | None = None  # the loop's end of the pair
        self._result: outcome.Outcome | None = None  # the thread's answer, set before its byte
        self._busy = False
        self._closing = False
        self.calls = 0  # jobs handed over (tests)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the worker thread; its result, or its exception raised here."""
        if self._busy:
            raise RuntimeError("FlushThread.run: one call at a time (the node flushes one at a "
                               "time; a second caller must wait for the first)")
        self._busy = True
        try:
            wake = self._wake if self._thread is not None else self._start()
            assert wake is not None
            self.calls += 1
            self._result = None
            self._jobs.put((fn, args))
            with trio.CancelScope(shield=True):  # a started flush is waited for, see above
                while self._result is None:
                    await trio.lowlevel.wait_readable(wake)
                    try:
                        got = wake.recv(64)
                    except BlockingIOError:  # (a byte of an earlier call, already taken)
                        continue
                    if not got and self._result is None:  # the thread's end closed: it died
                        raise RuntimeError(
                            "the flush thread ended without answering (see the exception it "
                            "printed); the flush's outcome is unknown, so the node must stop")
            result, self._result = self._result, None
        finally:
            self._busy = False
            if self._closing:
                self._close_wake()
        return result.unwrap()  # type: ignore[no-any-return]

    def _start(self) -> socket.socket:
        self._closing = False
        self._wake, thread_end = socket.socketpair()
        self._wake.setblocking(False)
        # A daemon: a process that stops without closing the flusher does not wait for it.
        self._thread = threading.Thread(target=self._work, args=(self._jobs, thread_end),
                                        name=self._name, daemon=True)
        self._thread.start()
        return self._wake

    def close(self) -> None:
        """The thread ends after the jobs already queued (none: one flush at a time); both
        ends of the socket pair are closed (the loop's once no call waits on it)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
            self._jobs = queue.SimpleQueue()  # a later run starts a new thread on a new queue
            if self._busy:
                self._closing = True
            else:
                self._close_wake()

    def _close_wake(self) -> None:
        if self._wake is not None:
            self._wake.close()
            self._wake = None
        self._closing = False

    def _work(self, jobs: queue.SimpleQueue, done: socket.socket) -> None:
        try:
            while True:
                job = jobs.get()
                if job is None:
                    return
                fn, args = job
                self._result = outcome.capture(fn, *args)
                try:
                    done.send(b"\0")
                except OSError:  # the loop's end is gone: nobody waits for this outcome
                    pass
        finally:
            done.close()
