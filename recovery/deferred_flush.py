"""When a follower flushes data that arrived with `flush=False` (the RFC's deferred flush).

Recovery chunks are appended to the follower's in-memory tail without an fsync each. The follower
flushes once `flush_bytes` are unflushed or after `flush_ticks` ticks with unflushed data,
whichever comes first, and then reports its new flushed offset unasked; the leader counts it
toward the commit index as the report arrives.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class DeferredFlush:
    flush_bytes: int
    flush_ticks: int
    unflushed_ticks: int = 0

    def on_tick(self, dirty_offset: int, flushed_offset: int) -> bool:
        """One tick passed; True when a flush is due."""
        if dirty_offset > flushed_offset:
            self.unflushed_ticks += 1
            return self.unflushed_ticks >= self.flush_ticks
        self.unflushed_ticks = 0
        return False

    def on_append(self, unflushed_bytes: int) -> bool:
        """Data was appended; True when enough is unflushed to flush now."""
        return unflushed_bytes >= self.flush_bytes

    def on_flushed(self) -> None:
        self.unflushed_ticks = 0
