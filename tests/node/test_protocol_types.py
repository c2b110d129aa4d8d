"""raft.protocol's typed requests, decoder and retry rules, without a node."""

from __future__ import annotations

import msgpack
import pytest

from raft.protocol import PARSERS, Limits, parse_request
from raft.protocol import errors as protocol_errors
from raft.protocol.errors import NOT_WRITTEN, RETRYABLE
from raft.protocol.framing import (GATHER_BYTES, LEN_SIZE, FrameDecoder, FrameTooLarge,
                                   WireError, decode_body, encode_frame)
from raft.protocol.hello import Hello, HelloReply
from raft.protocol.load_requests import (LoadAbort, LoadBegin, LoadCommit, LoadRefused,
                                         LoadStage, LoadStatus, parse_load)
from raft.protocol.requests import DEFAULT_TOPIC, Fetch, Produce, TransferLeader, acks_named
from raft.protocol.subscription_requests import CommitItem, SubCommitMany, SubList, SubRequest
from raft.core.types import Acks, ErrorCode

LIMITS = Limits(default_timeout_ms=5000, max_timeout_ms=120_000, max_frame_bytes=1 << 20,
                max_fetch_wait_ms=60_000)


def _through_the_wire(frame: dict) -> object:
    data = encode_frame(frame)
    decoded = decode_body(data[4:])
    return parse_request(decoded["t"], decoded, LIMITS)


@pytest.mark.parametrize("request_", [
    Produce(b"abc", 3, Acks.LEADER, 2000, producer_id=9, sequence=4, timestamp_ms=17),
    Fetch(12, 4096, 250),
    TransferLeader(2, 1000),
    SubRequest("sub_commit", "orders", 3000, "c1", position=5, lease_ms=100),
    SubRequest("sub_open", "orders", 3000, "c1", initial="end", lease_ms=0),
    SubRequest("sub_reset", "orders", 3000, "", initial=7),
    SubList("ord", "", 10, 3000),
    SubCommitMany([CommitItem("a", 1), CommitItem("b", 2, "c", 5)], 2, 3000),
])
def test_a_request_parses_back_to_what_its_frame_was_made_from(request_: object) -> None:
    assert _through_the_wire(request_.to_frame(5)) == request_


def test_parse_fills_the_node_defaults() -> None:
    req = _through_the_wire({"t": "produce", "id": 1, "payload": b"x", "count": 1})
    assert isinstance(req, Produce)
    # No group named: the node resolves the default topic's partition 0 (issue 26).
    assert (req.acks, req.timeout_ms, req.producer_id, req.sequence, req.group, req.topic,
            req.partition) == (Acks.QUORUM, LIMITS.default_timeout_ms, 0, -1, None,
                               DEFAULT_TOPIC, 0)
    assert isinstance(req.timestamp_ms, int)
    fetch = _through_the_wire({"t": "fetch", "id": 1, "offset": 0, "max_bytes": 1 << 40,
                               "max_wait_ms": 10**9})
    assert fetch.max_bytes == LIMITS.fetch_max_bytes and fetch.max_wait_ms == 60_000


@pytest.mark.parametrize("fields, fragment", [
    ({"count": True}, '"count" must be an integer, got bool'),
    ({"count": 0}, '"count"=0 must be >= 1'),
    ({"payload": "text"}, '"payload" must be msgpack bin'),
    ({"acks": "all"}, "must be one of"),
    ({"acks": ["quorum"]}, '"acks" must be a string'),
    ({"timeout_ms": 10**9}, '"timeout_ms"=1000000000 must be <= 120000'),
    ({"sequence": -2}, '"sequence"=-2 must be >= -1'),
    ({"producer_id": 1.5}, '"producer_id" must be an integer, got float'),
    ({"group": -1}, '"group"=-1 must be >= 0'),
])
def test_a_bad_produce_field_is_named(fields: dict, fragment: str) -> None:
    frame = {"v": 1, "t": "produce", "id": 1, "payload": b"x", "count": 1, **fields}
    with pytest.raises(WireError, match=fragment) as info:
        Produce.parse(frame, LIMITS)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_the_single_group_is_not_written_and_another_is() -> None:
    assert "group" not in Fetch(0).to_frame(1)
    assert Fetch(0, group=3).to_frame(1)["group"] == 3
    assert _through_the_wire(Fetch(0, group=3).to_frame(1)).group == 3
    # Produce builds its frame in place (the client's hot path): the same rule holds.
    assert "group" not in Produce(b"x", 1).to_frame(1)
    assert _through_the_wire(Produce(b"x", 1, group=3).to_frame(1)).group == 3


def test_acks_by_name_on_the_client_path() -> None:
    assert acks_named("leader") is Acks.LEADER and acks_named(Acks.NONE) is Acks.NONE
    with pytest.raises(ValueError, match="acks must be one of"):
        acks_named("all")


def test_every_parser_is_named_by_its_type() -> None:
    assert {"produce", "fetch", "status", "sub_commit_many", "sub_get"} <= set(PARSERS)


def test_decoder_takes_frames_however_the_bytes_arrive() -> None:
    frames = [{"v": 1, "t": "x", "n": i, "pad": b"p" * (i * 37)} for i in range(20)]
    data = b"".join(encode_frame(f) for f in frames)
    for step in (1, 3, 64, len(data)):
        decoder = FrameDecoder(1 << 20)
        got = []
        for i in range(0, len(data), step):
            decoder.feed(data[i:i + step])
            while (frame := decoder.next_frame()) is not None:
                got.append(frame)
        assert got == frames and decoder.buffered == 0


def test_decoder_gathers_large_frames_between_small_ones() -> None:
    """Large bodies are gathered read by read (framing.GATHER_BYTES) and joined once; frames
    come out whole and in order whatever the reads' sizes, and a reused read buffer (as a
    recv_into caller's) is not kept by reference."""
    big = GATHER_BYTES + 5
    frames = [{"v": 1, "t": "x", "n": i, "pad": bytes([i]) * (big * (i % 3) + i)}
              for i in range(9)]
    data = b"".join(encode_frame(f) for f in frames)
    for step in (7, 4096, GATHER_BYTES - 1, big + 11, len(data)):
        decoder = FrameDecoder(1 << 20)
        got = []
        scratch = bytearray(step)
        for i in range(0, len(data), step):
            piece = data[i:i + step]
            scratch[:len(piece)] = piece
            decoder.feed(memoryview(scratch)[:len(piece)])
            scratch[:len(piece)] = bytes(len(piece))  # the caller reuses its buffer
            assert decoder.held <= 2 * big + 4 * step + 64
            while (frame := decoder.next_frame()) is not None:
                got.append(frame)
        assert got == frames and decoder.buffered == 0
    decoder = FrameDecoder(1 << 20)
    decoder.feed(data[:LEN_SIZE + 100 + len(encode_frame(frames[0]))])
    assert decoder.next_body() is not None and decoder.next_body() is None
    assert decoder.wanted() == len(encode_frame(frames[1])) - LEN_SIZE - 100
    assert "got 100 of" in str(decoder.truncated())


def test_decoder_refuses_an_oversized_frame_from_its_header() -> None:
    decoder = FrameDecoder(100)
    decoder.feed((1 << 30).to_bytes(4, "big") + b"abc")
    with pytest.raises(FrameTooLarge):
        decoder.next_body()
    assert decoder.held < 16


def test_one_retry_rule_for_every_client() -> None:
    """Killer of the mutation test that drops the certainly-not-written rule (calls through
    the module so the mutant's patch is seen)."""
    may_retry = protocol_errors.may_retry
    # A plain produce may be resent only when it certainly was not written.
    plain = {c for c in RETRYABLE if may_retry(c, idempotent=False)}
    assert plain == {"NOT_LEADER", "BACKPRESSURE"}
    assert {c for c in RETRYABLE if may_retry(c, idempotent=True)} == RETRYABLE
    # Answers that may come after the append are never "not written".
    assert not NOT_WRITTEN & {"TIMEOUT", "LEADERSHIP_LOST", "SHUTTING_DOWN", "TRUNCATED"}
    # Codes that another attempt would only meet again are not retried.
    for code in ("BAD_REQUEST", "TOO_LARGE", "DISK_FULL", "FORBIDDEN", "UNAUTHENTICATED",
                 "LOAD_CLOSED", "INTERNAL", "POSITION_BEHIND"):
        assert not may_retry(code, idempotent=True)
    assert RETRYABLE - {"UNAVAILABLE"} <= {c.name for c in ErrorCode}
    # A lost connection: any request before its write, after it only an idempotent one.
    lost = protocol_errors.may_retry_lost_connection
    assert lost(written=False, idempotent=False) and lost(written=True, idempotent=True)
    assert not lost(written=True, idempotent=False)


# -- staged-load requests (raft.protocol.load_requests) ----------------------------------------

@pytest.mark.parametrize("request_", [
    LoadBegin("L"),
    LoadStage("L", 3, 1, 2, 0, 2, b"rows", Acks.QUORUM, 900),
    LoadCommit("L", 3, [(0, 0, 2, 4), (1, 1, 1, 1)]),
    LoadAbort("L", 3, "the job failed"),
    LoadStatus("L"),
    LoadStatus(),
])
def test_a_load_request_parses_back_to_what_its_frame_was_made_from(request_: object) -> None:
    decoded = decode_body(encode_frame(request_.to_frame(5))[4:])
    assert parse_load(decoded["t"], decoded) == request_


@pytest.mark.parametrize("t, fields, fragment", [
    ("load_stage", {"load_id": "L"}, '"gen"'),
    ("load_stage", {"load_id": "L", "gen": 1, "partition": 2**31, "attempt": 0, "seq": 0},
     '"partition"'),
    ("load_stage", {"load_id": "L", "gen": 1, "partition": 0, "attempt": 0, "seq": 0,
                    "count": 1, "payload": b"x", "acks": "all"}, "acks must be"),
    ("load_stage", {"load_id": "L", "gen": 1, "partition": 0, "attempt": 0, "seq": 0,
                    "count": 0, "payload": b"x"}, "count must be >= 1"),
    ("load_begin", {"load_id": ""}, "load_id must be 1..256 bytes"),
    ("load_commit", {"load_id": "L", "gen": 1, "attempts": [[0, "x"]]}, "attempts must be"),
    ("load_abort", {"load_id": "L"}, '"gen"'),
])
def test_a_bad_load_field_is_a_refusal_value_not_a_hang_up(t: str, fields: dict,
                                                           fragment: str) -> None:
    """The load service answers a bad field with a reply after its leader check, so parsing
    gives a value that carries the refusal instead of raising."""
    req = parse_load(t, {"v": 1, "t": t, "id": 1, **fields})
    assert isinstance(req, LoadRefused) and req.code == ErrorCode.BAD_REQUEST, req
    assert fragment in req.message, req.message


def test_a_bad_group_on_a_load_request_hangs_up_like_any_request() -> None:
    with pytest.raises(WireError, match='"group"'):
        parse_load("load_begin", {"v": 1, "t": "load_begin", "id": 1, "load_id": "L",
                                  "group": "x"})


# -- the handshake (raft.protocol.hello) -------------------------------------------------------

@pytest.mark.parametrize("hello", [Hello.client(), Hello.client("rl_secret"), Hello.peer(3)])
def test_a_hello_parses_back_to_what_its_frame_was_made_from(hello: Hello) -> None:
    assert Hello.parse(decode_body(encode_frame(hello.to_frame())[4:])) == hello


def test_a_hello_never_shows_its_token() -> None:
    assert "rl_secret" not in repr(Hello.client("rl_secret"))


@pytest.mark.parametrize("frame, fragment, code", [
    ({"t": "status"}, "the first frame must be", ErrorCode.BAD_REQUEST),
    ({"t": "hello", "role": "admin"}, "must be one of", ErrorCode.BAD_REQUEST),
    ({"t": "hello", "role": "peer", "node_id": True}, "must be an integer", ErrorCode.BAD_REQUEST),
    ({"t": "hello", "role": "client", "token": 42}, "non-empty string",
     ErrorCode.UNAUTHENTICATED),
])
def test_a_bad_hello_is_named(frame: dict, fragment: str, code: ErrorCode) -> None:
    with pytest.raises(WireError, match=fragment) as caught:
        Hello.parse({"v": 1, **frame})
    assert caught.value.code == code


def test_a_hello_reply_tolerates_what_an_older_node_leaves_out() -> None:
    full = HelloReply(2, 1 << 20, "ops")
    assert HelloReply.parse(decode_body(encode_frame(full.to_frame())[4:])) == full
    assert HelloReply.parse({"v": 1, "t": "hello", "node_id": 2}) == HelloReply(2)
    assert HelloReply.parse({"v": 1, "t": "hello", "node_id": 2, "max_frame_bytes": 0}) \
        == HelloReply(2)
    with pytest.raises(WireError):
        HelloReply.parse({"v": 1, "t": "error", "code": "SHUTTING_DOWN"})


def test_true_is_not_protocol_version_1() -> None:
    """msgpack keeps true and 1 apart; Python's True == 1 must not let true pass as v=1."""
    decoder = FrameDecoder()
    decoder.feed(encode_frame({"v": True, "t": "hello", "role": "client"}))
    with pytest.raises(WireError, match="unsupported protocol version"):
        decoder.next_frame()
    decoder.feed(encode_frame({"v": 1, "t": "hello", "role": "client"}))
    assert decoder.next_frame() == {"v": 1, "t": "hello", "role": "client"}
