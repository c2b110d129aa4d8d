"""Partitions placed on (node, shard) (docs/SHARDS.md): the shard index is the same on every
replica, replicas and preferred leaders spread over shards, the per-shard admission limit, the
state refusing shards a node does not run, and one-shard clusters byte for byte unchanged."""

from __future__ import annotations

from collections import Counter

import msgpack
import pytest

from controller_helpers import run
from raft.controller.bootstrap import bootstrap
from raft.controller.commands import (
    AlterTopicPartitions,
    CreateTopic,
    MoveReplicas,
    RegisterNode,
    decode_command,
    encode_command,
)
from raft.controller.placement import PlacementError, plan_create_topic, plan_grow_topic
from raft.controller.state import ClusterMetadata, Refusal, shard_address


def founded(nodes: int, shards: int) -> ClusterMetadata:
    from raft.controller.bootstrap import bootstrap_commands

    meta = ClusterMetadata()
    founders = {n: f"127.0.0.1:{9000 + 10 * n}" for n in range(1, nodes + 1)}
    for i, c in enumerate(bootstrap_commands(founders, shards=shards)):
        assert meta.apply(i, c).ok
    return meta


@pytest.mark.parametrize("nodes,shards,partitions,rf", [
    (1, 2, 16, 1), (3, 2, 12, 3), (3, 4, 32, 2), (4, 3, 9, 3), (1, 1, 8, 1), (3, 1, 6, 3),
])
def test_replicas_and_leaders_spread_over_shards(nodes, shards, partitions, rf):
    meta = founded(nodes, shards)
    [result] = run(meta, plan_create_topic(meta, "t", partitions, rf))
    assert result.ok, result.reason
    parts = list(meta.groups.values())  # the default topic's partition counts too
    per_pair = Counter((n, p.shard) for p in parts for n in p.replicas)
    leaders = Counter((p.replicas[0], p.shard) for p in parts)
    pairs = [(n, s) for n in range(1, nodes + 1) for s in range(shards)]
    counts = [per_pair[x] for x in pairs]
    assert max(counts) - min(counts) <= 1, per_pair
    # Preferred leaders come second to replicas (the node's leader is chosen first, then
    # the shard): every (node, shard) within two of each other, and each shard index within
    # one over the cluster.
    lead = [leaders[x] for x in pairs]
    assert max(lead) - min(lead) <= 2, leaders
    by_shard = Counter(s for (_, s) in leaders.elements())
    per_index = [by_shard[s] for s in range(shards)]
    assert max(per_index) - min(per_index) <= 1, by_shard
    assert all(0 <= p.shard < shards for p in meta.topics["t"].partitions)


def test_one_shard_commands_and_snapshots_are_unchanged():
    """A one-shard cluster writes exactly the entries and snapshots it wrote before shards:
    old nodes read them, and old data directories' states read back equal."""
    meta = bootstrap({1: "a:1", 2: "a:2", 3: "a:3"})
    cmd = plan_create_topic(meta, "t", 4, 3)
    assert cmd.shards == ()
    raw = msgpack.unpackb(encode_command(cmd))
    assert "shards" not in str(raw)
    assert "shards" not in str(msgpack.unpackb(encode_command(RegisterNode(1, "a:1"))))
    run(meta, cmd)
    snap = meta.to_snapshot()
    assert all(len(n) == 3 for n in snap["nodes"])
    assert all(len(p) == 3 for t in snap["topics"] for p in t[3])  # group, replicas, founders
    assert ClusterMetadata.from_snapshot(snap).to_snapshot() == snap


def test_sharded_state_round_trips_through_commands_and_snapshots():
    meta = founded(2, 2)
    cmd = plan_create_topic(meta, "t", 4, 2)
    assert decode_command(encode_command(cmd)) == cmd
    assert sorted(cmd.shards) == [0, 0, 1, 1]
    run(meta, cmd)
    again = ClusterMetadata.from_snapshot(meta.to_snapshot())
    assert [p.shard for p in again.topics["t"].partitions] == list(cmd.shards)
    assert again.nodes[1].shards == 2
    grow = plan_grow_topic(meta, "t", 6)
    assert decode_command(encode_command(grow)) == grow


@pytest.mark.parametrize("command,refusal", [
    (CreateTopic("t", ((1, 2),), shards=(2,)), Refusal.INVALID_REPLICAS),  # node runs 2
    (CreateTopic("t", ((1, 3),), shards=(1,)), Refusal.INVALID_REPLICAS),  # node 3 runs 1
    (CreateTopic("t", ((1, 3),), shards=(0,)), None),
    (CreateTopic("t", ((1, 2),), shards=(1,)), None),
])
def test_the_state_refuses_a_shard_a_replica_does_not_run(command, refusal):
    meta = founded(2, 2)
    assert run(meta, RegisterNode(3, "127.0.0.1:9030"))[0].ok  # one shard
    [result] = run(meta, command)
    assert result.refusal is refusal, result.reason


def test_a_move_keeps_the_shard_and_needs_it_on_the_new_replica():
    meta = founded(2, 2)
    run(meta, RegisterNode(3, "127.0.0.1:9030"), CreateTopic("t", ((1,),), shards=(1,)))
    [result] = run(meta, MoveReplicas("t", 0, (3,)))
    assert result.refusal is Refusal.INVALID_REPLICAS and "shard 1" in result.reason
    run(meta, RegisterNode(4, "127.0.0.1:9040", 2))
    assert run(meta, MoveReplicas("t", 0, (4,)))[0].ok
    assert meta.topics["t"].partitions[0].shard == 1
    # A node holding replicas on shard 1 cannot re-register with fewer shards.
    [result] = run(meta, RegisterNode(4, "127.0.0.1:9040", 1))
    assert result.refusal is Refusal.INVALID_REPLICAS


def test_mixed_shard_counts_place_within_the_smallest():
    meta = founded(2, 4)
    run(meta, RegisterNode(3, "127.0.0.1:9030", 2))
    cmd = plan_create_topic(meta, "t", 12, 3)
    assert set(cmd.shards) == {0, 1}
    assert all(r.ok for r in run(meta, cmd))


def test_the_per_shard_admission_limit_refuses_a_full_node():
    meta = founded(1, 2)  # the default topic holds (1, 0) once
    cmd = plan_create_topic(meta, "t", 3, 1, shard_limit=2)
    assert sorted(cmd.shards) == [0, 1, 1]
    run(meta, cmd)
    with pytest.raises(PlacementError, match="per-shard limit"):
        plan_create_topic(meta, "u", 1, 1, shard_limit=2)


def test_shard_addresses_are_the_next_ports():
    assert shard_address("127.0.0.1:7100", 0) == "127.0.0.1:7100"
    assert shard_address("127.0.0.1:7100", 3) == "127.0.0.1:7103"
    assert shard_address("[::1]:7100", 1) == "[::1]:7101"
    meta = founded(1, 2)
    assert meta.shard_address(1, 1) == "127.0.0.1:9011"
    assert meta.shard_address(9, 1) is None
    with pytest.raises(ValueError):
        shard_address("nohost", 1)


def test_an_entry_before_shards_decodes_as_shard_0():
    raw = encode_command(AlterTopicPartitions("t", 2, ((1,),)))
    assert decode_command(raw).new_shards == ()


def test_a_shard_process_reconciles_only_its_own_partitions():
    """Shard k starts the partitions placed on shard k, and no other (two processes running
    one group would be two replicas of one node: double votes)."""
    from raft.controller.reconcile import reconcile

    meta = founded(2, 2)
    run(meta, CreateTopic("t", ((1, 2), (2, 1), (1, 2)), shards=(0, 1, 1)))
    for shard, want in ((0, {1, 2}), (1, {3, 4})):
        plan = reconcile(meta, 1, [], [], shard)
        assert {p.group for p in plan.start} == want, (shard, plan)
    assert {p.group for p in reconcile(meta, 1, [], []).start} == {1, 2, 3, 4}


def test_a_shard_beyond_a_replicas_count_is_refused():
    """(The killer of the mutant that drops the rule: tests/raft/test_mutants.py.)"""
    meta = founded(2, 2)
    [result] = run(meta, CreateTopic("t", ((1, 2),), shards=(2,)))
    assert result.refusal is Refusal.INVALID_REPLICAS, result
    assert "t" not in meta.topics
