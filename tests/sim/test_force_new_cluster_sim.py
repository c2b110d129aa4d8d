"""The way out of a lost majority, on a simulated cluster (docs/DISK-LOSS.md, "A lost majority:
force a new cluster"): a diskloss run of 3 nodes, then two of them lose their disks at once
(more than the profile's nemesis ever does), so the cluster ends with no leader for good: the
intact node cannot win alone and the others may not vote before a leader re-adds them.
Stopping every node, forcing a new cluster from the survivor with the longest log
(raft/core/force_new.py, applied as `raftlog recover --force-new-cluster` does), wiping the
others and re-adding them (as `raftlog add-node` does) gives a cluster that elects a leader,
commits, and converges with every node a voter in good standing. (It used a seed that got stuck
by itself, 11250548, until a replica late to its group's founding stopped taking itself for one
that lost its disk: tests/raft/test_late_founder.py.)"""

from __future__ import annotations

from raft.cli.recover import apply_plan, read_facts
from raft.core.force_new import plan_force_new_cluster
from raft.core.incarnation import Standing
from raft.core.types import Acks
from raft.sim.runner import Simulation, profile_config
from storage.batch import Batch
from storage.records import encode_values

SEED, NODES = 11250548, 3


def lost_majority() -> Simulation:
    """A converged diskloss run whose nodes 2 and 3 then lose their disks at once."""
    sim = Simulation(profile_config(SEED, NODES, "diskloss"))
    result = sim.run()
    assert not result.violations and sim.converged(), result.describe()
    for node in sim.nodes.values():
        node.crash()
    for i in (2, 3):
        node = sim.nodes[i]
        sim.checkers.note_disk_loss(node)
        node.log.wipe(800_000 + i)
        node.log.crash()
        sim.note_new_identity(i, 800_000 + i)
    for node in sim.nodes.values():
        node.start()
    sim.loop.run_until(sim.loop.now + 3_000_000)
    return sim


def test_a_stuck_diskloss_run_gets_a_leader_after_forcing_a_new_cluster() -> None:
    sim = lost_majority()
    assert not sim.leaders(), "a lost majority is meant to end with no leader"
    stuck_violations = len(sim.checkers.violations)

    for node in sim.nodes.values():
        node.crash()  # every node stopped, as the command requires
    ids = sorted(sim.nodes)
    survivor = max(ids, key=lambda i: (sim.nodes[i].log.last_term(),
                                       sim.nodes[i].log.flushed_offset))
    log = sim.nodes[survivor].log
    plan = plan_force_new_cluster(read_facts(log, survivor))
    apply_plan(log, plan, now_ms=sim.loop.now // 1000)
    log.crash()  # what a restart's open finds
    others = [i for i in ids if i != survivor]
    for i in others:  # each wiped before it rejoins
        inc = 900_000 + i
        sim.nodes[i].log.wipe(inc)
        sim.nodes[i].log.crash()
        sim.note_new_identity(i, inc)
    sim.checkers.check_flushed_majority = False  # one voter is the whole cluster for a while

    lead = sim.nodes[survivor]
    lead.start()
    sim.loop.run_until(sim.loop.now + 3_000_000, stop=lambda: lead.is_leader)
    assert lead.is_leader, "the forced survivor did not lead alone"
    assert lead.core is not None and lead.core.config.voters == (survivor,)
    assert lead.propose(10**9 - 1, Batch.create(encode_values([b"after-force"]), 1),
                        Acks.QUORUM)
    before = lead.log.dirty_offset
    sim.loop.run_until(sim.loop.now + 1_000_000,
                       stop=lambda: lead.core is not None and lead.core.commit_index >= before)
    assert lead.core.commit_index >= before, "the forced cluster did not commit"

    rid = 10**9
    for i in others:
        sim.nodes[i].start()
        for _ in range(50):  # add-node, again while another change is still in flight
            assert lead.core is not None
            if i in lead.core.config.voters and sim.nodes[i].core is not None \
                    and sim.nodes[i].core.standing() == Standing.MEMBER:
                break
            if i not in lead.core.config.members:
                rid += 1
                lead.core.propose_config(rid, add_learner=i, address=f"sim:{i}")
                lead.process()
            sim.loop.run_until(sim.loop.now + 200_000)
        assert i in lead.core.config.voters, f"node {i} was not re-added and promoted"
    sim.checkers.check_flushed_majority = True
    sim.loop.run_until(sim.loop.now + 5_000_000, stop=sim.converged)
    assert sim.converged(), "the re-formed cluster did not converge"
    assert set(lead.core.config.voters) == set(ids)
    sim._final_checks()
    new = sim.checkers.violations[stuck_violations:]
    assert not new, f"the simulation's checkers found: {new}"
