"""Batch.decode(keep=True): a follower keeps a view of the bytes it received instead of copying
every payload (issue 28), and only of immutable bytes: a view into LMDB's map (a memoryview)
or of a buffer that may change (a bytearray) is still copied."""

from __future__ import annotations

import pytest

from raft.protocol.raft_frames import message_from_wire, message_to_wire
from raft.core import messages as m
from storage.batch import Batch, CorruptBatch


def _batch() -> Batch:
    return Batch.create(bytes(range(256)) * 64, 3).placed(10, 2)


def test_a_kept_payload_is_a_read_only_view_equal_to_the_copy() -> None:
    b = _batch()
    raw = b.encode()
    kept = Batch.decode(raw, keep=True)
    assert isinstance(kept.payload, memoryview) and kept.payload.readonly
    assert kept.payload.obj is raw  # no copy
    assert kept == b and hash(kept) == hash(b) and kept.encode() == raw


@pytest.mark.parametrize("wrap", [memoryview, bytearray])
def test_anything_but_immutable_bytes_is_copied(wrap) -> None:  # noqa: ANN001
    raw = wrap(_batch().encode())
    b = Batch.decode(raw, keep=True)
    assert type(b.payload) is bytes
    if isinstance(raw, bytearray):
        raw[-1] ^= 0xFF  # the decoded batch does not change with the buffer
        assert b.payload != bytes(raw[-len(b.payload):])


def test_a_kept_payload_is_still_checked() -> None:
    raw = bytearray(_batch().encode())
    raw[-1] ^= 0xFF
    with pytest.raises(CorruptBatch, match="crc mismatch"):
        Batch.decode(bytes(raw), keep=True)


def test_append_entries_off_the_wire_keep_their_batches_bytes() -> None:
    b = _batch()
    msg = m.AppendEntries(1, 2, 3, 9, 2, [b], 5, True, 7)
    back = message_from_wire(message_to_wire(msg))
    assert isinstance(back, m.AppendEntries) and back.batches == [b]
    assert isinstance(back.batches[0].payload, memoryview)


def test_a_kept_batch_encodes_as_the_bytes_it_came_from_unless_placed_elsewhere() -> None:
    """Batch.encode hands out the kept bytes (no copy: a leader sends what it read as it was
    stored, issue 28); a batch placed at another offset or term gets its own header."""
    raw = _batch().encode()
    kept = Batch.decode(raw, keep=True)
    assert kept.encode() is raw
    moved = kept.placed(11, 2)
    assert moved.encode() == moved.header() + bytes(kept.payload)
    assert Batch.decode(moved.encode()) == moved
    assert kept.placed(10, 3).encode()[:16] != raw[:16]


def test_batches_read_back_from_lmdb_encode_as_they_were_written(tmp_path) -> None:  # noqa: ANN001
    from storage.lmdb_log import LmdbLog

    log = LmdbLog(tmp_path / "log")
    try:
        batches = [Batch.create(bytes([i]) * (100 + i), 2).placed(i * 2, 1) for i in range(5)]
        log.append(batches)
        log.flush()
        back = log.read(0, 1 << 20)
        assert back == batches
        assert [b.encode() for b in back] == [b.encode() for b in batches]
        assert all(b.encode() is b.payload.obj for b in back)  # the read's one copy
    finally:
        log.close()
