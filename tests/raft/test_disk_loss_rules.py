"""Scripted runs for the disk-loss and corruption rules (raft/core/incarnation.py, raft/core/repair.py).

Each test drives a few cores through an exact sequence and checks the property the rule
protects: a committed entry is never overwritten, a leader's commit is flushed (and readable) on
a majority of nodes that are members in good standing, a node that forgot never votes, and a
committed range nobody holds stops the node loudly. tests/raft/test_mutants.py switches each
rule off and requires one of these to fail.
"""

from __future__ import annotations

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.incarnation import Standing
from raft.core.types import Acks, DataLost, Role
from storage.memory import MemoryLog
from test_safety_rules import Watched, campaign, campaign_until_leader


class WatchedDisks(Watched):
    """Watched, and also: a node that is not a member in good standing never grants a vote,
    and a leader's commit index is held flushed, readable (not damaged), by a majority of
    nodes that are members in good standing."""

    def __init__(self, n: int = 3, **knobs: object) -> None:
        self.commit_checked: dict[int, int] = {}
        super().__init__(n, **knobs)

    def process(self, i: int) -> None:
        seen = len(self.sent)
        super().process(i)
        if not self.watching:
            return
        for msg in self.sent[seen:]:
            if isinstance(msg, m.RequestVoteReply) and msg.granted:
                assert self.cores[msg.src].standing() == Standing.MEMBER, (
                    f"node {msg.src} granted a vote while {self.cores[msg.src].standing().value}")

    def check(self) -> None:
        """Watched's checks, except that a commit must be held by a majority when it is made:
        a disk lost afterwards legitimately leaves fewer copies (that is what re-adding and
        repair then restore)."""
        for i in self.ids:
            core, log = self.cores[i], self.logs[i]
            if core.role == Role.LEADER:
                other = self.leaders.setdefault(core.term, i)
                assert other == i, f"two leaders in term {core.term}: {other} and {i}"
            for off in range(max(log.start_offset, core.commit_index - 50),
                             core.commit_index + 1):
                term = log.term_at(off)
                first = self.committed.setdefault(off, term)
                assert first == term, (f"offset {off} committed with term {first} and, on node "
                                       f"{i}, with term {term}")
            seen = self.commit_checked.get(i, -1)
            self.commit_checked[i] = core.commit_index
            if core.role != Role.LEADER or core.commit_index <= seen:
                continue
            c = core.commit_index
            holders = [j for j in self.ids if self._holds(j, c, log.term_at(c))]
            assert len(holders) > len(self.ids) // 2, (
                f"leader {i} committed offset {c} but only {holders} hold it flushed, whole, "
                f"as members in good standing")

    def _holds(self, j: int, offset: int, term: int) -> bool:
        log, core = self.logs[j], self.cores[j]
        if log.flushed_offset < offset or core.standing() != Standing.MEMBER:
            return False
        if any(d.first <= offset for d in log.damaged()):
            return False
        return log.term_at(offset) == term


def wipe(c: Cluster, i: int) -> None:
    """Node i's data directory is lost; it restarts on an empty one with the same id."""
    c.logs[i] = MemoryLog()
    c.cores[i] = c._new_core(i)


def rot(c: Cluster, i: int, offset: int) -> None:
    """The stored copy of node i's batch at `offset` rots, and a scrub finds it."""
    c.logs[i].flip_bits(offset)
    c.logs[i].scrub(c.logs[i].start_offset, 1 << 30)


def write_committed(c: Cluster, leader: int, value: bytes) -> int:
    c.propose(leader, [value], Acks.QUORUM)
    c.tick(3)
    off = c.logs[leader].dirty_offset
    assert c.cores[leader].commit_index >= off, "the write did not commit"
    return off


def test_a_node_that_lost_its_disk_does_not_vote() -> None:
    """S1 and S3 commit E while S2 is away; S3 loses its disk; S1 is gone. S2, which lacks E,
    asks S3 for its vote: a vote from the forgetful S3 would elect S2 and overwrite E."""
    c = WatchedDisks(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    c.down = {2}
    e = write_committed(c, 1, b"E")
    c.down = {1}
    wipe(c, 3)
    campaign(c, 2)
    campaign(c, 2)
    assert c.cores[3].standing() == Standing.LOST_DISK
    assert c.cores[3].votes_refused >= 1
    assert c.cores[2].role != Role.LEADER, "S2 won with the vote of a node that forgot"
    # S1 comes back: it leads again and re-adds S3, which catches up and is promoted.
    c.down = set()
    campaign_until_leader(c, 1)
    c.tick(20)
    cfg = c.cores[1].config
    assert 3 in cfg.voters and cfg.incarnations[3] == c.logs[3].incarnation
    assert c.cores[3].standing() == Standing.MEMBER
    assert c.logs[3].read(e, 1)[0].term == c.logs[1].term_at(e)


def test_a_reply_from_another_incarnation_is_ignored() -> None:
    """After S_n was re-added with its new data directory, a reply from its old one (a late
    message, or an old process still running on a copy) must not count toward a commit."""
    c = WatchedDisks(3)
    leader = c.elect()
    c.tick(2)
    n, b = [i for i in c.ids if i != leader]
    old = c.logs[n].incarnation
    wipe(c, n)
    c.tick(30)
    cfg = c.cores[leader].config
    assert n in cfg.voters and cfg.incarnations[n] == c.logs[n].incarnation != old
    c.down = {b}
    c.filter = lambda msg: msg.dst != n
    c.propose(leader, [b"E"], Acks.QUORUM)
    e = c.logs[leader].dirty_offset
    term = c.cores[leader].term
    forged = m.HeartbeatReply(n, leader, term, 0, e, term, e, term, incarnation=old)
    c.cores[leader].step(forged)
    c.process(leader)
    assert c.cores[leader].commit_index < e, "a reply from the old disk counted"
    # And a vote from the old disk does not count either.
    vote = m.RequestVoteReply(n, leader, term, True, False, incarnation=old)
    assert not c.cores[leader]._screen(vote)


def test_a_voter_that_forgot_does_not_count_while_a_change_blocks_its_re_add() -> None:
    """S_n loses its disk while a membership change is in flight (so the leader cannot re-add
    it yet); it still replicates as a follower, but its flushed reports must not count."""
    c = WatchedDisks(3)
    leader = c.elect()
    c.tick(2)
    n, b = [i for i in c.ids if i != leader]
    c.down = {b, 4}
    c.cores[leader].propose_config(900, add_learner=4, address="h:4")  # cannot commit now
    wipe(c, n)
    c.propose(leader, [b"E"], Acks.QUORUM)
    c.tick(25)  # (its replies are ignored: the leader resends from scratch after a while)
    e = c.logs[leader].dirty_offset
    assert c.logs[n].flushed_offset == e, "the wiped node should still replicate"
    assert c.cores[leader].commit_index < e, "the reports of a node that forgot counted"
    assert c.cores[n].standing() == Standing.LOST_DISK


def test_a_leader_does_not_count_its_own_damaged_batch_and_hands_over() -> None:
    """The leader's copy of E rots before E commits: it must not count itself for E. It hands
    leadership to the follower that holds E, which then repairs the old leader's copy."""
    c = WatchedDisks(3)
    leader = c.elect()
    c.tick(2)
    b, n = [i for i in c.ids if i != leader]
    c.down = {n}
    c.auto_flush[b] = False
    c.propose(leader, [b"E"], Acks.QUORUM)
    c.deliver()
    e = c.logs[leader].dirty_offset
    assert c.logs[leader].flushed_offset == e and c.logs[b].dirty_offset == e
    rot(c, leader, e)
    c.flush(b)  # b reports E flushed: with the leader's own (rotten) copy that would commit
    assert c.cores[leader].commit_index < e
    c.auto_flush[b] = True
    c.tick(30)
    assert c.cores[b].role == Role.LEADER and c.cores[b].commit_index >= e
    assert c.logs[leader].damaged() == []  # repaired from the new leader's copy
    assert c.logs[leader].read(e, 1)[0] == c.logs[b].read(e, 1)[0]


def test_a_follower_reports_damage_and_gets_the_range_back() -> None:
    c = WatchedDisks(3)
    leader = c.elect()
    c.tick(2)
    f = next(i for i in c.ids if i != leader)
    offs = [write_committed(c, leader, f"v{k}".encode()) for k in range(4)]
    rot(c, f, offs[1])
    c.tick(1)
    pr = c.cores[leader].progress(f)
    assert pr is not None and pr.flushed_offset < offs[1] or not c.logs[f].damaged()
    c.tick(5)
    assert c.logs[f].damaged() == []
    assert c.logs[f].read(offs[1], 1)[0] == c.logs[leader].read(offs[1], 1)[0]


def test_committed_data_nobody_holds_stops_the_leader_loudly() -> None:
    """E is committed on the leader and S_b; S_b loses its disk and the leader's copy rots;
    S_n never had it. Nobody has a good copy: the leader must stop naming the range, not step
    down and let the cluster carry on as if E never existed."""
    c = WatchedDisks(3)
    leader = c.elect()
    c.tick(2)
    b, n = [i for i in c.ids if i != leader]
    c.down = {n}
    e = write_committed(c, leader, b"E")
    wipe(c, b)
    rot(c, leader, e)
    c.down = set()
    with pytest.raises(DataLost) as err:
        c.tick(60)
    assert f"offsets {e}..{e}" in str(err.value) and "DISK-LOSS" in str(err.value)


def test_a_node_that_lost_flushed_batches_votes_as_the_log_it_held() -> None:
    """S3 held E flushed (it counted toward E's commit) and lost it from its disk (a truncated
    file): it must still refuse S2, which lacks E."""
    c = WatchedDisks(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    c.down = {2}
    e = write_committed(c, 1, b"E")
    c.logs[3].lose_batches(e - 1)
    c.crash(3)
    assert c.logs[3].dirty_offset == e - 1 and c.logs[3].lost_position == (e, 1)
    c.down = {1}
    campaign(c, 2)
    campaign(c, 2)
    assert c.cores[2].role != Role.LEADER, "S2 won with a vote from a log that lost E"


def test_a_node_that_lost_flushed_entries_does_not_lead_before_it_has_them_again() -> None:
    """S2 held E flushed (E committed with S1 and S2) and lost it from its disk; S1 is gone and
    S3 never had E. S3 would vote for S2 (S2's cut log is as long as its own): S2 must not
    campaign until it holds E again, or it would lead and write over E."""
    c = WatchedDisks(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    c.down = {3}
    e = write_committed(c, 1, b"E")
    c.logs[2].lose_batches(e - 1)
    c.crash(2)
    c.down = {1}
    campaign(c, 2)
    campaign(c, 2)
    assert c.cores[2].role != Role.LEADER, "S2 led with a log missing what it had lost"
    c.down = set()  # S1 is back: it leads, S2 gets E again and may lead later
    campaign_until_leader(c, 1)
    c.tick(3)
    assert c.cores[2]._may_campaign()


def test_add_node_for_a_member_re_adds_it_only_when_it_lost_its_disk() -> None:
    """`raftlog add-node` for a member: refused (with the reason) while it answers from the
    data directory the configuration knows; once it comes back on a new one, answered as done
    (the leader re-added it by itself as soon as it heard from it)."""
    c = WatchedDisks(3)
    leader = c.elect()
    c.tick(2)
    n, b = [i for i in c.ids if i != leader]
    c.cores[leader].propose_config(701, add_learner=n, address="h:1")
    c.process(leader)
    refused = c.answers[701]
    assert refused.error.name == "BAD_REQUEST" and "already a member" in refused.message
    c.down = {b}  # so the re-add stays a learner's (it cannot commit, nor the promotion)
    wipe(c, n)
    c.tick(1)
    cfg = c.cores[leader].config
    assert n in cfg.learners and cfg.incarnations[n] == c.logs[n].incarnation
    c.cores[leader].propose_config(702, add_learner=n, address="h:1")
    c.process(leader)
    assert c.answers[702].error.name == "OK"
    c.down = set()
    c.tick(5)
    assert n in c.cores[leader].config.voters and c.cores[n].standing() == Standing.MEMBER


def test_a_leader_whose_producer_table_missed_a_damaged_batch_does_not_take_its_retry_as_new(
        ) -> None:
    """Simulation seed 7131584 (issue 24): a producer's write E commits; S3's copy of E rots
    and S3 restarts, so its producer table, rebuilt from its log, could not read E. S3 leads
    (S1 is away) and the producer retries E there: taken as new, it would commit a second
    time. The leader must refuse it for now (it cannot tell), and once the copy is repaired or
    a whole node leads, the retry gets E's original offsets."""
    c = WatchedDisks(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    first = c.propose(1, [b"c1-s45"], Acks.QUORUM, producer_id=1001, sequence=45)
    c.tick(3)
    e = c.answers[first].base_offset
    assert c.answers[first].error.name == "OK" and c.logs[3].flushed_offset >= e
    c.logs[3].flip_bits(e)
    c.crash(3)
    assert [d.first for d in c.logs[3].damaged()] == [e]
    c.down = {1}
    campaign_until_leader(c, 3)
    retry = c.propose(3, [b"c1-s45"], Acks.QUORUM, producer_id=1001, sequence=45)
    copies = [b.base_offset for b in c.logs[3].read(e + 1, 1 << 20)
              if (b.producer_id, b.sequence) == (1001, 45)]
    assert not copies, f"the retry of the write at {e} was appended again at {copies}"
    a = c.answers.get(retry)
    assert a is None or a.error.name != "OK" or a.base_offset == e
    c.tick(30)  # S3 hands over to S2, which holds E, and repairs S3's copy
    leader = c.leader()
    assert leader is not None and leader != 3 and c.logs[3].damaged() == []
    again = c.propose(leader, [b"c1-s45"], Acks.QUORUM, producer_id=1001, sequence=45)
    c.tick(3)
    assert c.answers[again].error.name == "OK" and c.answers[again].base_offset == e
    assert c.answers[again].duplicate


def test_a_repaired_batch_goes_back_into_the_producer_table_in_log_order() -> None:
    """The table's per-producer window is in log order (truncation pops the newest, the window
    drops the oldest): a damaged batch repaired after later writes must not land last."""
    from raft.core.producers import ProducerTable, Verdict
    from storage.batch import Batch

    def batch(seq: int, off: int) -> Batch:
        return Batch.create(b"\x91\xa1x", 1, producer_id=7, sequence=seq).placed(off, 1)

    t = ProducerTable(window=4)
    t.record(batch(0, 10))
    t.mark_unread(11, 11)  # seq 1 at 11: damaged, not read
    for seq, off in ((2, 12), (3, 13)):
        t.record(batch(seq, off))
    assert t.lookup(7, 1)[0] == Verdict.UNKNOWN and t.lookup(8, 0)[0] == Verdict.UNKNOWN
    t.record(batch(1, 11))  # repaired
    assert t.unread == [] and t.lookup(7, 1) == (Verdict.DUPLICATE, t.lookup(7, 1)[1])
    assert [w.base_offset for w in t._by_pid[7]] == [10, 11, 12, 13]
    t.truncate_after(11)  # the log drops 12 and 13: so does the table
    assert [w.base_offset for w in t._by_pid[7]] == [10, 11]
    assert t.lookup(7, 2)[0] == Verdict.NEW


def test_committed_data_is_not_declared_lost_while_a_voter_that_may_hold_it_is_down() -> None:
    """Simulation seed 29782835 (issue 24): E commits on S2 and S3 while S1 is away; S3's copy
    of E rots; S2 goes down; S1 comes back far behind and S3 leads. S1 answers without E, but S2
    has not answered at all: it may hold the only good copy (it does). S3 must wait, say in its
    status that it waits for S2, and repair once S2 is back, instead of stopping with
    DataLost."""
    c = WatchedDisks(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 2)
    c.tick(2)
    c.down = {1}
    e = write_committed(c, 2, b"E")
    c.tick(25)  # S3 checkpoints a commit index past E: it knows E is committed
    c.logs[3].flip_bits(e)
    c.crash(3)
    assert c.cores[3].commit_index >= e and [d.first for d in c.logs[3].damaged()] == [e]
    c.down = {2}
    campaign_until_leader(c, 3)
    c.tick(3 * c.cores[3].cfg.election_ticks)  # S1 answers without E; S2 says nothing
    assert c.cores[3].role == Role.LEADER
    assert c.logs[1].dirty_offset < e
    assert c.cores[3].status().damage_waiting_for == [2]
    c.down = set()  # S2 is back with E: S3 hands over to it and gets E repaired
    c.tick(30)
    assert c.logs[3].damaged() == []
    assert c.logs[3].read(e, 1)[0] == c.logs[2].read(e, 1)[0]
    assert c.cores[3].status().damage_waiting_for == []
