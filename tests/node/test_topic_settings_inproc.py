"""Per-topic settings in force (issue 26 item 7), in process on MemoryLogs: each partition runs
the retention policy of its own topic (else the node's flags) and refuses records larger than
its topic's max_record_bytes; `topic_alter` changes both on the running partitions, without a
restart. Retention is driven by calling the task's `step()` until it has nothing left to do
(the background task may run rounds too; the state it converges to is the same)."""

from __future__ import annotations

import trio

from inproc_cluster import DEADLINE_S, running_cluster, trio_test, values_payload
from test_topics_inproc import admin, group_of, metadata_everywhere, partition_leader, request

from raft.node.server import Node

RECORD = b"x" * 200  # one record per batch: a batch takes a little over 200 bytes
KEEP = 1000  # retention_bytes of the small topic: about five batches


async def produce_to(node: Node, topic: str, partition: int, value: bytes) -> dict:
    return await request(node, "produce", acks="quorum", timeout_ms=5000,
                         payload=values_payload([value]), count=1, topic=topic,
                         partition=partition)


async def fill(node: Node, topic: str, partition: int, batches: int) -> None:
    for _ in range(batches):
        reply = await produce_to(node, topic, partition, RECORD)
        assert reply["ok"], reply


async def settle(group) -> None:
    """Run retention rounds on `group` until a round leaves nothing more to delete now."""
    while await group.retention.step():
        pass


async def create(cluster, name: str, partitions: int, replicas: int = 1, **settings) -> None:
    reply = await admin(cluster, "topic_create", name=name, partitions=partitions,
                        replicas=replicas, **settings)
    assert reply["ok"], reply
    await metadata_everywhere(cluster, lambda m: name in m.topics)


@trio_test
async def test_each_partition_keeps_what_its_topic_says_and_an_alter_applies_at_once() -> None:
    async with running_cluster(1) as cluster:  # the node's flags keep everything
        await create(cluster, "small", 2, retention_bytes=KEEP)
        await create(cluster, "all", 1)
        node = cluster.live[0]
        groups = {}
        for topic, partition in (("small", 0), ("small", 1), ("all", 0), ("default", 0)):
            gid = group_of(node, topic, partition)
            await partition_leader(cluster, gid)
            await fill(node, topic, partition, 20)
            groups[topic, partition] = node.registry.get(gid)
        for key, group in groups.items():
            await settle(group)
        for partition in (0, 1):
            lg = groups["small", partition].log
            assert lg.start_offset > 0, "the small topic's partition kept everything"
            assert KEEP <= lg.retained_bytes < KEEP + 400, lg.retained_bytes
            report = groups["small", partition].retention.report()
            assert report["policy"]["retention_bytes"] == KEEP
        for key in (("all", 0), ("default", 0)):
            lg = groups[key].log
            assert lg.start_offset == 0 and lg.retained_bytes > 20 * len(RECORD), key
            assert groups[key].retention.report()["policy"]["retention_bytes"] is None

        # An alter applies to the running partition: no restart.
        reply = await admin(cluster, "topic_alter", name="all", retention_bytes=2 * KEEP)
        assert reply["ok"], reply
        assert reply["topic"]["settings"] == {"retention_bytes": 2 * KEEP}
        await settle(groups["all", 0])
        lg = groups["all", 0].log
        assert lg.start_offset > 0 and 2 * KEEP <= lg.retained_bytes < 2 * KEEP + 400


@trio_test
async def test_a_record_over_the_topics_limit_is_refused_naming_it_and_an_alter_moves_it() -> None:
    async with running_cluster(1) as cluster:
        await create(cluster, "tiny", 1, max_record_bytes=1000)
        node = cluster.live[0]
        await partition_leader(cluster, group_of(node, "tiny", 0))
        assert (await produce_to(node, "tiny", 0, RECORD))["ok"]  # 200 bytes fit in 1000

        reply = await admin(cluster, "topic_alter", name="tiny", max_record_bytes=100)
        assert reply["ok"], reply
        refused = await produce_to(node, "tiny", 0, RECORD)
        assert not refused["ok"] and refused["error"]["code"] == "TOO_LARGE", refused
        message = refused["error"]["message"]
        assert "at most 100 bytes" in message and "'tiny'" in message, message
        assert refused["error"]["max_record_bytes"] == 100
        small = await produce_to(node, "tiny", 0, b"y" * 50)
        assert small["ok"], small  # records within the limit still go in
        assert (await produce_to(node, "default", 0, RECORD))["ok"]  # other topics unaffected

        reply = await admin(cluster, "topic_alter", name="tiny", max_record_bytes=10_000)
        assert reply["ok"], reply
        assert (await produce_to(node, "tiny", 0, RECORD))["ok"]


def test_record_over_finds_the_first_record_over_the_limit() -> None:
    from raft.node.topic_settings import record_over
    payload = values_payload([b"a" * 10, b"b" * 300, b"c" * 500])
    assert record_over(payload, 10_000) is None
    index, size = record_over(payload, 200)
    assert index == 1 and 300 < size < 320
    assert record_over(payload, 600) is None


@trio_test
async def test_an_alter_reaches_the_retention_of_every_replica() -> None:
    """Three replicas: each applies the controller entry and cuts its own copy by the new
    setting (followers too: each replica runs its topic's retention on its own log)."""
    async with running_cluster(3) as cluster:
        await create(cluster, "r", 1, replicas=3)
        gid = group_of(cluster.live[0], "r", 0)
        leader = await partition_leader(cluster, gid)
        await fill(leader, "r", 0, 20)
        hw = leader.registry.get(gid).core.commit_index
        for node in cluster.live:  # committed and flushed on every replica (the leader holds
            group = node.registry.get(gid)  # retention back for members until they flush)
            with trio.fail_after(DEADLINE_S):
                while group.core.commit_index < hw or group.log.flushed_offset < hw:
                    await trio.sleep(0.02)
        reply = await admin(cluster, "topic_alter", name="r", retention_bytes=KEEP)
        assert reply["ok"], reply
        await metadata_everywhere(
            cluster, lambda m: m.topics["r"].settings.retention_bytes == KEEP)
        for node in cluster.live:
            group = node.registry.get(gid)
            assert group.retention.policy.max_bytes == KEEP, node.node_id
            await settle(group)
            assert group.log.start_offset > 0, node.node_id
            assert KEEP <= group.log.retained_bytes < KEEP + 400, node.node_id
