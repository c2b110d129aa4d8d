"""Load generators in separate processes, started together.

Why processes: one Python process saturates one core; with 8 producers in one process the
generator, not the server, would be measured. Each worker connects first, reports ready, and
all start at one shared CLOCK_MONOTONIC instant (time.monotonic is system-wide on Linux), so
their measurement windows line up. Spawned (not forked) so no parent thread or lock leaks in.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

_CTX = mp.get_context("spawn")


class WorkerError(Exception):
    """A load-generator process failed; the message carries its traceback."""


class Sync:
    """What a worker shares with the parent: ready reporting, numbered rounds that start at a
    common instant, an event instant (e.g. when the leader was killed) and a stop flag."""

    def __init__(self, q: Any, start_at: Any, round_no: Any, event_at: Any, stop: Any,
                 index: int) -> None:
        self.q, self.start_at, self.round_no, self.event_at, self.stop_flag, self.index = (
            q, start_at, round_no, event_at, stop, index)

    def ready(self) -> None:
        self.q.put(("ready", self.index, -1, None))

    def report(self, round_: int, result: Any) -> None:
        self.q.put(("result", self.index, round_, result))

    async def wait_round(self, round_: int) -> float | None:
        """Sleep until round `round_` starts (return its start instant) or stop (None)."""
        while self.round_no.value < round_:
            if self.stop_flag.value:
                return None
            await trio.sleep(0.002)
        t0 = self.start_at.value
        delay = t0 - time.monotonic()
        if delay > 0:
            await trio.sleep(delay)
        return t0

    async def rounds(self) -> AsyncIterator[tuple[int, float]]:
        """(round number, start instant) for rounds 1, 2, ... until the parent stops the
        workers: every worker's loop, written once."""
        k = 0
        while True:
            k += 1
            t0 = await self.wait_round(k)
            if t0 is None:
                return
            yield k, t0

    @property
    def event(self) -> float:
        return self.event_at.value

    @property
    def stopped(self) -> bool:
        return bool(self.stop_flag.value)


def _entry(fn: Callable, args: Any, q: Any, start_at: Any, round_no: Any, event_at: Any,
           stop: Any, index: int) -> None:
    sync = Sync(q, start_at, round_no, event_at, stop, index)
    try:
        trio.run(fn, args, sync)
        q.put(("done", index, -1, None))
    except BaseException:  # noqa: BLE001 - report everything to the parent, then exit
        q.put(("error", index, -1, traceback.format_exc()))


class WorkerGroup:
    """Run `fn(args, sync)` (async) once per args, each in its own process. The function
    connects, calls sync.ready(), then `async for k, t0 in sync.rounds():` measures and
    `sync.report(k, result)`; the loop ends when the parent stops the workers."""

    def __init__(self, fn: Callable, arg_list: list[Any]) -> None:
        self.q = _CTX.Queue()
        self.start_at = _CTX.Value("d", 0.0)
        self.round_no = _CTX.Value("i", 0)
        self.event_at = _CTX.Value("d", 0.0)
        self.stop_flag = _CTX.Value("b", 0)
        self.procs = [_CTX.Process(target=_entry, daemon=True,
                                   args=(fn, a, self.q, self.start_at, self.round_no,
                                         self.event_at, self.stop_flag, i))
                      for i, a in enumerate(arg_list)]
        self.n = len(arg_list)
        self.rounds = 0
        self._finished: set[int] = set()  # workers whose "done" arrived (maybe during collect)

    def __enter__(self) -> "WorkerGroup":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()

    def start(self, ready_timeout: float = 60.0) -> None:
        """Start the processes and wait until every one is connected."""
        for p in self.procs:
            p.start()
        ready = 0
        deadline = time.monotonic() + ready_timeout
        while ready < self.n:
            kind, i, _, payload = self._get(deadline)
            if kind == "ready":
                ready += 1
            elif kind == "error":
                self.abort()
                raise WorkerError(f"load generator {i} failed before starting:\n{payload}")

    def release(self, delay: float = 0.05) -> float:
        """Release every worker into the next round together; return its start instant."""
        self.rounds += 1
        t0 = time.monotonic() + delay
        self.start_at.value = t0
        self.round_no.value = self.rounds
        return t0

    def collect(self, timeout: float) -> list[Any]:
        """Every worker's report for the current round."""
        results: list[Any] = [None] * self.n
        got = 0
        deadline = time.monotonic() + timeout
        while got < self.n:
            kind, i, r, payload = self._get(deadline)
            if kind == "error":
                self.abort()
                raise WorkerError(f"load generator {i} failed:\n{payload}")
            if kind == "result" and r == self.rounds:
                results[i] = payload
                got += 1
            elif kind == "done":  # a worker stopped right after its report (stop flag set)
                self._finished.add(i)
        return results

    def round(self, timeout: float, delay: float = 0.05) -> tuple[float, list[Any]]:
        t0 = self.release(delay)
        return t0, self.collect(timeout)

    def mark_event(self) -> float:
        t = time.monotonic()
        self.event_at.value = t
        return t

    def close(self, timeout: float = 20.0) -> None:
        self.stop_flag.value = 1
        deadline = time.monotonic() + timeout
        try:
            while len(self._finished) < self.n:
                kind, i, _, payload = self._get(deadline)
                if kind == "error":
                    raise WorkerError(f"load generator {i} failed while stopping:\n{payload}")
                if kind == "done":
                    self._finished.add(i)
        finally:
            self.abort()

    def _get(self, deadline: float) -> tuple[str, int, int, Any]:
        while True:
            try:
                return self.q.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.abort()
                    raise WorkerError("load generators did not finish in time; is the cluster "
                                      "overloaded or down? (see the node logs)") from None
                dead = [p for p in self.procs if p.exitcode not in (None, 0)]
                if dead:
                    self.abort()
                    raise WorkerError(f"load generator process died with exit code "
                                      f"{dead[0].exitcode}") from None

    def abort(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.join(0.5)
            if p.is_alive():
                p.kill()
            p.join(5)
