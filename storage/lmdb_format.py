"""The LMDB log's on-disk format: keys, the start record, the snapshot and metadata encodings,
and the checks an open runs over them. Anything that does not decode, or breaks an invariant no
crash can break, raises LogInconsistent: it is refused, never repaired in place.

Layout: sub-db `log` maps the big-endian base offset (8 bytes) to `Batch.encode()`; sub-db `meta`
holds `meta` (term, vote, config, extra), `start` ([start_offset, start_term]) and `snapshot`
(the state at the log start, see LogStorage.snapshot), msgpack-encoded.
"""

from __future__ import annotations

import struct

import msgpack

from storage.api import LogInconsistent, Meta

KEY = struct.Struct(">Q")
# base_offset (q), count (I), term (q) at the head of every encoded batch (see storage.batch).
HEAD = struct.Struct("<qIq")
META_KEY = b"meta"
START_KEY = b"start"
SNAPSHOT_KEY = b"snapshot"  # the state at the log start (LogStorage.snapshot)


def key(offset: int) -> bytes:
    return KEY.pack(offset)


def check_next(path: str, start: int, last: int, last_term: int, base: int, count: int,
                term: int) -> None:
    """The stored batch base..base+count-1 of `term` must follow the one ending at `last`
    (start - 1 for the first) with no gap, no overlap and no lower term. Every writer keeps
    this in one transaction, so a crash cannot break it: refuse the log if it is broken."""
    end = base + count - 1
    if base < start:
        raise LogInconsistent(
            path, f"the batch at offsets {base}..{end} lies before the log start offset "
                       f"{start} recorded with it", (base, end, start))
    if base <= last:
        raise LogInconsistent(
            path, f"the batch at offsets {base}..{end} (term {term}) overlaps the batch "
                       f"ending at offset {last} (term {last_term})", (base, end, last))
    if base > last + 1:
        raise LogInconsistent(
            path, f"offsets {last + 1}..{base - 1} are missing: the batch at offset "
                       f"{base} follows one ending at offset {last}"
                       + (f" (the log start is {start})" if last == start - 1 else ""),
            (last + 1, base - 1))
    if term < last_term:
        raise LogInconsistent(
            path, f"the term goes backwards at offset {base}: {term} after {last_term} "
                       f"(at offset {last})", (base, last))

def decode_start(path: str, raw: bytes | memoryview | None) -> tuple[int, int]:
    if raw is None:
        return 0, 0
    try:
        start, start_term = msgpack.unpackb(bytes(raw))
        return int(start), int(start_term)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise LogInconsistent(path, f"the log start record cannot be decoded ({e})"
                              ) from None

def decode_snapshot(path: str, raw: bytes | memoryview | None) -> dict | None:
    if raw is None:
        return None
    try:
        snap = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise LogInconsistent(path, f"the state stored with the log start cannot be "
                                         f"decoded ({e!r})") from None
    if not isinstance(snap, dict):
        raise LogInconsistent(path, "the state stored with the log start is not a map")
    return snap

def decode_meta(path: str, raw: bytes) -> Meta:
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        return Meta(term=d["term"], voted_for=d["voted_for"], config=d["config"],
                    extra=d["extra"])
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise LogInconsistent(path, f"the term/vote metadata cannot be decoded ({e!r})"
                              ) from None
