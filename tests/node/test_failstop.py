"""Fail-stop: a node that can no longer trust its own state stops at once, loudly, and a restart
recovers from what it had flushed. A full disk is not such a fault (tests/node/test_disk_full.py).
"""

from __future__ import annotations

import pytest
import trio

from inproc_cluster import RawClient, running_cluster, trio_test, values_payload
from raft.core import messages as m
from raft.node.config import NodeConfig
from raft.node.errors import NodeFailed
from raft.node.server import Node
from raft.core.ready import StorageWork
from raft.core.types import Role
from storage.api import DiskFull, StorageIOError
from storage.memory import MemoryLog


def single_node(log: MemoryLog) -> Node:
    return Node(NodeConfig(node_id=1, data_dir="/nonexistent-in-memory",
                           peers={1: "127.0.0.1:0"}, tick_ms=10, election_ticks=20),
                log_storage=log)


async def wait_leader(node: Node) -> None:
    with trio.fail_after(10):
        while node.core is None or node.core.role != Role.LEADER or node.core.commit_index < 0:
            await trio.sleep(0.01)


@pytest.mark.parametrize("op", ["flush", "save_meta"])
@trio_test
async def test_a_storage_fault_stops_the_node_and_a_restart_recovers(op: str) -> None:
    log = MemoryLog()
    node = single_node(log)
    answers: list[dict] = []
    with pytest.raises(BaseExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await wait_leader(node)
            client = await RawClient.connect(node.address)
            ok = await client.request("produce", payload=values_payload([b"kept"]), count=1)
            assert ok["ok"], ok
            flushed_before = log.flushed_offset
            log.fail_next(op, StorageIOError)
            if op == "save_meta":
                # The next Ready saves metadata before its messages leave (an urgent save, as
                # a new cluster id's: a commit checkpoint alone is saved beside the Ready loop,
                # raft/node/meta_saver.py; its fault: tests/node/test_meta_checkpoint.py).
                node.core._hs_dirty = True
                node.group._identity_changed = True

            async def produce_one() -> None:
                try:
                    answers.append(await client.request(
                        "produce", payload=values_payload([b"lost"]), count=1))
                except Exception:  # the node went away mid-request: no answer at all
                    pass

            nursery.start_soon(produce_one)
            with trio.fail_after(10):
                await node._stopped.wait()
    assert raised.group_contains(NodeFailed)
    # It stopped without a final flush and never acknowledged the write it could not flush.
    assert log.flushed_offset == flushed_before
    assert not any(a.get("ok") for a in answers), answers
    # A restart recovers from the flushed log and serves again.
    log.crash()
    log.clear_faults()
    restarted = single_node(log)
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run)
        await wait_leader(restarted)
        client = await RawClient.connect(restarted.address)
        reply = await client.request("fetch", offset=0, max_bytes=1 << 20)
        assert reply["ok"] and any(b"kept" in b["payload"] for b in reply["batches"])
        restarted.request_shutdown()


@trio_test
async def test_a_full_disk_does_not_stop_the_node() -> None:
    log = MemoryLog()
    node = single_node(log)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        await wait_leader(node)
        client = await RawClient.connect(node.address)
        log.fail_next("flush", DiskFull, times=3)
        first = await client.request("produce", payload=values_payload([b"a"]), count=1,
                                     timeout_ms=200)
        assert first["error"]["code"] in ("TIMEOUT", "DISK_FULL"), first
        with trio.fail_after(10):
            while True:  # the flush is retried; once it succeeds, writes are taken again
                reply = await client.request("produce", payload=values_payload([b"b"]), count=1,
                                             timeout_ms=2000)
                if reply["ok"]:
                    break
                assert reply["error"]["code"] == "DISK_FULL", reply
                await trio.sleep(0.05)
        assert not node._stopped.is_set()
        node.request_shutdown()


FAULT_DEADLINE_S = 8.0


@pytest.mark.parametrize("fault", ["step", "storage work"])
@trio_test
async def test_a_fault_while_the_runtime_steps_the_core_stops_the_node(fault: str) -> None:
    """The runtime steps the core with every peer message, and runs the durable log changes
    the core asks for (a follower's truncation, its reset, a repair: StorageWork) outside the
    flush path. An exception on either (a storage error, a broken invariant) means the node can
    no longer trust its state: it stops at once, loudly, and serves nothing more. The faults are
    injected into one follower: its core's step raises, or the truncation it is made to ask
    for finds the disk failing."""
    stopped_follower: list[Node] = []
    with pytest.raises(BaseExceptionGroup) as raised:
        async with running_cluster(3) as cluster:
            leader = await cluster.wait_leader()
            client = await RawClient.connect(leader.address)
            ok = await client.request("produce", payload=values_payload([b"a"]), count=1)
            assert ok["ok"], ok
            follower = next(n for n in cluster.nodes if n is not leader)
            core, log = follower.core, cluster.logs[follower.node_id]
            assert isinstance(log, MemoryLog)
            real_step = core.step

            def faulty_step(msg: m.Message) -> None:
                if isinstance(msg, (m.AppendEntries, m.Heartbeat)):
                    if fault == "step":
                        raise StorageIOError("injected: the disk failed during a truncation")
                    if core._storage_running is None:  # the core asks to drop its tail
                        log.fail_next("truncate_suffix", StorageIOError)
                        core._hand_off(StorageWork.truncate_suffix(log.start_offset - 1))
                real_step(msg)

            core.step = faulty_step  # type: ignore[method-assign]
            with trio.fail_after(FAULT_DEADLINE_S):
                await follower._stopped.wait()
            stopped_follower.append(follower)
            # Loudly: the failure is recorded, and the node serves nothing more.
            assert follower.group.failure is not None
            with pytest.raises(OSError):
                await RawClient.connect(follower.address)
    assert stopped_follower, "the follower kept running after the fault"
    assert raised.group_contains(NodeFailed, match="StorageIOError")
