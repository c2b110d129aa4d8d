"""The node-pair failure detector under lag on the PEER's side (raft/node/liveness.py): a peer
whose recent silences ended with a frame (it was alive, only late) gets those silences added to
its timeout, so a loaded peer is not reported down (and every group the pair shares woken) by a
silence it has already shown it survives; a peer that has shown none is reported down after
the plain timeout; the memory of a silence expires. Driven in virtual time (trio's MockClock),
frames and checks fed by hand, so every verdict is deterministic."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from raft.node.liveness import GAP_MEMORY_S, MAX_SLACK_FACTOR, NodeLiveness

PING_S, DOWN_S = 0.1, 0.5


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def detector() -> tuple[NodeLiveness, list[tuple[int, bool]]]:
    seen: list[tuple[int, bool]] = []
    d = NodeLiveness(1, ping_s=PING_S, down_s=DOWN_S, peers=lambda: (2, 3))
    d.on_change = lambda peer, up: seen.append((peer, up))
    return d, seen


async def frames_every(d: NodeLiveness, clock_step: float, count: int, peers=(2, 3)) -> None:
    for _ in range(count):
        await trio.sleep(clock_step)
        for p in peers:
            d.heard(p)


def test_a_peer_that_came_back_from_a_long_silence_gets_that_silence_as_slack() -> None:
    async def main() -> None:
        d, seen = detector()
        now = trio.current_time()
        d.check(now)  # both presumed up
        await frames_every(d, PING_S, 5)
        # Peer 2 goes quiet for 0.9 s (its loop lagged) and comes back; peer 3 keeps pinging.
        for _ in range(9):
            await trio.sleep(0.1)
            d.heard(3)
            d.check(trio.current_time())
        # 0.9 s > 0.5 s: this first silence, before anything was known of peer 2, is a down.
        assert seen == [(2, False)]
        d.heard(2)
        assert seen == [(2, False), (2, True)]
        assert abs(d.peer_slack(2, trio.current_time()) - (0.9 - PING_S)) < 1e-6
        assert d.peer_slack(3, trio.current_time()) == 0.0
        await frames_every(d, PING_S, 3)
        # The same silence again, a few seconds later: not down this time.
        for _ in range(9):
            await trio.sleep(0.1)
            d.heard(3)
            d.check(trio.current_time())
        assert seen == [(2, False), (2, True)]
        # But a peer that stays silent past the timeout plus its slack is down.
        for _ in range(5):
            await trio.sleep(0.1)
            d.heard(3)
            d.check(trio.current_time())
        assert seen == [(2, False), (2, True), (2, False)]
        assert 3 not in d.down

    run(main)


def test_a_peer_that_showed_no_silence_is_down_after_the_plain_timeout() -> None:
    async def main() -> None:
        d, seen = detector()
        d.check(trio.current_time())
        await frames_every(d, PING_S, 20)
        t0 = trio.current_time()
        for _ in range(int(4 * MAX_SLACK_FACTOR * DOWN_S / 0.05)):  # (a bound: mock time)
            if seen:
                break
            await trio.sleep(0.05)
            d.heard(3)
            d.check(trio.current_time())
        assert seen == [(2, False)]
        assert trio.current_time() - t0 <= DOWN_S + 0.05 + 1e-9

    run(main)


def test_a_silence_is_forgotten_after_the_memory_and_outages_are_not_slack() -> None:
    async def main() -> None:
        d, seen = detector()
        d.check(trio.current_time())
        await trio.sleep(0.8)
        d.heard(2)
        assert d.peer_slack(2, trio.current_time()) > 0.6
        await frames_every(d, PING_S, int(GAP_MEMORY_S / PING_S) + 5, peers=(2,))
        assert d.peer_slack(2, trio.current_time()) == 0.0
        # A silence longer than the hard cap is an outage (or a restart), not lag: no slack.
        await trio.sleep(MAX_SLACK_FACTOR * DOWN_S + 1.0)
        d.heard(2)
        assert d.peer_slack(2, trio.current_time()) == 0.0

    run(main)


def test_a_refused_connection_reports_the_peer_down_at_once_and_a_frame_brings_it_up() -> None:
    """A refused dial means no process listens at the peer's address (killed, crashed): it
    is down now, not after the timeout; only watched peers; the next frame reports it up.
    What only a timeout can judge (a dial that times out: maybe a partition) stays with it."""
    async def main() -> None:
        d, seen = detector()
        d.check(trio.current_time())
        await frames_every(d, PING_S, 3)
        d.refused(2)
        assert seen == [(2, False)] and not d.is_up(2) and d.refusals == 1
        d.refused(2)  # already down: reported once
        d.refused(9)  # not watched
        d.refused(1)  # ourselves
        assert seen == [(2, False)]
        fresh, early = detector()
        fresh.check(trio.current_time())
        fresh.refused(3)  # never heard from since we started: not started yet, no verdict
        assert early == [] and fresh.is_up(3)
        d.heard(2)
        assert seen == [(2, False), (2, True)]

    run(main)


def test_only_a_refused_dial_counts_as_refused() -> None:
    from raft.node.peer import refused

    async def dial(port: int) -> BaseException:
        try:
            await trio.open_tcp_stream("127.0.0.1", port)
        except OSError as e:
            return e
        raise AssertionError("connected")

    import socket
    with socket.socket() as s:  # bound, not listening: a port nobody answers on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert refused(trio.run(dial, port))
    assert refused(ConnectionRefusedError())
    assert not refused(TimeoutError()) and not refused(OSError("unreachable"))
    assert not refused(trio.TooSlowError())
