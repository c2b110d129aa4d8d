"""The loads and subscription indexes read the log on the event loop while a state transfer's
reset runs on the storage worker (CI ci16: a node back from a state transfer stopped with
`OffsetOutOfRange: offset 0 is outside the log [12003, 12003)` from the retention task's loads
catch-up). The reset can land between an index's look at the log start and its read: the
index must take that as "not caught up yet" and restore from the new start on its next call,
never as a fault that stops the node."""

from __future__ import annotations

from typing import Any

import pytest

from raft.core.loads import LoadIndex
from raft.core.subscription_index import SubscriptionIndex
from storage.batch import Batch
from storage.memory import MemoryLog
from storage.records import encode_values


def _log(n: int) -> MemoryLog:
    log = MemoryLog()
    for off in range(n):
        log.append([Batch.create(encode_values([b"v%d" % off]), 1, timestamp_ms=1).placed(off, 1)])
    log.flush()
    return log


class ResetDuringRead:
    """The log, with a reset to `start` landing just before the index's first read: what the
    storage worker's state transfer does to an index on the event loop."""

    def __init__(self, log: MemoryLog, start: int) -> None:
        self._log, self._start, self.resets = log, start, 0

    def read_heads(self, *args: Any, **kwargs: Any) -> Any:
        if not self.resets:
            self.resets += 1
            self._log.reset(self._start, self._log.last_term())
        return self._log.read_heads(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


@pytest.mark.parametrize("index_type", [LoadIndex, SubscriptionIndex])
def test_a_reset_under_a_read_is_not_caught_up_yet_then_the_index_restores(index_type) -> None:
    log = _log(10)
    moving = ResetDuringRead(log, 20)
    idx = index_type(moving)
    assert idx.catch_up(25) is False  # the read met the new start: not caught up, no error
    assert moving.resets == 1
    for b in range(20, 26):
        log.append([Batch.create(encode_values([b"w"]), 1, timestamp_ms=1).placed(b, 1)])
    log.flush()
    assert idx.catch_up(25) is True  # restored at the new start, then read on
    assert idx.table.applied == 25
