"""The recovery token bucket against a fake clock (no sleeps, no wall clock)."""

from __future__ import annotations

import pytest

from recovery.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drain(bucket: TokenBucket, clock: FakeClock, chunks: list[int]) -> float:
    """Send chunks as fast as the bucket allows; return the simulated time taken."""
    for n in chunks:
        d = bucket.delay_for(n)
        clock.t += d
        assert bucket.delay_for(n) == pytest.approx(0.0, abs=1e-9)
        bucket.take(n)
    return clock.t


def test_long_run_rate_matches_the_limit() -> None:
    clock = FakeClock()
    b = TokenBucket(10 << 20, 1 << 20, clock)
    took = drain(b, clock, [512 << 10] * 200)  # 100 MiB
    # The first MiB rides the burst; the other 99 MiB take 9.9 s at 10 MiB/s.
    assert took == pytest.approx(99 / 10, rel=0.01)


def test_burst_is_available_after_idle_but_not_more() -> None:
    clock = FakeClock()
    b = TokenBucket(1 << 20, 4 << 20, clock)
    drain(b, clock, [4 << 20])
    clock.t += 100.0  # a long idle refills only up to the burst
    start = clock.t
    assert drain(b, clock, [4 << 20]) == start
    assert b.delay_for(1 << 20) == pytest.approx(1.0)


def test_chunk_bigger_than_burst_still_goes_and_pays_later() -> None:
    clock = FakeClock()
    b = TokenBucket(1 << 20, 256 << 10, clock)
    assert b.delay_for(1 << 20) == 0.0  # full bucket: an oversized chunk may go
    b.take(1 << 20)
    # It took 1 MiB against a 256 KiB bucket: the next 256 KiB waits ~1 s.
    assert b.delay_for(256 << 10) == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize("rate, burst", [(0, 1), (-1, 1), (1, 0)])
def test_bad_settings_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst, FakeClock())
