"""The leader's accumulator for subscription operations: many consumers' commits, one log entry.

A thousand consumers committing every 100 ms must not cost ten thousand log entries a second.
Operations wait here (at most `linger_ms`, or until `max_ops` are waiting) while at most
`max_inflight` entries are on their way to commit, then leave together as one CONTROL entry
(raft/core/subscription_table.py). Under load the batch is whatever arrived during one commit round trip,
so the entry rate stays bounded by the round trip, not by the commit rate; with one lone
consumer an entry leaves at once.

Two commits of the same subscription by the same consumer that are both still waiting become
one (the later position; both requesters get its verdict), which a consumer that commits faster
than entries commit would otherwise turn into a queue.

Every bound is explicit: `max_pending` operations waiting (beyond: refused, the caller answers
BACKPRESSURE), `max_ops` per entry, `max_inflight` entries proposed and not yet committed.

Sans-IO and generic over the waiter type: the runtime (raft/node/subscription_service.py) and the
simulation (raft/sim/subscription_model.py) both drive it; time comes in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from raft.core.subscription_table import Op, OpRequest

W = TypeVar("W")

DEFAULT_LINGER_MS = 2
DEFAULT_MAX_OPS = 2048
DEFAULT_MAX_PENDING = 100_000
DEFAULT_MAX_INFLIGHT = 1


@dataclass(slots=True)
class Slot(Generic[W]):
    """One operation of the next entry and everyone waiting for its verdict."""

    op: OpRequest
    waiters: list[W] = field(default_factory=list)


@dataclass(slots=True)
class Outgoing(Generic[W]):
    """One entry's worth: its operations (slot i is op i of the entry) and the barrier waiters
    (answered when the entry is applied, whatever it holds)."""

    seq: int
    slots: list[Slot[W]]
    barriers: list[W]

    @property
    def ops(self) -> list[OpRequest]:
        return [s.op for s in self.slots]


class CommitBatcher(Generic[W]):
    def __init__(self, *, linger_ms: int = DEFAULT_LINGER_MS, max_ops: int = DEFAULT_MAX_OPS,
                 max_pending: int = DEFAULT_MAX_PENDING,
                 max_inflight: int = DEFAULT_MAX_INFLIGHT) -> None:
        if linger_ms < 0 or max_ops < 1 or max_pending < max_ops or max_inflight < 1:
            raise ValueError("batcher bounds: linger_ms >= 0, max_ops >= 1, "
                             "max_pending >= max_ops, max_inflight >= 1")
        self.linger_ms = linger_ms
        self.max_ops = max_ops
        self.max_pending = max_pending
        self.max_inflight = max_inflight
        self._slots: list[Slot[W]] = []
        self._barriers: list[W] = []
        self._coalesce: dict[tuple[str, str, int], int] = {}  # (name, consumer, lease) -> slot
        self._first_ms: int | None = None
        self.inflight = 0
        self._seq = 0
        # Counters for status and the bench.
        self.ops_added = 0
        self.ops_coalesced = 0
        self.entries = 0

    # -- input ---------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._slots)

    def add(self, op: OpRequest, waiter: W, now_ms: int) -> bool:
        """Queue `op` for the next entry; False if the accumulator is full (BACKPRESSURE)."""
        if op.op == Op.COMMIT:
            key = (op.name, op.consumer, op.arg)
            i = self._coalesce.get(key)
            if i is not None and self._slots[i].op.position <= op.position:
                self._slots[i].op = op
                self._slots[i].waiters.append(waiter)
                self.ops_added += 1
                self.ops_coalesced += 1
                return True
        if len(self._slots) >= self.max_pending:
            return False
        if op.op == Op.COMMIT:
            key = (op.name, op.consumer, op.arg)
            if key in self._coalesce:
                # Below the waiting one (it will be refused): nothing may fold into it.
                del self._coalesce[key]
            else:
                self._coalesce[key] = len(self._slots)
        else:
            # Anything else on the name orders after the commits before it: no later commit of
            # that name may fold into an earlier slot across it.
            for key in [k for k in self._coalesce if k[0] == op.name]:
                del self._coalesce[key]
        self._slots.append(Slot(op, [waiter]))
        self.ops_added += 1
        self._touch(now_ms)
        return True

    def add_barrier(self, waiter: W, now_ms: int) -> None:
        """Wait for the next entry to be applied (a linearizable read: everything committed
        before the request is applied by then). Costs an entry only if nothing else is going."""
        self._barriers.append(waiter)
        self._touch(now_ms)

    def _touch(self, now_ms: int) -> None:
        if self._first_ms is None:
            self._first_ms = now_ms

    # -- output --------------------------------------------------------------------------------
    def due_at(self) -> int | None:
        """When the next entry may leave (None: nothing waits). The caller also needs a free
        in-flight slot (`can_send`)."""
        if self._first_ms is None:
            return None
        if len(self._slots) >= self.max_ops:
            return self._first_ms
        return self._first_ms + self.linger_ms

    def can_send(self, now_ms: int) -> bool:
        due = self.due_at()
        return due is not None and now_ms >= due and self.inflight < self.max_inflight

    def take(self) -> Outgoing[W]:
        """The next entry's operations (at most max_ops); counts it in flight until `done`."""
        n = min(len(self._slots), self.max_ops)
        slots, self._slots = self._slots[:n], self._slots[n:]
        barriers, self._barriers = self._barriers, []
        self._coalesce = {k: i - n for k, i in self._coalesce.items() if i >= n}
        self._first_ms = None
        if self._slots:
            self._first_ms = 0  # the rest is due at once
        self.inflight += 1
        self._seq += 1
        self.entries += 1
        return Outgoing(self._seq, slots, barriers)

    def done(self) -> None:
        """An entry taken earlier committed, failed or was given up on."""
        assert self.inflight > 0, "done() without a matching take()"
        self.inflight -= 1

    def drain(self) -> tuple[list[W], list[W]]:
        """Everything waiting (op waiters, barrier waiters): leadership ended, so none of it
        will be proposed here; the caller answers them NOT_LEADER."""
        waiters = [w for s in self._slots for w in s.waiters]
        barriers = self._barriers
        self._slots, self._barriers, self._coalesce, self._first_ms = [], [], {}, None
        return waiters, barriers
