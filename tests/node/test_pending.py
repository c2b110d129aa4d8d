"""A group's produce waiters share one timer (raft/node/pending.py): a waiter is woken by its
answer, or unanswered once its own deadline passed (TIMEOUT), never earlier; an answered
request costs the timer nothing. Driven in virtual time (trio's MockClock)."""

from __future__ import annotations

import trio
import trio.testing

from raft.core.ready import ProduceAnswer
from raft.core.types import ErrorCode
from raft.node.pending import COMPACT_SLACK, PendingAnswers


def run(main) -> None:  # noqa: ANN001
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def wait_one(table: PendingAnswers, rid: int, timeout_s: float,
                   out: dict[int, tuple[float, ProduceAnswer | None]]) -> None:
    pending = table.add(rid, timeout_s)
    try:
        await pending.event.wait()
    finally:
        table.discard(rid)
    out[rid] = (trio.current_time(), pending.answer)


def test_unanswered_waiters_wake_at_their_own_deadline() -> None:
    async def main() -> None:
        table = PendingAnswers()
        out: dict[int, tuple[float, ProduceAnswer | None]] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(table.run_timer)
            t0 = trio.current_time()
            async with trio.open_nursery() as waiters:
                waiters.start_soon(wait_one, table, 1, 5.0, out)
                await trio.testing.wait_all_tasks_blocked()
                waiters.start_soon(wait_one, table, 2, 1.0, out)  # earlier than the timer's sleep
                waiters.start_soon(wait_one, table, 3, 3.0, out)
                await trio.testing.wait_all_tasks_blocked()
                table.answer(ProduceAnswer(3, ErrorCode.OK, 7, 7))
            nursery.cancel_scope.cancel()
        assert out[3] == (t0, ProduceAnswer(3, ErrorCode.OK, 7, 7))
        assert out[2][1] is None and out[2][0] - t0 == 1.0
        assert out[1][1] is None and out[1][0] - t0 == 5.0
        assert len(table) == 0
    run(main)


def test_answered_entries_are_swept_and_the_heap_stays_bounded() -> None:
    async def main() -> None:
        table = PendingAnswers()
        for rid in range(10 * COMPACT_SLACK):
            table.add(rid, 30.0)
            table.answer(ProduceAnswer(rid, ErrorCode.OK, rid, rid))
            table.discard(rid)
        assert len(table) == 0
        assert len(table._deadlines) <= COMPACT_SLACK + 1
    run(main)


def test_wake_all_returns_every_waiter_unanswered() -> None:
    async def main() -> None:
        table = PendingAnswers()
        out: dict[int, tuple[float, ProduceAnswer | None]] = {}
        async with trio.open_nursery() as nursery:
            for rid in (1, 2):
                nursery.start_soon(wait_one, table, rid, 60.0, out)
            await trio.testing.wait_all_tasks_blocked()
            table.wake_all()
        assert out[1][1] is None and out[2][1] is None
        assert out[1][0] < 60.0
    run(main)
