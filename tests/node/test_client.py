"""raft.client against in-process nodes running the real core: leader discovery, batching
producer, idempotent retries, long-poll fetch, typed errors, the blocking wrapper."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from inproc_cluster import REAL_CORE, running_cluster, trio_test
from raft.client import (BlockingClient, Client, OffsetOutOfRangeError, Producer,
                         UnavailableError)
from storage.records import Record

pytestmark = pytest.mark.skipif(not REAL_CORE, reason="needs raft/raft.py")


@trio_test
async def test_client_finds_the_leader_from_any_node_and_round_trips() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        async with Client([follower.address]) as client:
            res = await client.produce([b"a", "b", Record(b"c", key=b"k")], acks="quorum")
            assert res.last_offset == res.base_offset + 2 and not res.duplicate
            got = await client.fetch(res.base_offset)
            assert [(r.offset, r.value) for r in got.records] == [
                (res.base_offset, b"a"), (res.base_offset + 1, b"b"),
                (res.base_offset + 2, b"c")]
            assert got.records[2].key == b"k"
            assert got.high_watermark >= res.last_offset


@trio_test
async def test_producer_batches_thousands_of_records_into_few_requests() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as client, \
                Producer(client, acks="leader", batch_bytes=64 << 10, linger=0.01) as p:
            values = [f"rec-{i:05d}".encode() for i in range(5000)]
            offsets = await p.send_many(values)
            assert len(set(offsets)) == 5000 and offsets == sorted(offsets)
            assert p.batches_sent <= 5000 * 20 // (64 << 10) + 2
            # Concurrent single sends share batches too.
            single: list[int] = []
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    async def one(i: int = i) -> None:
                        single.append(await p.send(f"s{i}".encode()))
                    nursery.start_soon(one)
            assert len(set(single)) == 50
            assert p.batches_sent < 5000 * 20 // (64 << 10) + 2 + 50


@trio_test
async def test_retry_with_the_same_sequence_is_not_written_twice() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as client:
            first = await client.produce([b"once"], producer_id=42, sequence=0)
            again = await client.produce([b"once"], producer_id=42, sequence=0)
            assert again.duplicate and again.base_offset == first.base_offset
            nxt = await client.produce([b"twice?"], producer_id=42, sequence=1)
            assert nxt.base_offset > first.base_offset and not nxt.duplicate


@trio_test
async def test_fetch_long_polls_until_new_data_commits() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as reader, Client([leader.address]) as writer:
            top = (await reader.fetch(0)).high_watermark
            got: list = []

            async def poll() -> None:
                got.append(await reader.fetch(top + 1, max_wait=10.0))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                # Every task is blocked (ticks are 10 ms apart): the poll is parked on the server.
                await trio.testing.wait_all_tasks_blocked(cushion=0.002)
                assert not got
                await writer.produce([b"late"])
            assert [r.value for r in got[0].records] == [b"late"]


@trio_test
async def test_typed_errors() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as client:
            hw = (await client.fetch(0)).high_watermark
            with pytest.raises(OffsetOutOfRangeError) as err:
                await client.fetch(hw + 1000)
            assert err.value.high_watermark == hw and err.value.start_offset == 0
    async with Client(["127.0.0.1:1"], timeout=0.5) as client:
        with pytest.raises(UnavailableError):
            await client.status()


def test_blocking_client_from_plain_threads() -> None:
    async def main() -> None:
        async with running_cluster(3) as cluster:
            leader = await cluster.wait_leader()

            def work() -> tuple[list[int], list[bytes]]:
                with BlockingClient([leader.address]) as c:
                    offs = c.produce_idempotent([b"x", b"y", b"z"], acks="quorum")
                    return offs, [r.value for r in c.fetch(offs[0]).records]

            offs, values = await trio.to_thread.run_sync(work)
            assert values == [b"x", b"y", b"z"] and offs == list(range(offs[0], offs[0] + 3))

    trio.run(main)
