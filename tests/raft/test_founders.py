"""The founders rule (raft/core/incarnation.py, (c)): a replica counted at its group's founding
but cut off before the answers it needed is recognised as a founder later, and nothing else is.

The simulation's diskloss seed 112 (3 nodes): a partition 2 ms into founding cut node 3 off
after its probes went out. Nodes 1 and 2 counted those probes and founded the cluster; node 3
never had their answers, and when it could ask again they said "not fresh" (they had elected
and written), so it took itself for a node that lost its disk. Then node 1 lost its metadata:
two of three nodes could not vote, node 2 could never be elected to re-add them, and the
cluster was stuck for good (liveness; nothing unsafe happened). A founder now remembers the
incarnation of every voter it counted, and vouches for the prober in its answer when the
prober still has that directory and is as new as it was then.

What must never happen: a node that really lost its disk (a new incarnation), or an answer
meant for the directory it had before, makes it a member that votes."""

from __future__ import annotations

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.incarnation import Standing
from raft.core.types import Acks, ErrorCode, Role
from storage.memory import MemoryLog

E = 10  # election ticks


def founded_without_node_3(seed: int = 1) -> Cluster:
    """Node 3's probes reach 1 and 2; everything else to node 3 is lost (a partition)."""
    c = Cluster(3, seed=seed, election_ticks=E)
    c.logs = {i: MemoryLog() for i in c.ids}  # a brand-new group, nobody probed yet
    c.net.clear()
    c.filter = lambda msg: msg.dst != 3
    for i in c.ids:
        c.cores[i] = c._new_core(i)
    c.deliver()
    assert c.cores[1].standing() == Standing.MEMBER, "nodes 1 and 2 count node 3's probe"
    assert c.cores[3].standing() == Standing.CHECKING
    return c


def elect_and_commit(c: Cluster) -> int:
    leader = c.elect(max_ticks=20 * E)
    rid = c.propose(leader, [b"a"], Acks.QUORUM)
    c.tick(2)
    assert c.answers[rid].error is ErrorCode.OK
    return leader


def heal(c: Cluster) -> None:
    c.filter = lambda msg: True


def lose_meta(c: Cluster, i: int) -> None:
    """Node i restarts with its metadata lost: a new incarnation, pending."""
    c.logs[i].lose_meta(c.logs[i].incarnation + 1000)
    c.crash(i)
    assert c.cores[i].standing() == Standing.LOST_DISK or c.cores[i]._pending


def converge(c: Cluster, ticks: int = 60 * E) -> int:
    for _ in range(ticks):
        c.tick()
        leader = c.leader()
        if leader is None:
            continue
        top = c.logs[leader].dirty_offset
        if all(c.cores[i].may_vote() and c.logs[i].flushed_offset == top
               and c.cores[i].commit_index == top for i in c.ids):
            return leader
    raise AssertionError("not converged: " + str({
        i: (c.cores[i].role.value, c.cores[i].term, c.logs[i].dirty_offset,
            c.cores[i].standing().value) for i in c.ids}))


@pytest.mark.parametrize("node_3_restarts", [False, True], ids=["asks again", "restarts"])
def test_a_founder_cut_off_before_its_answers_is_a_member_after_a_real_disk_loss(
        node_3_restarts: bool) -> None:
    """Seed 112 scripted: the leader, one of the two that counted node 3, then loses its
    metadata. Node 3 asks again (its probe timer, or a restart) and the founder that is left
    vouches for it: nodes 2 and 3 elect, and the leader re-adds node 1."""
    c = founded_without_node_3()
    leader = elect_and_commit(c)
    lose_meta(c, leader)
    heal(c)
    if node_3_restarts:
        c.crash(3)
    new = converge(c)
    assert new != leader
    assert c.cores[3].standing() == Standing.MEMBER
    assert c.cores[leader].config.incarnations[leader] == c.logs[leader].incarnation  # re-added


def test_a_founders_record_survives_its_restart() -> None:
    """The record is durable: the founder that is left restarted in between."""
    c = founded_without_node_3()
    leader = elect_and_commit(c)
    other = 2 if leader == 1 else 1
    c.crash(other)
    assert c.cores[other]._founders == {1: c.logs[1].incarnation, 2: c.logs[2].incarnation,
                                        3: c.logs[3].incarnation}
    lose_meta(c, leader)
    heal(c)
    converge(c)


def test_a_founder_that_really_lost_its_disk_is_not_vouched_for() -> None:
    """Node 3 was counted at founding, then founded, voted and held entries, then lost its
    disk: its new directory's probe is answered with no vouch (the founders recorded its old
    incarnation) and it waits to be re-added, never voting meanwhile."""
    c = Cluster(3, election_ticks=E)
    leader = c.elect(max_ticks=20 * E)
    rid = c.propose(leader, [b"a"], Acks.QUORUM)
    c.tick(2)
    assert c.answers[rid].error is ErrorCode.OK
    victim = 3 if leader != 3 else 2
    c.down.add(leader)  # nobody to re-add it: only the founders' answers could let it vote
    old = c.logs[victim].incarnation
    c.logs[victim].wipe(old + 1000)
    c.crash(victim)
    c.deliver()
    c.tick(5 * E)
    core = c.cores[victim]
    assert core.standing() == Standing.LOST_DISK, core.standing()
    assert not core.may_vote() and core.role != Role.LEADER


def test_answers_meant_for_an_earlier_directory_of_the_prober_count_for_nothing() -> None:
    """A founder's vouch, or a "fresh" answer, delayed across the prober's disk loss."""
    c = founded_without_node_3()
    old = c.logs[3].incarnation
    c.logs[3].wipe(old + 1000)
    c.crash(3)
    c.net.clear()
    core = c.cores[3]
    assert core.standing() == Standing.CHECKING
    for src in (1, 2):
        core.step(m.BootstrapProbeReply(src, 3, 1, c.logs[src].incarnation, False, old, True))
        core.step(m.BootstrapProbeReply(src, 3, 0, c.logs[src].incarnation, True, old, False))
    assert core.standing() == Standing.CHECKING and not core.may_vote()
    # The same answers to this directory do count.
    core.step(m.BootstrapProbeReply(1, 3, 1, c.logs[1].incarnation, False, core.incarnation,
                                    True))
    assert core.standing() == Standing.MEMBER


def test_a_founder_removed_since_is_not_vouched_for() -> None:
    """Node 3, counted at founding and cut off, was removed from the configuration meanwhile:
    the founders' answers do not make it a member again."""
    c = founded_without_node_3()
    leader = elect_and_commit(c)
    c.cores[leader].propose_config(999, remove=3)
    c.process(leader)
    c.tick(2)
    assert c.answers[999].error is ErrorCode.OK
    assert 3 not in c.cores[1].config.voters and 3 not in c.cores[2].config.voters
    heal(c)
    c.crash(3)  # it probes again at start
    c.deliver()
    c.tick(3 * E)
    assert c.cores[3].standing() != Standing.MEMBER and not c.cores[3].may_vote()


def test_a_founder_whose_vouch_was_lost_is_vouched_for_when_it_announces_itself() -> None:
    """Node 3's probes stop at its first "not fresh"; the founder's answer that vouched for it
    was lost, and no leader is left to re-add it. Its announce (it knows no leader) is
    answered with the vouch."""
    c = founded_without_node_3()
    leader = elect_and_commit(c)
    lose_meta(c, leader)
    lost = {"vouches": 0}

    def lose_the_first_vouch(msg: m.Message) -> bool:
        if isinstance(msg, m.BootstrapProbeReply) and msg.founder and not lost["vouches"]:
            lost["vouches"] += 1
            return False
        return True

    c.filter = lose_the_first_vouch
    converge(c)
    assert lost["vouches"] == 1 and c.cores[3].standing() == Standing.MEMBER
