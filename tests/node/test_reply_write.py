"""Replies written straight into a plain socket (raft.node.client_requests.send_reply) still
go out whole: a reply the socket takes only part of is finished before any other reply starts,
whatever the reader's pace."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
import trio.testing

from raft.node.client_requests import send_reply


@dataclass
class FakeConn:
    stream: trio.abc.Stream
    send_lock: trio.Lock = field(default_factory=trio.Lock)


async def read_all(stream: trio.SocketStream, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = await stream.receive_some(65536)
        assert chunk
        got += chunk
        await trio.sleep(0)
    return bytes(got)


def test_a_partly_taken_reply_is_finished_before_the_next() -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        out, inp = trio.SocketStream(a), trio.SocketStream(b)
        conn = FakeConn(out)
        big = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the socket buffers take
        small = [bytes([i]) * 100 for i in range(1, 6)]
        received: list[bytes] = []
        async with trio.open_nursery() as nursery:
            async def reader() -> None:
                received.append(await read_all(inp, len(big) + sum(map(len, small))))
            nursery.start_soon(send_reply, conn, big)
            await trio.testing.wait_all_tasks_blocked()  # the big one waits for the reader
            assert conn.send_lock.locked()
            for s in small:
                nursery.start_soon(send_reply, conn, s)
            nursery.start_soon(reader)
        data = received[0]
        assert data[:len(big)] == big
        rest = data[len(big):]
        assert sorted(rest[i:i + 100] for i in range(0, len(rest), 100)) == small

    trio.run(main)


def test_a_small_reply_on_an_idle_socket_needs_no_lock_wait() -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        conn = FakeConn(trio.SocketStream(a))
        await send_reply(conn, b"hello")
        assert not conn.send_lock.locked()
        assert await trio.SocketStream(b).receive_some(100) == b"hello"

    trio.run(main)


def test_plain_reads_return_the_prefix_then_the_socket_and_let_others_run() -> None:
    """PrefixedStream over plain TCP reads the socket itself (raft.node.tls): the sniffed
    prefix first, then bytes as they come; a reader that always finds bytes still yields to
    the loop now and then; one cancelled while waiting has taken nothing."""
    from raft.node.tls import PLAIN_READS_PER_CHECKPOINT, PrefixedStream

    async def main() -> None:
        a, b = trio.socket.socketpair()
        writer, stream = trio.SocketStream(a), PrefixedStream(trio.SocketStream(b), b"pre")
        assert await stream.receive_some(100) == b"pre"
        await writer.send_all(b"x" * 10_000)
        ran = []

        async def other() -> None:
            ran.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            got = b""
            # (two rounds: the loop may run the reader first in the batch after its checkpoint)
            for _ in range(2 * PLAIN_READS_PER_CHECKPOINT):
                got += await stream.receive_some(10)
            assert ran, "the reader never yielded while bytes kept coming"
        with trio.move_on_after(0.05):  # virtual time: nothing more is sent
            got += await stream.receive_some(100_000)
        assert got == b"x" * 10_000
        with trio.move_on_after(0.05):
            await stream.receive_some(100)
            raise AssertionError("a read returned with nothing sent")
        await writer.send_all(b"after")
        assert await stream.receive_some(100) == b"after"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_broken_connection_is_reported_as_trio_reports_it() -> None:
    """Callers handle trio.BrokenResourceError (the client or peer went away): the direct
    write reports a broken socket the same way trio's stream does, and frees the lock."""
    async def main() -> None:
        a, b = trio.socket.socketpair()
        conn = FakeConn(trio.SocketStream(a))
        b.close()
        try:
            await send_reply(conn, b"x" * 100)
        except trio.BrokenResourceError:
            pass
        else:
            raise AssertionError("a write to a closed peer did not fail")
        assert not conn.send_lock.locked()

    trio.run(main)


def test_the_reply_writer_finishes_a_partly_taken_reply_before_the_next() -> None:
    """raft.node.reply_writer: replies written from callbacks (no waiting) queue behind a reply
    the socket took only in part, and go out whole and in order once the reader reads."""
    from raft.node.reply_writer import ReplyWriter

    async def main() -> None:
        a, b = trio.socket.socketpair()
        out, inp = trio.SocketStream(a), trio.SocketStream(b)
        big = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the socket buffers take
        small = [bytes([i]) * 100 for i in range(1, 6)]
        received: list[bytes] = []
        async with trio.open_nursery() as nursery:
            writer = ReplyWriter(out, nursery)
            writer.write(big)  # partly taken: the rest queues for the drain task
            for s in small:
                writer.write(s)  # never waits: behind it
            received.append(await read_all(inp, len(big) + sum(map(len, small))))
        assert received[0] == big + b"".join(small)

    trio.run(main)
