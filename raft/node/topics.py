"""Topics as a node sees them: resolving a request's (topic, partition) to a Raft group, and the
maps `metadata` and the topic admin requests answer with.

Both read the controller metadata this node has applied (raft.controller.state.ClusterMetadata,
kept by raft.node.controller.ControllerService) and nothing else, so any node answers from what
it knows: a node whose metadata is behind may say UNKNOWN_TOPIC for a topic just created (the
client refreshes and retries), never route a request to another topic's group, since group ids
are never reused.

The rule that matters for safety is `resolve`: a request for partition p of topic t goes to
exactly the group the metadata gives partition p of t (tests/node/test_topics_inproc.py checks
records land in the partition they were addressed to; a mutant that ignores the partition is
killed by it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raft.controller.state import ClusterMetadata, Partition, Topic
from raft.protocol.replies import ErrorReply
from raft.core.types import ErrorCode

# What a node knows of a group's leader: (leader id, its address), (None, None) when unknown.
LeaderOf = Callable[[int], tuple[int | None, str | None]]
# At most this many names in an UNKNOWN_TOPIC message (the error's `topics` has them all).
NAMES_IN_MESSAGE = 20


@dataclass(slots=True, frozen=True)
class Resolved:
    """Where a partition-addressed request goes: `group`, or the refusal to answer."""

    group: int | None
    refusal: ErrorReply | None = None


def topic_names(meta: ClusterMetadata) -> list[str]:
    return sorted(meta.topics)


def unknown_topic(meta: ClusterMetadata, topic: str) -> ErrorReply:
    names = topic_names(meta)
    shown = ", ".join(names[:NAMES_IN_MESSAGE]) + (", ..." if len(names) > NAMES_IN_MESSAGE
                                                    else "")
    return ErrorReply(ErrorCode.UNKNOWN_TOPIC,
                      f"unknown topic {topic!r}; topics: {shown or '(none yet)'}; create it "
                      f"with `raftlog topic create {topic} --partitions N --replicas R`",
                      {"topic": topic, "topics": names})


def unknown_partition(topic: Topic, partition: int) -> ErrorReply:
    count = len(topic.partitions)
    return ErrorReply(ErrorCode.UNKNOWN_TOPIC,
                      f"topic {topic.name!r} has no partition {partition}; it has {count} "
                      f"partition{'s' if count != 1 else ''} (0..{count - 1})",
                      {"topic": topic.name, "partition": partition, "partitions": count})


def resolve(meta: ClusterMetadata, topic: str, partition: int,
            runs: Callable[[int], bool], address_of: Callable[[int], str | None],
            shard: int = 0) -> Resolved:
    """The group of partition `partition` of `topic` if this node runs it; else the refusal:
    UNKNOWN_TOPIC naming what exists, or NOT_LEADER naming the partition's replicas when this
    node holds none of it (`runs(group)` is False)."""
    t = meta.topics.get(topic)
    if t is None:
        return Resolved(None, unknown_topic(meta, topic))
    if not 0 <= partition < len(t.partitions):
        return Resolved(None, unknown_partition(t, partition))
    p = t.partitions[partition]
    if runs(p.group):
        return Resolved(p.group)
    if p.shard != shard:  # another shard's: where that shard of each replica listens
        address_of = functools.partial(_shard_address, meta, p.shard)
    return Resolved(None, ErrorReply(
        ErrorCode.NOT_LEADER,
        f"this node holds no replica of topic {topic!r} partition {partition} (group "
        f"{p.group}); its replicas are nodes {list(p.replicas)}: ask one of them (the "
        f"`metadata` request says where they listen)",
        {"leader_id": None, "topic": topic, "partition": partition, "group": p.group,
         "replicas": list(p.replicas),
         "replica_addresses": [address_of(n) for n in p.replicas]}))


def _shard_address(meta: ClusterMetadata, shard: int, node: int) -> str | None:
    return meta.shard_address(node, shard)


def partition_map(p: Partition, leader_of: LeaderOf,
                  meta: ClusterMetadata | None = None) -> dict[str, Any]:
    leader, address = leader_of(p.group)
    out = {"partition": p.index, "group": p.group, "replicas": list(p.replicas),
           "leader": leader, "leader_address": address}
    if p.shard and meta is not None:
        # Off shard 0: where that shard of each replica listens, so a client goes straight
        # there (docs/SHARDS.md). A node that does not run the partition's shard may not know
        # its leader: the client asks the replicas, which redirect to it.
        out["shard"] = p.shard
        out["replica_addresses"] = [meta.shard_address(n, p.shard) for n in p.replicas]
    return out


def topic_map(t: Topic, leader_of: LeaderOf,
              meta: ClusterMetadata | None = None) -> dict[str, Any]:
    """A topic as `metadata` and the admin requests answer it."""
    out = {"name": t.name, "settings": t.settings.to_raw(),
           "partitions": [partition_map(p, leader_of, meta) for p in t.partitions]}
    if t.origin is not None:  # a mirror (docs/REPLICATION.md): read-only while mirror_active
        out["origin"] = t.origin.to_map()
        out["mirror_active"] = t.mirror_active
    return out


def metadata_map(meta: ClusterMetadata, names: list[str] | None, leader_of: LeaderOf,
                 controller: tuple[int | None, str | None]) -> dict[str, Any]:
    """The `metadata` reply: the controller's leader, this node's applied offset, the nodes,
    and the topics asked for (every one when `names` is None; unknown names left out)."""
    chosen = topic_names(meta) if names is None else [n for n in dict.fromkeys(names)
                                                      if n in meta.topics]
    return {"controller": controller[0], "controller_address": controller[1],
            "applied": meta.applied,
            "nodes": [{"node_id": n.node_id, "address": n.address, "status": n.status.value,
                       **({"shards": n.shards} if n.shards != 1 else {})}
                      for n in sorted(meta.nodes.values(), key=lambda n: n.node_id)],
            "topics": [topic_map(meta.topics[n], leader_of, meta) for n in chosen]}
