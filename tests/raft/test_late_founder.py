"""A replica that starts before the others of a brand-new group (issue 27's flaky 3-node shard
test): the reconciler of the controller's leader creates a new partition's replica first, so
its bootstrap probes reach nodes that do not run the group yet and are dropped. The others then
probe it, it answers "fresh", they become members and elect; without more, its next probes are
answered "not fresh" (they have a term now), and it counts itself a node that lost its disk: no
vote, replies not counted, until the leader re-adds it. A leader lost before that re-add left
the partition with one voter of two survivors, unable to elect (a process test saw 60 s of
NOT_LEADER after SIGKILL of the preferred leader's node right after the create).

The rule (raft/core/incarnation.py, `_handle_probe`): a probe says its sender is fresh as
surely as a fresh answer does (a node probes only while CHECKING, which needs it fresh), so a
node being checked counts the sender of a probe among the fresh ones."""

from __future__ import annotations

from harness import Cluster
from raft.core import messages as m
from raft.core.incarnation import Standing
from raft.core.types import Acks, ErrorCode, Role
from storage.memory import MemoryLog

E = 10  # election ticks


def late_founder(seed: int) -> Cluster:
    """A new group whose node 1 started first (its first probes dropped), node 3 preferred."""
    c = Cluster(3, seed=seed, election_ticks=E)
    c.logs = {i: MemoryLog() for i in c.ids}  # a brand-new group on every node, not yet probed
    c.net.clear()
    dropped = {"first": True}

    def drop_node_1s_first_probes(msg: m.Message) -> bool:
        return not (dropped["first"] and isinstance(msg, m.BootstrapProbe) and msg.src == 1)

    c.filter = drop_node_1s_first_probes
    c.cores[1] = c._new_core(1)
    c.process(1)  # node 1's probes go out and are lost: the others do not run the group yet
    dropped["first"] = False
    for i in (2, 3):
        c.cores[i] = c._new_core(i)
    for i, core in c.cores.items():
        core.first_election(i == 3)
    c.deliver()
    return c


def test_a_replica_late_to_its_groups_founding_is_a_member_and_votes() -> None:
    for seed in range(1, 11):
        c = late_founder(seed)
        assert c.elect() == 3
        assert c.cores[1].standing() == Standing.MEMBER, c.cores[1].standing()
        # The leader never hears node 1 (so it cannot re-add it), commits with node 2, and
        # dies: nodes 1 and 2 must elect between them.
        c.filter = lambda msg: not (msg.src == 1 and msg.dst == 3)
        rid = c.propose(3, [b"a"], Acks.QUORUM)
        c.tick(2)
        assert c.answers[rid].error is ErrorCode.OK
        c.down.add(3)
        for i in (1, 2):
            c.cores[i].peer_down(3)
        leader = c.elect(max_ticks=20 * E)
        assert leader in (1, 2) and c.cores[leader].role == Role.LEADER
