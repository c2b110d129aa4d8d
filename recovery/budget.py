"""The node's recovery budget: how many partitions catch a follower up at once, and how many bytes
of recovery chunks all of them send per second together (issue 26: per-node budgets, not
per-group ones).

A node that comes back after a while lags in every partition it holds. Without a shared budget
each partition's leader streams catch-up chunks at once: a thousand streams, each with its own
rate limit, means a thousand times the bytes, a storm of reads on the leaders' disks and of
unflushed writes on the follower. Redpanda bounds recoveries per shard the same way.

- **Streams.** At most `max_streams` (group, follower) recoveries hold a slot at once (0 = no
  limit). A stream asks before each chunk (`may_send`), which takes or renews its slot; one that
  finds no free slot joins a first-come queue and is granted in turn as slots free, so a stream
  waiting since earlier is never overtaken by a later one. A slot is freed when its follower
  caught up (`done`), when its leader steps down (`release_group`), or when nobody renewed it
  for `lease_ticks` (a group stopped, a follower removed, a lost leadership that sent no
  notice): a budget can never be held by a stream that went away.
- **Bytes.** Unflushed recovery chunks of every stream draw from one token bucket of
  `rate_bytes_per_tick` (0 = no limit), as the per-group throttle did for one group.

Pure: the clock is a callable the runtime passes (the node's tick count, or the simulation's),
so the cores that share it stay deterministic in simulation. One object per node process; each
core gets a `GroupRecovery` bound to its group id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from recovery.ratelimit import TokenBucket

DEFAULT_LEASE_TICKS = 40  # 2 s at the default 50 ms tick: four election timeouts
WAITER_PATIENCE_TICKS = 3  # a waiting stream asks every tick; silent longer, it left the queue


@dataclass(slots=True)
class RecoveryBudget:
    max_streams: int = 0
    rate_bytes_per_tick: int = 0
    burst_bytes: int = 0
    clock: Callable[[], int] = lambda: 0
    lease_ticks: int = DEFAULT_LEASE_TICKS
    # (group, follower) -> tick it last used its slot, and the queue of streams waiting for one.
    _streams: dict[tuple[int, int], int] = field(default_factory=dict)
    _waiting: dict[tuple[int, int], int] = field(default_factory=dict)
    _bucket: TokenBucket | None = None
    granted: int = 0  # slots granted, for status
    denied: int = 0  # chunks held back for want of a slot

    def __post_init__(self) -> None:
        if self.max_streams < 0 or self.rate_bytes_per_tick < 0 or self.lease_ticks < 1:
            raise ValueError("recovery budget: max_streams and rate must be >= 0 (0 = no "
                             "limit) and lease_ticks >= 1")
        if self.rate_bytes_per_tick:
            self._bucket = TokenBucket(self.rate_bytes_per_tick,
                                       self.burst_bytes or self.rate_bytes_per_tick,
                                       self.clock)

    def for_group(self, group: int) -> "GroupRecovery":
        return GroupRecovery(self, group)

    # -- streams ------------------------------------------------------------------------------
    def _expire(self, now: int) -> None:
        for table in (self._streams, self._waiting):
            stale = [k for k, seen in table.items() if now - seen > self.lease_ticks]
            for k in stale:
                del table[k]

    def take_slot(self, key: tuple[int, int]) -> bool:
        """Whether stream `key` may send a recovery chunk now (taking or renewing its slot)."""
        now = self.clock()
        if key in self._streams or not self.max_streams:
            self._streams[key] = now
            return True
        if len(self._streams) >= self.max_streams:
            self._expire(now)
        if len(self._streams) < self.max_streams:
            # Waiters ask again every tick; one silent for a few ticks went away (its group
            # stopped or caught up another way) and must not hold the queue.
            while self._waiting:
                first, seen = next(iter(self._waiting.items()))
                if first == key or now - seen <= WAITER_PATIENCE_TICKS:
                    break
                del self._waiting[first]
            first = next(iter(self._waiting), None)
            if first is None or first == key:
                self._waiting.pop(key, None)
                self._streams[key] = now
                self.granted += 1
                return True
        self._waiting[key] = now  # (a key already queued keeps its place: dict order)
        self.denied += 1
        return False

    def done(self, key: tuple[int, int]) -> None:
        self._streams.pop(key, None)
        self._waiting.pop(key, None)

    def release_group(self, group: int) -> None:
        for table in (self._streams, self._waiting):
            for k in [k for k in table if k[0] == group]:
                del table[k]

    # -- bytes --------------------------------------------------------------------------------
    def bytes_ready(self, nbytes: int) -> bool:
        return self._bucket is None or self._bucket.delay_for(nbytes) == 0

    def spend(self, nbytes: int) -> None:
        if self._bucket is not None:
            self._bucket.take(nbytes)

    def status(self) -> dict[str, int]:
        return {"streams": len(self._streams), "max_streams": self.max_streams,
                "waiting": len(self._waiting), "granted": self.granted, "denied": self.denied,
                "rate_bytes_per_tick": self.rate_bytes_per_tick}


@dataclass(slots=True, frozen=True)
class GroupRecovery:
    """What one group's core holds: the node's budget, with its group id bound."""

    budget: RecoveryBudget
    group: int

    def may_send(self, follower: int, nbytes: int) -> bool:
        """May the next recovery chunk (about `nbytes`) go to `follower` now?"""
        return self.budget.take_slot((self.group, follower)) and self.budget.bytes_ready(nbytes)

    def sent(self, nbytes: int) -> None:
        self.budget.spend(nbytes)

    def done(self, follower: int) -> None:
        self.budget.done((self.group, follower))

    def release(self) -> None:
        self.budget.release_group(self.group)
