"""The node's one scrub scheduler: every group's background scrub, in one task, at one byte rate.

A node with 1,000 partitions has 1,000 logs to re-read for bit rot (raft.node.scrubber holds
each group's place in its own log and what it found). One task per group meant 1,000 timers and,
for small logs, a worker-thread hop per log per pass; the rate was per group, so the node's
disk read `scrub_rate` times the number of groups. Here instead:

- one task per node, one byte budget (`scrub_rate` MiB/s for the whole node): after each call
  it sleeps bytes_read / rate, so a full cycle over every log takes total bytes / rate;
- groups are visited least recently visited first (round-robin): a large log is read one slice
  per visit and does not starve the small ones;
- one call (one worker-thread hop for LMDB, inline for the in-memory log) scrubs several logs in
  turn until `slice_bytes` are read or MAX_BATCH logs are visited: 1,000 small logs do not make a
  thread hop each;
- a group whose pass just completed is not due again until its own rules say (raft.node.scrubber:
  a second for a small log, a minute for one unchanged since its last pass); while no group is
  due the task sleeps until the next is, but at least COALESCE_S after its last call, so the
  passes of many idle logs that fall due close together share one call.

What a slice finds goes to that slice's own group (`ScrubTarget.done` / `failed`): its damage
wakes that group's core, and a read its disk refuses fail-stops that group's node, never a
neighbour in the batch. A group being removed is waited for if a call is reading its log
(`forget`), so its log is never closed under a running scrub.
"""

from __future__ import annotations

from typing import Protocol

import trio

from storage.api import IoMode, LogStorage, ScrubSlice

MIB = 1 << 20
MAX_BATCH = 64  # logs one call visits at most (bounds one call's work besides the bytes)
COALESCE_S = 1.0  # idle logs due within this long of each other share one call


class ScrubTarget(Protocol):
    """One group's scrub state as the scheduler drives it (raft.node.scrubber.Scrubber)."""

    due: float  # trio time before which it is not visited again

    def begin(self, now: float) -> tuple[LogStorage, int] | None:
        """The log and the offset to read from now, or None: skip it (closing, no log)."""

    def done(self, got: ScrubSlice, now: float) -> None:
        """What its slice read and found (damage is woken in its own group)."""

    def failed(self, exc: BaseException) -> None:
        """Its log refused a read: its group fail-stops."""

    async def run_io(self, fn: object, *args: object) -> object:
        """Its group's way of running blocking storage work (worker thread or inline)."""


def scrub_batch(items: list[tuple[LogStorage, int]],
                budget: int) -> list[ScrubSlice | BaseException | None]:
    """Scrub each (log, offset) in turn until `budget` bytes are read; one result per item:
    its slice, the error its log raised (that log only), or None: not reached this call."""
    out: list[ScrubSlice | BaseException | None] = []
    left = budget
    for lg, offset in items:
        if left <= 0:
            out.append(None)
            continue
        try:
            got = lg.scrub(offset, left)
        except Exception as e:  # noqa: BLE001 - handed to that log's group (fail-stop)
            out.append(e)
            continue
        left -= max(got.bytes_read, 1)
        out.append(got)
    return out


class NodeScrubber:
    """See the module docstring. `add` / `forget` targets; `await run()` in the node's nursery."""

    def __init__(self, rate_mib_s: float, slice_bytes: int) -> None:
        if rate_mib_s < 0 or slice_bytes < 1:
            raise ValueError("the scrub rate must be >= 0 and the slice at least one byte")
        self.rate = rate_mib_s
        self.slice_bytes = slice_bytes
        # Least recently visited first: a visited target moves to the end.
        self._targets: dict[ScrubTarget, None] = {}
        self._in_flight: set[ScrubTarget] = set()
        self._batch_done = trio.Event()
        self._changed = trio.Event()
        self._last_call = -float("inf")
        self.calls = 0  # scrub calls made (one thread hop each for LMDB)
        self.visits = 0  # logs visited over all calls

    def add(self, target: ScrubTarget) -> None:
        self._targets[target] = None
        self._changed.set()

    async def forget(self, target: ScrubTarget) -> None:
        """Stop visiting `target`; returns once no call is reading its log."""
        self._targets.pop(target, None)
        while target in self._in_flight:
            await self._batch_done.wait()

    def __len__(self) -> int:
        return len(self._targets)

    def _pick(self, now: float) -> tuple[list[ScrubTarget], list[tuple[LogStorage, int]]]:
        picked: list[ScrubTarget] = []
        items: list[tuple[LogStorage, int]] = []
        mode: IoMode | None = None
        for target in self._targets:
            if target.due > now:
                continue
            got = target.begin(now)
            if got is None:
                continue
            if mode is None:
                mode = got[0].io_mode
            elif got[0].io_mode is not mode:  # one call runs one way: the rest wait a turn
                continue
            picked.append(target)
            items.append(got)
            if len(picked) >= MAX_BATCH:
                break
        return picked, items

    def _next_due(self) -> float:
        return min((t.due for t in self._targets), default=float("inf"))

    async def run(self) -> None:
        """Scrub until cancelled; returns at once when the rate is 0 (scrubbing off)."""
        if self.rate <= 0:
            return
        while True:
            now = trio.current_time()
            picked, items = self._pick(now)
            if not picked:
                wait = max(self._next_due(), self._last_call + COALESCE_S) - now
                with trio.move_on_after(max(wait, 0.0)):
                    await self._changed.wait()
                self._changed = trio.Event()
                continue
            read, visited = await self._call(picked, items)
            # A call that visited nothing (cannot happen: the first log is always read) must
            # still not spin.
            await trio.sleep(read / (self.rate * MIB) if visited else COALESCE_S)

    async def _call(self, picked: list[ScrubTarget],
                    items: list[tuple[LogStorage, int]]) -> tuple[int, int]:
        """One call over `picked`; hands each result to its own target. Returns the bytes
        read and how many logs were visited."""
        self._in_flight.update(picked)
        try:
            results = await picked[0].run_io(scrub_batch, items, self.slice_bytes)
        except BaseException:
            self._in_flight.clear()
            self._batch_done.set()
            self._batch_done = trio.Event()
            raise
        self._in_flight.clear()
        self._batch_done.set()
        self._batch_done = trio.Event()
        self.calls += 1
        now = trio.current_time()
        self._last_call = now
        read = visited = 0
        for target, res in zip(picked, results):
            if res is None:
                continue  # not reached within the budget: first in line next call
            self.visits += 1
            visited += 1
            if target in self._targets:  # visited: to the back of the line
                del self._targets[target]
                self._targets[target] = None
            else:
                continue  # forgotten meanwhile: its group is gone
            if isinstance(res, BaseException):
                target.failed(res)
                continue
            read += res.bytes_read
            target.done(res, now)
        return read, visited
