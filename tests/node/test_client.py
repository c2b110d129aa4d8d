"""raft.client against in-process nodes running the real core: leader discovery, batching
producer, idempotent retries, long-poll fetch, typed errors, the blocking wrapper."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import pytest
import trio
import trio.testing

from inproc_cluster import DEADLINE_S, RawClient, running_cluster, trio_test
from raft.client import (BlockingClient, Client, OffsetOutOfRangeError, Producer,
                         RequestTimeout, TooLargeError, UnavailableError)
from raft.protocol.framing import encode_frame
from raft.protocol.replies import error_reply
from raft.protocol.streams import FrameReader
from raft.core.types import ErrorCode
from storage.records import Record


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


# -- honest outcomes, typed errors, fast failure ------------------------------------------------

async def fake_node(behaviour: Callable[[dict], dict | None], *,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A node that says hello and answers each request with behaviour(frame) (None: no
    answer; "close": hang up)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream, 64 << 20)
        async with stream:
            if await reader.receive() is None:
                return
            await stream.send_all(encode_frame({"t": "hello", "node_id": 9}))
            while (frame := await reader.receive()) is not None:
                reply = behaviour(frame)
                if reply == "close":
                    return
                if reply is not None:
                    await stream.send_all(encode_frame(reply))

    task_status.started(f"127.0.0.1:{listeners[0].socket.getsockname()[1]}")
    await trio.serve_listeners(handle, listeners)


@pytest.mark.parametrize("leader_does", ["never answers", "hangs up"])
@trio_test
async def test_a_sent_produce_is_never_reported_as_an_earlier_not_leader(
        leader_does: str) -> None:
    """Issue 13, defect 9: a follower answers NOT_LEADER (nothing written), the redirect reaches
    the leader, and the produce is sent there; then no answer comes before the deadline (or the
    connection drops). The batch may be in the log, so the outcome is unknown: RequestTimeout,
    not the earlier, definite NOT_LEADER."""
    sent_to_leader: list[dict] = []
    async with trio.open_nursery() as nursery:
        def leader(frame: dict) -> dict | str | None:
            sent_to_leader.append(frame)
            return None if leader_does == "never answers" else "close"

        leader_addr = await nursery.start(fake_node, leader)
        follower_addr = await nursery.start(fake_node, lambda f: error_reply(
            f["id"], ErrorCode.NOT_LEADER, "not the leader", leader_id=2,
            leader_addr=leader_addr))
        async with Client([follower_addr], timeout=2.0) as client:
            with trio.fail_after(DEADLINE_S):
                with pytest.raises(RequestTimeout) as err:
                    await client.produce([b"maybe-written"])
        assert "may or may not be in the log" in err.value.message
        assert [f["t"] for f in sent_to_leader] == ["produce"]
        nursery.cancel_scope.cancel()


@trio_test
async def test_refused_on_every_address_fails_at_once_naming_them_all() -> None:
    ports = [free_port() for _ in range(3)]
    servers = [f"127.0.0.1:{p}" for p in ports]
    async with Client(servers, timeout=3600) as client:
        with trio.fail_after(DEADLINE_S):  # not the hour the timeout allows
            with pytest.raises(UnavailableError) as err:
                await client.produce([b"x"], producer_id=7, sequence=0)
    assert all(s in err.value.message for s in servers)
    assert "connection refused" in err.value.message
    assert sorted(err.value.details["addresses"]) == sorted(servers)
    # A client that is told to wait for a starting cluster keeps trying until its timeout.
    async with Client(servers, timeout=0.5, retry_refused=True) as client:
        start = trio.current_time()
        with pytest.raises(UnavailableError):
            await client.status()
        assert trio.current_time() - start >= 0.5


@trio_test
async def test_too_large_is_a_typed_error_from_client_and_producer_never_a_group() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        big = b"x" * (20 << 20)
        async with Client([leader.address]) as client:
            with pytest.raises(TooLargeError) as err:
                await client.produce([big])
            assert "max_frame_bytes" in err.value.message
            assert err.value.details["limit"] == leader.config.max_frame_bytes
            # Inside `async with Producer`, the error escapes as itself.
            with pytest.raises(TooLargeError):
                async with Producer(client, acks="leader") as p:
                    await p.send(big)
            # The producer sends the rest; the connection was never broken.
            async with Producer(client, acks="leader") as p:
                small = p.submit(b"small")
                large = p.submit(big)
                assert await small.wait() >= 0
                with pytest.raises(TooLargeError):
                    await large.wait()


@trio_test
async def test_a_raw_oversized_frame_sent_whole_still_gets_its_too_large_answer() -> None:
    """A client that sends all of an oversized frame before reading: the node drops the rest
    of it before closing, so the TOO_LARGE answer is not destroyed by a connection reset."""
    async with running_cluster(3) as cluster:
        node = cluster.nodes[0]
        limit = node.config.max_frame_bytes
        raw = await RawClient.connect(node.address)
        body = b"\x00" * (limit + 1024)
        await raw.stream.send_all(struct.pack(">I", len(body)) + body)
        with trio.fail_after(DEADLINE_S):
            err = await raw.recv()
        assert err is not None and err["t"] == "error" and err["code"] == "TOO_LARGE"
        await raw.stream.aclose()


@trio_test
async def test_offset_for_time_finds_the_first_record_stamped_at_or_after() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as client:
            assert await client.offset_for_time(0) == (await client.fetch(0)).start_offset
            at = {}
            for ts in (1_000, 2_000, 2_000, 3_000, 5_000):
                res = await client.produce([f"t{ts}-a", f"t{ts}-b"], timestamp_ms=ts)
                at.setdefault(ts, res.base_offset)
            for ask, expect in ((500, 1_000), (1_000, 1_000), (1_001, 2_000), (2_500, 3_000),
                                (4_000, 5_000), (5_000, 5_000)):
                assert await client.offset_for_time(ask) == at[expect], ask
            hw = (await client.fetch(0)).high_watermark
            assert await client.offset_for_time(6_000) == hw + 1


@trio_test
async def test_transfer_leader_answers_with_the_new_leader() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        target = next(n for n in cluster.nodes if n is not leader)
        async with Client([n.address for n in cluster.nodes]) as client:
            reply = await client.transfer_leader(target.node_id, timeout=DEADLINE_S)
        assert reply["leader_id"] == target.node_id
        assert reply["leader_addr"] == target.address


@trio_test
async def test_cluster_status_reports_a_refused_node_without_waiting() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        dead = f"127.0.0.1:{free_port()}"
        async with Client([cluster.nodes[0].address, dead]) as client:
            with trio.fail_after(DEADLINE_S):
                statuses = await client.cluster_status(timeout=3600)
        assert statuses[dead]["code"] == "UNAVAILABLE"
        assert {st.get("node_id") for a, st in statuses.items() if a != dead} == {1, 2, 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@trio_test
async def test_tasks_making_their_first_call_at_once_share_one_connection(monkeypatch) -> None:
    import raft.client.client as client_mod

    opened = []
    real_open = client_mod._Connection.open

    async def counting_open(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        conn = await real_open(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(client_mod._Connection, "open", staticmethod(counting_open))
    async with running_cluster(1) as c:
        leader = await c.wait_leader()
        async with Client(leader.address) as client:
            async with trio.open_nursery() as n:
                for _ in range(8):
                    n.start_soon(client.produce, [b"x"])
            assert len(opened) == 1  # not one per task, seven of them leaked
