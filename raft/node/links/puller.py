"""One mirror partition's puller: the leader of a mirror partition on the sink fetches the
source partition's committed batches and appends them as MIRRORED at the source's offsets.

Progress is the mirror's own log (docs/REPLICATION.md): the puller starts at the core's
`visible_end + 1` and, after anything unexpected (a MIRROR_POSITION answer, a lost
connection, a new leader here), starts again from there. The core's position rule refuses an
append at or below `visible_end`, so a retry or a second puller can never write a duplicate.

Bootstrap: when the source's log starts past the position (retention removed what the link
had not mirrored: a paused link, the age valve), the gap is recorded in the controller first
(LinkEvent, so it is counted and never hidden) and the puller continues at the source's start.

Continuity (the anchor): before it appends after the mirror's last batch, a puller checks that
the source still holds that very batch at the same offset (same count, timestamp and bytes),
once per run and again after any failure; the fetches that follow name the source partition's
group as the check found it, so a topic deleted and recreated between two fetches (a new
group) fails the next fetch, and the check runs again. A source that lost data or was recreated (its log
ends before the mirror's: `source_behind`; or it holds other batches there: `diverged`) is
never copied after the mirror's history: the mirror is never truncated, overwritten or
continued at offsets of another history (docs/REPLICATION.md, "Disaster recovery").

The position is reported to the source as the subscription `__link.<sink cluster>.<link>` on
the source partition (what the sink has committed, in visible offsets), which the source's
retention holds like any subscription's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import trio

from raft.client.errors import (OffsetOutOfRangeError, PositionBehind, RaftlogError,
                                UnknownSubscription)
from raft.core.types import ErrorCode, Role
from raft.node.api.fetch import visible_hw
from raft.node.links.subscriptions import CAPPED_AGAIN_S, SUBS_EVERY_S, mirror_subscriptions
from raft.node.links.throttle import ByteRate
from raft.protocol.requests import Fetch

log = logging.getLogger("raftlog.links")

FETCH_MAX_BYTES = 1 << 20  # a fetch at the source's end (the long poll's answer)
FETCH_BEHIND_BYTES = 4 << 20  # a fetch while the source holds more: fewer round trips a MiB
AHEAD_REPLIES = 1  # replies fetched and waiting to be appended (plus one fetch, one append)
LONG_POLL_MS = 5_000  # an idle puller sends one fetch per long poll, nothing else
APPEND_TIMEOUT_S = 10.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0
REPORT_EVERY_S = 1.0  # the position on the source moves at most this often per partition
RUNBOOK = "see the DR runbook in docs/REPLICATION.md"
# A source behind the mirror is logged once it stays so this long: a new source leader may
# report less than its predecessor committed for a moment, which is no loss.
BEHIND_LOG_AFTER_S = 5.0


class PullState(str, Enum):
    STARTING = "starting"
    MIRRORING = "mirroring"  # fetched data and appended it
    CAUGHT_UP = "caught_up"  # nothing new on the source
    SOURCE_UNREACHABLE = "source_unreachable"
    BOOTSTRAPPING = "bootstrapping"  # recording a gap before continuing past it
    SOURCE_BEHIND = "source_behind"  # the source's log ends before the mirror's (lost data?)
    DIVERGED = "diverged"  # the source holds another batch where the mirror's last one is
    BACKPRESSURE = "backpressure"  # the sink refused for now


@dataclass(slots=True, frozen=True)
class PullSpec:
    link: str
    sink_cluster_id: str
    topic: str  # the mirror's name here
    partition: int
    group: int
    source_topic: str

    @property
    def subscription(self) -> str:
        return f"__link.{self.sink_cluster_id}.{self.link}"


@dataclass(slots=True)
class _Fetched:
    """One fetch's outcome for the appender: the reply, or the error it raised, and the
    offset the fetcher went on at (the reply's next offset)."""

    pos: int
    reply: dict[str, Any] | None
    error: Exception | None
    next_offset: int
    reserved: int  # bytes the fetch asked for: counted in ByteRate.ahead until appended
    applied: trio.Event = field(default_factory=trio.Event)


GapReporter = Callable[[PullSpec, int, int], Awaitable[None]]


class Puller:
    def __init__(self, spec: PullSpec, group: Any, client: Any, rate: ByteRate,
                 report_gap: GapReporter) -> None:
        self.spec, self.group, self.client, self.rate = spec, group, client, rate
        self.report_gap = report_gap
        self.state = PullState.STARTING
        self.source_hw = -1
        self.source_start = 0
        self.message = ""
        self.bootstraps = 0  # this node's, since the puller started (the metadata has all)
        self.bytes_per_record = 0.0
        self.behind_since: float | None = None  # wall clock when it last stopped being caught up
        self.mirrored_bytes = 0
        # The source offset up to which the puller has seen everything: past the mirrored
        # data, the source's own no-ops and control entries (subscription commits, this link's
        # among them) take offsets that never become visible batches here.
        self.seen_to = -1
        self._reported = -1  # the last position committed on the source
        self._reserved = 0  # this puller's part of rate.ahead
        self._report_at = 0.0
        self._opened = False
        self._subs_at = 0.0
        self._subs_round = 0.0
        self._capped_at: int | None = None  # the mirror's end at a round that capped a position
        self.subscriptions_set = 0  # positions copied from the source (replicated subscriptions)
        # The term of the leadership this puller serves (set when it runs). A fetch answered
        # after this node lost and regained leadership is dropped: the new term's log may
        # have lost the old term's unflushed tail, so visible_end can be below the offset the
        # fetch started at, and its batches (which the position rule allows: gaps are legal)
        # would leave a hole the source does not have. Within one term a leader's log only
        # grows, so a reply fetched in it always continues the mirror.
        self.term: int | None = None
        # Whether this run checked the anchor (the source holds the mirror's last batch);
        # cleared by every failure, so a source recreated meanwhile is caught before an append.
        self._anchored = False
        self._behind_at: float | None = None  # since when the source is behind (logged: None)
        # The source partition's group when the anchor was checked: fetches name it, so one
        # served by another incarnation of the topic (deleted and created again) fails.
        self._source_group: int | None = None

    # -- status --------------------------------------------------------------------------------
    @property
    def mirrored(self) -> int:
        return self.group.core.visible_end

    @property
    def position(self) -> int:
        """The last source offset accounted for: mirrored, or seen to hold no data."""
        return max(self.mirrored, self.seen_to)

    def status(self) -> dict[str, Any]:
        s = self.spec
        lag = max(0, self.source_hw - self.position) if self.source_hw >= 0 else 0
        lag_s = 0.0 if lag == 0 or self.behind_since is None else \
            max(0.0, time.time() - self.behind_since)
        return {"link": s.link, "topic": s.topic, "partition": s.partition,
                "source_topic": s.source_topic, "group": s.group, "state": self.state.value,
                "source_high_watermark": self.source_hw, "source_start": self.source_start,
                "mirrored_offset": self.mirrored, "lag_records": lag,
                "lag_bytes": int(lag * self.bytes_per_record), "lag_seconds": round(lag_s, 3),
                "bootstraps_here": self.bootstraps, "mirrored_bytes": self.mirrored_bytes,
                "position_reported": self._reported,
                "subscriptions_set": self.subscriptions_set, "message": self.message}

    # -- the loop ------------------------------------------------------------------------------
    def _leads(self) -> bool:
        core = self.group.core
        return (core is not None and core.role == Role.LEADER and not self.group.closing
                and (self.term is None or core.term == self.term))

    async def run(self) -> None:
        """Until this node no longer leads the partition (the manager cancels it otherwise)."""
        pause = BACKOFF_MIN_S
        core = self.group.core
        if core is not None:
            self.term = core.term  # one leadership: the manager starts a new puller for the next
        pos = self.mirrored + 1
        while self._leads():
            if self._anchored:
                pos, ok = await self._pull_from(pos)
            else:
                try:
                    ok = await self._check_anchor()
                except (RaftlogError, OSError) as e:
                    self.state, self.message, ok = PullState.SOURCE_UNREACHABLE, str(e), False
                if self.state is PullState.DIVERGED:
                    await self._hold()
                    return
                pos = self.mirrored + 1
                if ok:
                    continue  # checked: the fetch at visible_end + 1 comes next
            if not ok:
                self._anchored = False  # check the source's history again before appending
            if ok:  # resync at pos (mirrored already, a bootstrap) or the leadership ended
                pause = BACKOFF_MIN_S
                continue
            await trio.sleep(pause)  # this partition's retry pause after a failure only
            pause = min(BACKOFF_MAX_S, pause * 2)
            pos = self.mirrored + 1  # resync from the log: the only progress there is

    async def _check_anchor(self) -> bool:
        """Whether the source still holds the mirror's last batch (the anchor) as it is here;
        sets SOURCE_BEHIND (retried: a new source leader may briefly report less) or DIVERGED
        (proof of another history: held until the operator acts) otherwise. A source whose log
        starts past the anchor (retention) cannot be checked: the offsets' checks remain."""
        s = self.spec
        info = await self.client.topic(s.source_topic, refresh=True)
        if s.partition >= len(info.partitions):  # recreated with fewer partitions
            self._behind(-1)
            return False
        gid = info.partitions[s.partition].group
        self._source_group = gid if gid >= 0 else None
        anchor = self.group.last_mirrored()
        if anchor is None:
            self._anchored = True
            return True
        base = int(anchor["base_offset"])
        try:
            reply = await self.client.call(
                Fetch(base, 1, 0, group=self._source_group, topic=s.source_topic,
                      partition=s.partition),
                timeout=LONG_POLL_MS / 1000 + 10, attempt_timeout=LONG_POLL_MS / 1000 + 5)
        except OffsetOutOfRangeError as e:
            if e.start_offset is not None and int(e.start_offset) > base:
                self._anchored = True  # cut by retention: nothing left to compare with
                return True
            self._behind(e.high_watermark)
            return False
        self.source_hw = int(reply["high_watermark"])
        self.source_start = int(reply["start_offset"])
        got = (reply.get("batches") or [None])[0]
        if got is None:
            self._behind(self.source_hw)
            return False
        theirs = (int(got["base_offset"]), int(got["count"]), int(got["timestamp_ms"]),
                  bytes(got["payload"]))
        ours = (base, int(anchor["count"]), int(anchor["timestamp_ms"]), bytes(anchor["payload"]))
        if theirs == ours:
            self._anchored = True
            return True
        self.state = PullState.DIVERGED
        self.message = (f"the source holds another batch (offset {theirs[0]}, {theirs[1]} "
                        f"records) where the mirror's last one is (offset {base}, {ours[1]} "
                        f"records): the source lost data and was written again, it is not the "
                        f"history this mirror copied. The mirror is left as it is, nothing "
                        f"more is copied; {RUNBOOK} (restore the source from this mirror, or "
                        f"promote it)")
        log.error("link_diverged link=%s topic=%s partition=%d mirror_end=%d source_hw=%d: %s",
                  s.link, s.topic, s.partition, self.mirrored, self.source_hw, RUNBOOK)
        return False

    def _behind(self, hw: int | None) -> None:
        """The source's log ends before the mirror's: nothing is appended; retried."""
        if hw is not None:
            self.source_hw = int(hw)
        now = trio.current_time()
        if self.state is not PullState.SOURCE_BEHIND:
            self._behind_at = now
        if self._behind_at is not None and now - self._behind_at >= BEHIND_LOG_AFTER_S:
            self._behind_at = None  # logged once per episode
            s = self.spec
            log.warning("link_source_behind link=%s topic=%s partition=%d mirror_end=%d "
                        "source_hw=%d: the source is behind the mirror: it lost data; %s",
                        s.link, s.topic, s.partition, self.mirrored, self.source_hw, RUNBOOK)
        self.state = PullState.SOURCE_BEHIND
        self.message = (f"the source is behind the mirror: it lost data (its high watermark "
                        f"is {self.source_hw}, the mirror holds up to {self.mirrored}); nothing "
                        f"is copied until it holds the mirror's history again (a new source "
                        f"leader may report less for a moment); {RUNBOOK}")

    async def _hold(self) -> None:
        """Diverged: no more fetches while this node leads (the manager starts a new puller,
        which checks again, after a leadership change or `link pause` then `link resume`)."""
        while self._leads():
            await trio.sleep(BACKOFF_MAX_S)

    async def _pull_from(self, pos: int) -> tuple[int, bool]:
        """Fetch from `pos` on and append in order until something other than a good append
        (an error, a resync, the leadership's end): then where to go on and whether it went
        well. Fetch and append overlap: the fetcher asks for the next reply as soon as one
        arrives (one fetch in flight, its offset the previous reply's next offset), while this
        task appends the one before; at most AHEAD_REPLIES replies wait between them. The
        appends stay in fetch order, each one continuing the previous (a reply is applied only
        while the whole chain before it was appended in full), so the mirror is written
        exactly as with one step at a time."""
        send, recv = trio.open_memory_channel[_Fetched](AHEAD_REPLIES)
        result = pos, True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._fetch_ahead, pos, send)
                async with recv:
                    async for item in recv:
                        try:
                            result = await self._apply(item)
                        finally:
                            self._release(item.reserved)
                            item.applied.set()
                        if result[0] != item.next_offset or not result[1]:
                            break  # the fetcher's continuation is not where the mirror goes on
                        await self._report_position()
                        await self._mirror_subscriptions()
                    # Before the channel closes: a fetcher waiting to hand over a reply is
                    # cancelled, not failed (a closed channel raises in its sender).
                    nursery.cancel_scope.cancel()
        finally:  # what was asked for and dropped (both tasks are done): off the node's count
            self.rate.ahead -= self._reserved
            self._reserved = 0
        return result

    async def _fetch_ahead(self, pos: int, send: trio.MemorySendChannel[_Fetched]) -> None:
        """Fetch from `pos` on, each reply's next offset the next fetch's, until a failure
        (handed over too, in order) or the leadership's end. While the source has more than a
        reply held (its next offset not past its high watermark), fetches ask for
        FETCH_BEHIND_BYTES: fewer round trips per MiB when catching up. What is asked for
        counts against the node's ahead limit (ByteRate.ahead) until appended: past it, a
        fetch asks for FETCH_MAX_BYTES and waits for the append before it (no fetch ahead)."""
        s, rate = self.spec, self.rate
        behind = False
        last: _Fetched | None = None
        async with send:
            while self._leads():
                max_bytes = FETCH_MAX_BYTES
                if behind and rate.ahead + FETCH_BEHIND_BYTES <= rate.ahead_limit:
                    max_bytes = FETCH_BEHIND_BYTES
                if last is not None and not last.applied.is_set() and \
                        rate.ahead + max_bytes > rate.ahead_limit:
                    await last.applied.wait()  # over the node's limit: not ahead of it
                self._reserve(max_bytes)
                try:
                    reply = await self.client.call(
                        Fetch(pos, max_bytes, LONG_POLL_MS, group=self._source_group,
                              topic=s.source_topic, partition=s.partition),
                        timeout=LONG_POLL_MS / 1000 + 10, attempt_timeout=LONG_POLL_MS / 1000 + 5)
                except (RaftlogError, OSError) as e:
                    await send.send(_Fetched(pos, None, e, pos, max_bytes))
                    return
                batches = reply.get("batches") or []
                nxt = int(reply["next_offset"])
                if not batches:
                    nxt = max(pos, nxt)
                last = _Fetched(pos, reply, None, nxt, max_bytes)
                await rate.spend(sum(len(b["payload"]) for b in batches))
                await send.send(last)
                if not batches:  # caught up: the next fetch long-polls once this one is seen
                    await last.applied.wait()
                behind = bool(batches) and nxt <= int(reply["high_watermark"])
                pos = nxt

    def _reserve(self, nbytes: int) -> None:
        self.rate.ahead += nbytes
        self._reserved += nbytes

    def _release(self, nbytes: int) -> None:
        self.rate.ahead -= nbytes
        self._reserved -= nbytes

    async def _apply(self, item: _Fetched) -> tuple[int, bool]:
        """One fetched reply (or the fetch's failure), appended: where to go on, and whether
        it went well."""
        pos, e = item.pos, item.error
        if e is not None:
            if isinstance(e, OffsetOutOfRangeError):
                return await self._out_of_range(pos, e)
            self.state, self.message = PullState.SOURCE_UNREACHABLE, str(e)
            return pos, False
        reply = item.reply
        assert reply is not None
        self.source_hw = int(reply["high_watermark"])
        self.source_start = int(reply["start_offset"])
        self.message = ""
        batches = reply.get("batches") or []
        if not batches:
            nxt = item.next_offset
            if self.mirrored < nxt:
                self.seen_to = max(self.seen_to, nxt - 1)
            self._caught_up_check()
            self.state = PullState.CAUGHT_UP if self.position >= self.source_hw else \
                PullState.MIRRORING
            return nxt, True
        size = sum(len(b["payload"]) for b in batches)
        if not self._leads():
            return pos, True
        done = await self.group.append_mirrored(batches, APPEND_TIMEOUT_S)
        if done.error == ErrorCode.OK:
            self.state, self.message = PullState.MIRRORING, ""
            records = sum(int(b["count"]) for b in batches[:done.appended])
            if records:
                self.bytes_per_record = size / max(1, sum(int(b["count"]) for b in batches))
            self.mirrored_bytes += size
            nxt = done.visible_end + 1
            if done.appended == len(batches):
                nxt = max(nxt, item.next_offset)
                self.seen_to = max(self.seen_to, nxt - 1)
            self._caught_up_check()
            if self.position >= self.source_hw:
                self.state = PullState.CAUGHT_UP
            return nxt, True
        if done.error == ErrorCode.MIRROR_POSITION:  # mirrored already: resume after it
            return done.visible_end + 1, True
        if done.error in (ErrorCode.NOT_LEADER, ErrorCode.LEADERSHIP_LOST,
                          ErrorCode.SHUTTING_DOWN):
            return pos, True  # the loop ends: no longer the leader here
        self.state, self.message = PullState.BACKPRESSURE, f"{done.error.name}: {done.message}"
        return pos, False

    def _caught_up_check(self) -> None:
        if self.position >= self.source_hw:
            self.behind_since = None
        elif self.behind_since is None:
            self.behind_since = time.time()

    async def _out_of_range(self, pos: int, e: OffsetOutOfRangeError) -> tuple[int, bool]:
        start, hw = e.start_offset, e.high_watermark
        if hw is not None:
            self.source_hw = int(hw)
        if start is not None and pos < int(start):
            try:
                start = await self._leaders_start(pos)
            except (RaftlogError, OSError) as err:
                self.message = (f"the source answered that its log starts past {pos}; asking "
                                f"its leader failed ({err}), retrying")
                return pos, False
        if start is not None and pos < int(start):
            self.state = PullState.BOOTSTRAPPING
            self.message = (f"the source's log starts at {start}, past the mirror's position "
                            f"{pos}: offsets {pos}..{int(start) - 1} are lost to the mirror")
            log.warning("link_bootstrap link=%s topic=%s partition=%d gap_from=%d gap_to=%d",
                        self.spec.link, self.spec.topic, self.spec.partition, pos,
                        int(start) - 1)
            try:
                await self.report_gap(self.spec, pos, int(start) - 1)
            except Exception as err:  # not recorded: do not continue past the gap yet
                self.message += f"; recording the gap failed ({err}), retrying"
                return pos, False
            self.bootstraps += 1
            self.source_start = int(start)
            return int(start), True
        self._behind(hw)
        return pos, False

    async def _leaders_start(self, pos: int) -> int | None:
        """The source partition's log start as its leader has it, when that is past `pos`
        (None: the leader still holds `pos`, or no leader is known yet). Each replica cuts
        its own log, and a follower (which serves fetches too) may have cut further than the
        leader: only the leader's start says what the mirror lost. The pinned fetch also
        points the client's route back at the leader."""
        s = self.spec
        info = await self.client.topic(s.source_topic, refresh=True)
        if s.partition >= len(info.partitions) or not info.partitions[s.partition].leader_address:
            return None
        try:
            await self.client.call(
                Fetch(pos, 1, 0, group=self._source_group, topic=s.source_topic,
                      partition=s.partition),
                server=info.partitions[s.partition].leader_address, timeout=10)
        except OffsetOutOfRangeError as e:
            return None if e.start_offset is None else int(e.start_offset)
        return None

    async def _mirror_subscriptions(self) -> None:
        """Copy the source partition's subscription positions (raft/node/links/
        subscriptions.py), at most once a SUBS_EVERY_S; after a round that capped a position
        (the mirror behind it), again once the mirror's committed end moved, at most once a
        CAPPED_AGAIN_S (a caught-up mirror carries the positions promptly; an idle one whose
        source positions sit past its end on the source's own no-ops costs nothing more)."""
        now = trio.current_time()
        if getattr(self.group, "subs", None) is None:
            return
        end = visible_hw(self.group)
        due = now >= self._subs_at or (self._capped_at is not None and end > self._capped_at
                                       and now >= self._subs_round + CAPPED_AGAIN_S)
        if not due:
            return
        self._subs_at, self._subs_round = now + SUBS_EVERY_S, now
        s = self.spec
        try:
            done, capped = await mirror_subscriptions(self.client, self.group, s.source_topic,
                                                      s.partition)
            self.subscriptions_set += done
            self._capped_at = end if capped else None
        except (RaftlogError, OSError) as e:
            log.info("link_subscriptions_failed link=%s topic=%s partition=%d error=%s",
                     s.link, s.topic, s.partition, e)

    async def _report_position(self) -> None:
        """Commit what the sink has committed to the source's link subscription (at most once
        a REPORT_EVERY_S, only when it moved); failures are retried at the next report. Only
        the committed data's end: the source offsets seen to hold none past it (no-ops,
        control entries, this very commit) are not in the mirror's log, so a later puller
        (resumed, or on a new leader) starts before them; had the source cut them on the
        report's word, that puller would record a bootstrap of offsets that lost nothing."""
        position = visible_hw(self.group) + 1
        now = trio.current_time()
        if position <= self._reported or now < self._report_at:
            return
        self._report_at = now + REPORT_EVERY_S
        s = self.spec
        try:
            if not self._opened:
                await self.client.subscription_open(s.subscription, start=position,
                                                    topic=s.source_topic, partition=s.partition)
                self._opened = True
            await self.client.subscription_commit(s.subscription, position,
                                                  topic=s.source_topic, partition=s.partition)
            self._reported = position
        except UnknownSubscription:
            self._opened = False  # expired or deleted on the source: open it again next time
        except PositionBehind:
            self._reported = position  # the source holds a later one already
        except (RaftlogError, OSError) as e:
            log.info("link_position_report_failed link=%s topic=%s partition=%d error=%s",
                     s.link, s.topic, s.partition, e)
