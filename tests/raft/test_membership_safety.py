"""A leader makes no membership change before it has committed an entry of its own term.

The single-server change bug Ongaro described on raft-dev (2015): configurations are in force
as soon as they are appended, so two leaders of different terms, each holding an uncommitted
change the other lacks, can each commit on a majority of its own configuration, and those two
majorities need not overlap. A leader that first commits an entry of its term (its no-op)
has, by then, caught a majority of the old configuration up to its log, which rules that out.

The scenario, on voters 1-4 with learner 5:
1. S1 (term 1) promotes S5; the change reaches only S5. S1's configuration: voters 1-5.
2. S2 wins term 2 with S3 and S4 (it never saw the promotion: voters 1-4) and, reaching only
   S3, removes S4. Its configuration, voters 1-3, makes S2 and S3 a majority: it commits.
3. S1 wins term 3 with S4 and S5 (a majority of voters 1-5) and commits its log.
Without the rule, offsets S2 committed in term 2 are committed again by S1 with other entries.
"""

from __future__ import annotations

import random

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.confchange import ConfChanges
from raft.core.raft import RaftConfig, RaftCore
from raft.core.types import ErrorCode, Role
from storage.batch import BatchKind


class FourVotersAndALearner(Cluster):
    """Voters 1-4 and learner 5 from the start; after every Ready, checks that no two nodes
    ever commit different entries (by term) at one offset, and one leader per term."""

    def __init__(self, **knobs: object) -> None:
        self.committed: dict[int, tuple[int, int]] = {}  # offset -> (term, first node)
        self.leaders: dict[int, int] = {}
        super().__init__(5, **knobs)

    def _new_core(self, i: int, voters: list[int] | None = None) -> RaftCore:
        cfg = RaftConfig(node_id=i, voters=[1, 2, 3, 4], learners=[5], **self.knobs)
        return RaftCore(cfg, self.logs[i], random.Random(self.seed * 1000 + i))

    def process(self, i: int) -> None:
        super().process(i)
        for j, core in self.cores.items():
            if core.role == Role.LEADER:
                assert self.leaders.setdefault(core.term, j) == j, f"two leaders, term {core.term}"
            log = self.logs[j]
            for off in range(max(log.start_offset, 0), core.commit_index + 1):
                term, first = self.committed.setdefault(off, (log.term_at(off), j))
                assert term == log.term_at(off), (
                    f"two different logs committed: offset {off} with term {term} on node "
                    f"{first} and with term {log.term_at(off)} on node {j}")


def campaign_until_leader(c: Cluster, i: int) -> None:
    """Node i campaigns at once (TimeoutNow: no pre-vote, no lease) until it wins."""
    for _ in range(5):
        c.cores[i].step(m.TimeoutNow(src=i, dst=i, term=c.cores[i].term))
        c.deliver()
        if c.cores[i].role == Role.LEADER:
            return
    raise AssertionError(f"node {i} could not win an election")


def run_scenario() -> tuple[FourVotersAndALearner, ErrorCode]:
    """Steps 1-3 of the module docstring; returns the cluster and S2's answer to its removal
    of S4. The cluster's checks raise as soon as two logs commit at one offset."""
    c = FourVotersAndALearner(pre_vote=False, check_quorum=False)
    # 1. S1 leads term 1; its no-op commits everywhere; the promotion of S5 reaches only S5.
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.dst in (2, 3, 4)
                                and any(b.kind == BatchKind.CONFIG for b in msg.batches))
    campaign_until_leader(c, 1)
    c.tick(3)
    promoted = c.cores[1].config
    assert promoted.voters == (1, 2, 3, 4, 5) and c.cores[5].config == promoted
    assert c.cores[2].config.voters == (1, 2, 3, 4)
    k = c.logs[1].dirty_offset  # the promotion's offset, uncommitted (S1 and S5 of five)
    assert c.cores[1].commit_index == k - 1
    # 2. S1 and S5 are cut off. S2 wins term 2 with S3 and S4; its entries reach only S3.
    c.down = {1, 5}
    c.filter = lambda msg: not (isinstance(msg, m.AppendEntries) and msg.src == 2
                                and msg.dst == 4 and msg.batches)
    campaign_until_leader(c, 2)
    assert c.cores[2].term == 2 and c.logs[3].term_at(k) == 2  # S2's no-op, at offset k
    c.answers.clear()
    c.cores[2].propose_config(777, remove=4)
    c.process(2)
    c.tick(3)
    refused = c.answers[777].error if 777 in c.answers else ErrorCode.OK
    # 3. S2 and S3 are cut off; S1 restarts and wins term 3 with S4 and S5.
    c.down = {2, 3}
    c.filter = lambda msg: True
    c.crash(1)
    campaign_until_leader(c, 1)
    c.tick(3)
    assert c.cores[1].commit_index >= k + 1  # its term-3 no-op, on S1, S4 and S5
    return c, refused


def test_a_leader_makes_no_membership_change_before_committing_in_its_term() -> None:
    c, answer = run_scenario()
    assert answer == ErrorCode.BACKPRESSURE, "S2 removed S4 before committing in its term"
    assert c.cores[2].config.voters == (1, 2, 3, 4)
    # Everyone back: one log.
    c.down = set()
    c.tick(10)
    leader = c.leader()
    assert leader is not None
    assert all(c.cores[i].commit_index == c.cores[leader].commit_index for i in c.ids)


def test_without_the_rule_two_logs_commit_at_the_same_offsets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario is a real reproduction: with only the one-change-at-a-time rule left, the
    cluster commits two different entries at one offset (what the test above guards)."""
    def one_change_at_a_time_only(self: RaftCore) -> str:
        if self._configs[-1].offset > self.commit_index:
            return "another membership change is in progress"
        return ""

    monkeypatch.setattr(ConfChanges, "_config_change_blocked", one_change_at_a_time_only)
    with pytest.raises(AssertionError, match="two different logs committed"):
        run_scenario()
