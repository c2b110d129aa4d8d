"""In-process 3-node clusters (Nodes on port 0, MemoryLog): the wire protocol end to end.

A raw-frame client pins the protocol itself. Crash tests use Node.abort() + MemoryLog.crash(),
which drops exactly the unflushed tail, as SIGKILL plus a power cut would.
"""

from __future__ import annotations

import functools
import os
import signal

import pytest
import trio

from inproc_cluster import (DEADLINE_S, Producer, RawClient, check_acked, fetched_values,
                            lmdb_available, read_all, running_cluster, trio_test,
                            values_payload)
from raft.node.config import NodeConfig
from raft.node.serve import run_node
from raft.core.types import Role

STORAGES = ["memory", pytest.param("lmdb", marks=pytest.mark.skipif(
    not lmdb_available(), reason="storage.lmdb_log has not landed"))]


@pytest.mark.parametrize("storage", STORAGES)
@trio_test
async def test_produce_fetch_status_at_every_ack_level(storage: str, tmp_path) -> None:
    async with running_cluster(3, storage=storage, tmp_path=tmp_path) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        offsets = {}
        for acks in ("quorum", "leader", "none"):
            reply = await client.request("produce", acks=acks,
                                         payload=values_payload([acks.encode(), b"x"]), count=2)
            assert reply["ok"], reply
            offsets[acks] = reply["base_offset"]
            assert reply["last_offset"] == reply["base_offset"] + 1
            assert reply["duplicate"] is False
        # All three land; wait until every node's HW covers them.
        last = max(offsets.values()) + 1
        await cluster.wait_hw(last)
        for node in cluster.nodes:
            records = await read_all(node.address)
            data = [(o, v) for o, v in records]
            for acks, base in offsets.items():
                assert (base, acks.encode()) in data and (base + 1, b"x") in data

        status = (await client.request("status"))["status"]
        assert status["role"] == "leader" and status["node_id"] == leader.node_id
        assert status["leader_id"] == leader.node_id
        assert status["commit_index"] >= last and status["high_watermark"] >= last
        assert status["flushed_offset"] >= last and status["dirty_offset"] >= last
        assert sorted(f["node_id"] for f in status["followers"]) == sorted(
            n.node_id for n in cluster.nodes if n is not leader)
        assert status["address"] == leader.address
        assert status["peers"] == {str(n.node_id): n.address for n in cluster.nodes}
        assert status["voters"] == [1, 2, 3]

        follower = next(n for n in cluster.nodes if n is not leader)
        fclient = await RawClient.connect(follower.address)
        fstatus = (await fclient.request("status"))["status"]
        assert fstatus["role"] == "follower" and fstatus["leader_id"] == leader.node_id
        assert fstatus["leader_addr"] == leader.address


@trio_test
async def test_not_leader_names_the_leader() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        client = await RawClient.connect(follower.address)
        reply = await client.request("produce", payload=values_payload([b"v"]), count=1)
        assert reply["ok"] is False
        err = reply["error"]
        assert err["code"] == "NOT_LEADER"
        assert err["leader_id"] == leader.node_id and err["leader_addr"] == leader.address
        assert "leader" in err["message"]
        reply = await client.request("transfer_leader")
        assert reply["error"]["code"] == "NOT_LEADER"


@trio_test
async def test_fetch_ranges_long_poll_and_budget() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        values = [f"v{i}".encode() for i in range(50)]
        for i in range(0, 50, 5):
            reply = await client.request("produce", payload=values_payload(values[i:i + 5]),
                                         count=5)
            assert reply["ok"], reply
        hw = (await client.request("fetch", offset=0, max_bytes=1, max_wait_ms=0))
        assert hw["ok"]
        # A tiny budget still returns one batch, and next_offset moves past it.
        assert len(hw["batches"]) == 1 and hw["next_offset"] > 0
        top = hw["high_watermark"]

        got = await read_all(leader.address)
        assert [v for _, v in got if v.startswith(b"v")] == values

        # Fetching from the middle of a batch returns the whole batch.
        mid = next(o for o, v in got if v == b"v7")
        reply = await client.request("fetch", offset=mid, max_bytes=1 << 20, max_wait_ms=0)
        assert reply["batches"][0]["base_offset"] < mid
        assert fetched_values(reply, mid)[0] == (mid, b"v7")

        # Beyond HW + 1 (and negative): OFFSET_OUT_OF_RANGE with the readable range.
        for bad in (top + 2, -1):
            reply = await client.request("fetch", offset=bad, max_bytes=100, max_wait_ms=0)
            err = reply["error"]
            assert err["code"] == "OFFSET_OUT_OF_RANGE"
            assert err["start_offset"] == 0 and err["high_watermark"] >= top

        # At HW + 1 with no wait: empty, same offset.
        reply = await client.request("fetch", offset=top + 1, max_bytes=100, max_wait_ms=0)
        assert reply["ok"] and reply["batches"] == [] and reply["next_offset"] == top + 1

        # Long poll: parked at HW + 1 until a produce commits, then it returns the new batch.
        poller = await RawClient.connect(leader.address)
        result = {}

        async def poll() -> None:
            result["reply"] = await poller.request("fetch", offset=top + 1, max_bytes=1 << 20,
                                                   max_wait_ms=15_000)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.sleep(0)  # let the poll go out first (order only, not timing)
            reply = await client.request("produce", payload=values_payload([b"late"]), count=1)
            assert reply["ok"]
        assert fetched_values(result["reply"], top + 1) == [(reply["base_offset"], b"late")]

        # A long poll that times out is an empty, successful reply.
        hw_now = result["reply"]["high_watermark"]
        reply = await client.request("fetch", offset=hw_now + 1, max_bytes=100, max_wait_ms=50)
        assert reply["ok"] and reply["batches"] == [] and reply["next_offset"] == hw_now + 1


@trio_test
async def test_an_offset_appended_but_not_committed_long_polls_instead_of_out_of_range() -> None:
    """A producer with acks=leader is given its offset before the commit; a consumer that
    fetches it at once must wait for it, not be told it is out of range (it would reset its
    position). Past the log end it still is out of range; a follower that has not got the
    offset sends the reader to the leader."""
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        top = (await client.request("fetch", offset=0, max_bytes=1, max_wait_ms=0))[
            "high_watermark"]
        # A follower whose log ends before the offset sends the reader to the leader.
        follower = next(n for n in cluster.nodes if n is not leader)
        reader = await RawClient.connect(follower.address)
        redirect = await reader.request("fetch", offset=top + 5, max_bytes=100, max_wait_ms=0)
        assert redirect["error"]["code"] == "NOT_LEADER", redirect
        assert redirect["error"]["leader_id"] == leader.node_id
        await reader.aclose()
        for other in cluster.nodes:
            if other is not leader:
                await cluster.stop(other.node_id)
        # The followers gone, nothing more commits.
        reply = await client.request("produce", acks="leader", payload=values_payload(
            [b"a", b"b", b"c"]), count=3)
        assert reply["ok"], reply
        base, last = reply["base_offset"], reply["last_offset"]
        assert last > top + 1  # past what the old rule (high_watermark + 1) allowed
        for offset in (base, last):
            got = await client.request("fetch", offset=offset, max_bytes=100, max_wait_ms=0)
            assert got["ok"] and got["batches"] == [] and got["next_offset"] == offset, got
        beyond = await client.request("fetch", offset=last + 2, max_bytes=100, max_wait_ms=0)
        assert beyond["error"]["code"] == "OFFSET_OUT_OF_RANGE", beyond
        assert beyond["error"]["high_watermark"] < base
        await client.aclose()


@trio_test
async def test_pipelined_requests_on_one_connection() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        n = 40
        for i in range(n):
            await client.send({"t": "produce", "id": 1000 + i, "acks": "quorum",
                               "payload": values_payload([f"p{i}".encode()]), "count": 1})
        await client.send({"t": "status", "id": 5000})
        replies = {}
        while len(replies) < n + 1:
            frame = await client.recv()
            assert frame is not None
            replies[frame["id"]] = frame
        assert all(replies[1000 + i]["ok"] for i in range(n))
        offsets = [replies[1000 + i]["base_offset"] for i in range(n)]
        assert len(set(offsets)) == n
        assert replies[5000]["ok"]


@trio_test
async def test_connection_in_flight_limit_stops_reading() -> None:
    async with running_cluster(3, max_inflight_per_connection=2) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        top = (await client.request("status"))["status"]["high_watermark"]
        # Two long polls fill the connection's budget; the status behind them is not read.
        for rid in (1, 2):
            await client.send({"t": "fetch", "id": rid, "offset": top + 1,
                               "max_bytes": 100, "max_wait_ms": 15_000})
        await client.send({"t": "status", "id": 3})
        with trio.move_on_after(0.3):
            early = await client.reader.receive()
            pytest.fail(f"got {early} while the connection's in-flight budget was spent")
        other = await RawClient.connect(leader.address)
        assert (await other.request("produce", payload=values_payload([b"go"]), count=1))["ok"]
        ids = []
        while len(ids) < 3:
            ids.append((await client.recv())["id"])
        assert set(ids) == {1, 2, 3} and ids.index(3) > min(ids.index(1), ids.index(2))


@trio_test
async def test_idempotent_retry_returns_the_original_offsets() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        req = dict(payload=values_payload([b"once"]), count=1, producer_id=99, sequence=0)
        first = await client.request("produce", **req)
        again = await client.request("produce", **req)
        assert first["ok"] and again["ok"]
        assert again["duplicate"] is True and again["base_offset"] == first["base_offset"]
        records = await read_all(leader.address)
        assert [v for _, v in records].count(b"once") == 1
        bad = await client.request("produce", payload=values_payload([b"x"]), count=1,
                                   producer_id=5, sequence=-1)
        assert bad["error"]["code"] == "BAD_REQUEST"


@trio_test
async def test_leader_stop_failover_restart_catch_up() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        addresses = [n.address for n in cluster.nodes]
        producer = Producer(addresses, producer_id=7)
        for i in range(10):
            await producer.produce([f"a{i}".encode()])
        await cluster.stop(leader.node_id)  # graceful: hands leadership over first
        new_leader = await cluster.wait_leader(exclude=leader.node_id)
        producer.addresses = [n.address for n in cluster.live]
        for i in range(10):
            await producer.produce([f"b{i}".encode()])
        await cluster.restart(leader.node_id)
        top = new_leader.core.high_watermark
        await cluster.wait_hw(top)
        logs = [await read_all(n.address) for n in cluster.nodes]
        for records in logs:
            check_acked(producer.acked, records)
        assert logs[0] == logs[1] == logs[2]
        await producer.aclose()


@pytest.mark.parametrize("storage", STORAGES)
@trio_test
async def test_crash_loses_nothing_quorum_acked(storage: str, tmp_path) -> None:
    """Abort the leader mid-stream and drop its unflushed tail: every quorum-acked record
    survives, exactly once, on every node after it restarts and catches up."""
    async with running_cluster(3, storage=storage, tmp_path=tmp_path) as cluster:
        for round_ in range(2):
            leader = await cluster.wait_leader()
            # A new producer session takes a new id (its sequences restart at 0).
            producers = [Producer([n.address for n in cluster.live],
                                  producer_id=100 + 10 * round_ + k) for k in range(3)]
            async with trio.open_nursery() as nursery:
                async def write(p: Producer, tag: str) -> None:
                    for i in range(15):
                        await p.produce([f"{tag}-{i}".encode()])

                for k, p in enumerate(producers):
                    nursery.start_soon(write, p, f"r{round_}p{k}")
                with trio.fail_after(DEADLINE_S):
                    while sum(len(p.acked) for p in producers) < 10:
                        await trio.sleep(0.01)
                await cluster.stop(leader.node_id, crash=True)
                for p in producers:
                    p.addresses = [n.address for n in cluster.live]
            await cluster.restart(leader.node_id)
            new_leader = await cluster.wait_leader()
            await cluster.wait_hw(new_leader.core.high_watermark)
            logs = [await read_all(n.address) for n in cluster.nodes]
            acked = [a for p in producers for a in p.acked]
            for records in logs:
                check_acked(acked, records)
            shortest = min(len(r) for r in logs)
            assert all(r[:shortest] == logs[0][:shortest] for r in logs)
            for p in producers:
                await p.aclose()


@trio_test
async def test_transfer_leader_admin_op() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        target = next(n for n in cluster.nodes if n is not leader)
        client = await RawClient.connect(leader.address)
        reply = await client.request("transfer_leader", to=target.node_id)
        assert reply["ok"], reply
        assert reply["leader_id"] in (None, target.node_id)
        new = await cluster.wait_leader()
        assert new is target
        bad = await RawClient.connect(target.address)
        reply = await bad.request("transfer_leader", to=42)
        assert reply["error"]["code"] == "BAD_REQUEST" and "not a peer" in reply["error"]["message"]
        # Adding a node that is already a member is refused with the reason.
        reply = await bad.request("add_node", node_id=1, address="127.0.0.1:1")
        assert reply["ok"] is False and reply["error"]["code"] == "BAD_REQUEST"
        assert "already a member" in reply["error"]["message"]


@trio_test
async def test_shutting_down_node_refuses_new_work() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        client = await RawClient.connect(follower.address)
        await cluster.stop(follower.node_id)
        # Open connections were hung up (closed_after_error fails if this one stayed open)...
        await client.closed_after_error()
        # ...and the listener is closed.
        with pytest.raises(OSError):
            await RawClient.connect(follower.address)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_flushes_and_stops_run_node() -> None:
    """run_node (what `raftlog serve` calls): SIGTERM flushes, saves metadata and returns."""
    from storage.memory import MemoryLog

    log_storage = MemoryLog()
    port = _free_port()
    config = NodeConfig(node_id=1, data_dir="/nonexistent", peers={1: f"127.0.0.1:{port}"},
                        tick_ms=10, election_ticks=5)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(
                functools.partial(run_node, config, log_storage=log_storage))
            with trio.fail_after(DEADLINE_S):
                while node.core.role != Role.LEADER:
                    await trio.sleep(0.02)
            client = await RawClient.connect(node.address)
            for acks in ("none", "leader", "quorum"):
                reply = await client.request("produce", acks=acks,
                                             payload=values_payload([acks.encode()]), count=1)
                assert reply["ok"], reply
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(DEADLINE_S):
                await node._stopped.wait()

    trio.run(main)
    # Clean stop: everything appended is durable and the term survived.
    assert log_storage.flushed_offset == log_storage.dirty_offset
    assert log_storage.load_meta().term >= 1
    log_storage.crash()
    values = [b.payload for b in log_storage.read(log_storage.start_offset, 1 << 20)]
    assert sum(1 for p in values if b"none" in p or b"leader" in p or b"quorum" in p) == 3


def test_sigterm_stops_run_node_cleanly(tmp_path) -> None:
    """run_node (what `raftlog serve` calls) on the real storage: SIGTERM makes it return."""
    pytest.importorskip("storage.lmdb_log")
    from storage import open_log  # noqa: F401  (the durable log this test needs)

    port = _free_port()
    config = NodeConfig(node_id=1, data_dir=tmp_path, peers={1: f"127.0.0.1:{port}"},
                        tick_ms=10, election_ticks=5)
    kept: list[int] = []  # the offset the record was acknowledged at

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(functools.partial(run_node, config))
            with trio.fail_after(DEADLINE_S):
                while node.core.role != Role.LEADER:
                    await trio.sleep(0.02)
            client = await RawClient.connect(node.address)
            reply = await client.request("produce", payload=values_payload([b"kept"]), count=1)
            assert reply["ok"], reply
            kept.append(reply["base_offset"])
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(DEADLINE_S):
                await node._stopped.wait()

    trio.run(main)
    assert (tmp_path / "node-1").is_dir()

    async def reopen() -> None:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(functools.partial(run_node, config))
            # Leading is not enough: the record is readable once the new term's first entry
            # commits and the high watermark covers it again.
            with trio.fail_after(DEADLINE_S):
                while node.core.high_watermark < kept[0]:
                    await node.group.wait_hw_change()
            records = await read_all(node.address)
            assert [v for _, v in records] == [b"kept"]
            node.request_shutdown()

    trio.run(reopen)
