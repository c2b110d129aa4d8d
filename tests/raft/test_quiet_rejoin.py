"""A node that restarts faster than the failure detector's down bound, with less than it had,
while its group is quiesced (raft/core/quiesce.py, `_announces_itself` and `_announce`).

Nothing reports it down and up again, so no peer_up wakes its group, and it may not campaign
(it lost its disk, or flushed entries it must get back first): before these rules nobody ever
sent it anything and it stayed empty or behind until the next write woke the group (the
simulation's diskloss seeds 11250097, 11250113 and 11250769 with 3 nodes, 77281 with 5). The
harness below has no failure detector, which is exactly the unseen restart."""

from __future__ import annotations

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.types import Role
from storage.memory import MemoryLog
from test_quiesce import E, followers, quiet_cluster


def _wipe(c: Cluster, i: int) -> None:
    """Node i restarts at once on an empty data directory with the same id."""
    c.logs[i] = MemoryLog()
    c.cores[i] = c._new_core(i)


def _converged(c: Cluster, leader: int) -> bool:
    top = c.logs[leader].dirty_offset
    return all(c.logs[i].flushed_offset == top and c.cores[i].commit_index == top
               and c.cores[i].leader_id == leader and c.cores[i].may_vote() for i in c.ids)


def _tick_until_converged(c: Cluster, ticks: int) -> int:
    for _ in range(ticks):
        leader = c.leader()
        if leader is not None and _converged(c, leader):
            return leader
        c.tick()
    raise AssertionError("not converged: " + str({
        i: (c.cores[i].role.value, c.cores[i].term, c.logs[i].dirty_offset,
            c.cores[i].commit_index, c.cores[i].quiesced, c.cores[i].standing().value)
        for i in c.ids}))


def test_a_wiped_followers_probe_wakes_its_quiet_leader_which_re_adds_it() -> None:
    c, leader = quiet_cluster()
    a, _ = followers(c, leader)
    _wipe(c, a)
    c.deliver()  # its bootstrap probes, their answers, and what they set off: no tick
    lead = c.cores[leader]
    assert (a in lead._rejoiners or lead.config.incarnations.get(a) == c.logs[a].incarnation), \
        f"the quiet leader did not hear of the lost disk: {c.cores[a].standing().value}"
    _tick_until_converged(c, 20 * E)
    assert c.cores[leader].config.incarnations[a] == c.logs[a].incarnation


def test_a_wiped_follower_whose_probes_to_the_leader_are_lost_still_gets_re_added() -> None:
    """The other follower's answer makes it a node that lost its disk (it stops probing);
    that follower wakes and pings the leader, and the node itself announces."""
    c, leader = quiet_cluster()
    a, _ = followers(c, leader)
    c.filter = lambda msg: not (isinstance(msg, m.BootstrapProbe) and msg.dst == leader)
    _wipe(c, a)
    _tick_until_converged(c, 20 * E)


@pytest.mark.parametrize("who", ["follower", "leader"])
def test_a_node_that_lost_flushed_entries_and_restarted_unseen_is_caught_up(who: str) -> None:
    """It keeps its term and vote, so it does not probe; it may not campaign until it holds
    what it lost, and knows no leader: it pings every member when its election timer runs
    out. A quiet leader catches it up; quiet followers of a leader that was it wake, time
    out and elect another."""
    c, leader = quiet_cluster()
    node = leader if who == "leader" else followers(c, leader)[0]
    top = c.logs[node].dirty_offset
    c.logs[node].lose_batches(0)  # a truncated file: only the first batch is left
    c.crash(node)
    assert c.logs[node].lost_position is not None and not c.cores[node]._may_campaign()
    new = _tick_until_converged(c, 20 * E)
    assert c.logs[node].dirty_offset >= top
    if who == "leader":
        assert new != node


# -- the wake-up rules, one message at a time ---------------------------------------------------
def _probe(src: int, dst: int) -> m.BootstrapProbe:
    return m.BootstrapProbe(src, dst, 0, 12345)


def _ping(src: int, dst: int, term: int, seq: int = 0) -> m.HeartbeatReply:
    return m.HeartbeatReply(src, dst, term, seq, -1, 0, -1, 0, 12345, True)


def _late_reply(src: int, dst: int, incarnation: int) -> m.HeartbeatReply:
    """A reply of an older term from the incarnation the leader knows, delayed."""
    return m.HeartbeatReply(src, dst, 0, 7, -1, 0, -1, 0, incarnation, False)


CASES = [
    # (what arrives, sent by, at which core, does it wake)
    ("a probe from a member", _probe, "leader", True),
    ("a probe from a member", _probe, "follower", True),
    ("a lower term's ping from a member", lambda s, d: _ping(s, d, 0), "leader", True),
    ("a lower term's ping from a member", lambda s, d: _ping(s, d, 0), "follower", True),
    ("a lower term's late reply (seq > 0)", _late_reply, "leader", False),
    ("a probe from a node that is no member", _probe, "leader", False),
]


@pytest.mark.parametrize("what,make,at,wakes", CASES, ids=[f"{c[0]} at the {c[2]}"
                                                            for c in CASES])
def test_what_a_node_that_restarted_unseen_sends_wakes_a_quiet_core(what, make, at,  # noqa: ANN001
                                                                       wakes) -> None:
    c, leader = quiet_cluster()
    a, b = followers(c, leader)
    core_id = leader if at == "leader" else b
    src = 9 if "no member" in what else a
    core = c.cores[core_id]
    core.step(_late_reply(src, core_id, c.cores[a].incarnation) if make is _late_reply
              else make(src, core_id))
    assert core.quiesced is not wakes, what
    rd = core.ready()
    if wakes and at == "leader":
        assert {x.dst for x in rd.messages if isinstance(x, m.Heartbeat)} == {a, b}
    if wakes and at == "follower":
        assert any(isinstance(x, m.HeartbeatReply) and x.dst == leader and x.seq == 0
                   for x in rd.messages), "a woken follower pings its leader"
    assert core.role == (Role.LEADER if at == "leader" else Role.FOLLOWER)
