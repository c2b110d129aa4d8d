"""The record encoding inside a DATA batch payload, and the one rule that says what is valid.

Producers encode, consumers decode; the server only checks. A payload is one msgpack array of
exactly `count` records, each `[key, value, headers]`:
  key      bin or nil
  value    bin
  headers  nil, or an array of `[name, value]` pairs, name a (UTF-8) str, value bin or nil
(the shape of Kafka's records, so Spark's Kafka conventions map one to one). Any msgpack width
is accepted (bin8/16/32, fixarray/array16/array32); nothing may follow the array.

`check_records` is that rule as a structural walk over the bytes: it reads the type bytes and
lengths and skips over keys and values without copying them. The walk costs about 0.2 us a
record in Python: 0.5 ms of leader CPU for a 256 KiB produce of 100 B records
(docs/PERFORMANCE.md, "Issue 24 and 25 before/after"). So a batch of many records is first
offered to `_plainly_valid`, which decodes it with msgpack's C unpacker and checks the decoded
shape in C-level passes (about 0.08 us a record). It only ever accepts; whatever it does not
accept goes to the walk, which alone refuses and says why. Every path that appends a payload a
client supplied (produce, staged Spark loads) calls it before the batch reaches the log, so a
malformed payload is refused (BAD_REQUEST) instead of committed. Readers decode with
`decode_records`, which applies the same rule first: a batch that breaks it (one written before
nodes checked, or by a faulty client library) raises MalformedRecords, which readers report with
the batch's offsets (`undecodable_message`) before reading on past it.
"""

from __future__ import annotations

import gc
import struct
from dataclasses import dataclass

import msgpack

# Where the record shape and the validation rule are documented for client writers.
RECORDS_DOC = "docs/PROTOCOL.md (section \"Records\")"
# The shortest record: fixarray(3), nil key, bin8 of length 0, nil headers.
MIN_RECORD_BYTES = 5

# When `_plainly_valid` is tried first: from this many records up (below it the walk costs under
# ~13 us), while records average under FAST_MAX_AVG_BYTES (above it copying the values out costs
# more than walking past them) and up to FAST_MAX_RECORDS records (it holds about 100 bytes of
# Python objects a record while it checks; the walk holds nothing). It also allocates a tuple a
# record, which the cyclic GC counts: so only up to half the young generation's threshold
# (`gc.get_threshold()[0]`; a node raises it to 10,000, raft.node.serve.tune_interpreter).
# Beyond that it would set off collections that traverse and promote its tuples: with Python's
# default threshold (700) and 2,621 records of 100 B it took 0.57 ms against the walk's 0.46.
FAST_MIN_RECORDS = 64
FAST_MAX_AVG_BYTES = 2048
FAST_MAX_RECORDS = 1 << 18
_BYTES = {bytes}
_KEY_TYPES = {bytes, type(None)}

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from


@dataclass(slots=True, frozen=True)
class Record:
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] | None = None


class MalformedRecords(ValueError):
    """A payload that is not exactly `count` records of the documented shape. `reason` says
    what is wrong (and at which record, when one is to blame); str() adds what to do."""

    def __init__(self, reason: str, record: int | None = None) -> None:
        where = f"record {record}: " if record is not None else ""
        super().__init__(
            f"the payload is not valid raftlog records ({where}{reason}). A payload is one "
            f"msgpack array of exactly `count` records, each [key (bin or nil), value (bin), "
            f"headers (nil or an array of [str, bin or nil])]; see {RECORDS_DOC}. Encode it "
            f"with a raftlog client (storage.records.encode_records) and set count to the "
            f"number of records")
        self.reason = reason
        self.record = record


def encode_records(records: list[Record]) -> bytes:
    return msgpack.packb(
        [[r.key, r.value, [list(h) for h in r.headers] if r.headers else None] for r in records],
        use_bin_type=True,
    )


def encode_values(values: list[bytes]) -> bytes:
    """Fast path for the common case of bare values (no keys, no headers)."""
    return msgpack.packb([[None, v, None] for v in values], use_bin_type=True)


def records_start(payload: bytes, count: int) -> int:
    """Where the records of `payload` begin (after its array header), if it starts with the
    header of an array of exactly `count` records; -1 otherwise. Reads the header only: what
    follows was checked when the payload was admitted (`check_records`)."""
    try:
        n, i = _array(payload, 0)
    except (IndexError, struct.error):
        return -1
    return i if n == count else -1


def join_records(parts: list[bytes], starts: list[int], count: int) -> bytes:
    """One payload of `count` records from payloads whose records begin at `starts`
    (`records_start`) and together number `count`: a new array header, then each payload's
    records as they are (the leader merges concurrent produces into one stored batch this way,
    raft/core/merging.py; no record is decoded or re-encoded)."""
    if count < 16:
        head = bytes((0x90 | count,))
    elif count < 1 << 16:
        head = b"\xdc" + count.to_bytes(2, "big")
    else:
        head = b"\xdd" + count.to_bytes(4, "big")
    return b"".join([head, *(memoryview(p)[i:] for p, i in zip(parts, starts))])


def decode_records(payload: bytes, count: int | None = None) -> list[Record]:
    """The records of a payload; MalformedRecords (never a msgpack error) when it breaks the
    rule, or holds other than `count` records when `count` is given."""
    check_records(payload, count)
    try:
        items = msgpack.unpackb(payload, raw=False, use_list=True)
        return [Record(value, key, tuple((k, v) for k, v in headers) if headers else None)
                for key, value, headers in items]
    except Exception as e:  # the walk accepted it, so this is a bug in one of the two
        raise MalformedRecords(f"msgpack refused it after the check passed: "
                               f"{type(e).__name__}: {e}") from None


def undecodable_message(first: int, last: int, reason: str,
                        next_step: str | None = None) -> str:
    """What every reader says about a committed batch it cannot decode: its offsets, why, and
    what to do (the same words in the CLI, the client library and Spark). `next_step` replaces
    the default "skipped, reading goes on" for a reader that stops instead."""
    where = f"offset {first}" if first == last else f"offsets {first}-{last}"
    step = next_step or f"Its records are skipped and reading goes on at offset {last + 1}"
    return (f"the batch at {where} cannot be decoded as records ({reason}); it was written by "
            f"a faulty client or before nodes validated payloads. {step}; re-produce its "
            f"records from their source if they matter. Retention removes the batch in time "
            f"(see {RECORDS_DOC})")


# -- the structural walk ---------------------------------------------------------------------------

def _kind(b: int) -> str:
    """The msgpack family of a type byte, for error messages."""
    if b <= 0x7F or b >= 0xE0 or 0xCC <= b <= 0xD3:
        return "an integer"
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        return "a map"
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        return "an array"
    if 0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB:
        return "a str"
    if b in (0xC4, 0xC5, 0xC6):
        return "a bin"
    if b == 0xC0:
        return "nil"
    if b in (0xC2, 0xC3):
        return "a boolean"
    if b in (0xCA, 0xCB):
        return "a float"
    if b == 0xC1:
        return "the never-used byte 0xc1"
    return "an ext"


def _array(p: bytes, i: int) -> tuple[int, int]:
    """(length, index after the header) of the array at p[i], or (-1, i) if it is none."""
    b = p[i]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, i + 1
    if b == 0xDC:
        return _U16(p, i + 1)[0], i + 3
    if b == 0xDD:
        return _U32(p, i + 1)[0], i + 5
    return -1, i


def _bin_end(p: bytes, i: int, b: int) -> int:
    """The index after the bin whose type byte b is at p[i], or -1 if b is not a bin."""
    if b == 0xC4:
        return i + 2 + p[i + 1]
    if b == 0xC6:
        return i + 5 + _U32(p, i + 1)[0]
    if b == 0xC5:
        return i + 3 + _U16(p, i + 1)[0]
    return -1


def _str_end(p: bytes, i: int) -> int:
    """The index after the UTF-8 str at p[i]; -1 if it is no str, -2 if not UTF-8."""
    b = p[i]
    if 0xA0 <= b <= 0xBF:
        start, n = i + 1, b & 0x1F
    elif b == 0xD9:
        start, n = i + 2, p[i + 1]
    elif b == 0xDA:
        start, n = i + 3, _U16(p, i + 1)[0]
    elif b == 0xDB:
        start, n = i + 5, _U32(p, i + 1)[0]
    else:
        return -1
    end = start + n
    if end > len(p):
        raise IndexError
    try:
        str(p[start:end], "utf-8")
    except UnicodeDecodeError:
        return -2
    return end


def _headers_end(p: bytes, i: int, r: int) -> int:
    """The index after record r's headers array at p[i] (nil handled by the caller)."""
    n, i2 = _array(p, i)
    if n < 0:
        raise MalformedRecords(f"headers must be nil or an array, got {_kind(p[i])}", r)
    i = i2
    for h in range(n):
        pair, i2 = _array(p, i)
        if pair != 2:
            raise MalformedRecords(f"header {h} must be an array [name, value], got "
                                   f"{_kind(p[i]) if pair < 0 else f'an array of {pair}'}", r)
        i = _str_end(p, i2)
        if i < 0:
            raise MalformedRecords(f"header {h}'s name must be a str, got {_kind(p[i2])}"
                                   if i == -1 else f"header {h}'s name is not UTF-8", r)
        b = p[i]
        if b == 0xC0:
            i += 1
        else:
            j = _bin_end(p, i, b)
            if j < 0:
                raise MalformedRecords(f"header {h}'s value must be a bin or nil, got "
                                       f"{_kind(b)}", r)
            i = j
    return i


def check_records(payload: bytes, count: int | None) -> int:
    """Raise MalformedRecords unless `payload` is exactly `count` records (any number when
    count is None) of the documented shape; return the number of records.

    Cost: a batch of many small records is accepted by `_plainly_valid` in C-level passes
    (about 0.08 us a record); otherwise a few byte reads per record and per header, none per
    payload byte (keys and values are skipped by their length, never copied). The walk is
    bounded by the payload's length, whatever its headers claim."""
    p = payload
    size = len(p)
    if count is not None and count > size // MIN_RECORD_BYTES:
        raise MalformedRecords(f"count {count} cannot fit in {size} bytes: a record takes at "
                               f"least {MIN_RECORD_BYTES}")
    if count is not None and count >= FAST_MIN_RECORDS and _uniform_valid(p, count):
        return count
    if (count is not None and FAST_MIN_RECORDS <= count <= FAST_MAX_RECORDS
            and size < count * FAST_MAX_AVG_BYTES and count * 2 <= gc.get_threshold()[0]
            and _plainly_valid(p, count)):
        return count
    r: int | None = None
    try:
        if size == 0:
            raise MalformedRecords("it is empty")
        n, i = _array(p, 0)
        if n < 0:
            raise MalformedRecords(f"it must start with a msgpack array of records, but starts "
                                   f"with {_kind(p[0])} (byte 0x{p[0]:02x})")
        if count is not None and n != count:
            raise MalformedRecords(f"the array holds {n} records but count is {count}")
        for r in range(n):
            b = p[i]
            if b == 0x93:
                i += 1
            else:
                fields, i2 = _array(p, i)
                if fields != 3:
                    raise MalformedRecords(
                        f"a record must be an array [key, value, headers], got "
                        f"{_kind(b) if fields < 0 else f'an array of {fields}'}", r)
                i = i2
            b = p[i]  # key: bin or nil
            if b == 0xC0:
                i += 1
            else:
                j = _bin_end(p, i, b)
                if j < 0:
                    raise MalformedRecords(f"the key must be a bin or nil, got {_kind(b)}", r)
                i = j
            b = p[i]  # value: bin
            j = _bin_end(p, i, b)
            if j < 0:
                raise MalformedRecords(f"the value must be a bin, got {_kind(b)}", r)
            i = j
            b = p[i]  # headers: nil or an array of pairs
            if b == 0xC0:
                i += 1
            else:
                i = _headers_end(p, i, r)
        if i > size:
            raise IndexError
    except (IndexError, struct.error):
        raise MalformedRecords(f"it ends inside a record ({size} bytes)", r) from None
    if i != size:
        raise MalformedRecords(f"{size - i} bytes follow the array of {n} records")
    return n


def _uniform_valid(p: bytes, count: int) -> bool:
    """True only if `p` is exactly `count` records that are all laid out like the first: the
    same size, and the same bytes at every position that is not key or value data (the array
    header of 3, the key's nil or bin header, the value's bin header with its length, the nil
    headers). False means "let the other paths decide".

    Why that is enough: the first record is walked as the rule says, so its non-data bytes
    spell out a valid record of exactly `size` bytes whatever its data bytes hold; a record
    with the same non-data bytes at the same places is then valid too. Checking a position in
    every record is one strided slice compared in C, so a batch of fixed-size records (a bulk
    load of fixed-width rows, a benchmark's) costs a dozen slices instead of a Python step per
    record (the walk: ~0.2 us a record, ~0.2 s of the leader's CPU per million 100-byte
    rows). Records with headers, or of differing sizes, are not this shape."""
    try:
        return _uniform(p, count)
    except (IndexError, struct.error):  # shorter than its first record: the walk says why
        return False


def _uniform(p: bytes, count: int) -> bool:
    n, i0 = _array(p, 0)
    body = len(p) - i0
    if n != count or n < 2 or body % n:
        return False
    size = body // n
    marks: list[int] = []  # offsets, within a record, of the bytes that are not data
    j = i0
    if p[j] != 0x93:
        return False
    marks.append(0)
    j += 1
    for field in ("key", "value"):
        b = p[j]
        if b == 0xC0 and field == "key":
            marks.append(j - i0)
            j += 1
            continue
        end = _bin_end(p, j, b)
        if end < 0:
            return False
        head = {0xC4: 2, 0xC5: 3, 0xC6: 5}[b]
        marks.extend(range(j - i0, j - i0 + head))
        j = end
    if j >= len(p) or p[j] != 0xC0:  # headers: nil only (rows with headers vary anyway)
        return False
    marks.append(j - i0)
    j += 1
    if j - i0 != size:
        return False
    for m in marks:  # the same byte at this place of every record
        column = p[i0 + m::size]
        if type(column) is not bytes:
            column = bytes(column)  # a memoryview's slice: count() needs bytes
        if column.count(p[i0 + m]) != n:
            return False
    return True


def _plainly_valid(p: bytes, count: int) -> bool:
    """True only if `p` is exactly `count` records of the documented shape; False means "let
    the walk decide" (it may still be valid, e.g. headers arrays longer than max(count, 3)).

    Why this is the rule and no looser: msgpack decodes the whole payload (nothing may follow
    it, str must be UTF-8, maps are refused outright by max_map_len=0) with arrays as tuples
    and bins as bytes. Transposing with zip(strict=True) succeeds only if every record is an
    iterable of exactly 3 items; of msgpack's values only an array of 3 can then hold a bytes
    value in the middle (a str yields str, a bin yields ints, an ext is 2 long). Keys are then
    checked bin or nil, values bin, headers nil or arrays of [str, bin or nil]."""
    try:
        items = msgpack.unpackb(p, raw=False, use_list=False, max_map_len=0,
                                max_array_len=max(count, 3))
        if type(items) is not tuple or len(items) != count:
            return False
        keys, values, headers = zip(*items, strict=True)
    except Exception:  # any refusal at all: the walk says why
        return False
    if set(map(type, values)) != _BYTES:
        return False
    if keys.count(None) != count and not set(map(type, keys)) <= _KEY_TYPES:
        return False
    if headers.count(None) != count:
        for h in headers:
            if h is None:
                continue
            if type(h) is not tuple:
                return False
            for pair in h:
                if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str:
                    return False
                if pair[1] is not None and type(pair[1]) is not bytes:
                    return False
    return True
