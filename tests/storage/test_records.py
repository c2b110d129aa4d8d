"""The record rule (storage/records.py): `check_records` is a byte-level walk, so it is checked
here against a reference that decodes with msgpack and inspects the objects. The two must agree
on every payload: well-formed ones (any msgpack width, keys, headers), near misses made by
changing one field of a good record, and arbitrary bytes and msgpack documents."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.records import (FAST_MIN_RECORDS, MalformedRecords, Record, _plainly_valid,
                             _uniform_valid,
                             check_records, decode_records, encode_records, encode_values,
                             join_records, records_start, undecodable_message)


def reference_ok(payload: bytes, count: int | None) -> bool:
    """The documented shape, checked on decoded objects (slow, copies, obviously right)."""
    try:
        items = msgpack.unpackb(payload, raw=False, use_list=True)
    except Exception:
        return False
    if not isinstance(items, list) or (count is not None and len(items) != count):
        return False
    for rec in items:
        if not (isinstance(rec, list) and len(rec) == 3):
            return False
        key, value, headers = rec
        if not (key is None or isinstance(key, bytes)) or not isinstance(value, bytes):
            return False
        if headers is None:
            continue
        if not isinstance(headers, list):
            return False
        for h in headers:
            if not (isinstance(h, list) and len(h) == 2 and isinstance(h[0], str)
                    and (h[1] is None or isinstance(h[1], bytes))):
                return False
    return True


def walk_ok(payload: bytes, count: int | None) -> bool:
    # The fast path only ever accepts, and only what the reference accepts.
    if count is not None and _plainly_valid(payload, count):
        assert reference_ok(payload, count), payload
    try:
        check_records(payload, count)
    except MalformedRecords as e:
        assert "docs/PROTOCOL.md" in str(e) and e.reason  # says what is wrong, what to do
        return False
    return True


scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=6) | st.binary(max_size=6))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=12)
header = st.tuples(st.text(max_size=5), st.binary(max_size=5) | st.none())
good_record = st.builds(lambda k, v, h: [k, v, [list(x) for x in h] if h is not None else None],
                        st.none() | st.binary(max_size=8), st.binary(max_size=8),
                        st.none() | st.lists(header, max_size=3))
# A good record with one part replaced by anything at all.
near_miss = st.tuples(good_record, st.integers(0, 4), anything).map(
    lambda t: _spoil(*t))


def _spoil(rec: list, where: int, junk: Any) -> Any:
    rec = list(rec)
    if where < 3:
        rec[where] = junk
        return rec
    if where == 3:
        return rec + [junk]
    return junk


@settings(max_examples=400, deadline=None)
@given(records=st.lists(good_record | near_miss, max_size=5), delta=st.integers(-1, 1),
       tail=st.sampled_from([b"", b"", b"\x00", b"\xc0"]))
def test_the_walk_agrees_with_the_reference(records: list, delta: int, tail: bytes) -> None:
    payload = msgpack.packb(records, use_bin_type=True) + tail
    count = max(1, len(records) + delta)
    assert walk_ok(payload, count) == reference_ok(payload, count)
    assert walk_ok(payload, None) == reference_ok(payload, None)
    # Every prefix of a payload is refused (it ends inside something), and never crashes.
    for cut in range(len(payload)):
        walk_ok(payload[:cut], None)


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=40) | anything.map(lambda x: msgpack.packb(x, use_bin_type=True)),
       count=st.integers(1, 9))
def test_arbitrary_bytes_never_crash_the_walk(data: bytes, count: int) -> None:
    assert walk_ok(data, count) == reference_ok(data, count)


def test_every_msgpack_width_is_accepted() -> None:
    """bin32 keys/values (what the Spark writer emits) and array16/array32 headers."""
    rec = b"\xdc\x00\x03" + b"\xc6\x00\x00\x00\x01k" + b"\xc5\x00\x02vv" + b"\xdd\x00\x00\x00\x01" \
        + b"\x92\xd9\x01h" + b"\xc4\x01x"
    payload = b"\xdd\x00\x00\x00\x02" + rec + b"\x93\xc0\xc4\x00\xc0"
    assert check_records(payload, 2) == 2
    assert reference_ok(payload, 2)
    assert decode_records(payload, 2) == [Record(b"vv", b"k", (("h", b"x"),)), Record(b"")]


@pytest.mark.parametrize("payload, count, fragment", [
    (b"\xc1not msgpack records", 3, "starts with the never-used byte 0xc1"),
    (encode_records([Record(b"a" * 9), Record(b"b" * 9)]), 3, "holds 2 records but count is 3"),
    (encode_records([Record(b"a")]) + b"\x00", 1, "1 bytes follow"),
    (msgpack.packb([[None, "text", None]]), 1, "record 0: the value must be a bin, got a str"),
    (msgpack.packb([[1, b"v", None]], use_bin_type=True), 1, "the key must be a bin or nil"),
    (msgpack.packb([[None, b"v", [["h"]]]], use_bin_type=True), 1, "header 0 must be an array"),
    (msgpack.packb([[None, b"v", [[b"h", b"x"]]]], use_bin_type=True), 1,
     "header 0's name must be a str"),
    (b"\x91\x93\xc0\xc4\x01v\x91\x92\xa2\xff\xfe\xc0", 1, "name is not UTF-8"),
    (b"\x91\x93\xc0\xc6\xff\xff\xff\xffv\xc0", 1, "ends inside a record"),
    (b"\x91", 1, "count 1 cannot fit in 1 bytes"),
    (b"", 1, "cannot fit"),
    (b"\xdd\xff\xff\xff\xff" + b"\x93\xc0\xc4\x00\xc0" * 3, 2**32 - 1, "cannot fit"),
])
def test_refusals_say_what_is_wrong(payload: bytes, count: int, fragment: str) -> None:
    with pytest.raises(MalformedRecords) as e:
        check_records(payload, count)
    assert fragment in str(e.value), str(e.value)
    with pytest.raises(MalformedRecords):
        decode_records(payload, count)


def test_a_huge_claimed_array_is_walked_only_as_far_as_the_bytes_go() -> None:
    payload = b"\xdd\xff\xff\xff\xff" + b"\x93\xc0\xc4\x00\xc0" * 3
    with pytest.raises(MalformedRecords, match="ends inside a record"):
        check_records(payload, None)


def test_round_trip_and_the_readers_message() -> None:
    recs = [Record(b"v1"), Record(b"v2", b"k", (("a", b"1"), ("b", None)))]  # type: ignore
    assert decode_records(encode_records(recs), 2) == recs
    msg = undecodable_message(3, 5, "it starts with 0xc1")
    assert "offsets 3-5" in msg and "offset 6" in msg and "0xc1" in msg
    assert "offset 7 " in undecodable_message(7, 7, "x") + " "


def test_the_walk_reads_a_memoryview_as_well() -> None:
    """Readers may hold a payload as a view into a larger buffer; the walk slices nothing but
    header names."""
    payload = encode_records([Record(b"x" * 70_000, b"k", (("n\u00e9", b"v"),)), Record(b"")])
    assert check_records(memoryview(b"pre" + payload)[3:], 2) == 2


# -- the fast path (_plainly_valid) on batches big enough to take it ---------------------------

@settings(max_examples=300, deadline=None)
@given(good=st.lists(good_record, min_size=FAST_MIN_RECORDS, max_size=FAST_MIN_RECORDS + 8),
       spoilt=st.lists(st.tuples(st.integers(0, 10**6), near_miss), max_size=2),
       delta=st.sampled_from([0, 0, 0, -1, 1]), tail=st.sampled_from([b"", b"", b"\xc0"]))
def test_big_batches_agree_with_the_reference(good: list, spoilt: list, delta: int,
                                              tail: bytes) -> None:
    """Near misses anywhere in a batch of FAST_MIN_RECORDS or more: accepted exactly when the
    reference accepts, by the fast path whenever it is well-formed."""
    records = list(good)
    for at, rec in spoilt:
        records.insert(at % (len(records) + 1), rec)
    payload = msgpack.packb(records, use_bin_type=True) + tail
    count = len(records) + delta
    ok = reference_ok(payload, count)
    assert walk_ok(payload, count) == ok
    if ok:  # the common case is the cheap one
        assert _plainly_valid(payload, count)


BIG = [[None, b"v" * 10, None]] * (FAST_MIN_RECORDS + 36)


def _big_with(rec: Any, at: int = 50) -> bytes:
    return msgpack.packb(BIG[:at] + [rec] + BIG[at:], use_bin_type=True)


BIG_NEAR_MISSES = [
    (_big_with([None, "text", None]), 101, "record 50: the value must be a bin, got a str"),
    (_big_with([1, b"v", None]), 101, "record 50: the key must be a bin or nil"),
    (_big_with([None, b"v", None, None]), 101, "record 50: a record must be an array"),
    (_big_with([None, b"v"]), 101, "record 50: a record must be an array"),
    (_big_with({"k": b"v"}), 101, "record 50: a record must be an array"),
    (_big_with(msgpack.ExtType(1, b"abc")), 101, "record 50: a record must be an array"),
    (_big_with(b"abc"), 101, "record 50: a record must be an array"),
    (_big_with([None, b"v", [[b"h", b"x"]]]), 101, "header 0's name must be a str"),
    (_big_with([None, b"v", [["h", 1]]]), 101, "header 0's value must be a bin or nil"),
    (_big_with([None, b"v", [msgpack.ExtType(1, b"ab")]]), 101, "header 0 must be an array"),
    (_big_with([None, b"v", {"h": b"x"}]), 101, "headers must be nil or an array"),
    (_big_with([None, b"v", None]), 100, "holds 101 records but count is 100"),
    (_big_with([None, b"v", None]) + b"\xc0", 101, "1 bytes follow"),
    (encode_values([b"x"] * 100)[:-1], 100, "ends inside a record"),
]


@pytest.mark.parametrize("payload, count, fragment", BIG_NEAR_MISSES)
def test_big_batch_refusals_say_what_is_wrong(payload: bytes, count: int, fragment: str) -> None:
    assert not _plainly_valid(payload, count)
    with pytest.raises(MalformedRecords) as e:
        check_records(payload, count)
    assert fragment in str(e.value), str(e.value)


def test_the_fast_path_accepts_no_near_miss() -> None:
    """The mutation tests' killer for the fast path's checks (tests/raft/test_mutants.py):
    through check_records, which looks the fast path up in its module."""
    for payload, count, fragment in BIG_NEAR_MISSES:
        with pytest.raises(MalformedRecords):
            check_records(payload, count)


def test_big_batches_with_keys_headers_and_wide_encodings_take_the_fast_path() -> None:
    recs = [Record(b"v%d" % i, b"k" if i % 2 else None,
                   (("n\u00e9", b"x"), ("h", None)) if i % 3 == 0 else None)  # type: ignore
            for i in range(FAST_MIN_RECORDS)]
    payload = encode_records(recs)
    assert _plainly_valid(payload, len(recs)) and check_records(payload, len(recs)) == len(recs)
    assert decode_records(payload, len(recs)) == recs
    # array32 of bin32 values (what the Spark writer emits), and from a memoryview.
    wide = b"\xdd" + (100).to_bytes(4, "big") + (b"\x93\xc0\xc6\x00\x00\x00\x02vv\xc0" * 100)
    assert _plainly_valid(memoryview(b"pre" + wide)[3:], 100)
    assert check_records(wide, 100) == 100


# Fixed-size records (the Spark writer's layout: bin32 values of one length) with record 50 one
# byte off in a place that is not data: same size, so only the uniform path's per-record check
# can tell it apart.
_ROW = b"\x93\xc0\xc6\x00\x00\x00\x02vv\xc0"


def _uniform_with(row50: bytes) -> bytes:
    assert len(row50) == len(_ROW)
    return b"\xdd" + (100).to_bytes(4, "big") + _ROW * 50 + row50 + _ROW * 49


UNIFORM_NEAR_MISSES = [
    (_uniform_with(b"\x93\xc0\xdb\x00\x00\x00\x02vv\xc0"), "the value must be a bin, got a str"),
    (_uniform_with(b"\x93\xc2\xc6\x00\x00\x00\x02vv\xc0"), "the key must be a bin or nil"),
    (_uniform_with(b"\x93\xc0\xc6\x00\x00\x00\x02vv\xc2"), "headers must be nil or an array"),
    (_uniform_with(b"\x94\xc0\xc6\x00\x00\x00\x02vv\xc0"), "got an array of 4"),
    (_uniform_with(b"\x93\xc0\xc6\x00\x00\x00\x03vv\xc0"), "record 50"),
]


@pytest.mark.parametrize("payload, fragment", UNIFORM_NEAR_MISSES)
def test_the_uniform_path_accepts_no_near_miss(payload: bytes, fragment: str) -> None:
    """Also the mutation tests' killer for the uniform path (tests/raft/test_mutants.py)."""
    assert not _uniform_valid(payload, 100)
    with pytest.raises(MalformedRecords) as e:
        check_records(payload, 100)
    assert fragment in str(e.value), str(e.value)


def test_fixed_size_records_take_the_uniform_path() -> None:
    keyed = [Record(b"%05d" % i, b"k%03d" % i) for i in range(FAST_MIN_RECORDS)]
    keyless = [Record(b"x" * 300) for _ in range(FAST_MIN_RECORDS)]
    for recs in (keyed, keyless):
        payload = encode_records(recs)
        assert _uniform_valid(payload, len(recs))
        assert check_records(payload, len(recs)) == len(recs)
        assert decode_records(payload, len(recs)) == recs
        assert _uniform_valid(memoryview(b"pre" + payload)[3:], len(recs))
    spark = _uniform_with(_ROW)
    assert _uniform_valid(spark, 100) and check_records(spark, 100) == 100
    # Not this shape: sizes differ, a key only on some rows, headers, a count the array lacks.
    assert not _uniform_valid(encode_records([Record(b"v%d" % i) for i in range(100)]), 100)
    assert not _uniform_valid(encode_records([Record(b"v", b"k" if i % 2 else None)
                                              for i in range(100)]), 100)
    assert not _uniform_valid(encode_records([Record(b"v", None, (("h", b"x"),))] * 100), 100)
    assert not _uniform_valid(spark, 99) and not _uniform_valid(spark[:-1], 100)


@pytest.mark.parametrize("counts", [(1, 1), (7, 8), (15, 1), (65_535, 1), (3, 65_534)])
def test_joined_payloads_are_one_array_of_every_record_in_order(counts: tuple[int, int]) -> None:
    """join_records (the leader's merge of concurrent produces, raft/core/merging.py) writes
    a new array header of the summed count, whatever width each part's header had and the
    sum needs (fixarray, array16, array32)."""
    parts = [encode_values([b"%d-%d" % (p, i) for i in range(n)]) for p, n in enumerate(counts)]
    starts = [records_start(p, n) for p, n in zip(parts, counts)]
    assert all(s > 0 for s in starts)
    joined = join_records(parts, starts, sum(counts))
    got = [r.value for r in decode_records(joined, sum(counts))]
    assert got == [b"%d-%d" % (p, i) for p, n in enumerate(counts) for i in range(n)]


@pytest.mark.parametrize("payload,count", [(b"", 1), (b"\xc0", 1), (encode_values([b"a"]), 2),
                                           (b"\xdc\x00", 1)])
def test_a_payload_that_is_not_an_array_of_count_records_has_no_records_start(
        payload: bytes, count: int) -> None:
    assert records_start(payload, count) == -1
