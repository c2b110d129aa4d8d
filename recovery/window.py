"""The per-follower in-flight window: requests sent and not yet acknowledged.

The leader pipelines up to `max_inflight` requests and `max_inflight_bytes` bytes to a
replicating follower (one request at a time while probing). An acknowledgement up to an offset
releases every request that ended at or below it; a lost request is noticed when the follower
answers a later heartbeat without having appended it (`lost_before`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class Inflight:
    seq: int
    last_offset: int
    nbytes: int


class InflightWindow:
    __slots__ = ("_requests", "bytes")

    def __init__(self) -> None:
        self._requests: deque[Inflight] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __iter__(self) -> Iterator[Inflight]:
        return iter(self._requests)

    def full(self, max_requests: int, max_bytes: int) -> bool:
        return len(self._requests) >= max_requests or self.bytes >= max_bytes

    def add(self, seq: int, last_offset: int, nbytes: int) -> None:
        self._requests.append(Inflight(seq, last_offset, nbytes))
        self.bytes += nbytes

    def release_upto(self, offset: int) -> int:
        """Drop every request that ended at or below `offset`; the bytes freed."""
        freed = 0
        while self._requests and self._requests[0].last_offset <= offset:
            freed += self._requests.popleft().nbytes
        self.bytes -= freed
        return freed

    def clear(self) -> None:
        self._requests.clear()
        self.bytes = 0

    def sent_before(self, seq: int) -> bool:
        """Some request still in the window was sent before `seq` (requests are in seq order)."""
        return bool(self._requests) and self._requests[0].seq < seq

    def lost_before(self, seq: int, follower_dirty: int) -> bool:
        """A request sent before `seq` ends past what the follower has appended, though the
        follower already answered `seq`: that request was lost (a dropped connection or queue)."""
        return any(f.seq < seq and f.last_offset > follower_dirty for f in self._requests)
