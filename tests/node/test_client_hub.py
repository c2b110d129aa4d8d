"""The client hub (raft.node.client_hub) on socket pairs, in process: one connection's frames
reach its callback in order and in bounded turns; a connection over its budget is not read
(and does not hold up the others) until a slot comes back; a malformed frame, a frame cut off
by EOF and a clean EOF each end only their own connection."""

from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing

from raft.node import client_hub
from raft.node.client_hub import ClientHub, HubConn
from raft.protocol.framing import FrameDecoder, WireError, encode_frame


def frames(ids: range) -> bytes:
    return b"".join(encode_frame({"t": "status", "id": i}) for i in ids)


class Peer:
    """A client socket and the hub's view of its other end."""

    def __init__(self, hub: ClientHub, budget: int) -> None:
        self.client, server = socket.socketpair()
        self.server = server  # kept open while registered
        self.got: list[int] = []
        self.passes: list[int] = []
        self.hub = hub
        self.conn: HubConn = hub.add(server.fileno(), FrameDecoder(1 << 20), budget,
                                     self.on_frame)

    def on_frame(self, frame: dict[str, Any]) -> None:
        self.got.append(frame["id"])
        self.passes.append(self.hub.passes)

    def close(self) -> None:
        self.hub.remove(self.conn)
        self.client.close()
        self.server.close()


GUARD_S = 10  # a hub that misses an event would hang the test: fail it instead


async def started_hub(nursery: trio.Nursery) -> ClientHub:
    hub = ClientHub()
    nursery.start_soon(hub.run)
    await trio.testing.wait_all_tasks_blocked()
    assert hub.running
    return hub


async def guarded(main: Any) -> None:
    with trio.fail_after(GUARD_S):
        await main()


def test_one_connection_in_order_in_bounded_turns() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            hub = await started_hub(nursery)
            a = Peer(hub, budget=1000)
            a.client.sendall(frames(range(100)))  # one write: all in the socket at once
            await trio.testing.wait_all_tasks_blocked()
            assert a.got == list(range(100))
            per_pass = [a.passes.count(p) for p in set(a.passes)]
            assert max(per_pass) <= client_hub.FRAMES_PER_SOCKET  # the hub yielded between
            a.client.sendall(frames(range(100, 103)))
            await trio.testing.wait_all_tasks_blocked()
            assert a.got == list(range(103))
            a.close()
            nursery.cancel_scope.cancel()

    trio.run(guarded, main)


def test_a_connection_over_its_budget_is_not_read_and_does_not_block_others() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            hub = await started_hub(nursery)
            slow, other = Peer(hub, budget=2), Peer(hub, budget=1000)
            slow.client.setblocking(False)
            sent = 0
            batch = frames(range(100))
            try:
                while sent < 4 << 20:  # far more than one read: the rest stays in the kernel
                    sent += slow.client.send(batch)
            except BlockingIOError:
                pass
            other.client.sendall(frames(range(50)))
            await trio.testing.wait_all_tasks_blocked()
            assert slow.got == [0, 1] and slow.conn.paused
            assert slow.conn.decoder.held <= 2 * client_hub.READ_BYTES  # not read on
            assert other.got == list(range(50))
            for _ in range(3):
                slow.conn.release()  # three answers done: three more frames, in order
            await trio.testing.wait_all_tasks_blocked()
            assert slow.got == [0, 1, 2, 3, 4]
            other.client.sendall(frames(range(50, 60)))
            await trio.testing.wait_all_tasks_blocked()
            assert other.got == list(range(60))
            slow.close()
            other.close()
            nursery.cancel_scope.cancel()

    trio.run(guarded, main)


def test_bad_frames_and_eof_end_only_their_connection() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            hub = await started_hub(nursery)
            bad, cut, done, ok = (Peer(hub, budget=100) for _ in range(4))
            bad.client.sendall(frames(range(3)) + b"\x00\x00\x00\x02\xc1\xc1")  # not msgpack
            cut.client.sendall(frames(range(2)) + b"\x00\x00\x00\x32" + b"\x80" * 10)
            cut.client.shutdown(socket.SHUT_WR)  # EOF inside a frame
            done.client.sendall(frames(range(4)))
            done.client.shutdown(socket.SHUT_WR)  # EOF between frames: a clean end
            ok.client.sendall(frames(range(5)))
            await trio.testing.wait_all_tasks_blocked()
            assert bad.conn.closed and cut.conn.closed and done.conn.closed  # without a wait
            assert isinstance(await bad.conn.finished(), WireError) and bad.got == [0, 1, 2]
            assert isinstance(await cut.conn.finished(), WireError) and cut.got == [0, 1]
            assert await done.conn.finished() is None and done.got == [0, 1, 2, 3]
            assert not ok.conn.closed and ok.got == list(range(5))
            ok.client.sendall(frames(range(5, 8)))
            await trio.testing.wait_all_tasks_blocked()
            assert ok.got == list(range(8))
            for p in (bad, cut, done, ok):
                p.close()
            nursery.cancel_scope.cancel()

    trio.run(guarded, main)


def test_a_callback_that_fails_ends_its_connection_with_that_error() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            hub = await started_hub(nursery)
            a, b = Peer(hub, budget=100), Peer(hub, budget=100)

            def refuse(frame: dict[str, Any]) -> None:
                raise WireError(f"no {frame['id']}")

            a.conn.on_frame = refuse
            a.client.sendall(frames(range(2)))
            b.client.sendall(frames(range(2)))
            ended = await a.conn.finished()
            assert isinstance(ended, WireError) and str(ended) == "no 0"
            await trio.testing.wait_all_tasks_blocked()
            assert b.got == [0, 1]
            a.close()
            b.close()
            nursery.cancel_scope.cancel()

    trio.run(guarded, main)
