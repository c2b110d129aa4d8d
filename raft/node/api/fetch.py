"""`fetch`: read committed DATA batches, with an optional long poll for new ones.

Consumers see up to the visible high watermark: the commit index, held back before any open
staged load (raft.node.load_service), whose batches stay hidden until the load commits.

A translated group (a mirror partition, docs/REPLICATION.md) speaks visible offsets: the offset
asked for, the batches, the high watermark, the start and the next offset are the MIRRORED tags'
(storage/mirrored.py reads them; raft.node.mirror_reads keeps the group's small caches).
"""

from __future__ import annotations

from typing import Any

import trio

from raft.node.api.context import ApiContext
from raft.node import mirror_reads
from raft.node.group import RaftGroup
from raft.protocol.replies import FetchOk, Reply
from raft.protocol.requests import Fetch
from raft.core.types import ErrorCode
from storage.api import OffsetOutOfRange
from storage.batch import BatchKind, CorruptBatch

# The log is read in slices of at most this many bytes and batches, with a checkpoint between
# them, and one reply carries at most FETCH_MAX_BATCHES batches (its encoding is one step):
# with small batches a byte budget alone meant hundreds of thousands of batches to read and
# encode while every other request, and the node's heartbeats, waited.
READ_SLICE_BYTES = 1 << 20
READ_SLICE_BATCHES = 1024
FETCH_MAX_BATCHES = 8192


async def execute(ctx: ApiContext, req: Fetch) -> Reply:
    group = ctx.group
    offset = req.offset
    deadline = trio.current_time() + req.max_wait_ms / 1000
    while True:
        if group.loads is not None:
            await group.loads.catch_up(group.core.high_watermark)
        hw = visible_hw(group)
        start = visible_start(group)
        end = fetchable_end(group, hw)
        if offset > end and not group.translated and not group.is_leader() \
                and group.core.leader_id is not None:
            # A follower whose log ends before `offset`: the leader may have it (appended,
            # not yet here); only the leader knows the log's end.
            return ctx.refuse_not_leader()
        if offset < start or offset > end:
            return ctx.error(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is outside the readable range [{start}, {end}]; fetch "
                f"from start_offset, or at most the log end (high_watermark + 1 once what "
                f"was appended is committed)", start_offset=start, high_watermark=hw)
        if offset <= hw:
            try:
                if group.translated:
                    batches, next_offset = await mirror_reads.read_visible(
                        group, offset, req.max_bytes, FETCH_MAX_BATCHES)
                else:
                    batches, next_offset = await read_committed(group, offset, hw,
                                                                req.max_bytes)
            except OffsetOutOfRange:  # retention moved the log start under us
                start = visible_start(group)
                return ctx.error(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} was removed by retention while reading; fetch from "
                    f"start_offset {start}", start_offset=start, high_watermark=hw)
            except CorruptBatch as e:
                return ctx.error(ErrorCode.INTERNAL, str(e))
            return FetchOk(batches, hw, start, next_offset)
        remaining = deadline - trio.current_time()
        if remaining <= 0 or ctx.closing:
            return FetchOk([], hw, start, offset)
        with trio.move_on_after(remaining):
            await group.wait_hw_change()


def visible_hw(group: RaftGroup) -> int:
    """What consumers may read: the commit index, held back before any open staged load
    (await `group.loads.catch_up` first, or this applies what is left in one step); in a
    translated group, the visible end of the last MIRRORED batch at or below the commit index
    (a visible offset)."""
    hw = group.core.high_watermark
    if group.translated:
        return mirror_reads.visible_hw(group, hw)
    return hw if group.loads is None else min(hw, group.loads.stable_offset(hw))


def fetchable_end(group: RaftGroup, hw: int) -> int:
    """The highest offset a fetch may name: high_watermark + 1, or this node's log end when
    it has appended past the watermark. An offset a producer was just given (acks=leader or
    none, answered before the commit) exists and becomes readable once committed: a fetch for
    it long-polls like one at high_watermark + 1 instead of failing, as a Kafka leader accepts
    offsets up to its log end offset. A consumer told OFFSET_OUT_OF_RANGE would reset its
    position. A translated group speaks visible offsets, which only committed batches have."""
    if group.translated:
        return hw + 1
    return max(hw, group.log.dirty_offset) + 1


def visible_start(group: RaftGroup) -> int:
    """The first offset consumers may ask for: the log start (a visible offset in a translated
    group: one past the visible end stored with the log start)."""
    if group.translated:
        return mirror_reads.visible_start(group)
    return group.log.start_offset


async def read_committed(group: RaftGroup, offset: int, hw: int,
                         max_bytes: int) -> tuple[list[dict], int]:
    """DATA batches from `offset` up to `hw` within `max_bytes` and FETCH_MAX_BATCHES (at
    least one batch when there is one), and the offset to fetch next (past any skipped
    control batches). Reads in bounded slices, yielding to the event loop between them."""
    log_storage, loads = group.log, group.loads
    out: list[dict[str, Any]] = []
    used = 0
    pos = offset
    # Skipped batches (no-ops, configuration, unpublished staged data) count against a
    # separate scan bound so a reply still carries data when there is some just past them.
    scanned, scan_limit = 0, 4 * max_bytes + (1 << 20)
    seen = 0
    while (pos <= hw and (used < max_bytes or not out) and scanned < scan_limit
           and seen < FETCH_MAX_BATCHES):
        if seen:
            await trio.lowlevel.checkpoint()
            if pos < log_storage.start_offset:  # retention moved the start meanwhile
                break
        got = log_storage.read(pos, min(READ_SLICE_BYTES, max(1, max_bytes - used)),
                               min(READ_SLICE_BATCHES, FETCH_MAX_BATCHES - seen))
        if not got:
            break
        seen += len(got)
        for b in got:
            if b.last_offset > hw or (out and used + b.size > max_bytes):
                return out, pos
            if loads is not None:
                payload = next((p for _, p in loads.visible([b], hw)), None)
            else:
                payload = b.payload if b.kind == BatchKind.DATA else None
            if payload is not None:
                out.append({"base_offset": b.base_offset, "count": b.count,
                            "timestamp_ms": b.timestamp_ms, "payload": payload})
                used += b.size
            scanned += b.size
            pos = b.last_offset + 1
    return out, pos


HANDLERS = {Fetch.T: execute}
