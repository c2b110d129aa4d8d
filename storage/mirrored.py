"""Mirror partitions: the MIRRORED batch's tag, and reads in *visible offsets*.

A mirror partition is an ordinary Raft group of the sink cluster (docs/REPLICATION.md). Its own
NOOP, CONFIG and CONTROL entries take offsets in its log, so its log offsets can never equal the
source's; what clients see must. So a *translated* group shows consumers only its MIRRORED
batches, each at the visible base offset its tag carries (the source's base offset), and every
offset a client sends or gets on such a group is a visible offset.

The tag: one version byte, then the visible base offset as a signed 64-bit integer (NEXT, -1, in
a proposal: "the next visible offset", filled in by the leader), then the records exactly as
`storage.records` encodes them. `count` and `timestamp_ms` of the batch are the source batch's.

Visible offsets grow with log offsets (the leader's position rule, raft/core/mirror.py, appends a
MIRRORED batch only past the visible end), so the reads below binary-search the log by tags.
They are pure functions over the `LogStorage` contract, shared by the node and the simulation,
written as generators that yield (None) between bounded slices of reading: the node awaits a
checkpoint at each yield (raft/node/api/fetch.py), the simulation runs them through with
`run_sync`. Gaps between visible batches are normal (the source's no-ops, control batches, a
bootstrap); a read from inside a gap starts at the next batch.

Below every layer (storage/): no imports from raft/.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from storage.api import LogStorage
from storage.batch import NO_PRODUCER, NO_SEQUENCE, Batch, BatchKind

TAG_VERSION = 1
_TAG = struct.Struct("<Bq")
TAG_SIZE = _TAG.size
# The visible base offset of a proposal that asks for "the next visible offset" (the leader's
# visible end + 1): what a client produce to a promoted mirror becomes.
NEXT = -1
# The name of the snapshot section (raft/core/snapshot.py) that keeps the visible end as of the
# log start: retention and state transfers drop the batches that set it.
MIRROR_SECTION = "mirror"
# Nothing mirrored yet.
NO_VISIBLE = -1


class MalformedTag(ValueError):
    """A MIRRORED payload whose tag cannot be read."""


def encode_tag(visible_base: int) -> bytes:
    if visible_base < NEXT:
        raise MalformedTag(f"a visible base offset is >= 0 (or {NEXT}: the next one), "
                           f"got {visible_base}")
    return _TAG.pack(TAG_VERSION, visible_base)


def encode_payload(visible_base: int, records: bytes) -> bytes:
    """A MIRRORED payload: the tag, then records as `storage.records.encode_records` makes."""
    return encode_tag(visible_base) + records


def decode_tag(payload: bytes | memoryview) -> int:
    """The visible base offset a MIRRORED payload's tag carries; MalformedTag if unreadable."""
    if len(payload) < TAG_SIZE:
        raise MalformedTag(f"a MIRRORED payload of {len(payload)} bytes is shorter than its "
                           f"{TAG_SIZE}-byte tag")
    version, base = _TAG.unpack_from(payload, 0)
    if version != TAG_VERSION:
        raise MalformedTag(f"MIRRORED tag version {version} is not {TAG_VERSION}: written by a "
                           f"newer build; upgrade this node")
    if base < NEXT:
        raise MalformedTag(f"MIRRORED tag carries visible base offset {base}")
    return base


def records_of(batch: Batch) -> bytes:
    """The records of a MIRRORED batch (its payload after the tag)."""
    return batch.payload[TAG_SIZE:]


def mirrored(visible_base: int, count: int, timestamp_ms: int, records: bytes, *,
             producer_id: int = NO_PRODUCER, sequence: int = NO_SEQUENCE) -> Batch:
    """A new MIRRORED batch (offset and term are the leader's to set)."""
    return Batch.create(encode_payload(visible_base, records), count, kind=BatchKind.MIRRORED,
                        timestamp_ms=timestamp_ms, producer_id=producer_id, sequence=sequence)


def retagged(batch: Batch, visible_base: int) -> Batch:
    """`batch` (DATA, or MIRRORED asking for NEXT) as a MIRRORED batch at `visible_base`, with
    its count, timestamp and producer id / sequence (the leader's conversion)."""
    records = batch.payload if batch.kind == BatchKind.DATA else records_of(batch)
    return mirrored(visible_base, batch.count, batch.timestamp_ms, records,
                    producer_id=batch.producer_id, sequence=batch.sequence)


def visible_last(batch: Batch) -> int:
    """The visible offset of a MIRRORED batch's last record."""
    return decode_tag(batch.payload) + batch.count - 1


def end_at_start(snapshot: dict | None) -> int:
    """The visible end as of a log start (its snapshot's `mirror` section), NO_VISIBLE when
    none was recorded (nothing mirrored before the start, or a plain group)."""
    if not snapshot:
        return NO_VISIBLE
    sections = snapshot.get("sections")
    raw = sections.get(MIRROR_SECTION) if isinstance(sections, dict) else None
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else NO_VISIBLE


# -- reads in visible offsets --------------------------------------------------------------------
T = TypeVar("T")
# A read: yields None between slices (the caller may let other work run), returns its result.
Steps = Generator[None, None, T]
READ_SLICE_BYTES = 1 << 20
READ_SLICE_BATCHES = 1024


def run_sync(steps: "Steps[T]") -> T:
    """Run a read to its end without yielding (the simulation, tests, worker threads)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def visible_start(log: LogStorage) -> int:
    """The first visible offset a consumer may still ask for: one past the visible end at the
    log start (what retention cut is gone; a fetch from there returns the first batch the log
    holds, past any gap)."""
    return end_at_start(log.snapshot) + 1


@dataclass(slots=True)
class Hint:
    """Where a sequential consumer's next fetch starts: visible offset `visible` is the one
    after the MIRRORED batch ending at log offset `after` (validated on use: a truncation or a
    cut may have changed the log since)."""

    visible: int
    after: int


@dataclass(slots=True)
class Found:
    """A MIRRORED batch located by visible offset (None fields: none at or past it)."""

    batch: Batch | None
    # The log offset the search found nothing below (where to read on from).
    log_offset: int


def _next_mirrored(log: LogStorage, offset: int, upto: int) -> Steps[Batch | None]:
    """The first MIRRORED batch holding an offset in [offset, upto], or None."""
    pos = max(offset, log.start_offset)
    first = True
    while pos <= upto:
        if not first:
            yield None
        first = False
        got = log.read(pos, READ_SLICE_BYTES, READ_SLICE_BATCHES)
        if not got:
            return None
        for b in got:
            if b.base_offset > upto:
                return None
            if b.kind == BatchKind.MIRRORED:
                return b
            pos = b.last_offset + 1
    return None


def find(log: LogStorage, visible: int, upto: int, hint: Hint | None = None) -> Steps[Found]:
    """The first MIRRORED batch at log offsets <= `upto` whose visible last offset is >=
    `visible` (the batch holding `visible`, or the next one after a gap): a binary search over
    log offsets by tags, or one step from a valid `hint`."""
    start = log.start_offset
    if hint is not None and hint.visible == visible and start <= hint.after <= upto:
        prev = log.read(hint.after, 1 << 30, 1)
        if (prev and prev[0].last_offset == hint.after and prev[0].kind == BatchKind.MIRRORED
                and visible_last(prev[0]) == visible - 1):
            b = yield from _next_mirrored(log, hint.after + 1, upto)
            return Found(b, upto + 1 if b is None else b.base_offset)
    lo, hi = start, upto
    found: Batch | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        b = yield from _next_mirrored(log, mid, hi)
        if b is None:
            hi = mid - 1
        elif visible_last(b) >= visible:
            found, hi = b, b.base_offset - 1
        else:
            lo = b.last_offset + 1
        yield None
    return Found(found, upto + 1 if found is None else found.base_offset)


def visible_end_upto(log: LogStorage, upto: int) -> Steps[int]:
    """The visible end of the last MIRRORED batch at log offsets <= `upto` (a batch boundary:
    the commit index makes the visible high watermark), else the visible end at the log start.
    Reads backwards from `upto`, one batch at a time."""
    pos = min(upto, log.dirty_offset)
    start = log.start_offset
    steps = 0
    while pos >= start:
        got = log.read(pos, 1 << 30, 1)
        if not got:
            break
        b = got[0]
        if b.kind == BatchKind.MIRRORED and b.last_offset <= upto:
            return visible_last(b)
        pos = b.base_offset - 1
        steps += 1
        if steps % 64 == 0:
            yield None
    return end_at_start(log.snapshot)


def visible_to_log(log: LogStorage, visible: int, upto: int) -> Steps[int]:
    """The log offset of visible offset `visible`: inside the batch holding it (a record's
    offset in the batch is the same in both), the base of the next batch after a gap, else
    `upto` + 1. What a hold on a visible position holds in the log (the batch holding it stays
    whole), and where lag in records and bytes starts counting."""
    got = yield from find(log, visible, upto)
    if got.batch is None:
        return got.log_offset
    return got.log_offset + max(0, visible - decode_tag(got.batch.payload))


def fetch(log: LogStorage, visible: int, upto: int, max_bytes: int, max_batches: int,
          hint: Hint | None = None) -> Steps[tuple[list[dict[str, Any]], int, Hint | None]]:
    """What a consumer fetching from visible offset `visible` gets, reading log offsets up to
    `upto` (the commit index): MIRRORED batches at their visible offsets, as the source's fetch
    returns them (`base_offset`, `count`, `timestamp_ms`, `payload` = the records), within
    `max_bytes` and `max_batches` (at least one batch when there is one); the visible offset to
    fetch next, and a hint for that next fetch. The first batch may start before `visible`
    (it holds it), like a fetch of a plain log from inside a batch."""
    found = yield from find(log, visible, upto, hint)
    out: list[dict[str, Any]] = []
    if found.batch is None:
        return out, visible, hint
    used = 0
    nxt = visible
    last_log = found.log_offset - 1
    pos = found.log_offset
    scanned, scan_limit = 0, 4 * max_bytes + (1 << 20)
    while pos <= upto and (used < max_bytes or not out) and len(out) < max_batches \
            and scanned < scan_limit:
        yield None
        if pos < log.start_offset:
            break  # retention moved the start meanwhile
        got = log.read(pos, min(READ_SLICE_BYTES, max(1, max_bytes - used)),
                       min(READ_SLICE_BATCHES, max_batches - len(out)))
        if not got:
            break
        for b in got:
            if b.last_offset > upto or (out and used + b.size > max_bytes) \
                    or len(out) >= max_batches:
                return out, nxt, Hint(nxt, last_log) if out else hint
            if b.kind == BatchKind.MIRRORED:
                base = decode_tag(b.payload)
                out.append({"base_offset": base, "count": b.count,
                            "timestamp_ms": b.timestamp_ms, "payload": records_of(b)})
                used += b.size
                nxt = base + b.count
                last_log = b.last_offset
            scanned += b.size
            pos = b.last_offset + 1
    return out, nxt, Hint(nxt, last_log) if out else hint
