"""acks=leader and acks=none writes are paced by replication (raft/core/backlog.py, issue 28).

A leader answers them on append, so nothing else stopped a producer from running the leader's
log far ahead of its followers (1.4 GB in 8 s, measured). Past `max_uncommitted_bytes`
appended beyond the commit index, such a write waits, unanswered and unwritten, until the
commit index makes room; every write proposed after it waits behind it (the log keeps the order
writes came in). Leadership lost first: NOT_LEADER, nothing written. What may wait is bounded;
past it a write is refused BACKPRESSURE.
"""

from __future__ import annotations

import pytest

from harness import Cluster
from raft.core.types import Acks, ErrorCode

LIMIT = 64 << 10
VALUES = [b"v" * 1000] * 8  # one ~8 KB batch per write
WRITES = 12  # ~96 KB: more than the limit, less than the limit plus what may wait (4x)


def _stalled(acks: Acks, writes: int = WRITES) -> tuple[Cluster, int, list[int]]:
    """A leader whose followers append but never flush (its commit index stands still), after
    `writes` writes of `acks`."""
    c = Cluster(3, max_uncommitted_bytes=LIMIT)
    leader = c.elect()
    c.tick(2)
    for f in c.ids:
        if f != leader:
            c.auto_flush[f] = False
    rids = [c.propose(leader, VALUES, acks) for _ in range(writes)]
    c.deliver()
    return c, leader, rids


def _unstall(c: Cluster, leader: int) -> None:
    for f in c.ids:
        if f != leader:
            c.auto_flush[f] = True
            c.flush(f)
    c.tick(3)


@pytest.mark.parametrize("acks", [Acks.LEADER, Acks.NONE])
def test_writes_that_do_not_wait_for_the_quorum_wait_past_the_backlog_bound(acks: Acks) -> None:
    c, leader, rids = _stalled(acks)
    core = c.cores[leader]
    taken = [r for r in rids if r in c.answers]
    assert taken == rids[:len(taken)] and 0 < len(taken) < len(rids)
    assert all(c.answers[r].error == ErrorCode.OK for r in taken)
    # The waiting ones are not in the log: it ends with the last one answered, and the
    # backlog is the limit plus at most the one batch that crossed it.
    assert c.logs[leader].dirty_offset == c.answers[taken[-1]].last_offset
    batch = core.leader.backlog.bytes // len(taken)
    assert LIMIT <= core.leader.backlog.bytes < LIMIT + batch
    # Replication makes room: every waiting write goes in, in the order proposed.
    _unstall(c, leader)
    assert all(c.answers[r].error == ErrorCode.OK for r in rids)
    offsets = [c.answers[r].base_offset for r in rids]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_a_quorum_write_waits_behind_them_in_order_and_commits() -> None:
    c, leader, rids = _stalled(Acks.NONE)
    quorum = c.propose(leader, VALUES, Acks.QUORUM)
    c.deliver()
    assert quorum not in c.answers
    _unstall(c, leader)
    assert c.answers[quorum].error == ErrorCode.OK
    assert c.answers[quorum].base_offset > max(c.answers[r].last_offset for r in rids)
    assert c.cores[leader].leader.backlog.bytes == 0


def test_waiting_writes_are_bounded_and_told_not_leader_when_leadership_goes() -> None:
    c, leader, rids = _stalled(Acks.NONE, writes=60)  # past the limit and 4x its bytes waiting
    refused = [r for r in rids if r in c.answers and c.answers[r].error != ErrorCode.OK]
    assert refused and all(c.answers[r].error == ErrorCode.BACKPRESSURE for r in refused)
    assert "max_uncommitted_bytes" in c.answers[refused[0]].message
    waiting = [r for r in rids if r not in c.answers]
    assert waiting
    dirty = c.logs[leader].dirty_offset
    c.cores[leader]._become_follower(c.cores[leader].term + 1, None)
    c.process(leader)
    assert all(c.answers[r].error == ErrorCode.NOT_LEADER for r in waiting)
    assert c.logs[leader].dirty_offset == dirty  # nothing of them was written
