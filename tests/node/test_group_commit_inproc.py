"""Group commit keeps per-record ack semantics (issue 28), and write tracing (raft/node/trace.py).

Many single-record writers with one write in flight each are batched by the leader: several
proposals share one flush and one append frame. Each write is still answered on its own terms:
quorum once a majority has flushed it, leader once the leader has appended it.
"""

from __future__ import annotations

import pytest
import trio

from inproc_cluster import (RawClient, lmdb_available, running_cluster, trio_test,
                            values_payload)
from raft.node import trace

WRITERS = 64
ROUNDS = 4
STORAGES = ["memory", pytest.param("lmdb", marks=pytest.mark.skipif(
    not lmdb_available(), reason="storage.lmdb_log has not landed"))]


async def _writers(cluster, leader, acks: str, check) -> int:  # noqa: ANN001
    clients = [await RawClient.connect(leader.address) for _ in range(WRITERS)]
    answered = 0

    async def writer(i: int, client: RawClient) -> None:
        nonlocal answered
        for r in range(ROUNDS):
            reply = await client.request("produce", acks=acks, count=1,
                                         payload=values_payload([b"w%d-%d" % (i, r)]))
            assert reply["ok"], reply
            check(reply["last_offset"])
            answered += 1

    async with trio.open_nursery() as nursery:
        for i, client in enumerate(clients):
            nursery.start_soon(writer, i, client)
    for client in clients:
        await client.aclose()
    return answered


@pytest.mark.parametrize("storage", STORAGES)
@trio_test
async def test_concurrent_quorum_writes_share_flushes_and_each_is_majority_flushed(
        storage: str, tmp_path) -> None:
    async with running_cluster(3, storage=storage, tmp_path=tmp_path) as cluster:
        leader = await cluster.wait_leader()
        flushes_before = leader.flusher.flushes

        def majority_flushed(offset: int) -> None:
            flushed = [cluster.logs[n.node_id].flushed_offset for n in cluster.nodes]
            assert sum(f >= offset for f in flushed) >= 2, (offset, flushed)

        answered = await _writers(cluster, leader, "quorum", majority_flushed)
        assert answered == WRITERS * ROUNDS
        # Group commit: the leader's flushes are shared by the writes (one each would be
        # WRITERS * ROUNDS).
        assert leader.flusher.flushes - flushes_before < answered


@trio_test
async def test_concurrent_leader_acks_are_answered_once_appended() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        log = cluster.logs[leader.node_id]

        def appended(offset: int) -> None:
            assert log.dirty_offset >= offset

        assert await _writers(cluster, leader, "leader", appended) == WRITERS * ROUNDS


@trio_test
async def test_a_traced_write_is_stamped_hop_by_hop(monkeypatch) -> None:
    monkeypatch.setattr(trace, "ENABLED", True)
    monkeypatch.setattr(trace, "_events", [])
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        reply = await client.request("produce", acks="quorum", count=1, trace=7,
                                     payload=values_payload([b"traced"]))
        assert reply["ok"], reply
        untraced = await client.request("produce", acks="quorum", count=1,
                                        payload=values_payload([b"plain"]))
        assert untraced["ok"], untraced
        await client.aclose()
    hops = [(kind, t) for kind, key, _, t, _ in trace._events
            if kind in ("recv", "propose", "woken", "sent")]
    # Only the sampled request's hops, once each, in order.
    assert [k for k, _ in hops] == ["recv", "propose", "woken", "sent"]
    assert [t for _, t in hops] == sorted(t for _, t in hops)
    assert all(key == 7 for kind, key, *_ in trace._events
               if kind in ("recv", "propose", "woken", "sent"))
    offset = reply["last_offset"]
    kinds = {kind for kind, _, off, _, _ in trace._events if off >= offset}
    # The log-position hops that cover the write, on the leader and the followers.
    assert {"flush_start", "flush_end", "net_send", "f_read", "f_stepped", "reply_send",
            "reply_read", "reply_stepped", "commit"} <= kinds


@trio_test
async def test_without_tracing_a_trace_flag_records_nothing(monkeypatch) -> None:
    monkeypatch.setattr(trace, "ENABLED", False)
    monkeypatch.setattr(trace, "_events", [])
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        reply = await client.request("produce", acks="quorum", count=1, trace=7,
                                     payload=values_payload([b"traced"]))
        assert reply["ok"], reply
        await client.aclose()
    assert trace._events == []
