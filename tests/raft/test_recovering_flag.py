"""When a follower stops recovering (FollowerProgress.recovering, shown in `status`).

The rule: a follower is recovering while it needs more requests to reach the leader's tail
and lacks committed entries, i.e. while its match index is below both the leader's dirty
offset and its commit index (one lacking only the write pipeline is in step, issue 28). Once
it matches the tail it is not recovering, however it got there: the tail chunk of the stream, or a reply or flush
report showing it already held what a resent chunk was about to repeat. Whether it has
flushed yet does not matter: it needs no more requests, only its own deferred flush, and
its next append must be a normal one (tail-sized, asking for a flush, never throttled).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.types import Acks
from storage.batch import Batch
from storage.records import encode_values


def _recovering(c: Cluster, leader: int, follower: int) -> bool:
    status = c.cores[leader].status()
    return next(f.recovering for f in status.followers if f.node_id == follower)


def _behind(c: Cluster, *, quiet_ticks: int, drop: Callable[[m.Message, int], bool],
            then_drop: Callable[[m.Message, int], bool]) -> tuple[int, int]:
    """A 3-node cluster, one follower stopped while 200 KiB were written (67 chunks), then
    back with its messages filtered by `drop` for `quiet_ticks` ticks, then by `then_drop`
    for as long again. Returns (leader, follower) with the filters lifted."""
    leader = c.elect()
    c.tick(2)
    lag = next(i for i in c.ids if i != leader)
    c.down.add(lag)
    for _ in range(200):
        c.propose(leader, [b"x" * 1000], Acks.LEADER)
    c.tick(2)
    c.down.discard(lag)
    c.filter = lambda msg: not drop(msg, lag)
    c.tick(quiet_ticks)
    c.filter = lambda msg: not then_drop(msg, lag)
    c.tick(quiet_ticks)
    c.filter = lambda msg: True
    return leader, lag


def _resent_short_of_tail(c: Cluster, leader: int, lag: int) -> bool:
    """After a chunk reached the leader's tail, a later one to `lag` stopped short of it (a
    resend after a reset): the premise of the rows that lose replies."""
    tail = c.logs[leader].dirty_offset
    reached = False
    for x in c.sent:
        if isinstance(x, m.AppendEntries) and x.dst == lag and x.batches:
            last = x.batches[-1].last_offset
            if reached and last < tail:
                return True
            reached = reached or last >= tail
    return False


def _no_drop(msg: m.Message, lag: int) -> bool:
    return False


def _after_first_success_drop_its_replies() -> Callable[[m.Message, int], bool]:
    """Let the follower's first successful append reply through (it turns replicate, and the
    whole stream leaves in one window), then drop everything it says: the leader hears of no
    progress for an election timeout and resends from its match point a chunk the follower
    already holds."""
    seen: list[bool] = []

    def drop(msg: m.Message, lag: int) -> bool:
        if msg.src != lag:
            return False
        if seen:
            return True
        if isinstance(msg, m.AppendEntriesReply) and msg.success:
            seen.append(True)
        return False
    return drop


def _its_heartbeat_replies(msg: m.Message, lag: int) -> bool:
    """The leader hears the follower only through replies to appends: the resent chunk's
    reply, not a heartbeat reply's flush report, tells it the follower holds the tail."""
    return msg.src == lag and isinstance(msg, m.HeartbeatReply)


# The row tests/raft/test_mutants.py runs as the killer of the mutant that reverts the rule.
RESENT_CHUNK_REPLY = "the reply to a resent chunk shows it already holds the tail"

# Enough in flight for the whole stream to leave at once (its last chunk reaches the tail).
WIDE = {"max_inflight": 256, "max_inflight_bytes": 1 << 30}

ROWS = [
    # (name, knobs, quiet ticks, drop while quiet, drop after that)
    ("the stream's tail chunk reaches it",
     {}, 0, lambda: _no_drop, _no_drop),
    ("a heartbeat reply's flush report shows it holds the tail after a resend",
     WIDE, 12, _after_first_success_drop_its_replies, _no_drop),
    (RESENT_CHUNK_REPLY,
     WIDE, 12, _after_first_success_drop_its_replies, _its_heartbeat_replies),
]


def row(name: str) -> tuple[object, ...]:
    """One row of ROWS by its name (tests/raft/test_mutants.py runs one as a killer)."""
    return next(r for r in ROWS if r[0] == name)


@pytest.mark.parametrize("name,knobs,quiet,make_drop,then_drop", ROWS,
                         ids=[r[0] for r in ROWS])
def test_a_follower_that_matches_the_leaders_tail_is_not_recovering(
        name: str, knobs: dict[str, int], quiet: int,
        make_drop: Callable[[], Callable[[m.Message, int], bool]],
        then_drop: Callable[[m.Message, int], bool]) -> None:
    c = Cluster(3, recovery_chunk_bytes=4096, max_append_bytes=4096, **knobs)
    leader, lag = _behind(c, quiet_ticks=quiet, drop=make_drop(), then_drop=then_drop)
    assert _resent_short_of_tail(c, leader, lag) == (quiet > 0), "the row's premise is not met"
    for _ in range(100):
        c.tick()
        if (c.logs[lag].flushed_offset == c.logs[leader].dirty_offset
                and not c.cores[leader].leader.progress[lag].inflight):
            break
    pr = c.cores[leader].leader.progress[lag]
    assert pr.match_index == c.logs[leader].dirty_offset, "never caught up"
    assert pr.flushed_offset == c.logs[leader].dirty_offset
    assert not _recovering(c, leader, lag), \
        f"{name}: follower {lag} matched and flushed the leader's tail, but status says recovering"
    # Its next append is a normal one: tail-sized and asking for a flush.
    c.sent.clear()
    c.propose(leader, [b"y" * 100], Acks.QUORUM)
    c.deliver()
    appends = [x for x in c.sent if isinstance(x, m.AppendEntries) and x.dst == lag
               and x.batches]
    assert appends and all(x.flush for x in appends), appends
    assert not _recovering(c, leader, lag)


def test_a_follower_still_behind_is_recovering() -> None:
    """The other side of the rule: mid-stream, with chunks still to send, it is recovering."""
    c = Cluster(3, recovery_chunk_bytes=4096, max_append_bytes=4096, max_inflight=2)
    leader = c.elect()
    c.tick(2)
    lag = next(i for i in c.ids if i != leader)
    c.down.add(lag)
    for _ in range(200):
        c.propose(leader, [b"x" * 1000], Acks.LEADER)
    c.tick(2)
    c.down.discard(lag)
    c.filter = lambda msg: msg.src != lag or not isinstance(msg, m.AppendEntriesReply)
    c.tick(3)
    pr = c.cores[leader].leader.progress[lag]
    assert pr.match_index < c.logs[leader].dirty_offset
    assert _recovering(c, leader, lag)


def test_a_follower_lacking_only_uncommitted_entries_is_replicated_in_step() -> None:
    """Issue 28: under eight producers the leader's log runs a few MiB ahead of both
    followers for good. A follower that lacks only entries not yet committed (the write
    pipeline) is in step: every request to it asks for a flush (the quorum may be waiting
    for it) and it never counts as recovering (no deferred flush, no recovery throttle). One
    that lacks committed entries still gets flush=False chunks until the last one."""
    c = Cluster(3, max_append_bytes=1, max_inflight=1)
    leader = c.elect()
    c.tick(2)
    f = next(i for i in c.ids if i != leader)
    c.auto_flush[f] = False  # f answers only after its flush: its window stays full
    c.sent.clear()
    for rid in (901, 902, 903):  # proposed together: the first request is not at the tail
        c.cores[leader].propose(rid, Batch.create(encode_values([b"x" * 1000]), 1),
                                Acks.LEADER)
    c.deliver()
    to_f = [x for x in c.sent if isinstance(x, m.AppendEntries) and x.dst == f and x.batches]
    assert to_f and all(x.flush for x in to_f), [x.flush for x in to_f]
    assert not _recovering(c, leader, f)
    # The third node committed all three meanwhile: f now lacks committed entries, and the
    # request after its flush (one batch, more committed ones follow) defers its flush.
    assert c.cores[leader].commit_index == c.logs[leader].dirty_offset
    c.sent.clear()
    c.flush(f)
    c.deliver()
    to_f = [x for x in c.sent if isinstance(x, m.AppendEntries) and x.dst == f and x.batches]
    assert to_f and not to_f[0].flush
