"""A fresh heartbeat reply that shows nothing lost accounts for what was sent before it.

Many groups share one peer link (raft.node.peer), so one group's appends can wait in the link's
bulk lane behind other groups' data, while its heartbeats (control lane) overtake them with a
seq lowered below the first queued append (raft.node.outbox). A follower that answers those
heartbeats is alive and has lost nothing; the leader must not take the appends' wait for a
loss, restart the stream from the match index and resend (from disk, by then) what is still
on its way. Likewise a follower whose append replies wait for its flush has still appended:
its heartbeat replies free the window. A follower that answers nothing still gets a probe.
"""

from __future__ import annotations

import dataclasses

from harness import Cluster
from raft.core import messages as m
from raft.core.types import Acks

ELECTION_TICKS = 10


def _appends_to(c: Cluster, dst: int) -> list[m.AppendEntries]:
    return [x for x in c.sent if isinstance(x, m.AppendEntries) and x.dst == dst and x.batches]


def _resent(appends: list[m.AppendEntries]) -> int:
    """Appends that start at or before the end of an earlier one (a restarted stream)."""
    end, n = -1, 0
    for a in appends:
        if a.batches[0].base_offset <= end:
            n += 1
        end = max(end, a.batches[-1].last_offset)
    return n


def _hold_appends(c: Cluster, slow: int) -> list[m.Message]:
    """Appends to `slow` wait (as in a busy link's bulk lane); everything else flows, and a
    heartbeat to `slow` that overtakes them leaves with its seq just below the first of them,
    as raft.node.outbox.PeerStream.leaving does."""
    held: list[m.Message] = []
    pass_through = c.filter

    def link(msg: m.Message) -> bool:
        if msg.dst == slow and isinstance(msg, m.AppendEntries):
            held.append(msg)
            return False
        if msg.dst == slow and isinstance(msg, m.Heartbeat) and held:
            first = held[0].seq
            if msg.seq >= first:
                c.net.append(dataclasses.replace(msg, seq=first - 1))
                return False
        return pass_through(msg)

    c.filter = link
    return held


def test_appends_queued_behind_other_groups_are_not_resent_while_heartbeats_answer() -> None:
    c = Cluster(3, election_ticks=ELECTION_TICKS)
    leader = c.elect()
    c.tick(2)
    slow = next(i for i in c.ids if i != leader)
    held = _hold_appends(c, slow)
    for _ in range(3):
        c.propose(leader, [b"v" * 100], Acks.QUORUM)
    c.tick(3 * ELECTION_TICKS)  # the appends wait three election timeouts; heartbeats flow
    assert len(held) == 3
    c.filter = lambda msg: True
    c.net.extend(held)  # the link finally writes them, in order
    c.deliver()
    c.tick(2)
    appends = _appends_to(c, slow)
    assert _resent(appends) == 0, [(a.seq, a.batches[0].base_offset) for a in appends]
    assert c.logs[slow].dirty_offset == c.logs[leader].dirty_offset


def test_heartbeat_replies_free_the_window_of_a_follower_slow_to_flush() -> None:
    c = Cluster(3, election_ticks=ELECTION_TICKS, max_inflight=2)
    leader = c.elect()
    c.tick(2)
    slow = next(i for i in c.ids if i != leader)
    c.auto_flush[slow] = False  # its append replies wait for a flush that does not come
    for _ in range(8):
        c.propose(leader, [b"v" * 100], Acks.QUORUM)
    c.tick(3)
    # It appended everything (heartbeat replies showed it) though it acked nothing yet...
    assert c.logs[slow].dirty_offset == c.logs[leader].dirty_offset
    c.tick(3 * ELECTION_TICKS)
    # ...and nothing was resent to it while it kept answering heartbeats.
    assert _resent(_appends_to(c, slow)) == 0


def test_a_follower_that_answers_nothing_still_gets_a_probe() -> None:
    c = Cluster(3, election_ticks=ELECTION_TICKS)
    leader = c.elect()
    c.tick(2)
    slow = next(i for i in c.ids if i != leader)
    c.filter = lambda msg: msg.src != slow  # its replies are all lost
    c.propose(leader, [b"v" * 100], Acks.QUORUM)
    c.tick(ELECTION_TICKS + 2)
    c.filter = lambda msg: True
    c.tick(2)
    assert _resent(_appends_to(c, slow)) >= 1  # the stream restarted from the match index
    assert c.logs[slow].dirty_offset == c.logs[leader].dirty_offset
