"""The node's recovery budget (recovery/budget.py): at most K catch-up streams at once, granted
first come first served as slots free, freed when caught up, when the leader steps down, or when
nobody renews them; one byte rate for all; and in the core, a second partition's lagging
follower waits while the only slot is taken, then catches up."""

from __future__ import annotations

import pytest

from raft.core import messages as m
from raft.core.types import Acks
from recovery.budget import RecoveryBudget

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "raft"))
from harness import Cluster  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def budget(**kw) -> tuple[RecoveryBudget, Clock]:
    clock = Clock()
    return RecoveryBudget(clock=clock, **kw), clock


def test_slots_are_granted_in_the_order_streams_asked() -> None:
    b, clock = budget(max_streams=2)
    a, c, d, e = (b.for_group(g) for g in (1, 2, 3, 4))
    assert a.may_send(9, 100) and c.may_send(9, 100)
    assert not d.may_send(9, 100)  # full: d waits first
    assert not e.may_send(9, 100)  # ... then e
    a.done(9)
    assert not e.may_send(9, 100), "a later stream must not overtake one waiting longer"
    assert d.may_send(9, 100)
    assert b.status()["streams"] == 2 and b.status()["waiting"] == 1
    c.done(9)
    assert e.may_send(9, 100)
    assert a.may_send(8, 0) is False  # (another follower of group 1: a new stream, queued)


@pytest.mark.parametrize("case", ["lease", "step_down", "waiter_left"])
def test_a_slot_or_a_place_is_never_held_by_a_stream_that_went_away(case: str) -> None:
    b, clock = budget(max_streams=1, lease_ticks=10)
    a, c, d = (b.for_group(g) for g in (1, 2, 3))
    assert a.may_send(9, 1)
    if case == "lease":  # group 1 stopped without a word: its slot expires
        clock.now = 11
        assert c.may_send(9, 1)
    elif case == "step_down":
        assert not c.may_send(9, 1)
        a.release()
        assert c.may_send(9, 1)
    else:  # c queued, then stopped asking: d is not held behind it once a slot frees
        assert not c.may_send(9, 1)
        clock.now = 2
        assert not d.may_send(9, 1)
        a.done(9)
        clock.now = 6  # c silent for 6 ticks, d asked 4 ticks ago
        assert d.may_send(9, 1)


def test_one_byte_rate_for_every_stream_and_zero_means_no_limit() -> None:
    b, clock = budget(rate_bytes_per_tick=1000, burst_bytes=1000)
    a, c = b.for_group(1), b.for_group(2)
    assert a.may_send(9, 1000)
    a.sent(1000)
    assert not c.may_send(9, 1000), "the other group draws from the same bucket"
    clock.now = 1
    assert c.may_send(9, 1000)
    free, _ = budget()
    assert all(free.for_group(g).may_send(9, 1 << 30) for g in range(100))


def test_a_second_partitions_lagging_follower_waits_for_the_only_slot() -> None:
    """Two groups (as two partitions led on one node) share a budget of one stream: while one
    follower catches up, the other group's lagging follower gets no recovery chunk; once the
    first caught up, the second does too. Messages are delivered a few at a time, both groups
    interleaved, so the two recoveries could overlap if the budget let them."""
    b, clock = budget(max_streams=1)
    knobs = dict(recovery_chunk_bytes=4096, max_append_bytes=4096)
    groups = [Cluster(3, recovery=b.for_group(g), **knobs) for g in (1, 2)]
    lagging = []
    for c in groups:
        leader = c.elect()
        c.tick(2)
        lag = next(i for i in c.ids if i != leader)
        c.down.add(lag)
        for _ in range(100):
            c.propose(leader, [b"x" * 1000], Acks.LEADER)
        c.tick(12)
        lagging.append((c, leader, lag))
    for c, _, lag in lagging:
        c.down.discard(lag)
    chunks: list[list[int]] = [[], []]  # the steps at which each lag got a recovery chunk
    for step in range(20_000):
        clock.now = step // 10
        for k, (c, leader, lag) in enumerate(lagging):
            c.sent.clear()
            if step % 10 == 0:
                for i in c.ids:
                    c.cores[i].tick()
            c.deliver(max_messages=2)
            if any(isinstance(x, m.AppendEntries) and x.dst == lag and x.batches
                   and not x.flush for x in c.sent):
                chunks[k].append(step)
        assert b.status()["streams"] <= 1
        if all(c.logs[lag].dirty_offset == c.logs[leader].dirty_offset
               for c, leader, lag in lagging):
            break
    else:
        raise AssertionError("both followers catch up in turn")
    assert chunks[0] and chunks[1], chunks
    first, second = sorted(chunks, key=min)
    assert max(first) < min(second), "one recovery at a time"


def test_a_follower_the_quorum_needs_is_never_held_back() -> None:
    """The budget bounds background catch-up, not a partition's writes: with every slot held by
    other partitions, a group whose majority waits on its recovering followers still catches
    one up and commits."""
    b, clock = budget(max_streams=1)
    other = b.for_group(99)
    c = Cluster(3, recovery=b.for_group(1), recovery_chunk_bytes=4096, max_append_bytes=4096)
    leader = c.elect()
    c.tick(2)
    lag, other_follower = [i for i in c.ids if i != leader]
    # `lag` misses 100 KiB the others commit (so it lacks committed entries: recovering, not
    # merely behind the write pipeline), then the other follower stops and one more write
    # can commit only once `lag` caught up.
    c.down.add(lag)
    for _ in range(100):
        c.propose(leader, [b"x" * 1000], Acks.LEADER)
    c.tick(12)
    assert c.cores[leader].commit_index == c.logs[leader].dirty_offset
    c.down = {other_follower}
    c.propose(leader, [b"x" * 1000], Acks.LEADER)
    for step in range(5_000):
        clock.now = step // 10
        assert other.may_send(7, 0)  # another partition keeps the only slot
        if step % 10 == 0:
            for i in c.ids:
                c.cores[i].tick()
        c.deliver(max_messages=2)
        if c.cores[leader].commit_index == c.logs[leader].dirty_offset:
            break
    assert c.cores[leader].commit_index == c.logs[leader].dirty_offset, \
        "the group's writes waited for a slot another partition held"
