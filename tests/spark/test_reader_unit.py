"""sparkio/reader.py without Spark or a cluster: fetched batches to Arrow, and what a partition
read does at a committed batch that cannot be decoded as records (issue 24 item 3)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from sparkio.reader import UndecodableBatchError, to_arrow  # noqa: E402
from storage.records import Record, encode_records, encode_values  # noqa: E402


def fetched(base: int, payload: bytes, count: int) -> dict:
    return {"base_offset": base, "count": count, "timestamp_ms": 1_000, "payload": payload}


BATCHES = [
    fetched(1, encode_values([b"b0", b"b1"]), 2),
    fetched(3, b"\xc1not msgpack records", 3),  # committed before nodes checked payloads
    fetched(6, encode_records([Record(b"a0", b"k", (("h", b"x"),))]), 1),
]


def test_an_undecodable_batch_stops_the_read_naming_its_offsets_and_the_option() -> None:
    with pytest.raises(UndecodableBatchError) as e:
        to_arrow(BATCHES, 1, 7, "UTC")
    assert (e.value.first_offset, e.value.last_offset) == (3, 5)
    assert "offsets 3-5" in str(e.value) and "skipUndecodable=true" in str(e.value)
    assert "offset 6" in str(e.value)


def test_with_skip_undecodable_the_records_around_it_are_read() -> None:
    rb = to_arrow(BATCHES, 1, 7, "UTC", skip_undecodable=True)
    assert rb.column("offset").to_pylist() == [1, 2, 6]
    assert rb.column("value").to_pylist() == [b"b0", b"b1", b"a0"]
    assert rb.column("headers").to_pylist()[2] == [{"key": "h", "value": b"x"}]


def test_a_range_that_does_not_touch_the_bad_batch_never_sees_it() -> None:
    rb = to_arrow(BATCHES, 6, 7, "UTC")
    assert rb.column("offset").to_pylist() == [6]
    assert to_arrow(BATCHES, 1, 3, "UTC").column("offset").to_pylist() == [1, 2]
