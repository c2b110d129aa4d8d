"""The node-wide link throttle (raft/node/links/throttle.py), on trio's virtual clock: over a
long run the pullers together receive no more than the rate (plus the burst)."""

from __future__ import annotations

import trio
import trio.testing

from raft.node.links.throttle import BURST_S, ByteRate


def test_pullers_together_stay_under_the_rate() -> None:
    rate = ByteRate(1000.0)

    async def main() -> float:
        start = trio.current_time()

        async def puller() -> None:
            for _ in range(50):
                await rate.spend(100)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(puller)
        return trio.current_time() - start

    elapsed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # 20,000 bytes at 1,000 B/s, less what the full bucket let through at once.
    assert elapsed >= (20_000 - 1000 * BURST_S) / 1000 - 1e-6


def test_unlimited_never_waits() -> None:
    rate = ByteRate(0)

    async def main() -> float:
        start = trio.current_time()
        for _ in range(100):
            await rate.spend(1 << 20)
        return trio.current_time() - start

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == 0
