"""Wire codec: frames, the bounded frame reader, and raft message round trips."""

from __future__ import annotations

import dataclasses
import functools
import struct

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from raft.core import messages as m
from raft.protocol.fields import get_bytes, get_int, get_opt_int, get_str
from raft.protocol.framing import (PIECE_BYTES, decode_body, encode_frame, encode_frame_pieces,
                                   FrameTooLarge, WireError)
from raft.protocol.raft_frames import (_KIND_OF, BatchEncodings, encode_raft_frame,
                                       encode_raft_frame_pieces, message_from_wire,
                                       message_to_wire, messages_from_frame, raft_frame,
                                       ZERO_COPY_BYTES)
from raft.protocol.replies import error_frame, error_reply, ok_reply
from raft.protocol.streams import FrameReader
from raft.core.types import ErrorCode
from storage.batch import Batch, BatchKind

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.integers(min_value=-1, max_value=2**40)


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    payload = draw(st.binary(max_size=64))
    b = Batch.create(payload, draw(st.integers(1, 1000)),
                     kind=draw(st.sampled_from(list(BatchKind))),
                     timestamp_ms=draw(st.integers(0, 2**48)),
                     producer_id=draw(st.integers(0, 2**40)),
                     sequence=draw(st.integers(-1, 2**31)))
    return b.placed(draw(st.integers(0, 2**40)), draw(st.integers(0, 2**20)))


def _strategy_for(cls: type) -> st.SearchStrategy:
    kwargs = {}
    for f in dataclasses.fields(cls):
        ann = f.type
        if ann == "int":
            kwargs[f.name] = small
        elif ann == "bool":
            kwargs[f.name] = st.booleans()
        elif ann == "int | None":
            kwargs[f.name] = st.none() | small
        elif ann == "list[Batch]":
            kwargs[f.name] = st.lists(batches(), max_size=4)
        else:  # a field added later: the codec passes it through as plain msgpack
            kwargs[f.name] = st.none()
    return st.builds(cls, **kwargs)


def trio_test(fn):
    """Run an async test under trio (the venv has no pytest-trio plugin)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return trio.run(functools.partial(fn, *args, **kwargs))
    return wrapper


any_message = st.one_of([_strategy_for(cls) for cls in m.MESSAGE_TYPES])


@settings(max_examples=150, deadline=None)
@given(st.lists(any_message, max_size=6))
def test_raft_frame_round_trip(msgs: list) -> None:
    items = [(0, x) for x in msgs]  # group 0: a single-group node's frames
    frame = encode_frame(raft_frame(items))
    (n,) = struct.unpack(">I", frame[:4])
    assert n == len(frame) - 4
    decoded = decode_body(frame[4:])
    assert decoded["t"] == "raft" and decoded["v"] == 1
    assert messages_from_frame(decoded) == items


@settings(max_examples=150, deadline=None)
@given(st.lists(any_message, max_size=6), st.integers(0, 40))
def test_fast_raft_frame_encoder_writes_the_same_document(msgs: list, extra: int) -> None:
    """The peer links' encoder (bin32 batches joined once) decodes to exactly what the plain
    msgpack encoding decodes to, arrays past 15 batches included."""
    many = [Batch.create(bytes([i]) * i, 1).placed(i, 1) for i in range(extra)]
    many.append(Batch.create(b"z" * ZERO_COPY_BYTES, 1).placed(extra, 1))  # left unjoined
    msgs = [*msgs, m.AppendEntries(1, 2, 3, -1, 0, many, 0, False, 7)]
    items = [(0, x) for x in msgs]
    prefix, body = encode_raft_frame(items, BatchEncodings())
    assert struct.unpack(">I", prefix)[0] == len(body)
    assert b"".join(encode_raft_frame_pieces(items)) == prefix + body
    assert decode_body(body) == decode_body(encode_frame(raft_frame(items))[4:])
    assert messages_from_frame(decode_body(body)) == items


@pytest.mark.parametrize("fields", [0, 3, 20])
def test_a_frame_in_pieces_is_the_same_bytes_with_large_values_uncopied(fields: int) -> None:
    """The blocking client's framing (a staged batch's payload written from the caller's
    object) sends exactly what encode_frame does, for small and for wide maps."""
    big, small = b"p" * PIECE_BYTES, b"s" * (PIECE_BYTES - 1)
    frame = {"t": "load_stage", **{f"f{i}": i for i in range(fields)}, "payload": big,
             "other": small, "n": None}
    pieces = encode_frame_pieces(frame)
    assert b"".join(pieces) == encode_frame(frame)
    assert any(p is big for p in pieces) and not any(p is small for p in pieces)
    assert encode_frame_pieces({"t": "x"}) == [encode_frame({"t": "x"})[:4],
                                               encode_frame({"t": "x"})[4:]]


def test_every_message_type_has_a_tag() -> None:
    for cls in m.MESSAGE_TYPES:
        assert cls in _KIND_OF


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.pop("term"), 'missing field "term"'),
    (lambda d: d.update(term="3"), '"term" must be an integer, got str'),
    (lambda d: d.update(term=True), '"term" must be an integer, got bool'),
    (lambda d: d.update(flush=1), '"flush" must be a boolean'),
    (lambda d: d.update(batches=b"x"), "must be an array of encoded batches"),
    (lambda d: d.update(batches=[7]), "expected encoded batch bytes"),
    (lambda d: d.update(batches=[b"\x00" * 3]), "damaged batch"),
    (lambda d: d.update(k="zz"), "unknown raft message kind"),
])
def test_bad_raft_message_fields_are_named(mutate, fragment: str) -> None:
    b = Batch.create(b"abc", 1).placed(5, 2)
    msg = m.AppendEntries(src=1, dst=2, term=2, prev_offset=4, prev_term=1, batches=[b],
                          commit_index=3, flush=True, seq=9)
    d = message_to_wire(msg)
    mutate(d)
    with pytest.raises(WireError, match=fragment.replace("(", r"\(")):
        message_from_wire(d)


def test_corrupted_batch_crc_is_refused() -> None:
    b = Batch.create(b"payload", 1).placed(0, 1)
    raw = bytearray(b.encode())
    raw[-1] ^= 0xFF
    d = {"k": "ae", "src": 1, "dst": 2, "term": 1, "prev_offset": -1, "prev_term": 0,
         "batches": [bytes(raw)], "commit_index": -1, "flush": True, "seq": 1}
    with pytest.raises(WireError, match="crc mismatch"):
        message_from_wire(d)


@pytest.mark.parametrize("body, fragment", [
    (b"\xc1", "not valid msgpack"),
    (msgpack.packb([1, 2, 3]), "must be a msgpack map, got list"),
    (msgpack.packb({"t": "hello"}), "unsupported protocol version"),
    (msgpack.packb({"v": 2, "t": "hello"}), "unsupported protocol version"),
    (msgpack.packb({"v": True, "t": "hello"}), "unsupported protocol version"),
    (msgpack.packb({"v": 1.0, "t": "hello"}), "unsupported protocol version"),
    (msgpack.packb({"v": 1}), 'string type tag "t"'),
    (msgpack.packb({"v": 1, "t": 5}), 'string type tag "t"'),
    (b"\x81\xa1v", "not valid msgpack"),  # truncated map
])
def test_bad_bodies(body: bytes, fragment: str) -> None:
    with pytest.raises(WireError, match=fragment):
        decode_body(body)


def test_int_map_keys_are_accepted() -> None:
    body = msgpack.packb({"v": 1, "t": "x", 1: "a"})
    assert decode_body(body)[1] == "a"


def test_field_getters() -> None:
    req = {"a": 1, "b": True, "c": b"x", "d": "quorum", "e": None}
    assert get_int(req, "a") == 1
    assert get_int(req, "missing", default=7) == 7
    with pytest.raises(WireError, match='"b" must be an integer, got bool'):
        get_int(req, "b")
    with pytest.raises(WireError, match='missing integer field "zz"'):
        get_int(req, "zz", request_id=3)
    with pytest.raises(WireError, match="must be >= 2"):
        get_int(req, "a", minimum=2)
    assert get_bytes(req, "c") == b"x"
    with pytest.raises(WireError, match="must be msgpack bin"):
        get_bytes(req, "d")
    assert get_str(req, "d", choices=["quorum", "none"]) == "quorum"
    with pytest.raises(WireError, match="must be one of"):
        get_str(req, "d", choices=["none"])
    assert get_opt_int(req, "e") is None
    try:
        get_int(req, "zz", request_id=3)
    except WireError as e:
        assert e.request_id == 3 and e.code is ErrorCode.BAD_REQUEST


def test_replies_and_error_frames() -> None:
    assert ok_reply(4, base_offset=1) == {"v": 1, "t": "reply", "id": 4, "ok": True,
                                          "base_offset": 1}
    r = error_reply(5, ErrorCode.NOT_LEADER, "go away", leader_id=2, leader_addr=None)
    assert r["ok"] is False and r["error"] == {"code": "NOT_LEADER", "message": "go away",
                                               "leader_id": 2}
    e = error_frame(ErrorCode.TOO_LARGE, "big", request_id=None)
    assert e == {"v": 1, "t": "error", "code": "TOO_LARGE", "message": "big"}


# -- the stream reader ----------------------------------------------------------------------------

@trio_test
async def test_reader_reassembles_frames_split_anywhere() -> None:
    frames = [{"v": 1, "t": "x", "n": i, "pad": b"p" * (i * 1000)} for i in range(20)]
    data = b"".join(encode_frame(f) for f in frames)
    send, recv = trio.testing.memory_stream_pair()
    reader = FrameReader(recv, max_frame_bytes=1 << 20)

    async def writer() -> None:
        pos, step = 0, 7
        while pos < len(data):
            await send.send_all(data[pos:pos + step])
            pos += step
            step = step * 3 % 9973 + 1
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        got = []
        while (frame := await reader.receive()) is not None:
            got.append(frame)
    assert got == frames


@trio_test
async def test_reader_refuses_oversize_from_header_alone() -> None:
    send, recv = trio.testing.memory_stream_pair()
    reader = FrameReader(recv, max_frame_bytes=1024)
    # Claim a 1 GiB body but send only a handful of bytes: the reader must not wait for (or
    # buffer) the body, it decides from the header.
    await send.send_all(struct.pack(">I", 1 << 30) + b"abc")
    with pytest.raises(FrameTooLarge) as info:
        with trio.fail_after(5):
            await reader.receive()
    assert info.value.code is ErrorCode.TOO_LARGE
    assert "--max-frame-bytes" in str(info.value)
    assert reader.held < 64 * 1024


@trio_test
async def test_reader_accepts_frame_exactly_at_limit() -> None:
    frame = encode_frame({"t": "x", "pad": b""})
    limit = len(frame) - 4
    send, recv = trio.testing.memory_stream_pair()
    reader = FrameReader(recv, max_frame_bytes=limit)
    await send.send_all(frame + encode_frame({"t": "x", "pad": b"1"}))
    assert (await reader.receive())["t"] == "x"
    with pytest.raises(FrameTooLarge):
        await reader.receive()


@pytest.mark.parametrize("data, fragment", [
    (b"\x00\x00", "inside a frame header"),
    (struct.pack(">I", 10) + b"abc", "got 3 of 10 body bytes"),
])
@trio_test
async def test_reader_reports_truncation(data: bytes, fragment: str) -> None:
    send, recv = trio.testing.memory_stream_pair()
    reader = FrameReader(recv, max_frame_bytes=1024)
    await send.send_all(data)
    await send.aclose()
    with pytest.raises(WireError, match=fragment):
        await reader.receive()


@trio_test
async def test_reader_clean_eof() -> None:
    send, recv = trio.testing.memory_stream_pair()
    reader = FrameReader(recv, max_frame_bytes=1024)
    await send.aclose()
    assert await reader.receive() is None


# -- peer links ---------------------------------------------------------------------------------------

def _link(address: str, **kw) -> "PeerLink":
    from raft.node.peer import PeerLink
    import random
    opts = dict(max_frame_bytes=1 << 20, queue_messages=100, queue_bytes=1 << 20,
                backoff_min_s=0.005, backoff_max_s=0.05, rng=random.Random(1))
    opts.update(kw)
    return PeerLink(1, 2, address, **opts)


def _stream(link: "PeerLink", group: int = 0) -> "PeerStream":
    """What a group queues through (raft.node.outbox): the link alone takes no raft messages."""
    from raft.node.outbox import PeerStream
    return PeerStream(link, group)


def _hb(seq: int) -> m.Heartbeat:
    return m.Heartbeat(src=1, dst=2, term=1, commit_index=-1, seq=seq)


def test_peer_link_queue_is_bounded_and_drops() -> None:
    link = _link("127.0.0.1:1", queue_messages=3)
    # Ten groups' heartbeats (a group's newer heartbeat takes its queued one's place, so one
    # group alone never fills the lane: tests/node/test_peer_lanes.py).
    accepted = [_stream(link, g).send(_hb(i)) for g, i in zip(range(1, 11), range(10))]
    assert accepted == [True] * 3 + [False] * 7
    assert link.status()["dropped"] == 7 and link.status()["queued"] == 3
    big = m.AppendEntries(src=1, dst=2, term=1, prev_offset=-1, prev_term=0,
                          batches=[Batch.create(b"x" * 5000, 1).placed(0, 1)],
                          commit_index=-1, flush=True, seq=1)
    after = dataclasses.replace(big, prev_offset=0, seq=2,
                                batches=[Batch.create(b"x" * 5000, 1).placed(1, 1)])
    small_bytes = _stream(_link("127.0.0.1:1", queue_bytes=6000))
    assert small_bytes.send(big) is True  # one message always fits an empty queue
    assert small_bytes.send(after) is False  # the stream's next append: over the bound


@trio_test
async def test_peer_link_delivers_in_batches_and_reconnects() -> None:
    received: list[m.Message] = []
    hellos: list[dict] = []
    connections = 0
    got_some = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        reader = FrameReader(stream, 1 << 20)
        hellos.append(await reader.receive())
        await stream.send_all(encode_frame({"t": "hello", "node_id": 2}))
        while (frame := await reader.receive()) is not None:
            received.extend(msg for _, msg in messages_from_frame(frame))
            got_some.set()
            if first:  # the peer "restarts" after its first frame
                await stream.aclose()
                return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        link = _link(f"127.0.0.1:{port}")
        stream = _stream(link)
        nursery.start_soon(link.run)
        for i in range(5):
            stream.send(_hb(i))
        with trio.fail_after(10):
            await got_some.wait()
            # Keep offering messages until the link has redialled and delivers again.
            i = 100
            while not any(h.seq >= 100 for h in received):
                stream.send(_hb(i))
                i += 1
                await trio.sleep(0.01)
        assert hellos[0] == {"v": 1, "t": "hello", "role": "peer", "node_id": 1}
        assert connections >= 2 and link.status()["connects"] >= 2
        assert all(isinstance(x, m.Heartbeat) and x.dst == 2 for x in received)
        nursery.cancel_scope.cancel()


@trio_test
async def test_peer_link_refuses_the_wrong_node() -> None:
    attempts = 0
    enough = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal attempts
        attempts += 1
        reader = FrameReader(stream, 1 << 20)
        await reader.receive()
        await stream.send_all(encode_frame({"t": "hello", "node_id": 3}))
        if attempts >= 3:
            enough.set()
        await reader.receive()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        link = _link(f"127.0.0.1:{port}")
        nursery.start_soon(link.run)
        with trio.fail_after(10):
            await enough.wait()
        assert link.connected is False and link.status()["connects"] == 0
        nursery.cancel_scope.cancel()


def test_batch_encodings_encode_each_batch_once_and_stay_bounded() -> None:
    enc = BatchEncodings(max_entries=3, max_bytes=1 << 20)
    batches = [Batch.create(bytes([i]) * 100, 1, base_offset=i, term=1) for i in range(5)]
    first = [enc.encode(b) for b in batches]
    assert [enc.encode(b) for b in batches[2:]] == first[2:]
    assert enc.hits == 3 and enc.misses == 5
    assert len(enc._entries) == 3  # oldest evicted
    assert enc.encode(batches[0]) == batches[0].encode()  # evicted: re-encoded, same bytes
    # An equal but distinct object is never confused with the cached one.
    twin = Batch.create(bytes([4]) * 100, 1, base_offset=4, term=1)
    before = enc.misses
    assert enc.encode(twin) == twin.encode() and enc.misses == before + 1


def test_batch_encodings_byte_bound() -> None:
    enc = BatchEncodings(max_entries=100, max_bytes=1000)
    for i in range(10):
        enc.encode(Batch.create(b"x" * 300, 1, base_offset=i, term=1))
    assert enc._bytes <= 1000
    big = Batch.create(b"y" * 5000, 1, base_offset=99, term=1)
    assert Batch.decode(enc.encode(big)) == big  # too big to keep, still encoded
