"""Where new partitions' replicas go: every node within one of the mean replica count.

The controller's leader runs this when it turns a `topic create` (or a grow) into a command
(commands.CreateTopic carries the replica lists it chose), so applying the command stays a pure
function of the log while placement may use what only the leader knows: which nodes are live.

The rule (Redpanda's and Kafka's allocators balance by the same counts): count every replica
already assigned to each eligible node (registered, active, live); give each new partition the
`rf` nodes with the fewest, distinct nodes, ties broken by node id, and count it before placing
the next. Placing on the least-loaded nodes keeps the spread (max - min) at most one if it was
(and never widens it otherwise), so every node stays within one of the mean. Deleted topics can
leave a skew that only moves can undo: that is the rebalance planner's job (rebalance.py).

Preferred leaders (the first replica of each partition) are balanced the same way: of the nodes
chosen, the one preferred-leading the fewest partitions goes first, so leadership spreads
evenly once every partition is led by its preferred replica.

Shards (docs/SHARDS.md): once the nodes are chosen, the partition gets one shard index, the
same on every replica (shard i only ever talks to shard i of other nodes), among the shards
all of its nodes run: the index whose (node, shard) pairs hold the fewest replicas, then the
fewest preferred leaderships on the leader's (node, shard), then the lowest index. A
(node, shard) holds at most `shard_limit` replicas (the per-shard admission limit,
SHARD_REPLICA_LIMIT by default): a partition none of whose shard indexes has room on all of
its nodes is refused. With one shard per node every partition is on shard 0 and the commands
are what they were before shards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from raft.controller.commands import AlterTopicPartitions, CreateTopic, TopicSettings
from raft.controller.state import ClusterMetadata

# Replicas one (node, shard) may hold: a shard is one Python process (one core); past a few
# thousand groups its ticker, links and flusher are the bound (docs/SHARDS.md).
SHARD_REPLICA_LIMIT = 2000


class PlacementError(ValueError):
    """The request cannot be placed; the message says what would make it possible."""


@dataclass(slots=True)
class Load:
    """Replica and preferred-leader counts per eligible node (what placement balances)."""

    replicas: dict[int, int]
    leaders: dict[int, int]

    def spread(self) -> int:
        values = list(self.replicas.values())
        return max(values) - min(values) if values else 0


def eligible_nodes(meta: ClusterMetadata, live: Iterable[int] | None = None) -> list[int]:
    """Active registered nodes, and of them only the live ones when `live` is given."""
    active = meta.active_nodes()
    if live is None:
        return active
    alive = set(live)
    return [n for n in active if n in alive]


def current_load(meta: ClusterMetadata, nodes: Iterable[int]) -> Load:
    """How many replicas (and preferred leaderships) each of `nodes` holds now."""
    replicas = {n: 0 for n in nodes}
    leaders = dict(replicas)
    for p in meta.groups.values():
        for n in p.replicas:
            if n in replicas:
                replicas[n] += 1
        if p.replicas[0] in leaders:
            leaders[p.replicas[0]] += 1
    return Load(replicas, leaders)


def place(load: Load, count: int, rf: int) -> list[tuple[int, ...]]:
    """Replica lists for `count` new partitions of `rf` replicas each, counting each one into
    `load` before the next (so a big topic spreads evenly too)."""
    nodes = sorted(load.replicas)
    if rf < 1:
        raise PlacementError(f"a partition needs at least one replica, got {rf}")
    if rf > len(nodes):
        raise PlacementError(f"{rf} replicas per partition need {rf} live active nodes; "
                             f"{len(nodes)} are ({nodes}): lower --replicas or bring nodes up")
    out = []
    for _ in range(count):
        chosen = sorted(nodes, key=lambda n: (load.replicas[n], n))[:rf]
        leader = min(chosen, key=lambda n: (load.leaders[n], load.replicas[n], n))
        replicas = (leader, *(n for n in chosen if n != leader))
        for n in replicas:
            load.replicas[n] += 1
        load.leaders[leader] += 1
        out.append(replicas)
    return out


@dataclass(slots=True)
class ShardLoad:
    """Replica and preferred-leader counts per (node, shard), and each node's shard count."""

    shards: dict[int, int]
    replicas: dict[tuple[int, int], int]
    leaders: dict[tuple[int, int], int]


def current_shard_load(meta: ClusterMetadata, nodes: Iterable[int]) -> ShardLoad:
    shards = {n: meta.nodes[n].shards for n in nodes if n in meta.nodes}
    replicas = {(n, s): 0 for n, k in shards.items() for s in range(k)}
    leaders = dict(replicas)
    for p in meta.groups.values():
        for n in p.replicas:
            if (n, p.shard) in replicas:
                replicas[(n, p.shard)] += 1
        if (p.replicas[0], p.shard) in leaders:
            leaders[(p.replicas[0], p.shard)] += 1
    return ShardLoad(shards, replicas, leaders)


def place_shards(load: ShardLoad, assignment: list[tuple[int, ...]],
                 shard_limit: int = SHARD_REPLICA_LIMIT) -> tuple[int, ...]:
    """One shard index per replica list of `assignment` (module docstring), counting each
    into `load` before the next; () when every one is shard 0 (the pre-shards command)."""
    out = []
    for replicas in assignment:
        count = min(load.shards.get(n, 1) for n in replicas)
        room = [s for s in range(count)
                if all(load.replicas.get((n, s), 0) < shard_limit for n in replicas)]
        if not room:
            raise PlacementError(f"every shard of nodes {list(replicas)} holds {shard_limit} "
                                 f"replicas (the per-shard limit): add nodes or shards, or "
                                 f"delete topics")
        shard = min(room, key=lambda s: (sum(load.replicas.get((n, s), 0) for n in replicas),
                                         load.leaders.get((replicas[0], s), 0), s))
        for n in replicas:
            load.replicas[(n, shard)] = load.replicas.get((n, shard), 0) + 1
        load.leaders[(replicas[0], shard)] = load.leaders.get((replicas[0], shard), 0) + 1
        out.append(shard)
    return tuple(out) if any(out) else ()


def plan_create_topic(meta: ClusterMetadata, name: str, partitions: int, rf: int,
                      settings: TopicSettings = TopicSettings(),
                      live: Iterable[int] | None = None,
                      shard_limit: int = SHARD_REPLICA_LIMIT) -> CreateTopic:
    """The CreateTopic command for `topic create NAME --partitions N --replicas R`."""
    if partitions < 1:
        raise PlacementError(f"a topic needs at least one partition, got {partitions}")
    nodes = eligible_nodes(meta, live)
    load = current_load(meta, nodes)
    assignment = place(load, partitions, rf)
    shards = place_shards(current_shard_load(meta, nodes), assignment, shard_limit)
    return CreateTopic(name, tuple(assignment), settings, shards)


def plan_grow_topic(meta: ClusterMetadata, name: str, partitions: int,
                    live: Iterable[int] | None = None,
                    shard_limit: int = SHARD_REPLICA_LIMIT) -> AlterTopicPartitions:
    """The AlterTopicPartitions command for `topic alter NAME --partitions N` (the state
    machine refuses it if the topic is gone or would shrink by the time it applies)."""
    topic = meta.topics.get(name)
    if topic is None:
        raise PlacementError(f"no topic named {name!r}")
    have = len(topic.partitions)
    if partitions < have:
        raise PlacementError(f"topic {name!r} has {have} partitions; partitions can only grow")
    rf = len(topic.partitions[0].replicas)
    nodes = eligible_nodes(meta, live)
    assignment = place(current_load(meta, nodes), partitions - have, rf)
    shards = place_shards(current_shard_load(meta, nodes), assignment, shard_limit)
    return AlterTopicPartitions(name, partitions, tuple(assignment), shards)
