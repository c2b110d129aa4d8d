"""The client's view of the cluster's topics: the `metadata` answer as typed values, and a cache
of it that refreshes when the client learns it is stale.

What the cache holds is what any node answers to `metadata` (raft/protocol/topic_requests.py):
the controller's leader, the nodes and their addresses, and per topic its settings and
partitions, each with its Raft group, replica set (the first replica is the preferred leader)
and current leader with its address. A node answers from the controller state it has applied
(`applied`), so an answer can lag the controller by a little; the client treats it as a hint
and lets NOT_LEADER redirects and refreshes correct it.

When the cache refreshes (Kafka's producer does the same):
- the first time a topic is needed, or when it is older than `max_age` (5 minutes);
- after NOT_LEADER for a partition, UNKNOWN_TOPIC, or a connection failure to a partition's
  leader (raft/client/client.py calls `refresh`).
The rate is bounded: a refresh starts at least `min_interval` (0.1 s) after the previous one
started, and callers that ask while one is in flight share it. So a client that meets a leader
change on 64 partitions at once asks once, not 64 times, and a cluster without a leader for a
while is asked at most ten times a second per client.

A node that predates topics answers `metadata` with BAD_REQUEST "unknown request type"; the
cache then says `supported = False` and the client routes every request as it always did (the
default topic's only partition, following NOT_LEADER hints).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.client.errors import BadRequestError, UnknownTopicError

DEFAULT_TOPIC = "default"
METADATA_MIN_INTERVAL_S = 0.1
METADATA_MAX_AGE_S = 300.0


@dataclass(slots=True, frozen=True)
class PartitionInfo:
    """One partition as the metadata answer describes it."""

    topic: str
    partition: int
    group: int
    replicas: tuple[int, ...]
    leader: int | None = None
    leader_address: str | None = None
    # A partition off shard 0 (docs/SHARDS.md): where its shard of each replica listens.
    replica_addresses: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class TopicInfo:
    name: str
    partitions: tuple[PartitionInfo, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    # A mirror topic's origin ({link, source_cluster_id, source_topic}), None for a plain
    # one; while mirror_active the link writes it and clients may only read (REPLICATION.md).
    origin: dict[str, str] | None = None
    mirror_active: bool = False

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


@dataclass(slots=True, frozen=True)
class Metadata:
    """One `metadata` answer."""

    controller: int | None
    controller_address: str | None
    applied: int
    nodes: dict[int, str]
    topics: dict[str, TopicInfo]
    cluster_id: str | None = None  # the answering node's cluster (links record the source's)

    @classmethod
    def parse(cls, reply: dict[str, Any]) -> "Metadata":
        nodes = {int(n["node_id"]): str(n.get("address") or "")
                 for n in reply.get("nodes") or []}
        topics: dict[str, TopicInfo] = {}
        for t in reply.get("topics") or []:
            name = str(t["name"])
            parts = sorted((PartitionInfo(
                name, int(p["partition"]), int(p.get("group", -1)),
                tuple(int(r) for r in p.get("replicas") or ()),
                p.get("leader"), p.get("leader_address") or None,
                tuple(str(a) for a in p.get("replica_addresses") or () if a))
                for p in t.get("partitions") or []), key=lambda p: p.partition)
            topics[name] = TopicInfo(name, tuple(parts), dict(t.get("settings") or {}),
                                     t.get("origin"), bool(t.get("mirror_active", False)))
        return cls(reply.get("controller"), reply.get("controller_address") or None,
                   int(reply.get("applied", -1)), nodes, topics, reply.get("cluster_id"))

    def topic(self, name: str) -> TopicInfo:
        """The topic, or UnknownTopicError naming the topics that exist."""
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(unknown_topic_message(name, self.topics), details={
                "topic": name, "topics": sorted(self.topics)})
        return info

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        """The partition, or UnknownTopicError naming the topic's partitions."""
        info = self.topic(topic)
        if not 0 <= partition < info.partition_count:
            raise UnknownTopicError(
                f"topic {topic!r} has no partition {partition}: it has "
                f"{info.partition_count} (0..{info.partition_count - 1}); grow it with "
                f"`raftlog topic alter {topic} --partitions N`",
                details={"topic": topic, "partition": partition,
                         "partitions": info.partition_count})
        return info.partitions[partition]

    def addresses_of(self, topic: str, partition: int) -> list[str]:
        """Where to send a request for the partition: its leader first, then its other
        replicas (preferred leader first), as far as their addresses are known."""
        try:
            p = self.partition(topic, partition)
        except UnknownTopicError:
            return []
        out = [p.leader_address] if p.leader_address else []
        if p.replica_addresses:  # the partition's shard of each replica: no extra hop
            out += list(p.replica_addresses)
        else:
            out += [self.nodes[r] for r in p.replicas if self.nodes.get(r)]
        return list(dict.fromkeys(out))


def unknown_topic_message(name: str, topics: Any) -> str:
    names = sorted(topics)
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return (f"no topic {name!r}; the cluster has {shown or 'none'}. Create it with "
            f"`raftlog topic create {name} --partitions N --replicas R`, or list them with "
            f"`raftlog topic list`")


class MetadataCache:
    """The latest `metadata` answer and the refresh rules of the module docstring. `fetch` asks
    the cluster for every topic (Client.metadata_request)."""

    def __init__(self, fetch: Callable[[], Awaitable[dict[str, Any]]], *,
                 min_interval: float = METADATA_MIN_INTERVAL_S,
                 max_age: float = METADATA_MAX_AGE_S) -> None:
        if min_interval < 0 or max_age <= 0:
            raise ValueError("metadata min_interval must be >= 0 and max_age > 0")
        self._fetch = fetch
        self.min_interval = min_interval
        self.max_age = max_age
        self.current: Metadata | None = None
        self.supported = True  # False once a node said it has no `metadata` request
        self.refreshes = 0  # answers fetched (tests, diagnostics)
        self._started = -float("inf")  # when the last refresh started (trio time)
        self._fetched = -float("inf")  # when the current answer arrived
        self._in_flight: trio.Event | None = None
        self._error: BaseException | None = None
        # Called after each fresh answer (the client's router rebuilds its rotations).
        self.on_refresh: Callable[[], None] | None = None

    @property
    def stale(self) -> bool:
        return self.current is None or trio.current_time() - self._fetched >= self.max_age

    async def get(self, topic: str | None = None) -> Metadata:
        """The cached answer, refreshed first when it is stale or does not know `topic`."""
        current = self.current
        if current is None or self.stale or (topic is not None and topic not in current.topics):
            return await self.refresh()
        return current

    async def refresh(self) -> Metadata:
        """A metadata answer that started after this call did (joining one in flight only if
        it started no earlier than min_interval ago, so the rate stays bounded). Raises the
        fetch's error (BadRequestError from a node without `metadata`: `supported` turns
        False)."""
        asked = trio.current_time()
        while True:
            if self._in_flight is not None:
                event = self._in_flight
                started = self._started
                await event.wait()
                if started >= asked - self.min_interval and self._error is None \
                        and self.current is not None:
                    return self.current
                if self._error is not None and started >= asked - self.min_interval:
                    raise self._error
                continue
            wait = self._started + self.min_interval - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)  # the rate bound (a client-side pacing, not a test sync)
                if self._in_flight is not None:
                    continue
            return await self._do_refresh()

    async def _do_refresh(self) -> Metadata:
        event = self._in_flight = trio.Event()
        self._started = trio.current_time()
        self._error = None
        try:
            reply = await self._fetch()
            self.current = Metadata.parse(reply)
            self._fetched = trio.current_time()
            self.refreshes += 1
            if self.on_refresh is not None:
                self.on_refresh()
            return self.current
        except BadRequestError as e:
            if "unknown request type" in e.message:
                self.supported = False
            self._error = e
            raise
        except BaseException as e:
            self._error = e
            raise
        finally:
            self._in_flight = None
            event.set()

    def learned_leader(self, topic: str, partition: int, leader: int | None,
                       address: str | None) -> None:
        """A NOT_LEADER hint named the partition's leader: keep it, so the next request goes
        there without a refresh."""
        meta = self.current
        if meta is None or topic not in meta.topics:
            return
        info = meta.topics[topic]
        if not 0 <= partition < info.partition_count:
            return
        parts = list(info.partitions)
        old = parts[partition]
        parts[partition] = PartitionInfo(old.topic, old.partition, old.group, old.replicas,
                                         leader, address, old.replica_addresses)
        topics = dict(meta.topics)
        topics[topic] = TopicInfo(info.name, tuple(parts), info.settings, info.origin,
                                  info.mirror_active)
        self.current = Metadata(meta.controller, meta.controller_address, meta.applied,
                                meta.nodes, topics, meta.cluster_id)


__all__ = ["DEFAULT_TOPIC", "Metadata", "MetadataCache", "PartitionInfo", "TopicInfo",
           "unknown_topic_message"]
