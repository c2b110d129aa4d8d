"""A commit checkpoint never holds a group's messages (raft/node/meta_saver.py, issue 28).

The store has one writer: a metadata save waits for the running flush. Under an acks=none
flood the leader's flush carried hundreds of MiB (1.5 s measured), and the commit checkpoint
saved every commit_checkpoint_ticks held the leader's Ready loop, its heartbeats with it, for
as long: its followers campaigned and deposed it. Now a save that only moves the checkpoint
is written by the saver's own task, while the Ready loop goes on sending; a new term or vote
is still durable before any message that depends on it.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from inproc_cluster import RawClient, lmdb_available, running_cluster, trio_test, values_payload
from raft.core.messages import Heartbeat
from raft.core.ready import HardState
from raft.core.types import Role
from raft.node.identity import IdState
from raft.node.meta_saver import MetaSaver, checkpoint_only
from storage.api import Meta

DEADLINE_S = 10.0
BEATS = 3  # heartbeats each follower must get while the checkpoint save waits
HEARTBEATS_DUE_S = 3.0


def _hs(term: int, vote: int | None, commit: int, history: int = 0) -> HardState:
    return HardState(term, vote, {"history": [history], "commit": commit})


def test_only_the_commit_checkpoint_may_wait() -> None:
    saved = Meta(term=3, voted_for=1, config={"history": [0], "commit": 10})
    assert checkpoint_only(_hs(3, 1, 20), saved)
    assert not checkpoint_only(_hs(4, 1, 20), saved)  # a new term
    assert not checkpoint_only(_hs(3, 2, 10), saved)  # a new vote
    assert not checkpoint_only(_hs(3, 1, 10, history=1), saved)  # a configuration change


@trio_test
async def test_a_waiting_checkpoint_never_overwrites_a_newer_term() -> None:
    written: list[HardState] = []
    gate = trio.Event()

    async def write(hs: HardState) -> None:
        await gate.wait()  # the store's writer is busy (a long flush)
        written.append(hs)

    saver = MetaSaver(write, lambda e, where: pytest.fail(f"{where}: {e}"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(saver.run)
        saver.later(_hs(3, 1, 20))
        await trio.testing.wait_all_tasks_blocked()  # the checkpoint's write has started
        saver.later(_hs(3, 1, 30))  # a newer checkpoint queues behind it

        async def urgent() -> None:
            await saver.save(_hs(4, 2, 30))  # a vote: written before its messages leave

        nursery.start_soon(urgent)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    # The queued checkpoint was carried by the vote's save; the last write is the newest.
    assert [(h.term, h.config["commit"]) for h in written] == [(3, 20), (4, 30)]


@pytest.mark.skipif(not lmdb_available(), reason="needs the LMDB store")
@trio_test
async def test_heartbeats_leave_while_a_checkpoint_waits_for_the_store(tmp_path) -> None:
    # Not quiescing: a busy group's leader heartbeats every tick (an idle one goes quiet).
    async with running_cluster(3, storage="lmdb", tmp_path=tmp_path,
                               raft={"quiesce_ticks": 0}) as cluster:
        leader = await cluster.wait_leader()
        group = leader.group
        with trio.fail_after(DEADLINE_S):
            while any(n.group.identity.state is not IdState.FIRM for n in cluster.nodes):
                await trio.sleep(0.01)
        client = await RawClient.connect(leader.address)
        reply = await client.request("produce", acks="quorum", count=1,
                                     payload=values_payload([b"x"]))
        assert reply["ok"], reply
        term = leader.core.term
        beats = {n.node_id: 0 for n in cluster.nodes if n is not leader}

        def counting(node_id: int, deliver):  # noqa: ANN001, ANN202
            def wrapped(msgs, *, from_peer):  # noqa: ANN001, ANN202
                beats[node_id] += sum(1 for m in msgs if type(m) is Heartbeat and m.term == term)
                return deliver(msgs, from_peer=from_peer)
            return wrapped

        for n in cluster.nodes:
            if n is not leader:
                n.group.deliver = counting(n.node_id, n.group.deliver)
        # A long flush: the store's one writer is taken, every write transaction waits.
        write_lock = cluster.logs[leader.node_id].store._write_lock
        write_lock.acquire()
        try:
            with trio.fail_after(DEADLINE_S):
                # The committed write is checkpointed within commit_checkpoint_ticks: its save
                # now waits for the writer.
                while not saver_waiting(group.meta_saver):
                    await trio.sleep(0.005)
            start = dict(beats)
            # A generous bound (BEATS ticks of 10 ms are due): with the save in the Ready loop
            # no heartbeat leaves until the writer is free, however long we wait.
            with trio.move_on_after(HEARTBEATS_DUE_S):
                while any(beats[i] < start[i] + BEATS for i in beats):
                    await trio.sleep(0.005)
            assert all(beats[i] >= start[i] + BEATS for i in beats), (
                f"heartbeats held while a checkpoint waits for the store: {start} -> {beats}")
        finally:
            write_lock.release()
        assert leader.core.role is Role.LEADER and leader.core.term == term
        await client.aclose()


def saver_waiting(saver: MetaSaver) -> bool:
    return saver._lock.locked()


@trio_test
async def test_a_checkpoint_save_that_fails_stops_the_node() -> None:
    """Fail-stop holds beside the Ready loop too: the saver's task hands the error to the
    group's `fail` (which stops the node) and writes nothing more."""
    failures: list[str] = []

    async def write(hs: HardState) -> None:
        raise OSError("injected: the disk failed")

    saver = MetaSaver(write, lambda e, where: failures.append(f"{where}: {e}"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(saver.run)
        saver.later(_hs(3, 1, 20))
        await trio.testing.wait_all_tasks_blocked()
        saver.later(_hs(3, 1, 30))  # nobody writes it: the task stopped
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert failures == ["save_meta: injected: the disk failed"]
