"""Placement (every node within one of the mean) and the rebalance planner (bounded, converges,
leadership returns a few at a time).

The planner is called through its module (`rebalance.plan_rebalance`) so the mutation tests
(tests/raft/test_mutants.py) reach it."""

from __future__ import annotations

import pytest

from controller_helpers import founded, replica_counts, run
from raft.controller.commands import DecommissionNode, DeleteTopic, RegisterNode
from raft.controller.placement import (
    PlacementError,
    current_load,
    plan_create_topic,
    plan_grow_topic,
)
from raft.controller import rebalance
from raft.controller.rebalance import RebalancePlan
from raft.controller.state import ClusterMetadata


def create(meta: ClusterMetadata, name: str, partitions: int, rf: int, live=None) -> None:
    [result] = run(meta, plan_create_topic(meta, name, partitions, rf, live=live))
    assert result.ok, result.reason


def spread(counts: dict[int, int]) -> int:
    return max(counts.values()) - min(counts.values())


def test_placement_counts_the_replicas_nodes_already_hold() -> None:
    """One-partition topics, one replica each, go round the nodes: each create sees what the
    earlier ones placed (ignoring them would pile every topic onto the same node)."""
    meta = founded(3)  # default topic: one replica on each of 1, 2, 3
    for i in range(6):
        create(meta, f"t{i}", 1, 1)
    assert [meta.partition(f"t{i}", 0).replicas for i in range(6)] == [
        (1,), (2,), (3,), (1,), (2,), (3,)]
    assert replica_counts(meta, [1, 2, 3]) == {1: 3, 2: 3, 3: 3}


def test_a_big_topic_spreads_replicas_and_preferred_leaders_evenly() -> None:
    meta = founded(5)
    create(meta, "big", 40, 3)
    counts = replica_counts(meta, [1, 2, 3, 4, 5])
    assert spread(counts) <= 1
    load = current_load(meta, [1, 2, 3, 4, 5])
    assert spread(load.leaders) <= 1
    for p in meta.topics["big"].partitions:
        assert len(set(p.replicas)) == 3


def test_more_replicas_than_live_nodes_is_refused_clearly() -> None:
    meta = founded(3)
    with pytest.raises(PlacementError, match="3 replicas per partition need 3 live"):
        plan_create_topic(meta, "t", 1, 3, live=[1, 2])
    run(meta, DecommissionNode(3))
    with pytest.raises(PlacementError, match="lower --replicas"):
        plan_create_topic(meta, "t", 1, 3)
    with pytest.raises(PlacementError, match="at least one partition"):
        plan_create_topic(meta, "t", 0, 1)


def test_placement_uses_only_live_active_nodes() -> None:
    meta = founded(4)
    run(meta, DecommissionNode(4))
    cmd = plan_create_topic(meta, "t", 6, 2, live=[1, 2, 3, 9])
    assert {n for r in cmd.replicas for n in r} == {1, 2, 3}


def test_growing_a_topic_places_only_the_new_partitions() -> None:
    meta = founded(3)
    create(meta, "t", 2, 2)
    cmd = plan_grow_topic(meta, "t", 5)
    assert cmd.partitions == 5 and len(cmd.new_replicas) == 3
    assert all(len(r) == 2 for r in cmd.new_replicas)
    assert run(meta, cmd)[0].ok and len(meta.topics["t"].partitions) == 5
    with pytest.raises(PlacementError, match="only grow"):
        plan_grow_topic(meta, "t", 4)
    with pytest.raises(PlacementError, match="no topic"):
        plan_grow_topic(meta, "nope", 4)


# -- the rebalance planner ---------------------------------------------------------------------
def apply_plan(meta: ClusterMetadata, plan: RebalancePlan, leaders: dict[int, int]) -> None:
    for move in plan.moves:
        [result] = run(meta, move)
        assert result.ok, result.reason
    for t in plan.transfers:
        assert leaders[t.group] == t.from_node
        leaders[t.group] = t.to_node


def converge(meta: ClusterMetadata, live: set[int], leaders: dict[int, int], *,
             max_moves: int = 2, max_transfers: int = 4, rounds: int = 500) -> int:
    """Apply plans until one is empty; the number of rounds it took."""
    for i in range(rounds):
        plan = rebalance.plan_rebalance(meta, live, leaders, max_moves=max_moves,
                              max_transfers=max_transfers)
        assert len(plan.moves) <= max_moves and len(plan.transfers) <= max_transfers
        if plan.empty:
            return i
        apply_plan(meta, plan, leaders)
    raise AssertionError(f"the planner did not converge in {rounds} rounds")


def skewed() -> tuple[ClusterMetadata, dict[int, int]]:
    """Four nodes, 20 partitions RF 2 placed while node 4 was down; node 4 is back."""
    meta = founded(4)
    create(meta, "t", 20, 2, live=[1, 2, 3])
    leaders = {g: p.replicas[0] for g, p in meta.groups.items()}
    return meta, leaders


def test_the_rebalance_plan_is_bounded() -> None:
    meta, leaders = skewed()
    leaders = {g: 1 for g in leaders}  # node 1 leads everything (the others just came back)
    for k in (1, 2, 3):
        plan = rebalance.plan_rebalance(meta, {1, 2, 3, 4}, leaders, max_moves=k, max_transfers=k)
        assert len(plan.moves) == k and len(plan.transfers) == k
    plan = rebalance.plan_rebalance(meta, {1, 2, 3, 4}, leaders, max_moves=0, max_transfers=0)
    assert plan.empty


def test_the_rebalance_planner_converges_to_balance() -> None:
    meta, leaders = skewed()
    assert replica_counts(meta, [1, 2, 3, 4])[4] == 1  # only the default topic's replica
    converge(meta, {1, 2, 3, 4}, leaders)
    counts = replica_counts(meta, [1, 2, 3, 4])
    assert spread(counts) <= 1, counts
    assert spread(current_load(meta, [1, 2, 3, 4]).leaders) <= 1
    assert all(leaders[g] == p.replicas[0] for g, p in meta.groups.items())
    assert rebalance.plan_rebalance(meta, {1, 2, 3, 4}, leaders).empty  # and stays quiet


def test_a_returning_node_gets_leadership_back_a_few_at_a_time() -> None:
    meta = founded(3)
    create(meta, "t", 30, 3)
    preferred = {g: p.replicas[0] for g, p in meta.groups.items()}
    # Node 3 was down: its partitions elected others.
    leaders = {g: (n if n != 3 else meta.groups[g].replicas[1]) for g, n in preferred.items()}
    assert rebalance.plan_rebalance(meta, {1, 2}, leaders).empty  # while it is down: nothing to do
    owed = sum(1 for g in leaders if preferred[g] == 3)
    assert owed >= 10
    rounds = 0
    while True:
        plan = rebalance.plan_rebalance(meta, {1, 2, 3}, leaders, max_transfers=3)
        if plan.empty:
            break
        assert not plan.moves and len(plan.transfers) <= 3
        assert all(t.to_node == 3 for t in plan.transfers)
        apply_plan(meta, plan, leaders)
        rounds += 1
    assert rounds == -(-owed // 3) and leaders == preferred


def test_leadership_goes_to_the_first_live_replica_when_the_preferred_is_down() -> None:
    meta = founded(3)
    create(meta, "t", 6, 3)
    leaders = {g: p.replicas[2] for g, p in meta.groups.items()}
    plan = rebalance.plan_rebalance(meta, {1, 2}, leaders, max_transfers=100)
    for t in plan.transfers:
        p = meta.groups[t.group]
        assert t.to_node == next(n for n in p.replicas if n in (1, 2))
    assert all(t.from_node != 3 for t in plan.transfers)  # a dead leader is not "moved"


def test_a_decommissioned_node_is_drained() -> None:
    meta = founded(4)
    create(meta, "t", 8, 2)
    run(meta, DecommissionNode(2))
    leaders = {g: p.replicas[0] for g, p in meta.groups.items()}
    converge(meta, {1, 2, 3, 4}, leaders)
    assert all(2 not in p.replicas for p in meta.groups.values() if p.topic == "t")
    assert spread(replica_counts(meta, [1, 3, 4])) <= 1


def test_a_partition_with_a_dead_replica_is_not_moved() -> None:
    meta = founded(3)
    run(meta, RegisterNode(4, "h:4"))
    create(meta, "t", 12, 2, live=[1, 2, 3])
    leaders = {g: p.replicas[0] for g, p in meta.groups.items()}
    plan = rebalance.plan_rebalance(meta, {1, 2, 4}, leaders, max_moves=50)
    assert plan.moves
    for move in plan.moves:
        before = meta.partition(move.topic, move.partition).replicas
        assert 3 not in before


def test_deletes_leave_a_skew_that_only_the_planner_undoes() -> None:
    meta = founded(2)
    for i in range(6):
        create(meta, f"t{i}", 1, 1)  # alternate 1, 2, 1, 2, ...
    for i in (1, 3, 5):
        run(meta, DeleteTopic(f"t{i}"))
    assert spread(replica_counts(meta, [1, 2])) == 3
    create(meta, "new", 1, 1)  # placement goes to the emptier node: never widens the skew
    assert meta.partition("new", 0).replicas == (2,)
    leaders = {g: p.replicas[0] for g, p in meta.groups.items()}
    converge(meta, {1, 2}, leaders)
    assert spread(replica_counts(meta, [1, 2])) <= 1


def test_same_inputs_give_the_same_plan() -> None:
    a, la = skewed()
    b, lb = skewed()
    assert (rebalance.plan_rebalance(a, {1, 2, 3, 4}, la)
            == rebalance.plan_rebalance(b, {4, 3, 2, 1}, lb))
