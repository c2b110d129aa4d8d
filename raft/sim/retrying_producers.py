"""What the simulation's producers share (raft/sim/workload.py, raft/sim/topics_workload.py):
sequential idempotent producers with one request outstanding, which pick an ack level per
write, retry the same sequence after an error or silence, and follow the leader hint an answer
carries. One copy of that discipline, so both profiles' clients retry alike and a change to it
(a timeout, a back-off) reaches both.

The workloads keep what differs: where a request goes and what it carries (`_send`) and what an
acknowledgement proves (their checkers' bookkeeping). The random draws happen in the same order
as before this was shared, so a seed replays the same schedule.
"""

from __future__ import annotations

import random
from typing import Any

from raft.core.ready import ProduceAnswer
from raft.core.types import Acks, ErrorCode

# A request unanswered this long (simulated us) is given up and retried.
REQUEST_TIMEOUT_US = 300_000


class RetryingProducers:
    """The retry discipline, mixed into a workload dataclass that has `sim` (with `loop`),
    `rng`, `requests` (request id -> a tuple whose first item is the client), `stopped`,
    `think_us`, and a `_send(client)` that sends the client's current sequence. A client has
    `hint` (the node to try first), `acks` and `outstanding` (its request id, or None)."""

    sim: Any
    rng: random.Random
    requests: dict[int, tuple[Any, ...]]
    stopped: bool
    think_us: tuple[int, int]

    def _send(self, c: Any) -> None:
        raise NotImplementedError

    def _next(self, c: Any) -> None:
        """The client's next write, at an ack level drawn for it (mostly quorum)."""
        if self.stopped or c.outstanding is not None:
            return
        c.acks = self.rng.choices([Acks.QUORUM, Acks.LEADER, Acks.NONE], [6, 3, 1])[0]
        self._send(c)

    def _expect(self, c: Any, rid: int) -> None:
        """`rid` is now the client's request: silence past the timeout retries it."""
        c.outstanding = rid
        self.sim.loop.after(REQUEST_TIMEOUT_US, lambda: self._timeout(c, rid))

    def _timeout(self, c: Any, rid: int) -> None:
        if c.outstanding == rid:
            c.outstanding = None
            c.hint = None
            self._retry(c)

    def _retry(self, c: Any) -> None:
        if self.stopped:
            return
        self.sim.loop.after(self.rng.randint(1_000, 20_000),
                            lambda: (c.outstanding is None) and self._send(c))

    def _claim(self, a: ProduceAnswer) -> tuple[Any, ...] | None:
        """The request `a` answers, if it is still its client's outstanding one (a late
        answer to a request already retried is dropped); the client is then free."""
        req = self.requests.pop(a.request_id, None)
        if req is None or req[0].outstanding != a.request_id:
            return None
        req[0].outstanding = None
        return req

    def _follow(self, c: Any, node_id: int, a: ProduceAnswer) -> None:
        """After an answer (its acknowledgement already recorded): the next write after a
        think time, or a retry towards the leader the answer names (anywhere if none)."""
        if a.error == ErrorCode.OK:
            c.hint = node_id
            self.sim.loop.after(self.rng.randint(*self.think_us), lambda: self._next(c))
        elif a.error == ErrorCode.NOT_LEADER:
            c.hint = a.leader_id
            self._retry(c)
        else:
            c.hint = None
            self._retry(c)
