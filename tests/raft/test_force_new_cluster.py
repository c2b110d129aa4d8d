"""The way out of a lost majority (raft/core/force_new.py, applied as `raftlog recover
--force-new-cluster` does: raft/cli/recover.py's read_facts and apply_plan).

A scripted stuck cluster: S2 holds a lost position (it lost flushed entries that counted toward
a commit), S1 and S3 lost their disks. Nobody can lead, for good. Forcing a new cluster from
S2's state must let S2 lead alone and commit, and the others must then rejoin through
add-node and catch up."""

from __future__ import annotations

from harness import Cluster
from test_disk_loss_rules import WatchedDisks, wipe, write_committed
from test_safety_rules import campaign, campaign_until_leader

from raft.cli.recover import apply_plan, read_facts
from raft.core import force_new
from raft.core.incarnation import Standing
from raft.core.membership import ClusterConfig
from raft.core.types import Acks
from storage.batch import BatchKind


def stuck_cluster() -> tuple[WatchedDisks, int]:
    """S2 lost the flushed entries from `e` on (committed with S1) and holds lost_position (e, term);
    S1 and S3 lost their disks. Returns the cluster (no leader can be elected) and `e`."""
    c = WatchedDisks(3, pre_vote=False, check_quorum=False)
    campaign_until_leader(c, 1)
    c.tick(2)
    write_committed(c, 1, b"before")
    c.down = {3}
    e = write_committed(c, 1, b"E")
    write_committed(c, 1, b"F")  # S2's lost position lies past where the forced entry goes
    c.logs[2].lose_batches(e - 1)
    c.crash(2)
    c.down = set()
    wipe(c, 1)
    wipe(c, 3)
    return c, e


def force(c: Cluster, i: int) -> None:
    """`raftlog recover --force-new-cluster` on node i's (stopped) state, then restart it."""
    log = c.logs[i]
    log.crash()  # stopped: what it holds is its flushed log
    plan = force_new.plan_force_new_cluster(read_facts(log, i))
    apply_plan(log, plan, now_ms=1)
    c.cores[i] = c._new_core(i)


def test_a_stuck_majority_stays_stuck_without_the_tool() -> None:
    c, _ = stuck_cluster()
    for _ in range(3):
        for i in c.ids:
            campaign(c, i)
    c.tick(100)
    assert c.leader() is None
    assert c.logs[2].lost_position is not None
    assert c.cores[1].standing() == Standing.LOST_DISK


def test_forcing_a_new_cluster_from_a_survivor_elects_it_and_the_others_rejoin() -> None:
    c, e = stuck_cluster()
    c.tick(50)
    assert c.leader() is None, "the scenario is meant to be stuck"
    kept = c.logs[2].flushed_offset
    assert kept < e
    force(c, 2)
    # What the operator accepted: E and F (committed with S1, lost from S2's disk) is gone.
    assert isinstance(c, WatchedDisks)
    c.committed = {off: t for off, t in c.committed.items() if off <= kept}
    c.commit_checked.clear()
    c.watching = False  # its majority checks count the three ids; S2 alone is the cluster now
    core = c.cores[2]
    assert core.config.voters == (2,) and core.standing() == Standing.MEMBER
    assert core.config.incarnations == {2: c.logs[2].incarnation}
    leader = c.elect()
    assert leader == 2
    c.propose(2, [b"after"], Acks.QUORUM)
    c.tick(3)
    after = c.logs[2].dirty_offset
    assert core.commit_index >= after, "the forced single-voter cluster did not commit"
    # The forced entry carries its audit record.
    forced = [b for b in c.logs[2].read(c.logs[2].start_offset, 1 << 20)
              if b.kind == BatchKind.CONFIG]
    assert forced and forced[-1].base_offset == kept + 1
    # The others rejoin through add-node (they run on empty data directories).
    for n, rid in ((1, 901), (3, 902)):
        core.propose_config(rid, add_learner=n, address=f"h:{n}")
        c.process(2)
        c.tick(10)
        assert c.answers[rid].error.name == "OK"
    assert set(core.config.voters) == {1, 2, 3}
    for n in (1, 3):
        assert c.cores[n].standing() == Standing.MEMBER
        assert c.logs[n].flushed_offset >= after
    # And the three-node cluster commits again, with the others counting.
    c.watching = True
    c.commit_checked.clear()
    c.down = {2}
    campaign_until_leader(c, 1)
    write_committed(c, 1, b"later")


def test_the_forced_entry_outranks_every_term_the_node_knows() -> None:
    """The rule: the forced configuration is written in a term above the node's term, its log's
    last term and its lost position's term (else the lost position refuses its campaign)."""
    c, _ = stuck_cluster()
    log = c.logs[2]
    log.crash()
    facts = read_facts(log, 2)
    plan = force_new.plan_force_new_cluster(facts)
    assert facts.lost_position is not None
    assert plan.term > max(facts.term, facts.last_term, facts.lost_position[1])
    assert plan.removed == (1, 3)
    assert plan.audit["new_term"] == plan.term
    assert any("LOST" in w for w in plan.warnings())


def test_a_damaged_batch_and_what_follows_it_are_dropped_loudly() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    for v in (b"a", b"b", b"c"):
        write_committed(c, leader, v)
    log = c.logs[leader]
    bad = log.dirty_offset - 1
    log.flip_bits(bad)
    log.crash()
    plan = force_new.plan_force_new_cluster(read_facts(log, leader))
    assert plan.keep_upto == bad - 1 and plan.dropped == (bad, log.flushed_offset)
    assert any(f"offsets {bad}.." in w for w in plan.warnings())
    apply_plan(log, plan, 5)
    assert log.damaged() == [] and log.dirty_offset == bad
    b = log.read(bad, 1 << 20)[0]
    assert b.kind == BatchKind.CONFIG and b.term == plan.term
    assert ClusterConfig.from_batch(b).voters == (leader,)


def test_forcing_from_a_node_that_holds_nothing_says_the_new_cluster_starts_empty() -> None:
    c = Cluster(3)
    c.elect()
    log = c.logs[1]
    log.wipe(77)
    log.crash()
    plan = force_new.plan_force_new_cluster(read_facts(log, 1))
    assert plan.keep_upto == -1 and any("starts EMPTY" in w for w in plan.warnings())
