"""Topic calls as `Client` methods (a mixin; raft/client/client.py inherits it): the metadata
request, topic admin (create, alter, delete: answered by the controller's leader, which the
client finds like any leader), and the per-partition view `raftlog topic describe` prints.

    async with Client(servers) as c:
        await c.create_topic("orders", partitions=8, replicas=3)
        for t in await c.list_topics(): print(t.name, t.partition_count)
        print(await c.describe_topic("orders"))   # leaders, replicas, high watermarks
        await c.move_partition("orders", 0, [1, 2, 4])  # then partition_membership(...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from raft.client.errors import (OffsetOutOfRangeError, RaftlogError, RequestTimeout,
                                UnknownTopicError)
from raft.client.metadata import DEFAULT_TOPIC, Metadata, TopicInfo
from raft.protocol.topic_requests import Metadata as MetadataRequest
from raft.protocol.topic_requests import TopicAlter, TopicCreate, TopicDelete, TopicMove

if TYPE_CHECKING:
    from raft.client.metadata import MetadataCache

SETTINGS = ("retention_bytes", "retention_ms", "max_record_bytes")


def where_fields(topic: str | None, partition: int) -> dict[str, Any]:
    """The `topic`/`partition` keywords of a log request, only when they are not the defaults
    (so a request to the default topic's partition 0 is built, and framed, as before topics)."""
    if partition < 0:
        raise ValueError(f"a partition is 0 or more, got {partition}")
    out: dict[str, Any] = {}
    if topic is not None and topic != DEFAULT_TOPIC:
        out["topic"] = topic
    if partition:
        out["partition"] = partition
    return out


def metadata_request(topics: list[str] | None = None) -> MetadataRequest:
    return MetadataRequest(None if topics is None else list(topics))


def _timeout_ms(budget_s: float) -> int:
    return max(1, min(120_000, int(budget_s * 1000)))


class TopicCalls:
    """Requires `call`, `timeout`, `metadata` and `refresh_metadata` (Client has them)."""

    timeout: float
    metadata: "MetadataCache"

    async def call(self, request: Any, *, timeout: float | None = None,
                   **kw: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def refresh_metadata(self, deadline: float | None = None) -> Metadata | None:
        raise NotImplementedError

    async def cluster_metadata(self, *, refresh: bool = True) -> Metadata:
        """The cluster's topics, partitions, leaders and nodes (a fresh answer unless
        `refresh=False` and the cache has one). Raises the error of a node that predates
        topics (BAD_REQUEST)."""
        if refresh or self.metadata.current is None:
            return await self.metadata.refresh()
        return self.metadata.current

    async def list_topics(self) -> list[TopicInfo]:
        meta = await self.cluster_metadata()
        return [meta.topics[name] for name in sorted(meta.topics)]

    async def topic(self, name: str, *, refresh: bool = False) -> TopicInfo:
        """One topic's metadata (cached unless `refresh`, or unknown to the cache);
        UnknownTopicError naming the topics that exist."""
        meta = await self.metadata.get(name) if not refresh else await self.cluster_metadata()
        try:
            return meta.topic(name)
        except UnknownTopicError:
            return (await self.controllers_view(meta, name)).topic(name)

    async def controllers_view(self, meta: Metadata, name: str) -> Metadata:
        """`meta` (an answer without topic `name`) checked with the controller's leader. A
        node answers from the controller state it applied, which can lag (a node just
        restarted, replaying or catching up): only the controller's leader may say a topic
        does not exist. `meta` itself when it came from that leader or the leader does not
        answer."""
        if not meta.controller_address or name in meta.topics:
            return meta
        try:
            reply = await self.call(metadata_request(), leader=False,
                                    server=meta.controller_address,
                                    timeout=min(self.timeout, 5.0))
        except RaftlogError:
            return meta
        return Metadata.parse(reply)

    async def create_topic(self, name: str, partitions: int, replicas: int, *,
                           retention_bytes: int | None = None, retention_ms: int | None = None,
                           max_record_bytes: int | None = None, wait: bool = True,
                           timeout: float | None = None) -> TopicInfo:
        """Create a topic (TopicExistsError if the name is taken). With `wait` (the default),
        return once the metadata shows a leader for every partition, so the next produce
        finds them; RequestTimeout if that takes longer than `timeout` (the topic exists)."""
        budget = self.timeout if timeout is None else timeout
        deadline = trio.current_time() + budget
        reply = await self.call(TopicCreate(name, partitions, replicas, retention_bytes,
                                            retention_ms, max_record_bytes, _timeout_ms(budget)),
                                timeout=budget)
        if not wait:
            # The controller's own answer: another node's metadata may not show the topic yet.
            return Metadata.parse({"topics": [reply["topic"]]}).topic(name)
        return await self.wait_for_leaders(name, deadline, partitions)

    async def wait_for_leaders(self, name: str, deadline: float,
                               partitions: int = 0) -> TopicInfo:
        """Poll the metadata (at its bounded rate) until `name` shows at least `partitions`
        partitions (a node that has not applied a grow yet still shows the old ones, all led)
        and every one of them has a leader with an address."""
        last: TopicInfo | None = None
        while True:
            try:
                meta = await self.cluster_metadata()
                last = meta.topics.get(name)
                if (last is not None and last.partition_count >= partitions
                        and all(p.leader_address for p in last.partitions)):
                    return last
            except RaftlogError:
                pass  # a node restarting: ask again
            if trio.current_time() >= deadline:
                have = sum(1 for p in last.partitions if p.leader_address) if last else 0
                total = max(partitions, last.partition_count) if last else partitions or "?"
                raise RequestTimeout(
                    f"topic {name!r} exists, but only {have} of {total} partitions had a "
                    f"leader in time; check `raftlog topic describe {name}` in a moment")
            await trio.sleep(self.metadata.min_interval)  # the next poll (client pacing)

    async def alter_topic(self, name: str, *, partitions: int | None = None,
                          retention_bytes: int | None = None, retention_ms: int | None = None,
                          max_record_bytes: int | None = None, wait: bool = True,
                          timeout: float | None = None) -> TopicInfo:
        """Grow a topic to `partitions` (never shrinks: BAD_REQUEST) and/or change its
        settings. With `wait`, return once every partition has a leader."""
        budget = self.timeout if timeout is None else timeout
        deadline = trio.current_time() + budget
        if partitions is None and retention_bytes is None and retention_ms is None \
                and max_record_bytes is None:
            raise ValueError("alter_topic needs partitions or a setting to change")
        reply = await self.call(TopicAlter(name, partitions, retention_bytes, retention_ms,
                                           max_record_bytes, _timeout_ms(budget)),
                                timeout=budget)
        if not wait:
            return Metadata.parse({"topics": [reply["topic"]]}).topic(name)
        return await self.wait_for_leaders(name, deadline, partitions or 0)

    async def describe_topic(self, name: str) -> dict[str, Any]:
        """A topic as `raftlog topic describe` shows it: {"name", "settings", "partitions":
        [{"partition", "group", "leader", "leader_address", "replicas", "high_watermark",
        "log_start"}]}, the offsets from each partition's leader (asked at the same time; a
        partition whose leader does not answer has "error" instead)."""
        info = await self.topic(name, refresh=True)
        rows: list[dict[str, Any]] = [
            {"partition": p.partition, "group": p.group, "leader": p.leader,
             "leader_address": p.leader_address, "replicas": list(p.replicas)}
            for p in info.partitions]

        async def bounds(row: dict[str, Any]) -> None:
            try:
                res = await self.fetch(0, max_bytes=1, topic=name,  # type: ignore[attr-defined]
                                       partition=row["partition"],
                                       timeout=min(self.timeout, 5.0))
                row["log_start"], row["high_watermark"] = res.start_offset, res.high_watermark
            except OffsetOutOfRangeError as e:
                row["log_start"] = e.start_offset
                row["high_watermark"] = e.high_watermark
            except RaftlogError as e:
                row["error"] = f"{e.code}: {e.message}"

        async with trio.open_nursery() as nursery:
            for row in rows:
                nursery.start_soon(bounds, row)
        out = {"name": info.name, "settings": dict(info.settings), "partitions": rows}
        if info.origin is not None:  # a mirror topic (docs/REPLICATION.md)
            out["origin"], out["mirror_active"] = dict(info.origin), info.mirror_active
        return out

    async def delete_topic(self, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Delete a topic and its data on every node (UnknownTopicError if there is none)."""
        budget = self.timeout if timeout is None else timeout
        reply = await self.call(TopicDelete(name, _timeout_ms(budget)), timeout=budget)
        await self.refresh_metadata()
        return reply

    async def move_partition(self, name: str, partition: int, replicas: list[int], *,
                             timeout: float | None = None) -> dict[str, Any]:
        """Give a partition a new replica set (first = preferred leader; as many as it has).
        Returns once the controller applied it ({"topic": topic map, "previous": [ids]}); the
        partition's leader then adds the new replicas as learners, promotes them once caught
        up and removes the old ones: `partition_membership` shows how far it got."""
        budget = self.timeout if timeout is None else timeout
        reply = await self.call(TopicMove(name, partition, [int(n) for n in replicas],
                                          _timeout_ms(budget)), timeout=budget)
        await self.refresh_metadata()
        return reply

    async def partition_membership(self, name: str, partition: int) -> dict[str, Any] | None:
        """The partition's Raft configuration as its leader sees it: {"leader", "voters",
        "learners", "replicas" (the desired set), "move" (the leader's current step)}; None
        while it has no leader to ask."""
        info = await self.topic(name, refresh=True)
        p = info.partitions[partition]
        if p.leader_address:
            found = await self._membership_at(p.leader_address, p.group, leader_only=False)
            if found is not None:
                return found
        # The node that answered the metadata does not know the leader: a node the partition
        # just moved away from (it no longer runs the group, so it names no leader). Ask the
        # partition's replicas which of them leads, instead of asking that node again.
        meta = await self.cluster_metadata(refresh=False)
        for address in meta.addresses_of(name, partition):
            found = await self._membership_at(address, p.group, leader_only=True)
            if found is not None:
                return found
        return None

    async def _membership_at(self, address: str, group: int, *,
                             leader_only: bool) -> dict[str, Any] | None:
        try:
            status = await self.status(address)  # type: ignore[attr-defined]
        except RaftlogError:
            return None  # that node is down or restarting: the caller asks again
        for line in status.get("partitions") or []:
            if line.get("group") == group and (not leader_only
                                                or line.get("role") == "leader"):
                return {"leader": line.get("leader"), "voters": line.get("voters"),
                        "learners": line.get("learners"), "replicas": line.get("replicas"),
                        "move": line.get("move")}
        return None


__all__ = ["SETTINGS", "TopicCalls", "metadata_request", "where_fields"]
