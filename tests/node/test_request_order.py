"""Requests pipelined on one connection are proposed in the order they were sent.

The node answers each request in its own task, and trio may run tasks started in one turn in
either order; the read loop takes frames already buffered without yielding (issue 28). The
serve loop therefore makes each request's handler start after the previous one's
(raft/node/client_requests.py): a client pipelining writes to one partition (the Spark
stager, a producer with several requests in flight) finds them in the log in its order."""

from __future__ import annotations

import pytest
import trio

from inproc_cluster import DEADLINE_S, RawClient, read_all, running_cluster, values_payload
from raft.node import trace
from raft.protocol.framing import encode_frame

WRITES = 64


def test_pipelined_writes_land_in_the_order_sent() -> None:
    """Plain produces (each proposed by the read loop itself, no task: issue 28), and produces
    mixed with ones answered in tasks (traced ones take that path): a produce read behind a
    request whose task has not started yet must not be proposed ahead of it."""
    for acks in ("leader", "quorum"):
        trio.run(_pipelined_writes_land_in_order, acks, False)
    with pytest.MonkeyPatch.context() as monkeypatch:  # not the fixture: mutants call bare
        monkeypatch.setattr(trace, "ENABLED", True)
        for acks in ("leader", "quorum"):
            trio.run(_pipelined_writes_land_in_order, acks, True)


async def _pipelined_writes_land_in_order(acks: str, mixed: bool) -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        client = await RawClient.connect(leader.address)
        values = [f"w{i:03d}".encode() for i in range(WRITES)]
        # One buffer of WRITES frames: the node finds them all waiting at its first read.
        frames = [{"t": "produce", "id": i + 1, "acks": acks,
                   "payload": values_payload([v]), "count": 1}
                  for i, v in enumerate(values)]
        if mixed:
            for f in frames[::3]:
                f["trace"] = f["id"]  # answered in a task (raft.node.client_requests)
        await client.send_raw(b"".join(encode_frame(f) for f in frames))
        replies = {}
        with trio.fail_after(DEADLINE_S):
            while len(replies) < WRITES:
                reply = await client.recv()
                assert reply is not None and reply["ok"], reply
                replies[reply["id"]] = reply["base_offset"]
        offsets = [replies[i + 1] for i in range(WRITES)]
        assert offsets == sorted(offsets), "offsets not in the order the writes were sent"
        await cluster.wait_hw(max(offsets))
        got = [v for _, v in await read_all(leader.address) if v.startswith(b"w")]
        assert got == values
