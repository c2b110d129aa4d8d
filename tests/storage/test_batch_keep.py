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
