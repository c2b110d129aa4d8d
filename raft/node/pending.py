"""A group's requests waiting for the core's answer, and their deadlines under one timer.

A produce waits for the answer a later Ready carries for its request id, up to its timeout.
A cancel scope per request (`move_on_after`) cost the leader's loop a scope, a deadline entry
and its removal on every write (issue 28: ~8% of the loop's time at 64 closed-loop writers).
Here every waiter of a group shares one timer task: deadlines go on a heap, the timer sleeps
until the earliest one still waiting, and an answered request's entry is dropped lazily (when
it reaches the top, or when stale entries outnumber live ones), so a write costs a heap push
and no wake-up of the timer unless its deadline is the earliest. An idle group's timer waits on
an event (no wake-ups).

A waiter is a task parked on an event (`add`), or a callback (`then`, issue 28: a produce
answered without a task of its own); a callback is called once, with the answer or None (timed
out, shutting down), and taken out at once.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, TypeVar

import trio

from raft.core.ready import ProduceAnswer

_P = TypeVar("_P", "Pending", "_Then")

# Stale heap entries (answered requests) are swept out when they exceed this many plus four
# times the live ones: the heap stays O(waiting) while a sweep is amortised over many writes.
COMPACT_SLACK = 1024


@dataclass(slots=True)
class Pending:
    """A request waiting for its answer; `answer` stays None on a timeout or a shutdown."""

    event: trio.Event
    answer: ProduceAnswer | None = None


@dataclass(slots=True)
class _Then:
    """A request whose answer goes to a callback (`then`)."""

    callback: Callable[[ProduceAnswer | None], None]  # must not raise
    answer: ProduceAnswer | None = None


class PendingAnswers:
    """Waiters by core request id, and the one timer that times them out."""

    def __init__(self) -> None:
        self._waiting: dict[int, Pending | _Then] = {}
        self._deadlines: list[tuple[float, int]] = []  # (trio deadline, request id), a heap
        self._wake = trio.Event()  # an earlier deadline than the timer sleeps until
        self._sleeping_until = float("inf")

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, request_id: int, timeout_s: float) -> Pending:
        return self._put(request_id, timeout_s, Pending(trio.Event()))

    def then(self, request_id: int, timeout_s: float,
             callback: Callable[[ProduceAnswer | None], None]) -> None:
        """Call `callback` once: with the answer, or None at the deadline or a shutdown. It runs
        in the Ready loop or the timer, so it must not raise or wait."""
        self._put(request_id, timeout_s, _Then(callback))

    def _put(self, request_id: int, timeout_s: float, pending: _P) -> _P:
        self._waiting[request_id] = pending
        deadline = trio.current_time() + timeout_s
        heapq.heappush(self._deadlines, (deadline, request_id))
        if deadline < self._sleeping_until:
            self._wake.set()
        if len(self._deadlines) > 4 * len(self._waiting) + COMPACT_SLACK:
            self._deadlines = [e for e in self._deadlines if e[1] in self._waiting]
            heapq.heapify(self._deadlines)
        return pending

    def discard(self, request_id: int) -> None:
        """The waiter is done (answered, timed out or cancelled); its heap entry goes lazily."""
        self._waiting.pop(request_id, None)

    def answer(self, answer: ProduceAnswer) -> None:
        pending = self._waiting.get(answer.request_id)
        if pending is not None:
            pending.answer = answer
            self._release(answer.request_id, pending)

    def wake_all(self) -> None:
        """Shutdown: every waiter returns now, unanswered (its handler says why)."""
        for request_id, pending in list(self._waiting.items()):
            self._release(request_id, pending)

    def _release(self, request_id: int, pending: Pending | _Then) -> None:
        if type(pending) is Pending:
            pending.event.set()  # the waiter discards itself
        elif self._waiting.pop(request_id, None) is not None:  # once
            pending.callback(pending.answer)

    async def run_timer(self) -> None:
        """Wake the waiters whose deadline passed (they answer TIMEOUT). Sleeps until the
        earliest deadline still waiting, or on an event while none waits."""
        while True:
            self._expire(trio.current_time())
            self._wake = trio.Event()
            if self._deadlines:
                self._sleeping_until = self._deadlines[0][0]
                with trio.move_on_at(self._sleeping_until):
                    await self._wake.wait()
            else:
                self._sleeping_until = float("inf")
                await self._wake.wait()

    def _expire(self, now: float) -> None:
        heap = self._deadlines
        while heap:
            deadline, request_id = heap[0]
            pending = self._waiting.get(request_id)
            if pending is not None and deadline > now:
                return
            heapq.heappop(heap)
            if pending is not None:
                self._release(request_id, pending)  # answer None: the waiter answers TIMEOUT
