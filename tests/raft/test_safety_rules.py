"""Scripted runs of the core for the safety rules that random schedules rarely reach.

Each test drives a few cores through an exact sequence (the harness's FIFO network, with
filters for lost or held messages) and checks the property the rule protects, not the rule's
code: a commit no majority holds durably, two different entries committed at one offset, two
leaders in one term. tests/raft/test_mutants.py switches each rule off and requires one of these to fail.
"""

from __future__ import annotations

from harness import Cluster
from raft.core import messages as m
from raft.core.types import Acks, Role
from storage.api import Meta
from storage.batch import Batch, BatchKind
from storage.memory import MemoryLog
from storage.records import encode_values


class Watched(Cluster):
    """A cluster that checks, after every message and every Ready:
    - every commit index a leader reports is flushed, with the leader's term at it, on a
      majority of voters (dirty copies never count);
    - no two nodes ever commit different entries (by term) at one offset;
    - at most one leader per term."""

    def __init__(self, n: int = 3, **knobs: object) -> None:
        self.committed: dict[int, int] = {}  # offset -> term, as first committed anywhere
        self.leaders: dict[int, int] = {}  # term -> leader
        self.watching = False
        super().__init__(n, **knobs)
        self.watching = True

    def process(self, i: int) -> None:
        super().process(i)
        if self.watching:
            self.check()

    def check(self) -> None:
        for i in self.ids:
            core, log = self.cores[i], self.logs[i]
            if core.role == Role.LEADER:
                other = self.leaders.setdefault(core.term, i)
                assert other == i, f"two leaders in term {core.term}: {other} and {i}"
            start = max(log.start_offset, core.commit_index - 50)
            for off in range(start, core.commit_index + 1):
                term = log.term_at(off)
                first = self.committed.setdefault(off, term)
                assert first == term, (f"offset {off} committed with term {first} and, on node "
                                       f"{i}, with term {term}")
            if core.role == Role.LEADER and core.commit_index >= 0:
                c = core.commit_index
                holders = [j for j in self.ids if self.logs[j].flushed_offset >= c
                           and self.logs[j].term_at(c) == log.term_at(c)]
                assert len(holders) > len(self.ids) // 2, (
                    f"leader {i} committed offset {c} but only {holders} hold it flushed")


def campaign(c: Cluster, i: int) -> None:
    """Make node i campaign now (a TimeoutNow as in a leadership transfer: no pre-vote, no
    lease), then deliver everything the filters let through."""
    c.cores[i].step(m.TimeoutNow(src=i, dst=i, term=c.cores[i].term))
    c.deliver()


def campaign_until_leader(c: Cluster, i: int, tries: int = 5) -> None:
    for _ in range(tries):
        campaign(c, i)
        if c.cores[i].role == Role.LEADER:
            return
    raise AssertionError(f"node {i} could not win an election")


def test_figure8_an_old_term_entry_commits_only_through_one_of_the_current_term() -> None:
    """The Raft paper's Figure 8 on five nodes. A leader of term 3 that finds its term-1 entry
    on a majority must not commit it until an entry of term 3 is on a majority too: otherwise a
    node holding a term-2 entry at that offset can still win and overwrite it."""
    c = Watched(5, max_append_bytes=1, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)  # term 1, no-op at offset 0 committed everywhere
    c.tick(2)
    # (a) S1 writes X at offset 1, which reaches S2 only.
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.batches
                                and msg.dst in (3, 4, 5))
    c.propose(1, [b"X"], Acks.LEADER)
    c.deliver()
    assert c.logs[2].dirty_offset == 1
    # (b) S1 stops; S5 wins term 2 with S3 and S4 and appends its no-op at offset 1, which
    # reaches nobody.
    c.down.add(1)
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.batches)
    campaign_until_leader(c, 5)
    assert c.logs[5].term_at(1) == c.cores[5].term
    # (c) S5 stops; S1 comes back and wins a later term with S2, S3 and S4; its X reaches S3,
    # so X is on a majority (S1, S2, S3), but its own no-op reaches nobody.
    c.down = {5}
    c.crash(1)

    def without_new_noop(msg: m.Message) -> bool:
        if isinstance(msg, m.AppendEntries) and msg.src == 1:
            if msg.dst == 4:
                return not msg.batches
            # The no-op is lost on the way; whatever came before it in the request arrives.
            msg.batches = [b for b in msg.batches
                           if not (b.kind == BatchKind.NOOP and b.term == c.cores[1].term)]
        return True

    c.filter = without_new_noop
    campaign_until_leader(c, 1)
    c.tick(3)
    assert c.logs[3].dirty_offset >= 1 and c.logs[3].term_at(1) == 1
    # (d) S1 stops for good; S5 comes back and wins with S2, S3 and S4 (its last term is
    # higher than theirs); it overwrites offset 1 everywhere. Had offset 1 been committed by
    # S1, the watcher reports two entries committed there.
    c.down = {1}
    c.crash(5)
    c.filter = lambda msg: True
    campaign_until_leader(c, 5)
    c.tick(5)
    assert c.cores[5].commit_index >= 1


def test_a_vote_granted_in_a_known_term_survives_a_crash() -> None:
    """A vote granted without a term change must be persisted too: after a crash the voter
    must refuse a second candidate of the same term (else two leaders in one term)."""
    c = Watched(3, pre_vote=False, check_quorum=False)
    # S3 already knows term 1 (durably), so S2's request in term 1 changes no term on S3.
    c.logs[3].save_meta(Meta(term=1, voted_for=None))
    c.cores[3] = c._new_core(3)
    # S1 hears nothing of S2's campaign, and S3 only its vote request (its log stays empty).
    c.filter = lambda msg: (msg.dst != 1 and msg.src != 1
                            and not isinstance(msg, m.AppendEntries))
    campaign_until_leader(c, 2)
    assert c.cores[2].term == 1 and c.cores[3].voted_for == 2
    c.crash(3)  # restart from what S3 persisted
    c.filter = lambda msg: msg.dst != 2 and msg.src != 2  # S1 campaigns in term 1 too
    campaign(c, 1)
    assert c.cores[1].term == 1
    assert c.cores[1].role != Role.LEADER, "S3 voted twice in term 1"


def test_a_stale_flushed_report_of_another_term_does_not_count() -> None:
    """A follower's flushed offset counts only if its entry there has the leader's term at that
    offset: a node that flushed an old leader's entry must not help commit the new leader's
    different entry at the same offset."""
    c = Watched(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    # S1 writes at offset 1; it reaches S3 only, and S1 itself never flushes it.
    c.auto_flush[1] = False
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.dst == 2)
    c.propose(1, [b"old"], Acks.LEADER)
    c.deliver()
    assert c.logs[3].flushed_offset == 1 and c.logs[3].term_at(1) == 1
    # S1 crashes (losing offset 1), S3 is away; S2 wins term 2 with S1 and appends its no-op
    # at offset 1, flushed on S2 only (S1 does not flush).
    c.crash(1)
    c.auto_flush[1] = False
    c.down = {3}
    c.filter = lambda msg: True
    campaign_until_leader(c, 2)
    assert c.logs[2].term_at(1) == c.cores[2].term
    # S3 comes back: its first heartbeat reply reports flushed offset 1 (of term 1).
    c.down = set()
    c.tick(1)
    c.tick(3)


def test_the_leader_counts_only_its_own_flushed_offset() -> None:
    c = Watched(3)
    leader = c.elect()
    c.tick(2)
    follower, other = [i for i in c.ids if i != leader]
    c.auto_flush[leader] = False
    c.auto_flush[other] = False
    c.propose(leader, [b"v"] * 3, Acks.QUORUM)
    c.tick(3)
    assert c.logs[follower].flushed_offset == c.logs[leader].dirty_offset
    assert c.cores[leader].commit_index < c.logs[leader].dirty_offset, \
        "committed with one durable copy: the leader counted its dirty offset"


def test_a_candidate_with_a_stale_log_gets_no_vote() -> None:
    c = Watched(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    c.down = {3}
    c.propose(1, [b"committed"], Acks.QUORUM)
    c.tick(3)
    assert c.cores[1].commit_index == c.logs[1].dirty_offset >= 1
    c.down = {1}
    c.logs[3].crash()
    c.cores[3] = c._new_core(3)
    campaign(c, 3)
    campaign(c, 3)
    assert c.cores[3].role != Role.LEADER, "a stale log won an election"


def test_a_pre_vote_request_changes_no_term() -> None:
    """A pre-vote only asks; the receivers' term (and so the leader) stays as it is."""
    c = Watched(3, check_quorum=False)
    leader = c.elect()
    c.tick(2)
    term = c.cores[leader].term
    iso = next(i for i in c.ids if i != leader)
    c.filter = lambda msg: msg.src != iso and msg.dst != iso
    c.tick(60)  # iso's election timer fires; its pre-votes go nowhere
    c.filter = lambda msg: True
    pre = m.RequestVote(iso, leader, term + 1, c.logs[iso].dirty_offset,
                        c.logs[iso].last_term(), pre_vote=True)
    c.cores[leader].step(pre)
    c.process(leader)
    assert c.cores[leader].term == term and c.cores[leader].role == Role.LEADER


def test_a_stale_success_reply_does_not_raise_match() -> None:
    """A reply to a request sent before the follower's stream was reset may describe a tail it
    has since lost (its crash dropped the unflushed data): it must not raise match_index, which
    picks the TimeoutNow target and promotes learners."""
    c = Watched(3, max_append_bytes=1, max_inflight=1)
    leader = c.elect()
    c.tick(2)
    f = next(i for i in c.ids if i != leader)
    c.propose(leader, [b"a"] * 5, Acks.QUORUM)
    c.tick(2)
    assert c.logs[f].flushed_offset == c.logs[leader].dirty_offset
    held: list[m.Message] = []

    def hold_f_replies(msg: m.Message) -> bool:
        if isinstance(msg, m.AppendEntriesReply) and msg.src == f and msg.success \
                and msg.last_appended > msg.flushed_offset:  # answered before its flush
            held.append(msg)
            return False
        return True

    c.auto_flush[f] = False
    c.filter = hold_f_replies
    # Three batches, one request in flight to f: it holds the first unflushed while the
    # leader and the third node commit all three. Once f flushes the first, the second
    # leaves it short of committed entries, so it goes with flush=False (more follows) and
    # f answers it at once, unflushed; that answer is held back. (A request to a follower
    # that lacks only uncommitted entries asks for a flush: no unflushed answer.)
    for rid, value in ((901, b"b"), (902, b"c"), (903, b"d")):
        c.cores[leader].propose(rid, Batch.create(encode_values([value] * 5), 5), Acks.LEADER)
    c.deliver()
    assert c.cores[leader].commit_index == c.logs[leader].dirty_offset
    c.flush(f)
    c.deliver()
    flushed = c.logs[f].flushed_offset
    assert held and held[-1].last_appended > flushed
    c.crash(f)  # loses the unflushed batch
    c.auto_flush[f] = False
    # Nothing reaches f but heartbeats: its reply shows the request lost, the leader resets.
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.dst == f)
    c.tick(1)
    c.cores[leader].step(held[-1])  # the old reply arrives late
    c.process(leader)
    pr = c.cores[leader].progress(f)
    assert pr is not None and pr.match_index <= c.logs[f].dirty_offset, (
        f"match {pr.match_index} but the follower holds only up to {c.logs[f].dirty_offset}")


def test_no_promotion_is_appended_during_a_leadership_transfer() -> None:
    """TimeoutNow goes once the target matches the leader's log. A learner's promotion
    appended right after it reaches the third voter before the target's vote request, so the
    target's log is no longer up to date and the transfer (and SIGTERM's hand-over) fails."""
    c = Watched(3)
    leader = c.elect()
    c.tick(2)
    c.ids.append(4)
    c.logs[4] = MemoryLog()
    c.cores[4] = c._new_core(4, voters=[1, 2, 3])
    c.auto_flush[4] = True
    held: list[m.Message] = []

    def hold_learner_replies(msg: m.Message) -> bool:
        # The learner's replies pass until one would show it caught up (and so promote it).
        if (msg.src == 4 and isinstance(msg, (m.AppendEntriesReply, m.HeartbeatReply))
                and msg.dirty_offset >= c.logs[leader].flushed_offset):
            held.append(msg)
            return False
        return True

    c.filter = hold_learner_replies
    c.cores[leader].propose_config(999, add_learner=4)
    c.process(leader)
    c.tick(3)  # the learner holds the whole log; the leader has not heard it yet
    assert c.logs[4].dirty_offset == c.logs[leader].dirty_offset and held
    target = next(i for i in (1, 2, 3) if i != leader)
    c.cores[leader].transfer_leadership(target)  # target matches: TimeoutNow goes now
    c.cores[leader].step(held[-1])  # ...and then the learner's reply arrives
    c.process(leader)
    c.filter = lambda msg: True
    c.deliver()
    c.tick(3)
    assert c.cores[target].role == Role.LEADER, "the transfer failed"


def test_votes_are_granted_to_candidates_outside_our_configuration() -> None:
    """The Raft thesis: a server with a stale configuration still votes for an up-to-date
    candidate it does not know (the lease keeps removed nodes from disrupting)."""
    c = Watched(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    voter = c.cores[2]
    req = m.RequestVote(9, 2, voter.term + 1, c.logs[2].dirty_offset, c.logs[2].last_term())
    voter.step(req)
    rd = voter.ready()
    replies = [msg for msg in rd.messages if isinstance(msg, m.RequestVoteReply)]
    assert replies and replies[0].granted


def test_a_candidate_whose_tail_is_full_does_not_lead_without_its_noop() -> None:
    """Winning an election with a full unflushed tail (no room for the no-op) leaves the node a
    follower of that term, never a leader without an entry of its term."""
    c = Watched(3, pre_vote=False, check_quorum=False)
    from storage.api import TailFull

    full = c.logs[1]
    real_append = full.append

    def append(batches: list[Batch]) -> None:
        raise TailFull(1 << 20, 1 << 20)

    full.append = append  # type: ignore[method-assign]
    campaign(c, 1)
    assert c.cores[1].role != Role.LEADER
    full.append = real_append  # type: ignore[method-assign]
    campaign_until_leader(c, 1)
    assert c.logs[1].term_at(c.logs[1].dirty_offset) == c.cores[1].term
