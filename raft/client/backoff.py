"""How long a client waits between two attempts of one request: exponential backoff with
jitter, bounded, and never past the request's deadline.

Why these numbers: the first retries are quick (an election settles in a few hundred ms, and a
NOT_LEADER without a leader's address is answered at once), the delay doubles so that a cluster
that is restarting (every node down for seconds) is not hammered by every client at once, and
the cap keeps a client that waited out a long restart from noticing the cluster's return more
than about a second late. Jitter ("equal jitter": a uniform draw in [delay/2, delay]) spreads
the clients that all lost the same cluster at the same moment.

Defaults (Client(retry_backoff=..., retry_backoff_max=...)): the first pause is at most 0.01 s,
each next one at most twice the last, none over 1 s; the pauses stop at the caller's timeout.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

RETRY_BACKOFF_S = 0.01
RETRY_BACKOFF_MAX_S = 1.0


@dataclass(slots=True)
class Backoff:
    """The pauses of one request's retries. `next_pause(remaining)` returns how long to wait
    before the next attempt: in [delay/2, delay], delay doubling from `initial` up to `cap`,
    and never more than `remaining` (the time left before the caller's deadline)."""

    rng: random.Random
    initial: float = RETRY_BACKOFF_S
    cap: float = RETRY_BACKOFF_MAX_S
    _delay: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap:
            raise ValueError(f"retry backoff: need 0 < initial ({self.initial}) <= cap "
                             f"({self.cap}) seconds")
        self._delay = self.initial

    def next_pause(self, remaining: float) -> float:
        delay = self._delay
        self._delay = min(self._delay * 2, self.cap)
        return max(0.0, min(remaining, delay * (0.5 + 0.5 * self.rng.random())))


__all__ = ["RETRY_BACKOFF_MAX_S", "RETRY_BACKOFF_S", "Backoff"]
