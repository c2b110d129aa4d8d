"""The controller's log entries: typed, versioned commands, and their bytes.

The controller is Raft group 0 (issue 26): its log holds every change to the cluster's metadata
(topics, partitions, replica sets, per-topic settings, nodes), and every node applies it in log
order to a `ClusterMetadata` (state.py). A command travels as the payload of a CONTROL batch,
a msgpack map in the style of the other CONTROL users (raft/core/loads.py, the subscription
table):

    {"ctl": "controller", "v": 1, "op": "create_topic", ...the command's fields...}

Other CONTROL users ignore maps whose "ctl" they do not know, and so do we (`decode_control`
answers None for them).

Decoding never trusts its input: the log may hold bytes written by a buggy or newer node, and a
snapshot may come from a peer. Two kinds of failure are told apart, because the state machine
must stay the same on every node:
- `MalformedCommand`: a known operation at a known version whose fields are wrong (a string
  where a count belongs, a negative node id, a missing field). Every node of every version
  reads the same bytes the same way, so the state machine refuses it deterministically
  (ApplyResult MALFORMED) and carries on.
- `UnsupportedCommand`: a version or operation this build does not know. A newer node may have
  written it and applies it; skipping it here would make this node's metadata diverge, so the
  runtime must stop loudly and ask for an upgrade (fail-stop), never skip.

Semantic checks (topic name rules, whether a topic exists, replica sets naming known nodes) are
the state machine's, at apply time, so they are decided by the log order alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, ClassVar, Union

import msgpack

from raft.controller.command_fields import (
    MalformedCommand,
    UnsupportedCommand,
    _int,
    _node_list,
    _str,
    MAX_NODE_ID,
    MAX_REPLICAS,
)
from raft.controller.link_commands import LINK_COMMANDS, LinkCommand

CTL_NAME = "controller"  # the "ctl" of every controller CONTROL payload
COMMAND_VERSION = 1

# Bounds on what a command may carry, so a bad entry cannot make every node allocate without
# limit. Generous against real use (Kafka clusters run a few thousand partitions per topic).
MAX_NAME_CHARS = 1024  # decode bound only; the topic name rule (state.py) allows 249
MAX_PARTITIONS = 10_000  # per topic
MAX_ADDRESS_CHARS = 512
MAX_SHARDS = 1024  # shard processes of one node (docs/SHARDS.md)


class CommandType(str, Enum):
    """The operation of a command ("op" on the wire)."""

    CREATE_TOPIC = "create_topic"
    ALTER_TOPIC_PARTITIONS = "alter_topic_partitions"
    SET_TOPIC_SETTINGS = "set_topic_settings"
    DELETE_TOPIC = "delete_topic"
    MOVE_REPLICAS = "move_replicas"
    REGISTER_NODE = "register_node"
    DECOMMISSION_NODE = "decommission_node"



# -- field readers: command_fields.py (shared with the link commands) ------------------------


def _assignment(raw: dict[str, Any], key: str, op: str) -> tuple[tuple[int, ...], ...]:
    value = raw.get(key)
    if not isinstance(value, (list, tuple)) or len(value) > MAX_PARTITIONS:
        raise MalformedCommand(f"{op}: {key} must be a list (one replica list per partition, "
                               f"at most {MAX_PARTITIONS})")
    return tuple(_node_list(r, f"{key}[{i}]", op) for i, r in enumerate(value))


def _shards(raw: dict[str, Any], key: str, op: str, count: int) -> tuple[int, ...]:
    """One shard index per partition (docs/SHARDS.md), or () when the key is absent: every
    partition on shard 0, which is what an entry written before shards means."""
    value = raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or len(value) != count or any(
            isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < MAX_SHARDS
            for s in value):
        raise MalformedCommand(f"{op}: {key} must be a list of {count} shard indexes "
                               f"(0..{MAX_SHARDS - 1}), one per partition")
    return tuple(value)


def _with_shards(fields: dict[str, Any], key: str, shards: tuple[int, ...]) -> dict[str, Any]:
    """Written only when some partition is off shard 0: entries of a node with one shard stay
    byte for byte what they were before shards."""
    if any(shards):
        fields[key] = list(shards)
    return fields


# -- settings ----------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class TopicSettings:
    """A topic's own settings; None means "the cluster's default" (the node's --retention-*
    flags today), so changing a default changes every topic that did not set its own.
    Retention by bytes or age (docs/RETENTION.md: None keeps everything); the largest record a
    producer may write."""

    retention_bytes: int | None = None
    retention_ms: int | None = None
    max_record_bytes: int | None = None

    def to_raw(self) -> dict[str, int]:
        """Only the set fields: a default stays a default across versions."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    @staticmethod
    def from_raw(raw: Any, op: str = "settings") -> "TopicSettings":
        if not isinstance(raw, dict):
            raise MalformedCommand(f"{op}: settings must be a map")
        names = {f.name for f in fields(TopicSettings)}
        unknown = sorted(str(k) for k in raw if k not in names)
        if unknown:
            raise MalformedCommand(f"{op}: unknown setting(s) {', '.join(unknown)}; known: "
                                   f"{', '.join(sorted(names))}")
        return TopicSettings(**{k: _int(raw, k, op, least=1, most=2**62) for k in raw})

    def merged(self, change: "TopicSettings", reset: frozenset[str]) -> "TopicSettings":
        """These settings with `change`'s set fields applied, then `reset` back to defaults."""
        out = replace(self, **change.to_raw())
        return replace(out, **{name: None for name in reset})

    def resolved(self, defaults: "TopicSettings") -> "TopicSettings":
        """The settings in force: this topic's, else the defaults'."""
        return TopicSettings(**{f.name: (getattr(self, f.name) if getattr(self, f.name)
                                         is not None else getattr(defaults, f.name))
                                for f in fields(self)})


SETTING_NAMES = frozenset(f.name for f in fields(TopicSettings))


# -- the commands ------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class CreateTopic:
    """A new topic. `replicas` holds one replica list per partition, first = preferred leader:
    the proposer chooses them (placement.py, with what it knows of live nodes), so applying is
    a pure function of the log, as in Kafka's and Redpanda's controllers."""

    T: ClassVar[CommandType] = CommandType.CREATE_TOPIC
    name: str
    replicas: tuple[tuple[int, ...], ...]
    settings: TopicSettings = TopicSettings()
    # The shard index of each partition on every one of its replicas (docs/SHARDS.md); () =
    # every partition on shard 0.
    shards: tuple[int, ...] = ()

    @property
    def partitions(self) -> int:
        return len(self.replicas)

    def _fields(self) -> dict[str, Any]:
        return _with_shards({"name": self.name, "replicas": [list(r) for r in self.replicas],
                             "settings": self.settings.to_raw()}, "shards", self.shards)

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "CreateTopic":
        replicas = _assignment(raw, "replicas", op)
        return CreateTopic(_str(raw, "name", op, most=MAX_NAME_CHARS), replicas,
                           TopicSettings.from_raw(raw.get("settings", {}), op),
                           _shards(raw, "shards", op, len(replicas)))


@dataclass(slots=True, frozen=True)
class AlterTopicPartitions:
    """Grow a topic to `partitions` partitions (never shrink: keys would move and records would
    be lost). `new_replicas` places the added partitions, one list each."""

    T: ClassVar[CommandType] = CommandType.ALTER_TOPIC_PARTITIONS
    name: str
    partitions: int
    new_replicas: tuple[tuple[int, ...], ...]
    new_shards: tuple[int, ...] = ()  # as CreateTopic.shards, for the added partitions

    def _fields(self) -> dict[str, Any]:
        return _with_shards({"name": self.name, "partitions": self.partitions,
                             "new_replicas": [list(r) for r in self.new_replicas]},
                            "new_shards", self.new_shards)

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "AlterTopicPartitions":
        replicas = _assignment(raw, "new_replicas", op)
        return AlterTopicPartitions(_str(raw, "name", op, most=MAX_NAME_CHARS),
                                    _int(raw, "partitions", op, least=1, most=MAX_PARTITIONS),
                                    replicas, _shards(raw, "new_shards", op, len(replicas)))


@dataclass(slots=True, frozen=True)
class SetTopicSettings:
    """Set the given settings of a topic and return the `reset` ones to the cluster default;
    the rest keep their values (two admins changing different settings do not undo each
    other)."""

    T: ClassVar[CommandType] = CommandType.SET_TOPIC_SETTINGS
    name: str
    settings: TopicSettings
    reset: frozenset[str] = frozenset()

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "settings": self.settings.to_raw(),
                "reset": sorted(self.reset)}

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "SetTopicSettings":
        reset = raw.get("reset", [])
        if not isinstance(reset, list) or not all(isinstance(r, str) for r in reset):
            raise MalformedCommand(f"{op}: reset must be a list of setting names")
        unknown = sorted(set(reset) - SETTING_NAMES)
        if unknown:
            raise MalformedCommand(f"{op}: reset names unknown setting(s) {', '.join(unknown)}")
        return SetTopicSettings(_str(raw, "name", op, most=MAX_NAME_CHARS),
                                TopicSettings.from_raw(raw.get("settings", {}), op),
                                frozenset(reset))


@dataclass(slots=True, frozen=True)
class DeleteTopic:
    """Delete a topic: its groups are tombstoned and every node drops their data."""

    T: ClassVar[CommandType] = CommandType.DELETE_TOPIC
    name: str

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name}

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "DeleteTopic":
        return DeleteTopic(_str(raw, "name", op, most=MAX_NAME_CHARS))


@dataclass(slots=True, frozen=True)
class MoveReplicas:
    """The target replica set of one partition, first = preferred leader. The same set in
    another order only moves the preferred leader (no data moves); another set is carried out
    by the group's own learner -> voter membership change (runtime work)."""

    T: ClassVar[CommandType] = CommandType.MOVE_REPLICAS
    topic: str
    partition: int
    replicas: tuple[int, ...]

    def _fields(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition,
                "replicas": list(self.replicas)}

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "MoveReplicas":
        return MoveReplicas(_str(raw, "topic", op, most=MAX_NAME_CHARS),
                            _int(raw, "partition", op, least=0, most=MAX_PARTITIONS - 1),
                            _node_list(raw.get("replicas"), "replicas", op))


@dataclass(slots=True, frozen=True)
class RegisterNode:
    """A node joins the cluster's metadata (or changes its address). New replicas may be placed
    on it from here on."""

    T: ClassVar[CommandType] = CommandType.REGISTER_NODE
    node_id: int
    address: str
    # Shard processes the node runs (docs/SHARDS.md): shard k listens on the address's port
    # + k. Written only when not 1, so a one-shard node's entry is what it was before shards.
    shards: int = 1

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"node_id": self.node_id, "address": self.address}
        if self.shards != 1:
            fields["shards"] = self.shards
        return fields

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "RegisterNode":
        shards = _int(raw, "shards", op, least=1, most=MAX_SHARDS) if "shards" in raw else 1
        return RegisterNode(_int(raw, "node_id", op, least=1, most=MAX_NODE_ID),
                            _str(raw, "address", op, most=MAX_ADDRESS_CHARS), shards)


@dataclass(slots=True, frozen=True)
class DecommissionNode:
    """A node is leaving: nothing new is placed on it, and the rebalance planner moves its
    replicas away. Its id is never given to another node."""

    T: ClassVar[CommandType] = CommandType.DECOMMISSION_NODE
    node_id: int

    def _fields(self) -> dict[str, Any]:
        return {"node_id": self.node_id}

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "DecommissionNode":
        return DecommissionNode(_int(raw, "node_id", op, least=1, most=MAX_NODE_ID))


Command = Union[CreateTopic, AlterTopicPartitions, SetTopicSettings, DeleteTopic, MoveReplicas,
                RegisterNode, DecommissionNode, LinkCommand]
_BY_TYPE: dict[str, Any] = {c.T.value: c for c in (
    CreateTopic, AlterTopicPartitions, SetTopicSettings, DeleteTopic, MoveReplicas,
    RegisterNode, DecommissionNode, *LINK_COMMANDS)}


# -- bytes -------------------------------------------------------------------------------------
def encode_command(command: Command) -> bytes:
    """The CONTROL payload for `command` (storage.batch.BatchKind.CONTROL in group 0's log).
    MalformedCommand if the command holds what decoding would refuse (a zero retention, a node
    id out of range): the proposer hears it at once instead of committing an entry that every
    node then refuses."""
    body = {"ctl": CTL_NAME, "v": COMMAND_VERSION, "op": command.T.value}
    body.update(command._fields())
    payload = msgpack.packb(body, use_bin_type=True)
    decode_command(payload)  # the same checks every node makes when it applies the entry
    return payload


def decode_command(payload: bytes | memoryview) -> Command:
    """The command a controller payload holds. MalformedCommand if it is not a well-formed
    controller command; UnsupportedCommand if it is one of a newer version or operation."""
    try:
        raw = msgpack.unpackb(bytes(payload), raw=False)
    except Exception as e:  # msgpack raises several types for bad input
        raise MalformedCommand(f"a controller entry is not valid msgpack ({type(e).__name__})"
                               ) from None
    if not isinstance(raw, dict) or raw.get("ctl") != CTL_NAME:
        raise MalformedCommand("a controller entry must be a map with ctl='controller'")
    version = raw.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise MalformedCommand(f"a controller entry needs an integer version v, got {version!r}")
    if version != COMMAND_VERSION:
        raise UnsupportedCommand(f"the controller log holds a version {version} entry; this "
                                 f"node reads version {COMMAND_VERSION}: upgrade it to the "
                                 f"cluster's version before it applies the controller log")
    op = raw.get("op")
    cls = _BY_TYPE.get(op) if isinstance(op, str) else None
    if cls is None:
        raise UnsupportedCommand(f"the controller log holds an operation {op!r} this node "
                                 f"does not know: upgrade it to the cluster's version")
    return cls._parse(raw, op)


def is_controller_payload(payload: bytes | memoryview) -> bool:
    """Whether a CONTROL payload is the controller's (cheap check, no validation)."""
    try:
        raw = msgpack.unpackb(bytes(payload), raw=False)
    except Exception:
        return False
    return isinstance(raw, dict) and raw.get("ctl") == CTL_NAME


def decode_control(payload: bytes | memoryview) -> Command | None:
    """None for another CONTROL user's payload; else decode_command's answer (or error)."""
    if not is_controller_payload(payload):
        return None
    return decode_command(payload)
