"""One mirror partition's puller (raft/node/links/puller.py) against a scripted source and a
fake mirror group that applies the core's position rule: batches land at the source's
offsets, gaps of the source kept; a MIRROR_POSITION answer resyncs from the mirror's log; a
bootstrap records the gap before anything past it is appended, and not at all while the
record fails; a mirror ahead of its source is reported source_behind and written nothing; a reply
fetched under a leadership this node since lost and regained is dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from raft.client.errors import OffsetOutOfRangeError
from raft.core.types import ErrorCode, Role
from raft.node.links.puller import (FETCH_BEHIND_BYTES, FETCH_MAX_BYTES, Puller, PullSpec,
                                     PullState)
from raft.node.links.throttle import ByteRate

SPEC = PullSpec("dr", "sink", "orders", 0, 7, "orders")


class Mirror:
    """A mirror group: the position rule, leader until told otherwise."""

    def __init__(self, visible_end: int = -1) -> None:
        self.core = SimpleNamespace(role=Role.LEADER, term=1, visible_end=visible_end,
                                    high_watermark=visible_end)
        self.closing, self.loads, self.translated = False, None, False
        self.appended: list[tuple[int, int]] = []
        self.events: list[Any] = []
        self.refuse_next_at: int | None = None  # answer MIRROR_POSITION with this visible end
        self.gate: Any = None  # awaited before each append (an async callable)

    async def append_mirrored(self, batches: list[dict], timeout_s: float) -> Any:
        if self.gate is not None:
            await self.gate()
        if self.refuse_next_at is not None:
            end, self.refuse_next_at = self.refuse_next_at, None
            self.core.visible_end = self.core.high_watermark = end
            return SimpleNamespace(error=ErrorCode.MIRROR_POSITION, visible_end=end,
                                   appended=0, message="")
        for b in batches:
            assert b["base_offset"] > self.core.visible_end, "position rule"
            self.appended.append((b["base_offset"], b["count"]))
            self.events.append(("append", b["base_offset"]))
            self.core.visible_end = self.core.high_watermark = b["base_offset"] + b["count"] - 1
        return SimpleNamespace(error=ErrorCode.OK, visible_end=self.core.visible_end,
                               appended=len(batches), message="")

    def last_mirrored(self) -> dict | None:
        """The anchor: the last batch appended, as the Source below makes batches (none
        known for a visible end set up front)."""
        if not self.appended:
            return None
        base, count = self.appended[-1]
        return {"base_offset": base, "count": count, "timestamp_ms": base,
                "payload": b"x" * count}


class Source:
    """Scripted source partition: batches (base, count), its log start and high watermark.
    Once the mirror holds everything, the mirror's leadership ends (the puller returns)."""

    def __init__(self, mirror: Mirror, batches: list[tuple[int, int]], start: int = 0) -> None:
        self.mirror, self.batches, self.start = mirror, batches, start
        self.hw = max((b + c - 1 for b, c in batches), default=-1)
        self.fetched: list[int] = []
        self.max_bytes: list[int] = []
        self.fetch_seen = trio.Event()  # set at every fetch (replaced after)
        self.commits: list[int] = []

    async def call(self, request: Any, **kw: Any) -> dict:
        offset = request.offset
        self.fetched.append(offset)
        self.max_bytes.append(request.max_bytes)
        self.fetch_seen.set()
        self.fetch_seen = trio.Event()
        if offset < self.start or offset > self.hw + 1:
            raise OffsetOutOfRangeError("out of range", code="OFFSET_OUT_OF_RANGE",
                                        details={"start_offset": self.start,
                                                 "high_watermark": self.hw})
        out = [{"base_offset": b, "count": c, "timestamp_ms": b, "payload": b"x" * c}
               for b, c in self.batches if b + c - 1 >= offset][:2]
        if not out and self.mirror.core.visible_end >= self.hw:
            self.mirror.core.role = Role.FOLLOWER  # done: end the run
        return {"batches": out, "high_watermark": self.hw, "start_offset": self.start,
                "next_offset": out[-1]["base_offset"] + out[-1]["count"] if out else offset}

    async def subscription_open(self, name: str, **kw: Any) -> dict:
        return {}

    async def subscription_commit(self, name: str, position: int, **kw: Any) -> dict:
        self.commits.append(position)
        return {}

    async def topic(self, name: str, **kw: Any) -> Any:
        """The source partition's group (one incarnation of the topic here)."""
        return SimpleNamespace(partitions=[SimpleNamespace(group=1, leader_address="source")])


def run(mirror: Mirror, source: Source, report_gap: Any = None,
        rate: ByteRate | None = None) -> Puller:
    async def no_gap(spec: PullSpec, a: int, b: int) -> None:
        raise AssertionError("no bootstrap expected")

    puller = Puller(SPEC, mirror, source, rate or ByteRate(0), report_gap or no_gap)

    async def main() -> None:
        with trio.fail_after(600):
            await puller.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return puller


def test_batches_land_at_the_source_offsets_with_its_gaps() -> None:
    mirror = Mirror()
    source = Source(mirror, [(0, 2), (3, 1), (5, 4), (12, 1)])
    puller = run(mirror, source)
    assert mirror.appended == source.batches
    assert puller.status()["lag_records"] == 0
    assert source.commits and source.commits[-1] <= 13


def test_a_mirror_position_answer_resyncs_from_the_log() -> None:
    mirror = Mirror()
    source = Source(mirror, [(0, 2), (3, 1), (5, 4)])
    mirror.refuse_next_at = 3  # another puller (a stale leader) got there first
    run(mirror, source)
    assert mirror.appended == [(5, 4)]
    assert source.fetched[:2] == [0, 4]


def test_a_bootstrap_records_the_gap_before_going_past_it() -> None:
    mirror = Mirror(visible_end=1)
    source = Source(mirror, [(10, 2), (12, 1)], start=10)
    failures = [RuntimeError("controller unreachable")] * 2

    async def report(spec: PullSpec, a: int, b: int) -> None:
        mirror.events.append(("gap", a, b))
        if failures:
            raise failures.pop()

    puller = run(mirror, source, report)
    assert mirror.events[:3] == [("gap", 2, 9)] * 3  # not past it while unrecorded
    assert mirror.events[3:] == [("append", 10), ("append", 12)]
    assert puller.bootstraps == 1


def test_a_followers_further_cut_is_no_gap_while_the_leader_holds_the_position() -> None:
    """Each source replica cuts its own log, and followers serve fetches: a follower whose log
    starts past the mirror's position says nothing of what is lost while the partition's
    leader still holds it. The puller asks the leader before recording a bootstrap (CI: a
    paused link resumed against a follower recorded a gap of offsets the leader held)."""
    mirror = Mirror(visible_end=1)
    source = Source(mirror, [(0, 2), (2, 3), (5, 1)])
    follower_says_start = [5]  # the first fetch after the pause lands on a follower

    async def call(request: Any, **kw: Any) -> dict:
        if follower_says_start and kw.get("server") is None:
            raise OffsetOutOfRangeError("out of range", code="OFFSET_OUT_OF_RANGE", details={
                "start_offset": follower_says_start.pop(), "high_watermark": source.hw})
        return await Source.call(source, request, **kw)

    async def report(spec: PullSpec, a: int, b: int) -> None:
        mirror.events.append(("gap", a, b))

    source.call = call  # type: ignore[method-assign]
    puller = run(mirror, source, report)
    assert ("gap", 2, 4) not in mirror.events and puller.bootstraps == 0
    assert mirror.appended == [(2, 3), (5, 1)]


def test_a_mirror_ahead_of_its_source_is_source_behind_and_left_alone() -> None:
    mirror = Mirror(visible_end=5)
    source = Source(mirror, [(0, 2)])
    puller = Puller(SPEC, mirror, source, ByteRate(0), None)  # type: ignore[arg-type]

    async def main() -> None:
        with trio.move_on_after(30):
            await puller.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert puller.state is PullState.SOURCE_BEHIND and mirror.appended == []
    assert "the source is behind the mirror: it lost data" in puller.message
    assert "DR runbook in docs/REPLICATION.md" in puller.message


def test_replicated_subscriptions_never_ahead_of_the_mirror() -> None:
    from raft.node.links.subscriptions import planned
    rows = [{"name": "ahead", "position": 50}, {"name": "behind", "position": 7},
            {"name": "same", "position": 9}, {"name": "__link.x.dr", "position": 3},
            {"name": "moved_back", "position": 2}]
    have = {"same": 9, "moved_back": 8}
    assert planned(rows, have, cap=20) == [("ahead", 20), ("behind", 7), ("moved_back", 2)]


def test_a_reply_fetched_under_an_earlier_leadership_is_dropped() -> None:
    """The node lost leadership while the fetch was out and led again (term 1 -> 3) with the old
    term's unflushed tail gone (visible end 3 -> 1): the reply's batches from 4 on would leave
    offsets 2..3 out for good (the position rule allows gaps). The puller serves one term: it
    ends, and the manager starts a new one from the new term's log."""
    mirror = Mirror(visible_end=3)
    source = Source(mirror, [(0, 2), (2, 2), (4, 2)])
    real_call = source.call

    async def call(request: Any, **kw: Any) -> dict:
        reply = await real_call(request, **kw)
        mirror.core.term, mirror.core.visible_end = 3, 1
        return reply

    source.call = call  # type: ignore[method-assign]
    puller = run(mirror, source)
    assert mirror.appended == [] and puller.term == 1
    # The next puller (the manager's, for term 3) starts from the log: nothing is skipped.
    source.call = real_call  # type: ignore[method-assign]
    run(mirror, source)
    assert mirror.appended == [(2, 2), (4, 2)]


def test_the_next_fetch_goes_out_while_an_append_waits() -> None:
    """Fetch and append overlap (the catch-up's round trip per reply, docs/PERFORMANCE.md):
    each append here waits until the puller has asked the source for the reply after it.
    Without the fetch-ahead it would wait for good (the run's time bound fails the test).
    While the source holds more than a reply, fetches ask for the larger size."""
    mirror = Mirror()
    source = Source(mirror, [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2), (10, 2)])

    async def after_the_next_fetch() -> None:
        at = mirror.core.visible_end + 1  # where the reply being appended starts
        while at < 8 and max(source.fetched) <= at:  # the last reply (8..11) has none after it
            await source.fetch_seen.wait()

    mirror.gate = after_the_next_fetch
    rate = ByteRate(0)
    puller = run(mirror, source, rate=rate)
    assert mirror.appended == source.batches
    assert source.fetched[:3] == [0, 4, 8]
    assert source.max_bytes[0] == FETCH_MAX_BYTES and source.max_bytes[1] == FETCH_BEHIND_BYTES
    assert puller.status()["lag_records"] == 0
    assert rate.ahead == 0  # every byte counted ahead was given back


def test_past_the_nodes_ahead_limit_a_puller_fetches_after_each_append() -> None:
    """Fetching ahead costs memory (replies held before their append): node-wide, what the
    pullers asked for ahead is bounded (ByteRate.ahead_limit). Past it a puller fetches as
    before: 1 MiB at a time, each fetch after the previous reply's append."""
    mirror = Mirror()
    source = Source(mirror, [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2), (10, 2)])
    fetches_at_append: list[int] = []

    async def count() -> None:
        fetches_at_append.append(len(source.fetched))

    mirror.gate = count
    rate = ByteRate(0)
    rate.ahead_limit = FETCH_MAX_BYTES  # one fetch's worth: never one ahead of an append
    run(mirror, source, rate=rate)
    assert mirror.appended == source.batches
    assert fetches_at_append == [1, 2, 3]  # reply k appended when k fetches had gone out
    assert set(source.max_bytes) == {FETCH_MAX_BYTES}
    assert rate.ahead == 0


def test_a_resync_drops_the_reply_fetched_ahead() -> None:
    """The first append answers MIRROR_POSITION (another puller mirrored up to 5 meanwhile)
    after the puller fetched 4..7 ahead: that reply is dropped and the puller resyncs at 6
    from the log, never appending at or below the visible end (the fake asserts the rule)."""
    mirror = Mirror()
    source = Source(mirror, [(0, 2), (2, 2), (4, 2), (6, 2)])
    first = True

    async def refuse_after_the_next_fetch() -> None:
        nonlocal first
        if first:
            first = False
            while max(source.fetched) == 0:
                await source.fetch_seen.wait()
            mirror.refuse_next_at = 5

    mirror.gate = refuse_after_the_next_fetch
    run(mirror, source)
    assert mirror.appended == [(6, 2)]
    assert source.fetched[:2] == [0, 4] and 6 in source.fetched[2:]
