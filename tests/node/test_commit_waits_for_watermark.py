"""A subscription commit past the high watermark waits (bounded) while the leader does not yet
know the watermark, instead of failing the consumer (raft/node/api/subscribe.py `_hw_reaching`).

Found in CI: every node restarted, the consumer committed position 27 (read before the restart)
to the new leader before an entry of its term had committed; the leader's watermark was still
-1, and the commit was refused with POSITION_PAST_HIGH_WATERMARK, a permanent error.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from raft.node.api import subscribe
from storage.api import OffsetOutOfRange


class FakeLog:
    def __init__(self, terms: dict[int, int]) -> None:
        self.terms = terms

    def term_at(self, offset: int) -> int:
        if offset not in self.terms:
            raise OffsetOutOfRange(offset, 0, max(self.terms))
        return self.terms[offset]


class FakeGroup:
    """What `_hw_reaching` looks at: leadership, the core's commit index and term, the log."""

    def __init__(self) -> None:
        self.translated = False
        self.loads = None
        self.leader = True
        self.core = SimpleNamespace(high_watermark=-1, commit_index=-1, term=3,
                                    log=FakeLog({i: 2 for i in range(30)} | {30: 3}))
        self.moved = trio.Event()

    def is_leader(self) -> bool:
        return self.leader

    async def wait_hw_change(self) -> None:
        await self.moved.wait()
        self.moved = trio.Event()

    def commit(self, offset: int) -> None:
        self.core.high_watermark = self.core.commit_index = offset
        self.moved.set()


def run(fn: Any) -> Any:
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_new_leader_is_waited_for_until_its_term_commits() -> None:
    async def main() -> tuple[int, float]:
        group = FakeGroup()
        ctx = SimpleNamespace(group=group)
        async with trio.open_nursery() as n:
            async def elect_then_commit() -> None:
                await trio.sleep(0.3)
                group.commit(30)  # the new leader's first entry (term 3) commits
            n.start_soon(elect_then_commit)
            t0 = trio.current_time()
            hw = await subscribe._hw_reaching(ctx, 26, 10.0)
            return hw, trio.current_time() - t0

    hw, waited = run(main)
    assert hw == 30 and 0.3 <= waited < subscribe.HW_WAIT_S


def test_a_leader_that_knows_its_watermark_answers_at_once() -> None:
    async def main() -> tuple[int, float]:
        group = FakeGroup()
        group.core.high_watermark = group.core.commit_index = 30  # committed in its term
        t0 = trio.current_time()
        hw = await subscribe._hw_reaching(SimpleNamespace(group=group), 40, 10.0)
        return hw, trio.current_time() - t0

    assert run(main) == (30, 0)  # past the watermark: refused by the caller, without a wait


def test_the_wait_is_bounded() -> None:
    async def main() -> tuple[int, float]:
        group = FakeGroup()  # never commits
        t0 = trio.current_time()
        hw = await subscribe._hw_reaching(SimpleNamespace(group=group), 26, 10.0)
        return hw, trio.current_time() - t0

    hw, waited = run(main)
    assert hw == -1 and waited == subscribe.HW_WAIT_S
