"""The controller's commands on the wire: every one round-trips; malformed bytes are a clear
MalformedCommand; a newer version or operation is UnsupportedCommand (stop, upgrade)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raft.controller.commands import (
    AlterTopicPartitions,
    CreateTopic,
    DecommissionNode,
    DeleteTopic,
    MalformedCommand,
    MoveReplicas,
    RegisterNode,
    SetTopicSettings,
    TopicSettings,
    UnsupportedCommand,
    decode_command,
    decode_control,
    encode_command,
)

EVERY_COMMAND = [
    CreateTopic("orders", ((1, 2, 3), (2, 3, 1))),
    CreateTopic("logs", ((1,),), TopicSettings(retention_bytes=1 << 40, retention_ms=60_000,
                                               max_record_bytes=1 << 20)),
    AlterTopicPartitions("orders", 4, ((3, 1, 2), (1, 2, 3))),
    AlterTopicPartitions("orders", 2, ()),
    SetTopicSettings("orders", TopicSettings(retention_ms=1)),
    SetTopicSettings("orders", TopicSettings(), frozenset({"retention_bytes", "retention_ms"})),
    DeleteTopic("orders"),
    MoveReplicas("orders", 1, (4, 2, 3)),
    RegisterNode(4, "10.0.0.4:7000"),
    DecommissionNode(4),
]


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda c: type(c).__name__)
def test_every_command_round_trips(command) -> None:
    payload = encode_command(command)
    assert decode_command(payload) == command
    assert decode_control(payload) == command
    raw = msgpack.unpackb(payload, raw=False)
    assert (raw["ctl"], raw["v"], raw["op"]) == ("controller", 1, command.T.value)


def _entry(op: str, **fields) -> bytes:
    return msgpack.packb({"ctl": "controller", "v": 1, "op": op, **fields})


MALFORMED = [
    ("not msgpack", b"\xc1\xc1", "msgpack"),
    ("not a map", msgpack.packb([1, 2]), "map"),
    ("no version", msgpack.packb({"ctl": "controller", "op": "delete_topic"}), "version"),
    ("version is a bool", msgpack.packb({"ctl": "controller", "v": True}), "version"),
    ("name missing", _entry("delete_topic"), "name"),
    ("name not a string", _entry("delete_topic", name=b"bytes"), "name"),
    ("name too long", _entry("delete_topic", name="x" * 2000), "name"),
    ("replicas not a list", _entry("create_topic", name="t", replicas=3), "replicas"),
    ("a replica list empty", _entry("create_topic", name="t", replicas=[[]]), "replicas"),
    ("a node id zero", _entry("create_topic", name="t", replicas=[[0]]), "node id"),
    ("a node id a bool", _entry("create_topic", name="t", replicas=[[True]]), "node id"),
    ("a node id a string", _entry("move_replicas", topic="t", partition=0, replicas=["1"]),
     "node id"),
    ("too many replicas", _entry("move_replicas", topic="t", partition=0,
                                 replicas=list(range(1, 30))), "replicas"),
    ("too many partitions", _entry("create_topic", name="t", replicas=[[1]] * 10_001),
     "replicas"),
    ("partition negative", _entry("move_replicas", topic="t", partition=-1, replicas=[1]),
     "partition"),
    ("partitions zero", _entry("alter_topic_partitions", name="t", partitions=0,
                               new_replicas=[]), "partitions"),
    ("settings not a map", _entry("create_topic", name="t", replicas=[[1]], settings=[1]),
     "settings"),
    ("unknown setting", _entry("create_topic", name="t", replicas=[[1]],
                               settings={"colour": 1}), "colour"),
    ("setting zero", _entry("create_topic", name="t", replicas=[[1]],
                            settings={"retention_ms": 0}), "retention_ms"),
    ("setting a float", _entry("create_topic", name="t", replicas=[[1]],
                               settings={"retention_bytes": 1.5}), "retention_bytes"),
    ("reset unknown", _entry("set_topic_settings", name="t", settings={}, reset=["x"]),
     "reset"),
    ("reset not a list", _entry("set_topic_settings", name="t", settings={}, reset="x"),
     "reset"),
    ("address not a string", _entry("register_node", node_id=1, address=5), "address"),
    ("node id too big", _entry("decommission_node", node_id=2**40), "node_id"),
]


@pytest.mark.parametrize("name,payload,field", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_entry_is_a_clear_error(name, payload, field) -> None:
    with pytest.raises(MalformedCommand) as info:
        decode_command(payload)
    assert field in str(info.value)


@pytest.mark.parametrize("payload", [
    msgpack.packb({"ctl": "controller", "v": 2, "op": "delete_topic", "name": "t"}),
    _entry("split_topic", name="t"),
])
def test_a_newer_entry_asks_for_an_upgrade(payload) -> None:
    with pytest.raises(UnsupportedCommand, match="upgrade"):
        decode_command(payload)


def test_other_control_users_entries_are_not_ours() -> None:
    assert decode_control(msgpack.packb({"ctl": "load_begin", "load_id": "x"})) is None
    assert decode_control(msgpack.packb({"ctl": "sub_ops", "ops": []})) is None
    assert decode_control(b"\xc1") is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decoding_arbitrary_bytes_never_fails_otherwise(data) -> None:
    try:
        decode_command(data)
    except (MalformedCommand, UnsupportedCommand):
        pass


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                     st.text(max_size=5),
                     st.binary(max_size=5))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([c.T.value for c in EVERY_COMMAND]),
       st.dictionaries(st.sampled_from(["name", "topic", "partition", "partitions", "replicas",
                                        "new_replicas", "settings", "reset", "node_id",
                                        "address"]), _values, max_size=6))
def test_decoding_arbitrary_fields_never_fails_otherwise(op, fields) -> None:
    try:
        decode_command(_entry(op, **fields))
    except (MalformedCommand, UnsupportedCommand):
        pass


@pytest.mark.parametrize("command,field", [
    (CreateTopic("t", ((1,),), TopicSettings(retention_bytes=0)), "retention_bytes"),
    (MoveReplicas("t", -1, (1,)), "partition"),
    (RegisterNode(0, "h:1"), "node_id"),
    (CreateTopic("t", ((),)), "replicas"),
])
def test_the_proposer_hears_at_once_what_every_node_would_refuse(command, field) -> None:
    with pytest.raises(MalformedCommand, match=field):
        encode_command(command)
