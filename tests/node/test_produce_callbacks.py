"""A produce answered without a task (raft/node/propose_then.py, raft/node/reply_writer.py,
issue 28): its reply is written by a callback from the group's loops. A connection that closes
while such answers are pending leaves the node serving, loses nothing acknowledged, and the
late answers are dropped: they never reach the connection that took over its descriptor."""

from __future__ import annotations

import trio
import trio.testing

from inproc_cluster import RawClient, raw_frame, read_all, running_cluster, values_payload
from raft.protocol.framing import encode_frame


def produce(rid: int, value: bytes) -> dict:
    return {"t": "produce", "id": rid, "acks": "quorum", "payload": values_payload([value]),
            "count": 1}


# Once the held flush is let go, the answers are one flush and a step away (a single node,
# in this process): milliseconds, seconds under CI load. The harness's DEADLINE_S (20 s) was
# what each of the mutants these tests kill cost the suite, waiting for answers that never
# come.
ANSWERS_S = 5.0

def test_a_connection_closed_with_answers_pending_leaves_the_node_serving() -> None:
    trio.run(_closed_with_answers_pending)


async def _closed_with_answers_pending() -> None:
    async with running_cluster(1) as cluster:
        node = await cluster.wait_leader()
        a = await RawClient.connect(node.address)
        acked = {}
        for i in range(4):  # answered while the connection lives
            reply = await a.request("produce", acks="quorum", count=1,
                                    payload=values_payload([f"a{i}".encode()]))
            assert reply["ok"], reply
            acked[reply["base_offset"]] = f"a{i}".encode()
        # The flusher holds back: quorum writes wait for it, so their answers stay pending.
        held: list = []
        flusher = node.flusher
        flusher.request, real_request = held.append, flusher.request  # type: ignore[method-assign]
        await a.send_raw(b"".join(encode_frame(produce(100 + i, f"p{i}".encode()))
                                  for i in range(8)))
        await a.send_raw(raw_frame(b"\xc1"))  # not msgpack: the node hangs up on a
        assert await a.closed_after_error() is not None
        await a.aclose()
        b = await RawClient.connect(node.address)  # likely a's descriptor on the node
        assert (await b.request("status"))["ok"]
        flusher.request = real_request  # type: ignore[method-assign]
        for group in held:
            flusher.request(group)
        with trio.fail_after(ANSWERS_S):
            await node.clients.idle.wait()  # every pending answer came (and was dropped)
        assert node.clients._active == 0
        reply = await b.request("status")  # the first frame b sees after them is its own
        assert reply["ok"], reply
        reply = await b.request("produce", acks="quorum", count=1,
                                payload=values_payload([b"b0"]))
        assert reply["ok"], reply
        acked[reply["base_offset"]] = b"b0"
        await b.aclose()
        log = dict(await read_all(node.address))
        for offset, value in acked.items():
            assert log.get(offset) == value, (offset, log.get(offset), value)


def test_a_client_that_half_closes_gets_every_pending_reply() -> None:
    trio.run(_half_closed)


async def _half_closed() -> None:
    async with running_cluster(1) as cluster:
        node = await cluster.wait_leader()
        c = await RawClient.connect(node.address)
        held: list = []
        flusher = node.flusher
        flusher.request, real_request = held.append, flusher.request  # type: ignore[method-assign]
        await c.send_raw(b"".join(encode_frame(produce(i, f"h{i}".encode())) for i in range(8)))
        await c.stream.send_eof()  # the node reads EOF with all eight answers pending
        await trio.testing.wait_all_tasks_blocked()
        assert node.clients._active == 8  # read, proposed, waiting for the flush
        flusher.request = real_request  # type: ignore[method-assign]
        for group in held:
            flusher.request(group)
        replies = {}
        with trio.fail_after(ANSWERS_S):
            while (reply := await c.recv()) is not None:
                replies[reply["id"]] = reply
        assert sorted(replies) == list(range(8)) and all(r["ok"] for r in replies.values())
        log = dict(await read_all(node.address))
        for r in replies.values():
            assert log[r["base_offset"]] == f"h{r['id']}".encode()
