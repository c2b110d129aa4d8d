"""A puller's anchor (raft/node/links/puller.py, docs/REPLICATION.md "Disaster recovery"): a
source that lost data or was recreated is never copied after the mirror's history.

- A source whose log ends before the mirror's is `source_behind`: nothing is appended, the
  puller retries, and once the source holds the mirror's history again (restored from this
  very mirror) it continues at the right offsets.
- A source that holds another batch where the mirror's last one is (recreated and written
  again, past the mirror's end) is `diverged`: nothing is appended, and the puller stops
  fetching, also when the source is recreated while the puller runs (it checks again after
  every failure).
- A source whose log starts past the anchor (retention) cannot be compared: the puller goes on.
- A source behind is logged once it lasted BEHIND_LOG_AFTER_S (not a new leader's moment).
- The position reported to the source is the mirror's committed end, not the source offsets
  seen to hold no data (a later puller would count those as a bootstrap's gap).

Scripted source and the fake mirror of test_link_puller, on trio's virtual clock.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from raft.client.errors import OffsetOutOfRangeError, RaftlogError
from raft.node.links.puller import Puller, PullState
from raft.node.links.throttle import ByteRate
from test_link_puller import SPEC, Mirror


class History:
    """One source partition's history: batches (base, count), their bytes, its log start, and
    the group of that incarnation of the topic (another for each history: a recreated topic
    is a new group)."""

    groups = itertools.count(100)

    def __init__(self, batches: list[tuple[int, int]], fill: bytes = b"x", start: int = 0,
                 hw: int | None = None):
        self.batches, self.fill, self.start = batches, fill, start
        self.group = next(History.groups)
        self.hw = max((b + c - 1 for b, c in batches), default=-1) if hw is None else hw


class Source:
    """A source partition whose history the test swaps (`then`: after that many fetches, the
    next history, or an exception raised once). An empty fetch long-polls on the clock."""

    def __init__(self, history: History, then: list[tuple[int, Any]] | None = None) -> None:
        self.history, self.then = history, list(then or [])
        self.fetched: list[int] = []
        self.commits: list[int] = []  # the link's position reports
        self.states: list[PullState] = []
        self.puller: Puller | None = None

    async def call(self, request: Any, **kw: Any) -> dict:
        if self.puller is not None:
            self.states.append(self.puller.state)
        self.fetched.append(request.offset)
        if self.then and len(self.fetched) > self.then[0][0]:
            _, nxt = self.then.pop(0)
            if isinstance(nxt, Exception):
                raise nxt
            self.history = nxt
        h, offset = self.history, request.offset
        if request.group is not None and request.group != h.group:
            raise RaftlogError(f"group {request.group} does not run here", code="BAD_REQUEST")
        if offset < h.start or offset > h.hw + 1:
            raise OffsetOutOfRangeError("out of range", code="OFFSET_OUT_OF_RANGE",
                                        details={"start_offset": h.start,
                                                 "high_watermark": h.hw})
        out = [{"base_offset": b, "count": c, "timestamp_ms": b, "payload": h.fill * c}
               for b, c in h.batches if b + c - 1 >= offset][:2]
        if out:
            nxt = out[-1]["base_offset"] + out[-1]["count"]
        elif offset <= h.hw:
            nxt = h.hw + 1  # offsets holding no data (the source's no-ops), skipped
        else:
            nxt = offset
            if request.max_wait_ms:
                await trio.sleep(request.max_wait_ms / 1000)  # the long poll
        return {"batches": out, "high_watermark": h.hw, "start_offset": h.start,
                "next_offset": nxt}

    async def topic(self, name: str, **kw: Any) -> Any:
        return SimpleNamespace(partitions=[SimpleNamespace(group=self.history.group,
                                                          leader_address="source")])

    async def subscription_open(self, name: str, **kw: Any) -> dict:
        return {}

    async def subscription_commit(self, name: str, position: int, **kw: Any) -> dict:
        self.commits.append(position)
        return {}


def pull(mirror: Mirror, source: Source, seconds: float = 60) -> Puller:
    """Run a puller for `seconds` of virtual time."""
    mirror.core.role = mirror.core.role.LEADER

    async def no_gap(*args: Any) -> None:
        raise AssertionError("no bootstrap expected")

    puller = Puller(SPEC, mirror, source, ByteRate(0), no_gap)
    source.puller = puller

    async def main() -> None:
        with trio.move_on_after(seconds):
            await puller.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return puller


ORIGINAL = [(0, 2), (2, 2)]


def mirrored_original() -> Mirror:
    mirror = Mirror()
    pull(mirror, Source(History(ORIGINAL)), 1)
    assert mirror.appended == ORIGINAL
    return mirror


def test_a_source_recreated_past_the_mirrors_end_is_diverged_and_never_copied() -> None:
    mirror = mirrored_original()
    other = Source(History([(0, 2), (2, 2), (4, 3), (7, 1)], fill=b"y"))  # written again
    puller = pull(mirror, other)
    assert puller.state is PullState.DIVERGED, puller.status()
    assert mirror.appended == ORIGINAL
    assert other.fetched == [2]  # the anchor only: then no more fetches
    assert "DR runbook in docs/REPLICATION.md" in puller.message


def test_a_source_recreated_while_the_puller_runs_is_caught_before_an_append() -> None:
    """The source's topic is deleted under a running puller (its fetch fails) and recreated
    with other batches past the mirror's end: the puller checks the anchor again first."""
    mirror = mirrored_original()
    other = History([(0, 1), (1, 1), (2, 2), (4, 4)], fill=b"y")
    source = Source(History(ORIGINAL), then=[
        (2, RaftlogError("UNKNOWN_TOPIC: no topic 'orders'", code="UNKNOWN_TOPIC")),
        (2, other)])
    puller = pull(mirror, source)
    assert puller.state is PullState.DIVERGED, puller.status()
    assert mirror.appended == ORIGINAL


def test_a_source_behind_the_mirror_is_left_alone_until_restored_then_continues() -> None:
    """The source lost the topic (recreated empty): `source_behind`, nothing appended. It is
    restored from this mirror (the same batches) and written again: the mirror goes on."""
    mirror = mirrored_original()
    restored = History(ORIGINAL + [(4, 3)])
    source = Source(History([]), then=[(6, History([(0, 2)])), (4, restored)])
    puller = pull(mirror, source)
    assert PullState.SOURCE_BEHIND in source.states
    assert mirror.appended == ORIGINAL + [(4, 3)], puller.status()
    assert puller.state is PullState.CAUGHT_UP


def test_an_anchor_cut_by_the_sources_retention_is_not_compared() -> None:
    mirror = mirrored_original()
    source = Source(History([(4, 3)], start=4))
    pull(mirror, source)
    assert mirror.appended == ORIGINAL + [(4, 3)]


def test_the_reported_position_is_the_mirrors_committed_end_not_the_offsets_seen() -> None:
    """Source offsets 6..8 hold no data (its no-ops, control entries). Reported as the link's
    position, the source could cut them; a later puller (resumed, a new leader) starts at the
    mirror's end + 1 = 6 and would record a bootstrap of offsets that lost nothing."""
    mirror = Mirror()
    source = Source(History([(0, 2), (5, 1)], hw=8))
    puller = pull(mirror, source, 30)
    assert mirror.appended == [(0, 2), (5, 1)] and puller.status()["lag_records"] == 0
    assert source.commits and max(source.commits) == 6, source.commits


def test_a_source_behind_is_logged_once_it_lasts(caplog: Any) -> None:
    """A new source leader may report less than its predecessor committed for a moment: only
    a source behind for BEHIND_LOG_AFTER_S is logged, once."""
    caplog.set_level("WARNING", logger="raftlog.links")
    mirror = mirrored_original()
    puller = pull(mirror, Source(History([])), 3)
    assert puller.state is PullState.SOURCE_BEHIND and not caplog.records
    pull(mirror, Source(History([])), 60)
    [record] = [r for r in caplog.records if "link_source_behind" in r.getMessage()]
    assert "DR runbook in docs/REPLICATION.md" in record.getMessage()


def test_a_source_recreated_between_two_fetches_is_caught_before_an_append() -> None:
    """The topic is deleted and recreated, with other batches past the mirror's end, between
    two fetches that both succeed: the fetch names the source group the anchor was checked
    on, so the new incarnation's answer is refused and the anchor checked again."""
    mirror = mirrored_original()
    other = History([(0, 1), (1, 1), (2, 2), (4, 4)], fill=b"y")
    source = Source(History(ORIGINAL), then=[(3, other)])
    puller = pull(mirror, source)
    assert puller.state is PullState.DIVERGED, puller.status()
    assert mirror.appended == ORIGINAL
