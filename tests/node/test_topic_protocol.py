"""Topic addressing and the topic requests in raft.protocol (issue 26), without a node: every
partition-addressed request carries `topic` and `partition` (written only when not the
defaults, so frames from before topics are unchanged), and the metadata and admin requests
parse back to what they were made from and refuse bad fields naming them."""

from __future__ import annotations

import pytest

from raft.client.errors import TopicExistsError, UnknownTopicError, error_from_reply
from raft.protocol import PARSERS, Limits, parse_request
from raft.protocol.errors import NOT_WRITTEN, RETRYABLE
from raft.protocol.framing import WireError, decode_body, encode_frame
from raft.protocol.load_requests import LoadBegin, LoadRefused, LoadStage, parse_load
from raft.protocol.requests import (CONTROLLER_GROUP, DEFAULT_TOPIC, Fetch, Produce, Status,
                                    TransferLeader)
from raft.protocol.subscription_requests import CommitItem, SubCommitMany, SubList, SubRequest
from raft.protocol.topic_requests import Metadata, TopicAlter, TopicCreate, TopicDelete
from raft.core.types import Acks, ErrorCode

LIMITS = Limits()


def _wire(frame: dict) -> dict:
    return decode_body(encode_frame(frame)[4:])


def _through(frame: dict) -> object:
    decoded = _wire(frame)
    return parse_request(decoded["t"], decoded, LIMITS)


@pytest.mark.parametrize("request_", [
    Produce(b"abc", 3, Acks.LEADER, 2000, timestamp_ms=1, topic="orders", partition=5),
    Fetch(12, 4096, 250, topic="orders", partition=2),
    Status(topic="orders", partition=1),
    TransferLeader(2, 1000, topic="t", partition=3),
    SubRequest("sub_open", "s", 3000, "c1", initial="end", topic="orders", partition=4),
    SubList("ord", "", 10, 3000, topic="orders", partition=1),
    SubCommitMany([CommitItem("a", 1)], 1, 3000, topic="orders", partition=7),
    Metadata(), Metadata(["a", "b"]),
    TopicCreate("orders", 8, 3, retention_bytes=1 << 30, timeout_ms=9000),
    TopicCreate("orders", 1, 1, timeout_ms=5000),
    TopicAlter("orders", 12, max_record_bytes=1 << 20, timeout_ms=5000),
    TopicAlter("orders", None, retention_ms=60_000, timeout_ms=5000),
    TopicDelete("orders", 5000),
])
def test_a_topic_addressed_request_parses_back_to_itself(request_: object) -> None:
    assert _through(request_.to_frame(9)) == request_


@pytest.mark.parametrize("request_", [
    Produce(b"abc", 1, timestamp_ms=1), Fetch(0), Status(), TransferLeader(),
    SubRequest("sub_get", "s", 3000), SubList(), SubCommitMany([CommitItem("a", 1)], 1),
])
def test_the_default_topic_and_partition_are_not_written(request_: object) -> None:
    """Frames of clients from before topics are what today's clients send for the default."""
    frame = request_.to_frame(1)
    assert not {"topic", "partition", "group"} & set(frame)
    parsed = _through(frame)
    assert (parsed.topic, parsed.partition, parsed.group) == (DEFAULT_TOPIC, 0, None)


def test_a_load_names_its_topic_partition_apart_from_the_spark_partition() -> None:
    stage = LoadStage("L", 1, 3, 0, 0, 1, b"x", topic="orders", topic_partition=2)
    frame = _wire(stage.to_frame(1))
    assert frame["partition"] == 3 and frame["topic_partition"] == 2
    parsed = parse_load("load_stage", frame)
    assert parsed == stage
    begin = _wire(LoadBegin("L").to_frame(1))
    assert not {"topic", "topic_partition"} & set(begin)
    refused = parse_load("load_begin", {"t": "load_begin", "id": 1, "topic": "orders",
                                        "topic_partition": 1})
    assert isinstance(refused, LoadRefused) and (refused.topic, refused.topic_partition) == (
        "orders", 1)
    with pytest.raises(WireError, match='"topic_partition"'):
        parse_load("load_begin", {"t": "load_begin", "id": 1, "load_id": "L",
                                  "topic_partition": -1})


def test_admin_requests_route_to_the_controller_group_without_saying_so_on_the_wire() -> None:
    for req in (Metadata(), TopicCreate("a", 1, 1), TopicAlter("a", 2), TopicDelete("a")):
        assert req.group == CONTROLLER_GROUP and "group" not in req.to_frame(1)
    assert {"metadata", "topic_create", "topic_alter", "topic_delete"} <= set(PARSERS)


@pytest.mark.parametrize("frame, fragment", [
    ({"t": "fetch", "offset": 0, "topic": ""}, '"topic" must be a topic name'),
    ({"t": "fetch", "offset": 0, "topic": "x" * 250}, "250 characters"),
    ({"t": "fetch", "offset": 0, "topic": 7}, "got int"),
    ({"t": "produce", "payload": b"x", "count": 1, "partition": -1}, '"partition"=-1'),
    ({"t": "produce", "payload": b"x", "count": 1, "topic": ["a"]}, '"topic"'),
    ({"t": "sub_get", "name": "s", "partition": "0"}, '"partition" must be an integer'),
    ({"t": "metadata", "topics": "orders"}, '"topics" must be a list'),
    ({"t": "metadata", "topics": ["ok", 3]}, '"topics[1]"'),
    ({"t": "topic_create", "partitions": 1, "replicas": 1}, '"name" must be a topic name'),
    ({"t": "topic_create", "name": "a", "replicas": 1}, 'missing integer field "partitions"'),
    ({"t": "topic_create", "name": "a", "partitions": 0, "replicas": 1}, '"partitions"=0'),
    ({"t": "topic_create", "name": "a", "partitions": 1, "replicas": 17}, '"replicas"=17'),
    ({"t": "topic_create", "name": "a", "partitions": 1, "replicas": 1,
      "retention_bytes": 0}, '"retention_bytes"=0'),
    ({"t": "topic_create", "name": "a", "partitions": 1, "replicas": 1,
      "retention_ms": "1d"}, '"retention_ms" must be an integer'),
    ({"t": "topic_alter", "name": "a", "partitions": True}, '"partitions" must be an integer'),
    ({"t": "topic_alter", "name": "a", "max_record_bytes": -5}, '"max_record_bytes"=-5'),
    ({"t": "topic_delete"}, '"name" must be a topic name'),
])
def test_a_bad_topic_field_is_refused_naming_it(frame: dict, fragment: str) -> None:
    with pytest.raises(WireError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as e:
        _through({**frame, "id": 1})
    assert e.value.code == ErrorCode.BAD_REQUEST


def test_topic_errors_are_typed_in_the_client_and_never_retried_as_such() -> None:
    err = error_from_reply({"code": "UNKNOWN_TOPIC", "message": "unknown topic 'x'",
                            "topic": "x", "topics": ["default"]})
    assert isinstance(err, UnknownTopicError) and err.topics == ["default"]
    assert isinstance(error_from_reply({"code": "TOPIC_EXISTS", "message": "m"}),
                      TopicExistsError)
    assert ErrorCode.UNKNOWN_TOPIC.value == 22 and ErrorCode.TOPIC_EXISTS.value == 23
    assert "UNKNOWN_TOPIC" in NOT_WRITTEN and "UNKNOWN_TOPIC" not in RETRYABLE
    assert "TOPIC_EXISTS" not in RETRYABLE
