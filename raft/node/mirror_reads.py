"""Reads of a translated group (a mirror partition) in visible offsets, on the node.

The reads themselves are storage/mirrored.py's pure functions (shared with the simulation);
this module drives them on the event loop (a checkpoint whenever a read has run for a slice of
time, as raft/node/api/fetch.py does between slices) and keeps two small per-group caches:
- the visible high watermark by commit index: a committed prefix never changes, so the visible
  end at or below a given commit index never does either (a retention cut keeps it in the
  `mirror` section);
- hints for sequential consumers: where the fetch after one that ended at visible offset V
  starts in the log, so it need not binary-search. A hint is checked against the log when used
  (storage.mirrored.find), so a truncation or a cut since can only cost a search.
Plain groups never get here.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from storage import mirrored
from storage.api import OffsetOutOfRange
from storage.batch import BatchKind

# The group (raft.node.group.RaftGroup, not imported: it imports this module's users).
RaftGroup = Any

T = TypeVar("T")
SLICE_S = 0.002  # a read runs at most about this long between checkpoints
MAX_HINTS = 64  # sequential consumers remembered per group


@dataclass(slots=True)
class MirrorCache:
    hw_for: int = -2  # the commit index `hw` was computed for
    hw: int = -1
    hints: OrderedDict[int, mirrored.Hint] = field(default_factory=OrderedDict)


def _cache(group: RaftGroup) -> MirrorCache:
    cache = group.mirror_cache
    if cache is None:
        cache = group.mirror_cache = MirrorCache()
    return cache


async def drive(steps: mirrored.Steps[T]) -> T:
    """Run a storage/mirrored.py read on the event loop, checkpointing every SLICE_S."""
    started = time.perf_counter()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        if time.perf_counter() - started > SLICE_S:
            await trio.lowlevel.checkpoint()
            started = time.perf_counter()


def visible_hw(group: RaftGroup, commit: int) -> int:
    """The visible high watermark: the visible end of the last MIRRORED batch at or below the
    commit index (usually a read or two backwards from it; cached per commit index)."""
    cache = _cache(group)
    if cache.hw_for != commit:
        cache.hw = mirrored.run_sync(mirrored.visible_end_upto(group.log, commit))
        cache.hw_for = commit
    return cache.hw


def visible_start(group: RaftGroup) -> int:
    return mirrored.visible_start(group.log)


async def read_visible(group: RaftGroup, offset: int, max_bytes: int,
                       max_batches: int) -> tuple[list[dict[str, Any]], int]:
    """Committed MIRRORED batches from visible offset `offset` (the batch holding it, or the
    next one after a gap), as the source's fetch returns them, and the visible offset to
    fetch next. OffsetOutOfRange when retention moves the log start under the read."""
    cache = _cache(group)
    hint = cache.hints.pop(offset, None)
    out, nxt, new_hint = await drive(mirrored.fetch(
        group.log, offset, group.core.commit_index, max_bytes, max_batches, hint))
    if new_hint is not None and out:
        cache.hints[nxt] = new_hint
        while len(cache.hints) > MAX_HINTS:
            cache.hints.popitem(last=False)
    return out, nxt


def to_log(group: RaftGroup, visible: int) -> int:
    """The log offset visible offset `visible` is read from (the batch holding it, or the
    next; past the commit index: commit + 1): what a hold on a visible position holds."""
    commit = group.core.commit_index
    try:
        return mirrored.run_sync(mirrored.visible_to_log(group.log, visible, commit))
    except OffsetOutOfRange:
        return group.log.start_offset


def answer_offsets(group: RaftGroup, base: int, last: int) -> tuple[int, int]:
    """A produce answer's visible offsets, from the log offsets of the MIRRORED batch the
    leader placed ((-1, -1) when retention removed it since: a duplicate of an old write)."""
    try:
        got = group.log.read(base, 1 << 30, 1)
    except OffsetOutOfRange:
        return -1, -1
    if not got or got[0].base_offset != base or got[0].kind != BatchKind.MIRRORED:
        return -1, -1
    vbase = mirrored.decode_tag(got[0].payload)
    return vbase, vbase + got[0].count - 1
