"""The node-wide limit on what link pullers fetch (NodeConfig.link_rate, MiB/s; 0 = none).

It also counts what the pullers hold fetched ahead of their appends (`ahead`), so that
fetching ahead costs the node at most `ahead_limit` bytes of memory however many partitions
it mirrors.

A token bucket: a puller asks for the bytes it just received before its next fetch, and waits
while the bucket is in debt. One bucket for every puller of the node, so a link catching up
after an outage takes at most this much of the node's network and disk, however many mirror
partitions it has (issue 30: "a catching-up link does not starve producers").
"""

from __future__ import annotations

import trio

BURST_S = 0.5  # the bucket holds this many seconds of the rate
# Bytes the node's pullers may hold fetched ahead of their appends (or asked for ahead):
# past it a puller fetches 1 MiB at a time, one after its append, as before fetching ahead.
AHEAD_LIMIT_BYTES = 64 << 20


class ByteRate:
    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self._tokens = bytes_per_s * BURST_S
        self._at: float | None = None
        self.waited_s = 0.0  # total time pullers waited here (status)
        self.ahead = 0  # bytes fetched ahead (or asked for ahead) and not appended yet
        self.ahead_limit = AHEAD_LIMIT_BYTES

    def _refill(self, now: float) -> None:
        if self._at is not None:
            self._tokens = min(self.rate * BURST_S, self._tokens + (now - self._at) * self.rate)
        self._at = now

    async def spend(self, nbytes: int) -> None:
        """Count `nbytes` received; wait while the node is over its rate."""
        if self.rate <= 0 or nbytes <= 0:
            return
        now = trio.current_time()
        self._refill(now)
        self._tokens -= nbytes
        if self._tokens < 0:
            pause = -self._tokens / self.rate
            self.waited_s += pause
            await trio.sleep(pause)
