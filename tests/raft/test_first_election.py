"""A new partition's first election (RaftCore.first_election): its preferred replica campaigns
at its next tick, the other replicas hold back two election timeouts longer than usual, and a
group that already had a term is left alone. Liveness only: a held-back replica still
campaigns once its longer timeout runs out."""

from __future__ import annotations

from harness import Cluster
from raft.core.types import Role

E = 10  # election ticks


def ticks_until_someone_campaigns(c: Cluster, bound: int = 10 * E) -> tuple[int, set[int]]:
    for n in range(1, bound + 1):
        c.tick()
        who = {i for i, core in c.cores.items() if i not in c.down
               and (core.role is not Role.FOLLOWER or core.voted_for == i)}
        if who:
            return n, who
    raise AssertionError("nobody campaigned")


def test_the_preferred_replica_campaigns_first_and_wins_the_first_term() -> None:
    for seed in range(1, 21):
        c = Cluster(3, seed=seed, election_ticks=E)
        for i, core in c.cores.items():
            core.first_election(i == 2)
        n, who = ticks_until_someone_campaigns(c)
        assert n == 1 and who == {2}
        c.tick(3)
        assert c.leader() == 2 and c.cores[2].term == 1  # one election, won by the preferred


def test_held_back_replicas_still_campaign_and_an_older_group_is_left_alone() -> None:
    for seed in range(1, 21):
        c = Cluster(3, seed=seed, election_ticks=E)
        c.down.add(1)  # the preferred replica never comes: the others elect, later than usual
        for i in (2, 3):
            c.cores[i].first_election(False)
        n, _ = ticks_until_someone_campaigns(c)
        assert 3 * E <= n < 4 * E
    c = Cluster(3, seed=1, election_ticks=E)
    c.cores[3].term = 3  # it has had elections (a restarted older group)
    c.cores[3].first_election(False)
    n, who = ticks_until_someone_campaigns(c)
    assert n < 2 * E


def test_failed_campaigns_widen_the_timeout_spread_until_a_leader_is_known() -> None:
    """Votes that never arrive (an overloaded loop, a partition): each campaign that times out
    doubles the random spread of the next timeout (up to 8 x), so candidates that keep
    colliding drift apart; once a leader is heard of, the spread is back to [e, 2e)."""
    widest = 0
    for seed in range(1, 11):
        c = Cluster(3, seed=seed, election_ticks=E)
        c.filter = lambda msg: False  # nothing gets through
        c.tick(40 * E)
        for core in c.cores.values():
            assert core._failed_campaigns >= 3
            assert E <= core._randomized_timeout < 9 * E
            widest = max(widest, core._randomized_timeout)
        c.filter = lambda msg: True
        leader = c.elect(max_ticks=40 * E)
        c.tick(2)
        for i, core in c.cores.items():
            assert core._failed_campaigns == 0
            if i != leader:
                assert E <= core._randomized_timeout < 2 * E
    assert widest >= 2 * E  # some timeout drew from the widened spread
