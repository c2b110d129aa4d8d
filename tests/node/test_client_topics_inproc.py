"""The partition-aware client against real nodes in this process (issue 26 acceptance, client
side): a topic of 8 partitions with 3 replicas each, keyed produce puts every record of a key in
that key's partition in the order produced, reading every partition returns every acknowledged
record exactly once, unknown topics and partitions are refused naming what exists, and the
default topic works with today's calls. Waiting is on conditions under trio.fail_after."""

from __future__ import annotations

import pytest
import trio

from inproc_cluster import DEADLINE_S, running_cluster, trio_test
from raft.client import Client, Producer, TopicConsumer, TopicExistsError, UnknownTopicError
from raft.protocol.partitioner import partition_for_key
from storage.records import Record


@trio_test
async def test_keyed_records_of_a_topic_of_8_partitions_round_trip_exactly_once() -> None:
    async with running_cluster(3) as cluster:
        servers = [n.address for n in cluster.nodes]
        with trio.fail_after(DEADLINE_S * 3):
            async with Client(servers, timeout=DEADLINE_S) as c:
                info = await c.create_topic("orders", partitions=8, replicas=3)
                assert info.partition_count == 8
                assert all(len(p.replicas) == 3 and p.leader_address for p in info.partitions)
                with pytest.raises(TopicExistsError):
                    await c.create_topic("orders", partitions=8, replicas=3)

                async with Producer(c, topic="orders", linger=0.002, acks="quorum") as p:
                    sent = await p.deliver_many(
                        [Record(f"{k}:{i}".encode(), f"user-{k}".encode())
                         for i in range(25) for k in range(12)])
                for d in sent:  # each key in its partition, by Kafka's hash
                    assert d.partition == partition_for_key(d.record.key, 8)

                got = [r async for r in TopicConsumer(c, "orders", follow=False)]
                assert sorted((r.partition, r.offset) for r in got) == \
                    sorted((d.partition, d.offset) for d in sent)  # exactly once each
                for k in range(12):  # per key: one partition, in the order produced
                    mine = [r for r in got if r.key == f"user-{k}".encode()]
                    assert len({r.partition for r in mine}) == 1
                    assert [r.value for r in mine] == [f"{k}:{i}".encode() for i in range(25)]

                desc = await c.describe_topic("orders")
                for row in desc["partitions"]:
                    n = sum(1 for d in sent if d.partition == row["partition"])
                    assert row["high_watermark"] >= n - 1 and row["log_start"] >= 0
                    assert row["leader"] in row["replicas"]

                # A grow waits for the new partitions (a node that has not applied it yet still
                # shows 8, all led), and a create without waiting answers from the controller.
                grown = await c.alter_topic("orders", partitions=12)
                assert grown.partition_count == 12
                assert all(p.leader_address for p in grown.partitions)
                quick = await c.create_topic("audit", partitions=2, replicas=3, wait=False)
                assert quick.partition_count == 2

                with pytest.raises(UnknownTopicError, match="audit, default, orders"):
                    await c.produce([b"x"], topic="ordres")
                with pytest.raises(UnknownTopicError, match=r"0\.\.11"):
                    await c.fetch(0, topic="orders", partition=12)

                # Today's calls: the default topic's partition 0.
                res = await c.produce([b"legacy"])
                back = await c.fetch(res.base_offset)
                assert [r.value for r in back.records][:1] == [b"legacy"]
                assert back.records[0].partition == 0 and back.records[0].topic == "default"


@trio_test
async def test_a_subscription_keeps_one_partitions_position() -> None:
    from raft.client import Consumer, UnknownSubscription

    async with running_cluster(3) as cluster:
        servers = [n.address for n in cluster.nodes]
        with trio.fail_after(DEADLINE_S * 3):
            async with Client(servers, timeout=DEADLINE_S) as c:
                await c.create_topic("subs", partitions=3, replicas=3)
                async with Producer(c, topic="subs", linger=0) as p:
                    for part in range(3):
                        await p.send_many([f"p{part}-{i}".encode() for i in range(5)],
                                          partition=part)

                async def read(n: int) -> list[bytes]:
                    out = []
                    async with Consumer(c, "etl", topic="subs", partition=1, follow=False,
                                        auto_commit_ms=0) as consumer:
                        async for r in consumer:
                            assert r.partition == 1
                            out.append(r.value)
                            if len(out) == n:
                                break
                    return out

                assert await read(2) == [b"p1-0", b"p1-1"]
                # Closing committed the position in partition 1's log: the next run resumes.
                assert await read(10) == [f"p1-{i}".encode() for i in range(2, 5)]
                sub = await c.subscription("etl", topic="subs", partition=1)
                assert sub["name"] == "etl"
                # The same name in another partition is another subscription.
                with pytest.raises(UnknownSubscription):
                    await c.subscription("etl", topic="subs", partition=2)
