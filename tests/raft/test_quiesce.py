"""Quiescence (raft/core/quiesce.py): an idle group goes quiet, each condition alone keeps it
awake, whatever matters wakes it, and node liveness (peer_down / peer_up) stands in for the
heartbeats a quiet group no longer sends."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.leader_state import Waiting
from raft.core.types import Acks, Role
from raft.protocol.raft_frames import message_from_wire, message_to_wire

Q = 3  # quiesce_ticks in these tests
E = 10  # election_ticks (the harness default)


def quiet_cluster(n: int = 3, **knobs: object) -> tuple[Cluster, int]:
    """A cluster with some data, ticked until every core is quiesced."""
    c = Cluster(n, quiesce_ticks=Q, **knobs)
    leader = c.elect()
    c.propose(leader, [b"a", b"b"])
    c.deliver()
    settle(c)
    return c, leader


def settle(c: Cluster, max_ticks: int = 4 * Q + 10) -> int:
    """Tick until every live core is quiesced; returns the ticks it took."""
    for t in range(max_ticks):
        if all(c.cores[i].quiesced for i in c.ids if i not in c.down):
            return t
        c.tick()
    states = {i: (c.cores[i].role.value, c.cores[i].quiesced,
                  c.cores[i]._quiesce_blocker() if c.cores[i].leader else "")
              for i in c.ids if i not in c.down}
    raise AssertionError(f"not every core quiesced within {max_ticks} ticks: {states}")


def followers(c: Cluster, leader: int) -> list[int]:
    return [i for i in c.ids if i != leader]


# -- going quiet ---------------------------------------------------------------------------------
def test_an_idle_group_quiesces_and_then_sends_nothing() -> None:
    c, leader = quiet_cluster()
    lead = c.cores[leader]
    assert lead.role == Role.LEADER and lead.commit_index == lead.log.dirty_offset
    before = len(c.sent)
    terms = {i: c.cores[i].term for i in c.ids}
    c.tick(20 * E)  # many election timeouts: nobody campaigns, nobody heartbeats
    assert len(c.sent) == before
    assert {i: c.cores[i].term for i in c.ids} == terms
    assert all(c.cores[i].quiesced for i in c.ids)


def test_a_quiesced_cores_tick_is_a_no_op_that_emits_nothing() -> None:
    c, leader = quiet_cluster()
    for i in c.ids:
        core = c.cores[i]
        state = (core.role, core.term, core._election_elapsed, core._ticks, core.commit_index,
                 core._randomized_timeout)
        for _ in range(3 * E):
            core.tick()
            assert core.ready().empty()
        assert (core.role, core.term, core._election_elapsed, core._ticks, core.commit_index,
                core._randomized_timeout) == state


def test_quiescing_checkpoints_the_commit_index() -> None:
    """No tick will ask for the periodic checkpoint while quiet: the hard state goes now, so a
    restart of a quiet node comes back with the commit index it served."""
    c, leader = quiet_cluster(commit_checkpoint_ticks=1000)
    for i in c.ids:
        c.crash(i)
        assert c.cores[i].commit_index == c.logs[i].dirty_offset


def test_a_follower_that_never_answers_quiesced_keeps_its_leader_heartbeating() -> None:
    """An older follower (it ignores the field) or one with quiescence off never answers
    quiesced: the leader keeps heartbeating it, so it never times out."""
    c = Cluster(3, quiesce_ticks=Q)
    leader = c.elect()
    old = followers(c, leader)[0]
    c.cores[old].cfg.quiesce_ticks = 0
    c.propose(leader, [b"a"])
    c.tick(10 * E)
    assert not c.cores[leader].quiesced
    assert c.cores[leader].role == Role.LEADER and c.cores[old].leader_id == leader
    assert not c.cores[old].quiesced
    term = c.cores[leader].term
    assert all(c.cores[i].term == term for i in c.ids)
    heartbeats = [x for x in c.sent[-20:] if isinstance(x, m.Heartbeat)]
    assert heartbeats and all(x.dst == old for x in heartbeats)


# -- each condition alone keeps the leader awake ---------------------------------------------------
def _lagging_follower(c: Cluster, leader: int) -> str:
    """Its appends are lost, its heartbeats are not: the heartbeats carry min(commit, its
    match), so the follower itself would agree to go quiet; only the leader knows it lags."""
    f = followers(c, leader)[0]
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.dst == f)
    c.propose(leader, [b"more"])
    return f"follower {f} has matched"


def _unflushed_follower(c: Cluster, leader: int) -> str:
    f = followers(c, leader)[0]
    c.auto_flush[f] = False
    c.propose(leader, [b"more"], Acks.LEADER)
    return f"follower {f}"


def _pending_answer(c: Cluster, leader: int) -> str:
    lead = c.cores[leader].leader
    assert lead is not None
    last = c.logs[leader].dirty_offset
    lead.waiting.append(Waiting(999, last + 1, last + 1))
    return "answers wait"


def _uncommitted(c: Cluster, leader: int) -> str:
    c.filter = lambda msg: not isinstance(msg, m.AppendEntries)
    c.propose(leader, [b"more"], Acks.LEADER)
    return "not committed"


def _leader_unflushed(c: Cluster, leader: int) -> str:
    c.auto_flush[leader] = False
    c.propose(leader, [b"more"], Acks.NONE)
    return "leader's own log is not flushed"


def _membership_change(c: Cluster, leader: int) -> str:
    c.filter = lambda msg: msg.dst != 9  # a learner that never starts
    c.cores[leader].propose_config(12345, add_learner=9, address="nowhere:1")
    c.process(leader)
    return "learners"


def _lost_quorum(c: Cluster, leader: int) -> str:
    for f in followers(c, leader):
        c.cores[leader].peer_down(f)
    c.filter = lambda msg: False
    return "not a majority"


def _in_flight(c: Cluster, leader: int) -> str:
    f = followers(c, leader)[0]
    # The append never arrives (nor would its reply): a heartbeat reply that showed the
    # follower holding it would account for it (LeaderSide._heartbeat_accounts).
    c.filter = lambda msg: not (isinstance(msg, (m.AppendEntries, m.AppendEntriesReply))
                                and f in (msg.src, msg.dst))
    c.propose(leader, [b"more"], Acks.LEADER)
    return f"follower {f}"


CONDITIONS: list[tuple[str, Callable[[Cluster, int], str]]] = [
    ("a follower lags", _lagging_follower),
    ("a follower has not flushed", _unflushed_follower),
    ("an answer waits for the commit index", _pending_answer),
    ("entries are not committed", _uncommitted),
    ("the leader has not flushed", _leader_unflushed),
    ("a membership change is in progress", _membership_change),
    ("the live voters are not a majority", _lost_quorum),
    ("an append is in flight, unanswered", _in_flight),
]


@pytest.mark.parametrize("name,condition", CONDITIONS, ids=[x[0] for x in CONDITIONS])
def test_each_condition_alone_keeps_the_leader_awake(
        name: str, condition: Callable[[Cluster, int], str]) -> None:
    c = Cluster(3, quiesce_ticks=Q, check_quorum=False)
    leader = c.elect()
    c.propose(leader, [b"a"])
    c.deliver()
    c.tick(1)  # caught up, not idle long enough yet
    assert not c.cores[leader].quiesced and c.cores[leader]._quiesce_blocker() == ""
    expect = condition(c, leader)
    c.deliver()
    c.tick(4 * Q + 5)
    core = c.cores[leader]
    assert core.role == Role.LEADER
    assert not core.quiesced, name
    assert expect in core._quiesce_blocker(), core._quiesce_blocker()


def test_quiescence_off_never_quiesces() -> None:
    c = Cluster(3, quiesce_ticks=0)
    leader = c.elect()
    c.propose(leader, [b"a"])
    c.tick(10 * E)
    assert not any(c.cores[i].quiesced for i in c.ids)
    assert "off" in c.cores[leader]._quiesce_blocker()


def test_a_transfer_in_progress_keeps_the_leader_awake_until_it_gives_up() -> None:
    c = Cluster(3, quiesce_ticks=Q)
    leader = c.elect()
    c.propose(leader, [b"a"])
    to = followers(c, leader)[0]
    c.filter = lambda msg: not isinstance(msg, m.TimeoutNow)
    c.cores[leader].transfer_leadership(to)
    c.process(leader)
    c.tick(E - 1)
    assert not c.cores[leader].quiesced
    assert "leadership is moving" in c.cores[leader]._quiesce_blocker()
    settle(c)  # it gave up after an election timeout: quiet again
    assert c.cores[leader].role == Role.LEADER


def test_a_follower_does_not_quiesce_unless_its_log_matches_the_leaders() -> None:
    """A quiescing heartbeat whose commit index is not our log's end (we hold more, or less,
    or have not flushed) is answered, not obeyed."""
    c, leader = quiet_cluster()
    f = followers(c, leader)[0]
    core = c.cores[f]
    core.wake()
    c.net.clear()
    last = c.logs[f].dirty_offset
    for commit in (last - 1, last + 1):
        core.step(m.Heartbeat(leader, f, core.term, commit, 10_000, quiesce=True))
        rd = core.ready()
        replies = [x for x in rd.messages if isinstance(x, m.HeartbeatReply)]
        assert replies and not replies[0].quiesced
        assert not core.quiesced
    core.step(m.Heartbeat(leader, f, core.term, last, 10_001, quiesce=True))
    rd = core.ready()
    assert core.quiesced and [x.quiesced for x in rd.messages] == [True]


# -- wake-ups ------------------------------------------------------------------------------------
def test_a_proposal_wakes_the_leader_and_its_appends_wake_the_followers() -> None:
    c, leader = quiet_cluster()
    rid = c.propose(leader, [b"new"])
    assert not c.cores[leader].quiesced
    c.deliver()
    assert c.answers[rid].error.name == "OK"
    assert not any(c.cores[i].quiesced for i in c.ids)
    settle(c)  # and quiet again once it is committed everywhere
    assert all(c.cores[i].commit_index == c.logs[leader].dirty_offset for i in c.ids)


def test_a_vote_request_wakes_a_follower_which_wakes_its_leader() -> None:
    """A pre-vote from a node that cannot hear the leader: the quiet follower wakes, still in
    its lease (the leader's node is up), refuses, and pings its leader, which heartbeats again:
    no election, no new term."""
    c, leader = quiet_cluster()
    a, b = followers(c, leader)
    term = c.cores[leader].term
    core = c.cores[a]
    core.step(m.RequestVote(b, a, term + 1, c.logs[b].dirty_offset, c.logs[b].last_term(),
                            pre_vote=True))
    assert not core.quiesced
    rd = core.ready()
    assert not any(isinstance(x, m.RequestVoteReply) for x in rd.messages)  # in lease
    pings = [x for x in rd.messages if isinstance(x, m.HeartbeatReply) and x.dst == leader]
    assert pings
    c.cores[leader].step(pings[0])
    assert not c.cores[leader].quiesced
    rd = c.cores[leader].ready()
    assert {x.dst for x in rd.messages if isinstance(x, m.Heartbeat)} == {a, b}
    for x in rd.messages:
        c.net.append(x)
    c.deliver()
    settle(c)
    assert all(c.cores[i].term == term for i in c.ids) and c.cores[leader].role == Role.LEADER


def test_a_follower_whose_leaders_node_is_down_elects_a_new_leader() -> None:
    """The liveness half: the leader's node dies while the group is quiet. Its followers hear
    of it only from the failure detector (peer_down), wake, and elect a new leader within the
    usual randomised timeout."""
    c, leader = quiet_cluster()
    term = c.cores[leader].term
    c.down.add(leader)
    c.tick(5 * E)
    assert all(c.cores[i].quiesced for i in followers(c, leader))  # nothing told them yet
    for f in followers(c, leader):
        c.cores[f].peer_down(leader)
        assert not c.cores[f].quiesced
    for t in range(2 * E + 5):
        c.tick()
        new = [i for i in followers(c, leader) if c.cores[i].role == Role.LEADER]
        if new:
            break
    assert new, "no new leader within two election timeouts of the leader's node going down"
    assert c.cores[new[0]].term > term


def test_a_follower_whose_leader_is_reported_down_grants_a_pre_vote() -> None:
    """Its election counter stood still while it was quiet; the lease must not hold for a
    leader reported down, or the other follower could never win."""
    c, leader = quiet_cluster()
    a, b = followers(c, leader)
    core = c.cores[a]
    term = core.term
    pre_vote = m.RequestVote(b, a, term + 1, c.logs[b].dirty_offset, c.logs[b].last_term(),
                             pre_vote=True)
    core.peer_down(leader)
    core.ready()
    core.step(pre_vote)
    rd = core.ready()
    assert [x.granted for x in rd.messages if isinstance(x, m.RequestVoteReply)] == [True]


def test_a_quiet_leader_stays_quiet_while_it_keeps_a_majority_and_wakes_when_a_peer_returns() -> None:
    c, leader = quiet_cluster()
    a, b = followers(c, leader)
    core = c.cores[leader]
    core.peer_down(a)
    assert core.quiesced and core.ready().empty()
    core.peer_up(a)  # it may have restarted and lost its unflushed tail: look at it
    assert not core.quiesced
    assert {x.dst for x in core.ready().messages if isinstance(x, m.Heartbeat)} == {a, b}


def test_a_quiet_leader_that_lost_its_majority_wakes_and_steps_down() -> None:
    c, leader = quiet_cluster()
    a, b = followers(c, leader)
    c.down.update({a, b})
    core = c.cores[leader]
    core.peer_down(a)
    assert core.quiesced
    core.peer_down(b)
    assert not core.quiesced
    for _ in range(2 * E + 2):
        c.tick()
    assert core.role != Role.LEADER


def test_a_group_quiesces_without_a_follower_whose_node_is_down() -> None:
    """One node down must not keep every group it follows awake (TiKV #19070)."""
    c = Cluster(3, quiesce_ticks=Q)
    leader = c.elect()
    gone = followers(c, leader)[0]
    c.down.add(gone)
    c.propose(leader, [b"a"])
    c.tick(5 * E)
    assert not c.cores[leader].quiesced  # it waits for the silent follower's answer
    c.cores[leader].peer_down(gone)
    settle(c)
    c.down.discard(gone)
    c.cores[leader].peer_up(gone)  # back: caught up, then quiet again
    c.process(leader)
    c.deliver()
    settle(c)
    assert c.logs[gone].dirty_offset == c.logs[leader].dirty_offset


def test_damage_found_by_the_scrubber_wakes_a_quiet_follower_and_is_repaired() -> None:
    c, leader = quiet_cluster()
    f = followers(c, leader)[0]
    log = c.logs[f]
    log.flip_bits(0)
    log.scrub(0, 1 << 20)
    assert log.damaged()
    c.tick()
    assert not c.cores[f].quiesced
    c.tick(2 * E)
    assert not log.damaged()
    settle(c)


# -- the wire ------------------------------------------------------------------------------------
def test_heartbeats_without_the_new_fields_decode_and_the_fields_round_trip() -> None:
    old_hb = {"k": "hb", "src": 1, "dst": 2, "term": 3, "commit_index": 4, "seq": 5}
    got = message_from_wire(old_hb)
    assert got == m.Heartbeat(1, 2, 3, 4, 5) and got.quiesce is False
    old_reply = {"k": "hbr", "src": 2, "dst": 1, "term": 3, "seq": 5, "dirty_offset": 4,
                 "dirty_term": 3, "flushed_offset": 4, "flushed_term": 3}
    assert message_from_wire(old_reply).quiesced is False
    for msg in (m.Heartbeat(1, 2, 3, 4, 5, quiesce=True),
                m.HeartbeatReply(2, 1, 3, 5, 4, 3, 4, 3, quiesced=True)):
        assert message_from_wire(message_to_wire(msg)) == msg


def test_a_follower_that_restarts_during_a_quiescing_round_is_heartbeated_again() -> None:
    """It answered quiesced, then restarted (faster than the failure detector noticed) while
    the leader still waited for another follower: its vote requests take it off the answered
    list, so the leader heartbeats it again instead of leaving it to campaign."""
    c = Cluster(3, quiesce_ticks=Q)
    leader = c.elect()
    a, b = followers(c, leader)
    c.propose(leader, [b"x"])
    c.deliver()
    c.cores[b].cfg.quiesce_ticks = 0  # it never answers quiesced: the round stays open
    c.tick(Q + 2)
    lead = c.cores[leader].leader
    assert lead is not None and lead.quiesce_acked == {a} and not c.cores[leader].quiesced
    c.crash(a)
    term = c.cores[leader].term
    c.tick(3 * E)
    assert c.cores[leader].role == Role.LEADER and c.cores[leader].term == term
    assert c.cores[a].leader_id == leader and c.cores[a].term == term


def test_the_groups_of_a_dead_node_elect_once_each_and_not_all_in_one_tick() -> None:
    """Many quiet groups led from one node (what a node of a multi-Raft cluster holds): its
    death reaches every group's followers at once through peer_down, yet their timeouts stay
    randomised and pre-vote first, so the groups elect about once each (issue 26's target:
    <= 1.1 elections per partition) and their campaigns spread over the timeout window."""
    groups = []
    for seed in range(40):
        c = Cluster(3, seed=seed + 1, quiesce_ticks=Q)
        leader = c.elect()
        c.propose(leader, [b"v"])
        c.deliver()
        settle(c)
        groups.append((c, leader, c.cores[leader].term))
    first_campaign: list[int] = []  # per group: ticks after the report until a term moved
    elections = 0
    for c, leader, term in groups:
        c.down.add(leader)
        for f in followers(c, leader):
            c.cores[f].peer_down(leader)
        campaigned = None
        for t in range(1, 4 * E):
            c.tick()
            if campaigned is None and max(c.cores[f].term for f in followers(c, leader)) > term:
                campaigned = t
            if any(c.cores[f].role == Role.LEADER for f in followers(c, leader)):
                break
        else:
            raise AssertionError("a group of the dead node elected no leader")
        assert campaigned is not None
        first_campaign.append(campaigned)
        elections += max(c.cores[f].term for f in followers(c, leader)) - term
    print(f"elections per group {elections / len(groups):.3f}, first campaigns at ticks "
          f"{sorted(first_campaign)}")
    assert elections / len(groups) <= 1.1, elections
    assert len(set(first_campaign)) >= 5, sorted(first_campaign)  # spread, not one tick
    assert min(first_campaign) >= E  # a full randomised timeout after the report, as usual


@pytest.mark.parametrize("n", [3, 5])
def test_an_awake_groups_dead_leader_is_replaced_within_half_a_timeout_in_turn(n: int) -> None:
    """An awake group whose leader's node is reported down early (its process refused a
    connection) need not wait out its followers' timers: the survivors campaign in turn, in
    the order they follow the old leader, the first within half an election timeout, the next
    not before it; each group elects once, and the groups of a dead node are taken over by
    different survivors."""
    successors = set()
    for seed in range(1, 21):
        c = Cluster(n, seed=seed)
        leader = c.elect()
        c.propose(leader, [b"v"])
        c.deliver()
        c.tick(1)  # a heartbeat: every follower's timer starts afresh
        c.deliver()
        term = c.cores[leader].term
        c.down.add(leader)
        ring = sorted(followers(c, leader), key=lambda v: (v - leader) % (n + 1))
        for f in followers(c, leader):
            c.cores[f].peer_down(leader)
        for t in range(1, E):
            c.tick()
            campaigners = [f for f in followers(c, leader)
                           if c.cores[f].role != Role.FOLLOWER]
            if campaigners:
                break
        assert campaigners == [ring[0]] and t <= E // 2, (seed, t, campaigners, ring)
        for _ in range(E):
            c.tick()
            if any(c.cores[f].role == Role.LEADER for f in followers(c, leader)):
                break
        won = [f for f in followers(c, leader) if c.cores[f].role == Role.LEADER]
        assert won == [ring[0]] and c.cores[ring[0]].term == term + 1, (seed, won)
        successors.add(ring[0])
    assert len(successors) > 1  # leaders differ by seed, so do their successors


def test_a_leader_reported_down_by_mistake_is_pinged_when_reported_up_again() -> None:
    """A detector flap: the follower woke and started its timer; when its leader's node is
    heard from again it pings the leader, whose heartbeats then keep it from campaigning."""
    c, leader = quiet_cluster()
    a, _ = followers(c, leader)
    term = c.cores[leader].term
    before = len(c.sent)
    c.cores[a].peer_down(leader)
    c.process(a)
    c.cores[a].peer_up(leader)
    c.process(a)
    c.deliver()
    assert not c.cores[leader].quiesced
    c.tick(3 * E)
    assert all(c.cores[i].term == term for i in c.ids) and c.cores[leader].role == Role.LEADER
    assert not any(isinstance(x, m.RequestVote) for x in c.sent[before:])
