"""The client with topics (issue 26 item 5), against fake nodes in this process (fake_topics.py):
key -> partition is Kafka's murmur2 and stable, keyless records stick to one partition per
batch, idempotent sequences are per (producer, partition), requests go to each partition's
leader, and the metadata cache refreshes on NOT_LEADER, UNKNOWN_TOPIC and a lost connection,
at a bounded rate."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from fake_topics import FakeCluster, start
from inproc_cluster import DEADLINE_S, trio_test
from raft.client import Client, Producer, UnknownTopicError
from raft.client.metadata import MetadataCache
from raft.client.topic_consumer import TopicConsumer
from raft.protocol.partitioner import partition_for_key
from storage.records import Record, decode_records


def keys_in(cluster: FakeCluster, topic: str, partition: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for payload, count, _ in cluster.produced(topic, partition):
        out += [r.key for r in decode_records(payload, count)]
    return out


def produce_frames(cluster: FakeCluster, topic: str) -> list[tuple[int, dict]]:
    return [(n, f) for n, f in cluster.frames
            if f["t"] == "produce" and f.get("topic", "default") == topic]


def test_key_to_partition_is_kafkas_murmur2_as_documented() -> None:
    # docs/PARTITIONING.md: "foobar" over 50 partitions goes to partition 16, and the empty
    # key hashes to 275646681 (Kafka's own vectors): a producer hashing otherwise breaks this.
    assert partition_for_key(b"foobar", 50) == 16
    assert partition_for_key(b"", (1 << 31) - 1) == 275646681
    assert partition_for_key(b"21", 1000) == (-973932308 & 0x7FFFFFFF) % 1000
    for n in (1, 2, 8, 64):
        for k in (b"k", b"key-123", "\u00fc".encode()):
            assert 0 <= partition_for_key(k, n) < n


@trio_test
async def test_keyed_records_land_in_their_keys_partition_in_the_order_produced() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("orders", 8)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c, Producer(c, topic="orders", linger=0.01) as p:
                records = [Record(f"{k}-{i}".encode(), f"key-{k}".encode())
                           for i in range(20) for k in range(10)]
                deliveries = await p.deliver_many(records)
        for d in deliveries:
            assert d.partition == partition_for_key(d.record.key, 8)
        for part in range(8):
            values: list[bytes] = []
            for payload, count, _ in cluster.produced("orders", part):
                values += [r.value for r in decode_records(payload, count)]
            for k in range(10):
                mine = [v for v in values if v.startswith(f"{k}-".encode())]
                if partition_for_key(f"key-{k}".encode(), 8) == part:
                    assert mine == [f"{k}-{i}".encode() for i in range(20)]  # all, in order
                else:
                    assert mine == []
        # Every produce went straight to its partition's leader (metadata knew it).
        for node, frame in produce_frames(cluster, "orders"):
            assert cluster.leaders["orders"][frame.get("partition", 0)] == node
        nursery.cancel_scope.cancel()


@trio_test
async def test_keyless_records_stick_to_one_partition_per_batch() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("logs", 4)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c, Producer(c, topic="logs", seed=7) as p:
                first = await p.deliver_many([b"a", b"b", b"c", b"d"])
                second = await p.deliver_many([b"e", b"f", b"g"])
        assert len({d.partition for d in first}) == 1  # one batch, one partition
        assert len({d.partition for d in second}) == 1
        assert first[0].partition != second[0].partition  # the next batch moved on
        frames = produce_frames(cluster, "logs")
        assert [f["count"] for _, f in frames] == [4, 3]
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_full_batch_of_keyless_records_moves_the_sticky_partition() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("logs", 4)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c, \
                    Producer(c, topic="logs", seed=3, batch_bytes=100) as p:
                ds = await p.deliver_many([b"x" * 40 for _ in range(9)])
        # 48 bytes a record: two fill a batch, then the sticky partition moves.
        runs = [ds[i].partition for i in range(0, 9, 2)]
        assert all(ds[i].partition == ds[i + 1].partition for i in range(0, 8, 2))
        assert all(a != b for a, b in zip(runs, runs[1:]))
        nursery.cancel_scope.cancel()


@trio_test
async def test_idempotent_sequences_are_per_partition_and_a_retry_is_written_once() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("t", 3)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c, Producer(c, topic="t", linger=0) as p:
                for rnd in range(3):
                    for part in range(3):
                        await p.send(f"{rnd}".encode(), partition=part)
                # The leader of partition 1 writes the next batch, then the connection drops
                # before its answer: the retry carries the same sequence and is deduplicated.
                cluster.drop_reply_once.add(("produce", cluster.leaders["t"][1]))
                offset = await p.send(b"once", partition=1)
        pids = {f["producer_id"] for _, f in produce_frames(cluster, "t")}
        assert len(pids) == 1
        for part in range(3):
            seqs = [f["sequence"] for _, f in produce_frames(cluster, "t")
                    if f.get("partition", 0) == part]
            expected = [0, 1, 2] + ([3, 3] if part == 1 else [])
            assert seqs == expected, (part, seqs)
        assert len(cluster.produced("t", 1)) == 4 and offset == 3  # written once
        nursery.cancel_scope.cancel()


@trio_test
async def test_not_leader_without_a_hint_refreshes_the_metadata_and_finds_the_leader() -> None:
    cluster = FakeCluster(hints=False)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("t", 2)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c:
                await c.produce([b"1"], topic="t", partition=0)
                refreshes = c.metadata.refreshes
                # Leadership of partition 0 moves; the client's cached leader is wrong.
                old = cluster.leaders["t"][0]
                cluster.leaders["t"][0] = new = 1 + old % 3
                res = await c.produce([b"2"], topic="t", partition=0)
                assert res.base_offset == 1
                assert c.metadata.refreshes == refreshes + 1
                assert c.router.leader(("t", 0)) == cluster.nodes[new]
        nursery.cancel_scope.cancel()


@trio_test
async def test_not_leader_with_a_hint_is_followed_without_a_refresh() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("t", 2)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c:
                await c.produce([b"1"], topic="t", partition=1)
                refreshes = c.metadata.refreshes
                cluster.leaders["t"][1] = new = 1 + cluster.leaders["t"][1] % 3
                await c.produce([b"2"], topic="t", partition=1)
                assert c.metadata.refreshes == refreshes
                lead = c.metadata.current.topics["t"].partitions[1]
                assert (lead.leader, lead.leader_address) == (new, cluster.nodes[new])
        nursery.cancel_scope.cancel()


@trio_test
async def test_unknown_topic_refreshes_once_and_names_the_topics_that_exist() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("orders", 2)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers, timeout=30) as c:
                start_t = trio.current_time()
                with pytest.raises(UnknownTopicError) as e:
                    await c.produce([b"x"], topic="ordres")
                assert "'default', 'orders'" not in e.value.message
                assert "default, orders" in e.value.message
                assert "raftlog topic create ordres" in e.value.message
                assert trio.current_time() - start_t < 5  # not the 30 s timeout
                with pytest.raises(UnknownTopicError, match=r"has 2 \(0\.\.1\)"):
                    await c.produce([b"x"], topic="orders", partition=5)
                with pytest.raises(UnknownTopicError, match="default, orders"):
                    async with Producer(c, topic="ordres"):
                        pass
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_node_that_has_not_applied_a_new_topic_yet_is_retried() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c:
                await c.cluster_metadata()  # cached before the topic exists
                cluster.add_topic("fresh", 1)
                lead = cluster.leaders["fresh"][0]
                cluster.new_topics.add("fresh")
                cluster.lagging.add(lead)  # its leader answers UNKNOWN_TOPIC for now
                refreshes = c.metadata.refreshes
                async with trio.open_nursery() as inner:
                    inner.start_soon(lambda: c.produce([b"x"], topic="fresh"))
                    while c.metadata.refreshes < refreshes + 2:
                        await trio.sleep(0.01)  # polling: the client is refreshing
                    cluster.lagging.clear()  # it catches up; the produce goes through
                assert len(cluster.produced("fresh", 0)) == 1
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_node_behind_the_controller_does_not_make_a_topic_unknown() -> None:
    """A node answers `metadata` from the controller state it applied; one that restarted
    and is still catching up lacks a topic everyone else has. The client asks the
    controller's leader before it says a topic does not exist."""
    cluster = FakeCluster(controller=2)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("orders", 2)
        cluster.new_topics.add("orders")
        cluster.lagging.add(1)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers[:1]) as c:
                assert "orders" not in (await c.cluster_metadata()).topics  # node 1's view
                info = await c.topic("orders", refresh=True)
                assert info.partition_count == 2
                desc = await c.describe_topic("orders")
                assert [p["partition"] for p in desc["partitions"]] == [0, 1]
                with pytest.raises(UnknownTopicError, match="default, orders"):
                    await c.topic("ordres", refresh=True)  # the controller agrees: unknown
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_lost_connection_to_a_partitions_leader_refreshes_the_metadata() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("t", 3)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c:
                await c.produce([b"1"], topic="t", partition=2)
                refreshes = c.metadata.refreshes
                cluster.drop_reply_once.add(("fetch", cluster.leaders["t"][2]))
                res = await c.fetch(0, topic="t", partition=2)
                assert [r.value for r in res.records] == [b"1"]
                assert res.records[0].partition == 2 and res.records[0].topic == "t"
                assert c.metadata.refreshes == refreshes + 1
        nursery.cancel_scope.cancel()


@trio_test
async def test_admin_calls_go_to_the_controllers_leader() -> None:
    cluster = FakeCluster(controller=3)
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers[:1]) as c:
                info = await c.create_topic("new", partitions=4, replicas=3)
                assert info.partition_count == 4
                assert all(p.leader_address for p in info.partitions)
                creates = [n for n, f in cluster.frames if f["t"] == "topic_create"]
                assert creates[-1] == 3
                assert [t.name for t in await c.list_topics()] == ["default", "new"]
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_producer_without_a_topic_writes_as_before_topics() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c, Producer(c) as p:
                assert await p.send_many([b"a", Record(b"b", b"k")]) == [0, 1]
            assert c.metadata.refreshes == 0  # no metadata needed
        frames = produce_frames(cluster, "default")
        assert frames and all("topic" not in f and "partition" not in f for _, f in frames)
        nursery.cancel_scope.cancel()


@trio_test
async def test_topic_consumer_reads_every_partition_each_in_order() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("t", 4)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c:
                async with Producer(c, topic="t", linger=0) as p:
                    sent = await p.deliver_many(
                        [Record(f"v{i}".encode(), f"k{i % 7}".encode()) for i in range(60)])
                got = [r async for r in TopicConsumer(c, "t", follow=False)]
                only = [r async for r in TopicConsumer(c, "t", partitions=[2], follow=False)]
        assert sorted((r.partition, r.offset) for r in got) == \
            sorted((d.partition, d.offset) for d in sent)  # every record exactly once
        for part in range(4):
            mine = [r for r in got if r.partition == part]
            assert [r.offset for r in mine] == sorted(r.offset for r in mine)
            assert [r.value for r in mine] == [d.record.value for d in sent
                                              if d.partition == part]
        assert only == [r for r in got if r.partition == 2]
        nursery.cancel_scope.cancel()


def test_metadata_refreshes_are_shared_and_rate_bounded() -> None:
    calls: list[float] = []

    async def fetch() -> dict:
        calls.append(trio.current_time())
        await trio.sleep(0.01)
        return {"controller": 1, "nodes": [], "topics": [], "applied": len(calls)}

    async def main() -> None:
        cache = MetadataCache(fetch, min_interval=0.1)
        async with trio.open_nursery() as nursery:  # 50 callers at once: one request
            for _ in range(50):
                nursery.start_soon(cache.refresh)
        assert len(calls) == 1
        t0 = trio.current_time()
        while trio.current_time() - t0 < 1.0:  # a caller refreshing in a loop for 1 s
            await cache.refresh()
        assert len(calls) <= 1 + 11
        assert all(b - a >= 0.1 - 1e-9 for a, b in zip(calls, calls[1:]))
        assert cache.current is not None and cache.current.applied == len(calls)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@trio_test
async def test_a_following_topic_consumer_gets_records_produced_after_it_started() -> None:
    cluster = FakeCluster()
    async with trio.open_nursery() as nursery:
        servers = await start(nursery, cluster)
        cluster.add_topic("default", 1)
        cluster.add_topic("t", 3)
        with trio.fail_after(DEADLINE_S):
            async with Client(servers) as c:
                got: list = []
                reader = TopicConsumer(c, "t", start="end", max_wait=0.05)
                await reader.open()  # positions fixed at the end before anything is written

                async def read(n: int) -> None:
                    async for r in reader:
                        got.append(r)
                        if len(got) == n:
                            return

                async with trio.open_nursery() as inner:
                    inner.start_soon(read, 6)
                    async with Producer(c, topic="t", linger=0) as p:
                        for part in (2, 0, 1, 2, 0, 1):
                            await p.send(f"p{part}".encode(), partition=part)
        assert sorted(r.partition for r in got) == [0, 0, 1, 1, 2, 2]
        assert all(r.value == f"p{r.partition}".encode() for r in got)
        nursery.cancel_scope.cancel()
