"""The client's retries of lost connections (issue 29, item 7): the backoff's bounds, first
contact with a cluster where nothing listens still failing at once, and a client that has
reached a node riding through that node's absence, even with a produce that must not be sent
twice. Against fake nodes in this process (the restart of real processes is in
test_restart_all_processes.py)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import trio

from inproc_cluster import DEADLINE_S, trio_test
from raft.client import BackpressureError, Client, UnavailableError
from raft.client.backoff import RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S, Backoff
from raft.protocol.framing import encode_frame
from raft.core.types import ErrorCode
from raft.protocol.replies import error_reply, ok_reply
from raft.protocol.streams import FrameReader
from test_client import free_port


def test_backoff_pauses_double_with_jitter_up_to_the_cap_and_stop_at_the_deadline() -> None:
    for seed in range(20):
        backoff = Backoff(random.Random(seed), initial=0.01, cap=1.0)
        pauses = [backoff.next_pause(remaining=3600) for _ in range(12)]
        for k, pause in enumerate(pauses):
            delay = min(0.01 * 2 ** k, 1.0)
            assert delay / 2 <= pause <= delay, (seed, k, pause)
        assert max(pauses) <= 1.0 and max(pauses[8:]) >= 0.5  # capped, and it got there
        assert backoff.next_pause(remaining=0.003) <= 0.003  # never past the deadline
        assert backoff.next_pause(remaining=-1.0) == 0.0
    # The documented defaults, and bounds that make no sense refused when the client is made.
    assert (RETRY_BACKOFF_S, RETRY_BACKOFF_MAX_S) == (0.01, 1.0)
    assert Client("127.0.0.1:1").retry_backoff_max == RETRY_BACKOFF_MAX_S
    for initial, cap in ((0.0, 1.0), (0.5, 0.1), (-1.0, 1.0)):
        with pytest.raises(ValueError, match="retry backoff"):
            Client("127.0.0.1:1", retry_backoff=initial, retry_backoff_max=cap)


async def serve_fake_node(port: int, answer: Callable[[dict], dict], *,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A node on `port` that says hello and answers each frame with `answer(frame)`; it hangs
    up every connection when its task is cancelled (a killed node, as the client sees it)."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream, 64 << 20)
        async with stream:
            if await reader.receive() is None:
                return
            await stream.send_all(encode_frame({"t": "hello", "node_id": 9}))
            while (frame := await reader.receive()) is not None:
                await stream.send_all(encode_frame(answer(frame)))

    task_status.started()
    await trio.serve_listeners(handle, listeners)


async def fake_node_at(port: int, seen: list[dict], *,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A node that answers status and produce (each produce at the next offset)."""
    def answer(frame: dict) -> dict:
        seen.append(frame)
        if frame["t"] == "produce":
            return ok_reply(frame["id"], base_offset=len(seen), last_offset=len(seen))
        return ok_reply(frame["id"], status={"node_id": 9, "role": "leader"})

    await serve_fake_node(port, answer, task_status=task_status)


@trio_test
async def test_first_contact_fails_at_once_but_a_client_that_reached_a_node_waits_for_it(
        ) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    # First contact with nothing listening: at once, today's message (not the hour allowed).
    async with Client([address], timeout=3600) as client:
        with trio.fail_after(DEADLINE_S):
            with pytest.raises(UnavailableError, match="no raftlog node answers at"):
                await client.status()
        assert not client.reached

    seen: list[dict] = []
    async with trio.open_nursery() as nursery, Client([address], timeout=DEADLINE_S) as client:
        node, node_gone = trio.CancelScope(), trio.Event()

        async def run_node(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with node:
                await fake_node_at(port, seen, task_status=task_status)
            node_gone.set()

        await nursery.start(run_node)
        assert (await client.status())["node_id"] == 9
        assert client.reached
        node.cancel()  # the node goes away; the client's idle connection is hung up on

        # A plain produce (no producer id: it must never be sent twice) while nothing
        # listens: refused connections are retried, not fatal, for a client that has been
        # there; a call pinned to the absent node still answers at once.
        done = trio.Event()
        result: list[int] = []

        async def produce() -> None:
            result.append((await client.produce([b"once"], acks="quorum")).base_offset)
            done.set()

        with trio.fail_after(DEADLINE_S):
            await node_gone.wait()
            retries = client.retries
            nursery.start_soon(produce)
            while client.retries < retries + 3:
                await trio.sleep(0.01)  # polling a condition: the client is retrying
            assert not done.is_set()
            with pytest.raises(UnavailableError, match="no raftlog node answers at"):
                await client.status(address)
            await nursery.start(fake_node_at, port, seen)  # the node is back
            await done.wait()
        produced = [f for f in seen if f["t"] == "produce"]
        assert len(produced) == 1 and result == [len(seen)]  # delivered, and written once
        nursery.cancel_scope.cancel()


async def busy_leader_at(port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A leader that answers every produce BACKPRESSURE (it cannot take the write yet), and
    metadata as a node that predates topics."""
    def answer(frame: dict) -> dict:
        if frame["t"] == "produce":
            return error_reply(frame["id"], ErrorCode.BACKPRESSURE,
                               "the leader is waiting for a repair")
        return error_reply(frame["id"], ErrorCode.BAD_REQUEST, "unknown request")

    await serve_fake_node(port, answer, task_status=task_status)


@trio_test
async def test_giving_up_reports_the_live_leaders_answer_not_a_down_nodes_refusal() -> None:
    # ci16: a leader kept answering BACKPRESSURE while another node was down; the client's
    # rotation ended on the down node, and the caller was told UNAVAILABLE. Every seed: the
    # rotation's order and where the budget runs out differ, the answer must not.
    busy, down = free_port(), free_port()
    async with trio.open_nursery() as nursery:
        await nursery.start(busy_leader_at, busy)
        for seed in range(4):
            async with Client([f"127.0.0.1:{down}", f"127.0.0.1:{busy}"], timeout=0.25,
                              rng=random.Random(seed)) as client:
                with trio.fail_after(DEADLINE_S):
                    with pytest.raises(BackpressureError):
                        await client.produce([b"x"], acks="leader", producer_id=7, sequence=0)
                assert client.retries >= 2  # it did go round, the down node included
        nursery.cancel_scope.cancel()
