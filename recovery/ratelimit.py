"""A node-wide token bucket for recovery traffic, so catching a follower up cannot starve live
writes of disk and network bandwidth (Redpanda's recovery throttle plays the same role).

Pure arithmetic over a clock passed in. The core runs it on its own tick count (the rate is then
bytes per tick: RaftConfig.recovery_rate_bytes_per_tick), so throttled chunks wait inside the
core instead of in a queue that later heartbeats would overtake; tests give it a fake clock."""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float, burst_bytes: float,
                 clock: Callable[[], float]) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"recovery rate must be positive, got {rate_bytes_per_s}; "
                             f"leave it unset (0) to disable the limit")
        if burst_bytes <= 0:
            raise ValueError("burst must be positive")
        self.rate = float(rate_bytes_per_s)
        self.burst = float(burst_bytes)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()
        self.granted_bytes = 0
        self.waited_s = 0.0

    def _refill(self) -> None:
        now = self._clock()
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def delay_for(self, nbytes: int) -> float:
        """Seconds until `nbytes` may go. A request larger than the burst goes once the bucket
        is full (it is not refused: one recovery chunk may exceed the burst)."""
        self._refill()
        need = min(float(nbytes), self.burst)
        if self._tokens >= need:
            return 0.0
        return (need - self._tokens) / self.rate

    def take(self, nbytes: int) -> None:
        """Spend tokens for `nbytes` (after delay_for returned 0). May go negative for a
        chunk larger than the burst, which then delays the next one accordingly."""
        self._refill()
        self._tokens -= nbytes
        self.granted_bytes += nbytes
