"""A discrete-event loop: a heap of (time, sequence, action). Ties break by insertion order, so
a run depends only on the seed that scheduled its events."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(order=True, slots=True)
class _Event:
    time: int
    seq: int
    action: Callable[[], None] = field(compare=False)


class EventLoop:
    def __init__(self) -> None:
        self.now = 0  # simulated microseconds
        self._heap: list[_Event] = []
        self._seq = 0
        self.events_run = 0

    def at(self, when: int, action: Callable[[], None]) -> None:
        if when < self.now:
            raise ValueError(f"cannot schedule in the past ({when} < {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, _Event(when, self._seq, action))

    def after(self, delay: int, action: Callable[[], None]) -> None:
        self.at(self.now + max(0, delay), action)

    def run_until(self, end: int, stop: Callable[[], bool] | None = None) -> None:
        while self._heap and self._heap[0].time <= end:
            ev = heapq.heappop(self._heap)
            self.now = ev.time
            ev.action()
            self.events_run += 1
            if stop is not None and stop():
                return
        self.now = max(self.now, end)
