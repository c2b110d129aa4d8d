"""A mirror partition's group API (issue 30, docs/REPLICATION.md): what the link runtime calls
on the sink's leader, and what makes a mirror read-only while a link feeds it.

RaftGroup mixes this in. `translated` is set before the core starts (the reconciler creates the
groups of a topic with an origin with it, and it is never cleared: RaftConfig.translated);
`write_refusal` is set and cleared by the link runtime from the metadata while the topic is an
active mirror. `append_mirrored` proposes a source fetch reply's batches in order as MIRRORED
batches with leader acks, and stops at the first the core did not place: a later one placed
after a refused one would leave a gap the source never had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raft.core.types import Acks, ErrorCode
from raft.node.pending import Pending
from storage.api import OffsetOutOfRange
from storage.mirrored import (MalformedTag, decode_tag, find, mirrored, records_of, run_sync,
                              visible_last)
from storage.records import MalformedRecords, check_records

if TYPE_CHECKING:
    from raft.core.raft import RaftCore


@dataclass(slots=True)
class MirrorAppend:
    """What `append_mirrored` did: `appended` batches placed (the first ones given), then
    `error` for the next (OK when all were placed); `visible_end` is the mirror's visible end
    now, where the link goes on (visible_end + 1) after MIRROR_POSITION, NOT_LEADER or
    BACKPRESSURE."""

    error: ErrorCode
    visible_end: int
    appended: int
    message: str = ""


class MirrorGroup:
    """The mirror half of RaftGroup (raft/node/group.py provides core, closing, kick and the
    pending answers (`_pending`, `_request_ids`) its Ready loop routes)."""

    # A mirror partition: offsets on the wire are visible offsets (storage/mirrored.py).
    translated: bool = False
    # While a link feeds the mirror: why client writes are refused (MIRROR_READ_ONLY), with
    # what to run (`raftlog topic promote T`). None: writes are taken.
    write_refusal: str | None = None
    # Reads in visible offsets: the group's small caches (raft.node.mirror_reads.MirrorCache).
    mirror_cache: Any = None

    async def append_mirrored(self, batches: list[dict[str, Any]],
                              timeout_s: float) -> MirrorAppend:
        """Propose source batches (`base_offset`, `count`, `timestamp_ms`, `payload`) in
        order as MIRRORED at their visible base offsets, with leader acks."""
        core: RaftCore | None = self.core  # type: ignore[attr-defined]
        if core is None or self.closing:  # type: ignore[attr-defined]
            return MirrorAppend(ErrorCode.SHUTTING_DOWN, -1, 0, "the group is not running")
        if not self.translated:
            return MirrorAppend(ErrorCode.BAD_REQUEST, core.visible_end, 0,
                                "this group is not a mirror partition")
        try:
            made = [mirrored(int(b["base_offset"]), int(b["count"]), int(b["timestamp_ms"]),
                             bytes(b["payload"])) for b in batches]
            for b, raw in zip(made, batches):
                check_records(bytes(raw["payload"]), b.count)
        except (KeyError, TypeError, ValueError, MalformedTag, MalformedRecords) as e:
            return MirrorAppend(ErrorCode.BAD_REQUEST, core.visible_end, 0,
                                f"a source batch is malformed ({e}); the link stops")
        pending = self._pending  # type: ignore[attr-defined]  # raft.node.pending
        waiters: list[Pending] = []
        rids: list[int] = []
        try:
            try:
                for b in made:
                    before = core.visible_end
                    rid = next(self._request_ids)  # type: ignore[attr-defined]
                    waiters.append(pending.add(rid, timeout_s))
                    rids.append(rid)
                    core.propose(rid, b, Acks.LEADER)
                    if core.visible_end == before:
                        break  # not placed: nothing after it may be
            except Exception as e:
                self.fail(e, "propose")  # type: ignore[attr-defined]
                return MirrorAppend(ErrorCode.SHUTTING_DOWN, -1, 0, "the node failed")
            self.kick()  # type: ignore[attr-defined]
            for w in waiters:  # each answered, timed out (the group's timer) or shut down
                await w.event.wait()
        finally:
            for rid in rids:
                pending.discard(rid)
        appended = 0
        for a in (w.answer for w in waiters):
            if a is None:
                return MirrorAppend(ErrorCode.TIMEOUT, core.visible_end, appended,
                                    "no answer in time; resume from visible_end + 1")
            if a.error != ErrorCode.OK:
                end = a.visible_end if a.error == ErrorCode.MIRROR_POSITION else core.visible_end
                return MirrorAppend(a.error, end, appended, a.message)
            appended += 1
        return MirrorAppend(ErrorCode.OK, core.visible_end, appended)

    def last_mirrored(self) -> dict[str, Any] | None:
        """The mirror's last MIRRORED batch (the one holding `visible_end`, committed or not) as
        the source's fetch returns it, or None when the log no longer holds it (a retention cut
        or a state transfer past it). The link's anchor: a puller checks that the source still
        holds this very batch before it appends after it (raft/node/links/puller.py)."""
        core: RaftCore | None = self.core  # type: ignore[attr-defined]
        if core is None or not self.translated or core.visible_end < 0:
            return None
        log = self.log  # type: ignore[attr-defined]
        try:
            got = run_sync(find(log, core.visible_end, log.dirty_offset))
        except OffsetOutOfRange:
            return None
        b = got.batch
        if b is None or visible_last(b) != core.visible_end:
            return None
        return {"base_offset": decode_tag(b.payload), "count": b.count,
                "timestamp_ms": b.timestamp_ms, "payload": records_of(b)}
