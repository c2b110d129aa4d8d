"""The keyed load generator's frames are encoded once and sent with only the request id
changed (bench/partitions_load.py): each must decode to exactly the produce request a
per-request encoding would have sent, with its own id."""

from __future__ import annotations

from bench.partitions_load import KeyedArgs, payloads, prebuilt
from raft.core.types import Acks
from raft.protocol.framing import decode_body, encode_frame
from raft.protocol.requests import Produce


def test_a_prebuilt_frame_is_the_encoded_request_with_its_id() -> None:
    a = KeyedArgs("t", {p: "x" for p in range(4)}, [f"k{i}".encode() for i in range(16)],
                  64, 8, 2, 0.0, 0.0, acks="leader", partitions=4)
    batches = payloads(a)
    for p, (head, tail) in prebuilt(a, batches).items():
        for rid in ((1 << 31) + 1, (1 << 31) + 70_000):
            frame = head + rid.to_bytes(4, "big") + tail
            assert int.from_bytes(frame[:4], "big") == len(frame) - 4
            want = encode_frame(Produce(batches[p], 8, Acks("leader"), 5000, topic="t",
                                        partition=p).to_frame(rid))
            assert decode_body(frame[4:]) == decode_body(want[4:])
