"""The client connection pipelines requests (raft/client/connection.py): replies matched by id
whatever their order, a cancelled or timed-out request leaves the connection to the others, the
in-flight bound holds, and a long-poll fetch does not hold back other requests of its Client.

Fake nodes on socket pairs or loopback script the replies; ordering is asserted with events and
`trio.testing.wait_all_tasks_blocked`, never with the clock."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

from inproc_cluster import DEADLINE_S, running_cluster, trio_test
from raft.client import Client, RequestTimeout
from raft.client import connection as connection_mod
from raft.client.connection import MAX_IN_FLIGHT, _Connection
from raft.protocol.framing import encode_frame
from raft.protocol.replies import ok_reply
from raft.protocol.streams import FrameReader


class FakeNode:
    """The node's end of one connection: reads request frames, sends whatever a test says."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, 1 << 20)

    async def next_request(self) -> dict[str, Any]:
        frame = await self.reader.receive()
        assert frame is not None, "the client hung up"
        return frame

    async def answer(self, request: dict[str, Any], **fields: Any) -> None:
        await self.stream.send_all(encode_frame(ok_reply(request["id"], **fields)))


def connection_pair() -> tuple[_Connection, FakeNode]:
    a, b = trio.socket.socketpair()
    conn = _Connection("fake:1", trio.SocketStream(a), node_id=1, max_frame_bytes=1 << 20)
    return conn, FakeNode(trio.SocketStream(b))


@trio_test
async def test_replies_out_of_order_reach_their_own_callers() -> None:
    conn, node = connection_pair()
    got: dict[str, dict[str, Any]] = {}

    async def ask(tag: str, rid: int) -> None:
        got[tag] = await conn.request({"t": "status", "tag": tag}, rid)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "first", 1)
            nursery.start_soon(ask, "second", 2)
            reqs = [await node.next_request(), await node.next_request()]
            assert {r["tag"] for r in reqs} == {"first", "second"}  # both in flight at once
            for req in sorted(reqs, key=lambda r: r["id"], reverse=True):
                await node.answer(req, echo=req["tag"])
    assert got["first"]["echo"] == "first" and got["second"]["echo"] == "second"
    assert not conn.broken and conn.in_flight == 0


@trio_test
async def test_cancelled_mid_reply_leaves_the_connection_usable() -> None:
    """The classic bug: a reader cancelled with half a frame read. The half stays buffered and
    the next request's reader carries on from it; the abandoned reply is dropped."""
    conn, node = connection_pair()
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            cancelled = trio.Event()

            async def abandoned() -> None:
                with scope:
                    await conn.request({"t": "fetch", "tag": "a"}, 1)
                    raise AssertionError("the cancelled request returned")
                cancelled.set()

            nursery.start_soon(abandoned)
            first = await node.next_request()
            late = encode_frame(ok_reply(first["id"], echo="a"))
            await node.stream.send_all(late[:7])  # half the reply: header and a few bytes
            await trio.testing.wait_all_tasks_blocked()  # the client has read them, waits
            scope.cancel()
            await cancelled.wait()
            assert not conn.broken and conn.in_flight == 0

            result: list[dict[str, Any]] = []
            nursery.start_soon(_append, result, conn.request({"t": "status", "tag": "b"}, 2))
            second = await node.next_request()
            await node.stream.send_all(late[7:])  # the rest of the abandoned reply
            await node.answer(second, echo="b")
    assert result[0]["id"] == 2 and result[0]["echo"] == "b"
    assert not conn.broken


async def _append(out: list[Any], coro: Any) -> None:
    out.append(await coro)


@trio_test
async def test_in_flight_requests_are_bounded_per_connection() -> None:
    conn, node = connection_pair()
    extra = 5
    results: dict[int, dict[str, Any]] = {}

    async def ask(rid: int) -> None:
        results[rid] = await conn.request({"t": "status"}, rid)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            for rid in range(1, MAX_IN_FLIGHT + extra + 1):
                nursery.start_soon(ask, rid)
            received = [await node.next_request() for _ in range(MAX_IN_FLIGHT)]
            await trio.testing.wait_all_tasks_blocked()
            assert conn.in_flight == MAX_IN_FLIGHT  # the others wait for a slot, unsent
            await node.answer(received[0], n=received[0]["id"])  # one slot frees ...
            received.append(await node.next_request())  # ... and one more request leaves
            await trio.testing.wait_all_tasks_blocked()
            assert conn.in_flight == MAX_IN_FLIGHT
            for req in received[1:]:
                await node.answer(req, n=req["id"])
            for _ in range(extra - 1):
                req = await node.next_request()
                await node.answer(req, n=req["id"])
    assert sorted(results) == list(range(1, MAX_IN_FLIGHT + extra + 1))
    assert all(reply["n"] == rid for rid, reply in results.items())
    assert conn.in_flight == 0 and not conn.broken


@trio_test
async def test_eof_fails_every_request_in_flight_and_breaks_the_connection() -> None:
    conn, node = connection_pair()
    failures: list[BaseException] = []

    async def ask(rid: int) -> None:
        try:
            await conn.request({"t": "status"}, rid)
        except trio.BrokenResourceError as e:
            failures.append(e)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 1)
            nursery.start_soon(ask, 2)
            await node.next_request()
            await node.next_request()
            await node.stream.aclose()
    assert len(failures) == 2 and conn.broken
    with pytest.raises(trio.BrokenResourceError, match="broken"):
        await conn.request({"t": "status"}, 3)  # refused at once: the Client opens another


class FakeListener:
    """A fake node on loopback that speaks the hello, then queues every request it reads (with
    the stream to answer on) for the test to answer."""

    def __init__(self) -> None:
        self.send, self.requests = trio.open_memory_channel[tuple[FakeNode, dict[str, Any]]](
            MAX_IN_FLIGHT)
        self.accepted = 0
        self.address = ""

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(functools.partial(
            trio.serve_tcp, self.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    async def handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        node = FakeNode(stream)
        await node.next_request()  # the hello
        await stream.send_all(encode_frame({"t": "hello", "node_id": 1}))
        while (frame := await node.reader.receive()) is not None:
            await self.send.send((node, frame))


@trio_test
async def test_a_timed_out_request_does_not_break_the_others_on_its_connection() -> None:
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            fake = FakeListener()
            await fake.serve(nursery)
            async with Client([fake.address]) as client:
                timed_out = trio.Event()
                other: list[dict[str, Any]] = []

                async def slow() -> None:
                    with pytest.raises(RequestTimeout, match="no answer from"):
                        await client.call("status", server=fake.address, timeout=0.5,
                                          attempt_timeout=0.5, tag="slow")
                    timed_out.set()

                nursery.start_soon(slow)
                node, slow_req = await fake.requests.receive()
                nursery.start_soon(_append, other,
                                   client.call("status", server=fake.address, tag="other"))
                _, other_req = await fake.requests.receive()
                await timed_out.wait()  # the slow one gave up; the other is still in flight
                conn = client._conns[fake.address]
                assert not conn.broken and conn.in_flight == 1
                await node.answer(slow_req, echo="slow")  # too late: dropped
                await node.answer(other_req, echo="other")
                while not other:
                    await trio.testing.wait_all_tasks_blocked()
                assert other[0]["echo"] == "other"
                nursery.start_soon(_append, other,
                                   client.call("status", server=fake.address, tag="next"))
                node, next_req = await fake.requests.receive()
                await node.answer(next_req, echo="next")
                while len(other) < 2:
                    await trio.testing.wait_all_tasks_blocked()
                assert other[1]["echo"] == "next"
                assert client._conns[fake.address] is conn and fake.accepted == 1
            nursery.cancel_scope.cancel()


@trio_test
async def test_a_long_poll_fetch_does_not_hold_back_other_requests_of_its_client() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as client:
            first = await client.produce([b"before"])
            fetched: list[Any] = []
            fetch_done = trio.Event()

            async def follow() -> None:
                fetched.append(await client.fetch(first.last_offset + 1, max_wait=100.0))
                fetch_done.set()

            with trio.fail_after(DEADLINE_S):  # a hang guard: the fetch alone would wait 100 s
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(follow)
                    conn = client._conns[leader.address]
                    while conn.in_flight < 1:  # the fetch is on the wire, waiting for records
                        await trio.sleep(0.005)
                    status = await client.status()  # answered while the fetch still waits
                    assert status["role"] == "leader" and not fetch_done.is_set()
                    res = await client.produce([b"after"])  # completes; its record ...
                    assert res.base_offset == first.last_offset + 1
                    await fetch_done.wait()  # ... then releases the fetch
            assert [(r.offset, r.value) for r in fetched[0].records] == [
                (res.base_offset, b"after")]
            assert client._conns[leader.address] is conn


def test_in_flight_bound_is_documented_and_below_the_nodes() -> None:
    from raft.node.config import NodeConfig
    default = NodeConfig.__dataclass_fields__["max_inflight_per_connection"].default
    assert 0 < connection_mod.MAX_IN_FLIGHT <= default


@trio_test
async def test_a_consumer_waiting_for_records_does_not_hold_back_one_sharing_its_client() -> None:
    """docs/SUBSCRIPTIONS.md, "Many consumers, one client": one consumer sits at the end of
    the log long-polling; the other, on the same Client, reads and commits meanwhile."""
    from raft.client import Consumer
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        async with Client([leader.address]) as client:
            res = await client.produce([b"r0", b"r1", b"r2"])
            idle = Consumer(client, "idle", start="end", max_wait=100.0)
            busy = Consumer(client, "busy", follow=False, auto_commit_ms=0)
            await idle.open()
            woke: list[Any] = []
            with trio.fail_after(DEADLINE_S):  # a hang guard: the long poll alone takes 100 s
                async with trio.open_nursery() as nursery:
                    async def wait_for_one() -> None:
                        woke.append(await idle.__anext__())

                    nursery.start_soon(wait_for_one)
                    conn = client._conns[leader.address]
                    while conn.in_flight < 1:  # the idle consumer's fetch waits on the node
                        await trio.sleep(0.005)
                    got = [r.value async for r in busy]
                    sub = await busy.commit()
                    assert got == [b"r0", b"r1", b"r2"] and not woke
                    assert sub is not None and sub["position"] > res.last_offset  # committed
                    await client.produce([b"r3"])  # now the idle one has a record
            assert woke[0].value == b"r3"


@trio_test
async def test_a_caller_cancelled_while_its_frame_is_sent_still_sends_it_whole() -> None:
    """Half a frame on the wire would corrupt the stream for every request after it: a frame
    the kernel cannot take at once (the node is not reading) is finished after its caller is
    cancelled, and the connection stays usable."""
    conn, node = connection_pair()
    node.reader = FrameReader(node.stream, 64 << 20)
    big = b"x" * (8 << 20)  # far more than the socket buffers hold
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            cancelled = trio.Event()

            async def abandoned() -> None:
                with scope:
                    await conn.request({"t": "produce", "payload": big}, 1)
                cancelled.set()

            nursery.start_soon(abandoned)
            await trio.testing.wait_all_tasks_blocked()  # stuck in the send: nobody reads
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not cancelled.is_set()  # still sending: cancellation waits for the frame
            first = await node.next_request()  # the node reads: the frame arrives whole
            assert first["payload"] == big
            await cancelled.wait()
            assert not conn.broken and conn.in_flight == 0
            result: list[dict[str, Any]] = []
            nursery.start_soon(_append, result, conn.request({"t": "status"}, 2))
            second = await node.next_request()
            await node.answer(first, late=True)  # the abandoned request's reply: dropped
            await node.answer(second, echo="ok")
    assert result[0]["id"] == 2 and result[0]["echo"] == "ok"
