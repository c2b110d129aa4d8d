"""A probe resent because a later heartbeat was answered instead is a reset of the stream.

While the leader probes a follower (one request at a time, ProgressState.PROBE), a heartbeat
reply makes it send the probe again ("a probe may have been lost"). When that heartbeat left
after the probe, the follower has either lost the probe or answered it late; if it crashed in
between, that late answer describes a tail it no longer holds. The resend must therefore move
the follower's `reset_seq` like any other reset, so that the late answer cannot raise
match_index (which picks the next index, the TimeoutNow target and learner promotions). Before
this rule only the first reset moved it: each later resend in probe state kept the old one
(issue 28, seen by bulk28).

Each row drives one follower through a probe whose success answer (sent before its flush) is
held back, then decides what happens before the held answer arrives. What must hold is the
row's `match` after it: never past what the follower holds, and a follower that did not crash
keeps what its answers showed (the rule must not cost a healthy follower its progress).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.progress import ProgressState
from raft.core.types import Acks

ELECTION_TICKS = 10


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    crash: bool  # the follower loses its unflushed tail while the answer is held
    heartbeat_after_probe: bool  # the answered heartbeat left after the probe (else before)


ROWS = [
    # The bug: the late answer raised match past the crashed follower's log.
    Row("crashed, a later heartbeat answered first", crash=True, heartbeat_after_probe=True),
    # No crash: the heartbeat's reply itself shows the appended tail (match moves by it).
    Row("alive, a later heartbeat answered first", crash=False, heartbeat_after_probe=True),
    # A heartbeat sent before the probe says nothing of it: the probe's answer still counts.
    Row("alive, an earlier heartbeat answered first", crash=False, heartbeat_after_probe=False),
]


def _probing(c: Cluster) -> tuple[int, int]:
    """A 3-node cluster whose leader probes follower `f`, which lacks committed entries (so
    the probe asks for no flush and `f` answers it at once, unflushed)."""
    leader = c.elect()
    c.tick(2)
    f = next(i for i in c.ids if i != leader)
    c.down.add(f)
    for _ in range(5):
        c.propose(leader, [b"v" * 10], Acks.QUORUM)
    c.tick(2 * ELECTION_TICKS)  # nothing answers: f's stream ages into a probe
    pr = c.cores[leader].progress(f)
    assert pr is not None and pr.state == ProgressState.PROBE
    assert c.cores[leader].commit_index == c.logs[leader].dirty_offset
    c.down.discard(f)
    return leader, f


def _run(row: Row) -> tuple[int, int, int]:
    """(leader's match for f, f's log end, the held answer's last_appended)."""
    c = Cluster(3, election_ticks=ELECTION_TICKS, max_append_bytes=1, max_inflight=1)
    leader, f = _probing(c)
    c.auto_flush[f] = False
    held: list[m.AppendEntriesReply] = []
    early: list[m.Message] = []  # a heartbeat sent before the probe, delivered after it
    capture = [not row.heartbeat_after_probe]

    def network(msg: m.Message) -> bool:
        if capture[0] and isinstance(msg, m.Heartbeat) and msg.dst == f:
            early.append(msg)
            return False
        if isinstance(msg, m.AppendEntriesReply) and msg.src == f and msg.success:
            held.append(msg)
            return False
        if isinstance(msg, m.AppendEntries) and msg.dst == f and held:
            return False  # a resent probe is lost: only the held answer can move match
        return True

    c.filter = network
    if capture[0]:
        c.cores[leader].tick()
        c.process(leader)
        capture[0] = False
        assert early
    # A heartbeat's answer lets the leader send its probe; f answers it at once, unflushed.
    c.tick()
    assert held, "f never answered a probe"
    assert held[0].last_appended > c.logs[f].flushed_offset
    if row.crash:
        c.crash(f)  # loses what the held answer reports
    if row.heartbeat_after_probe:
        c.cores[leader].tick()
        c.deliver()
    else:
        c.net.extend(early)
        c.deliver()
    c.cores[leader].step(held[0])  # the probe's answer arrives late
    c.process(leader)
    pr = c.cores[leader].progress(f)
    assert pr is not None
    return pr.match_index, c.logs[f].dirty_offset, held[0].last_appended


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_a_resent_probe_is_a_reset(row: Row) -> None:
    match, f_end, answered = _run(row)
    assert match <= f_end, (f"match {match} but the follower holds only up to {f_end} "
                            f"(a late answer from before the resend raised it)")
    if not row.crash:
        assert match == answered, f"the follower holds {answered} and match says {match}"
