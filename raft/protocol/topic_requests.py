"""Topic requests as typed values (issue 26, docs/PROTOCOL.md "Topics"): `metadata`, which any
node answers from the controller metadata it has applied, and the admin requests
`topic_create`, `topic_alter`, `topic_delete`, which the controller's leader answers once the
controller entry carrying them has committed and been applied on that node.

Like every request, a field of the wrong type or out of range is a malformed frame
(WireError, BAD_REQUEST, naming the field). Whether a name is a valid topic name beyond its
length, whether a topic exists, whether enough nodes can hold the replicas: those are verdicts
of the controller (error replies), since they depend on the cluster's state.

These requests are the controller's (group 0, `CONTROLLER_GROUP`): `group` is not a wire field
of theirs, it is what the node routes them by.

`topic_move` proposes a partition's new replica set (the controller's MoveReplicas).

Replies (see docs/PROTOCOL.md): `metadata` -> {"controller", "controller_address", "applied",
"nodes": [{"node_id", "address"}], "topics": [topic map]}; `topic_create` / `topic_alter` ->
{"topic": topic map}; `topic_delete` -> {}; `topic_move` -> {"topic": topic map,
"previous": [node ids]}. A topic map is {"name", "settings": {set ones},
"partitions": [{"partition", "group", "replicas", "leader", "leader_address"}]}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from raft.protocol.fields import get_int
from raft.protocol.framing import WireError
from raft.protocol.requests import CONTROLLER_GROUP, Limits, request_frame, topic_name

# Bounds as the controller's commands have them (raft/controller/commands.py): a request the
# controller could not encode is refused before it reaches the log.
MAX_PARTITIONS = 10_000
MAX_REPLICAS = 16
MAX_SETTING = 2**62
MAX_METADATA_TOPICS = 10_000
MAX_NODE_ID = 2**31 - 1
SETTING_FIELDS = ("retention_bytes", "retention_ms", "max_record_bytes")


def _settings(frame: dict[str, Any], where: str) -> dict[str, int]:
    """The per-topic settings a frame sets (absent or nil: not set), as keyword arguments of
    the request that carries them."""
    out = {}
    for key in SETTING_FIELDS:
        if frame.get(key) is not None:
            out[key] = get_int(frame, key, minimum=1, maximum=MAX_SETTING, where=where)
    return out


def _admin_frame(t: str, rid: int, fields: dict[str, Any],
                 timeout_ms: int | None) -> dict[str, Any]:
    """An admin request's frame: its fields, and its timeout when it has one."""
    if timeout_ms is not None:
        fields["timeout_ms"] = timeout_ms
    return request_frame(t, rid, fields)


class _CarriesSettings:
    """The requests that set per-topic settings (create, alter): one reading of which are set,
    so a new setting is a new SETTING_FIELDS name and field, nothing more."""

    __slots__ = ()

    def settings(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in SETTING_FIELDS if getattr(self, k) is not None}


@dataclass(slots=True)
class Metadata:
    """Topics, partitions, replicas and leaders as this node knows them; `topics` None asks
    for every topic (a named topic that does not exist is left out of the reply)."""

    T: ClassVar[str] = "metadata"
    topics: list[str] | None = None
    group: int = CONTROLLER_GROUP  # routing only, never on the wire

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> Metadata:
        w = cls.T
        raw = frame.get("topics")
        if raw is None:
            return cls(None)
        if not isinstance(raw, list) or len(raw) > MAX_METADATA_TOPICS:
            raise WireError(f'{w} field "topics" must be a list of at most '
                            f'{MAX_METADATA_TOPICS} topic names (or absent: every topic)')
        return cls([topic_name(t, w, f"topics[{i}]") for i, t in enumerate(raw)])

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields = {} if self.topics is None else {"topics": list(self.topics)}
        return request_frame(self.T, rid, fields)


@dataclass(slots=True)
class TopicCreate(_CarriesSettings):
    """Create topic `name` with `partitions` partitions of `replicas` replicas each; settings
    not given follow the cluster's defaults."""

    T: ClassVar[str] = "topic_create"
    name: str
    partitions: int
    replicas: int
    retention_bytes: int | None = None
    retention_ms: int | None = None
    max_record_bytes: int | None = None
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> TopicCreate:
        w = cls.T
        name = topic_name(frame.get("name"), w, "name")
        partitions = get_int(frame, "partitions", minimum=1, maximum=MAX_PARTITIONS, where=w)
        replicas = get_int(frame, "replicas", minimum=1, maximum=MAX_REPLICAS, where=w)
        settings = _settings(frame, w)
        return cls(name, partitions, replicas, **settings, timeout_ms=limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"name": self.name, "partitions": self.partitions,
                                  "replicas": self.replicas, **self.settings()}
        return _admin_frame(self.T, rid, fields, self.timeout_ms)


@dataclass(slots=True)
class TopicAlter(_CarriesSettings):
    """Grow topic `name` to `partitions` partitions (never shrink: keys would move) and/or set
    its settings; what is not given stays as it is."""

    T: ClassVar[str] = "topic_alter"
    name: str
    partitions: int | None = None
    retention_bytes: int | None = None
    retention_ms: int | None = None
    max_record_bytes: int | None = None
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> TopicAlter:
        w = cls.T
        name = topic_name(frame.get("name"), w, "name")
        partitions = None
        if frame.get("partitions") is not None:
            partitions = get_int(frame, "partitions", minimum=1, maximum=MAX_PARTITIONS,
                                 where=w)
        settings = _settings(frame, w)
        return cls(name, partitions, **settings, timeout_ms=limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"name": self.name, **self.settings()}
        if self.partitions is not None:
            fields["partitions"] = self.partitions
        return _admin_frame(self.T, rid, fields, self.timeout_ms)


@dataclass(slots=True)
class TopicDelete:
    """Delete topic `name`: every node stops its partitions and drops their data."""

    T: ClassVar[str] = "topic_delete"
    name: str
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> TopicDelete:
        w = cls.T
        return cls(topic_name(frame.get("name"), w, "name"), limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return _admin_frame(self.T, rid, {"name": self.name}, self.timeout_ms)


@dataclass(slots=True)
class TopicMove:
    """Give partition `partition` of topic `name` the replica set `replicas` (first = preferred
    leader). Answered once the controller applied it: the partition's leader then carries it
    out (learners added and promoted, leaving replicas removed), which `status` shows."""

    T: ClassVar[str] = "topic_move"
    name: str
    partition: int
    replicas: list[int]
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> TopicMove:
        w = cls.T
        name = topic_name(frame.get("name"), w, "name")
        partition = get_int(frame, "partition", minimum=0, maximum=MAX_PARTITIONS - 1, where=w)
        raw = frame.get("replicas")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_REPLICAS or any(
                isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NODE_ID
                for n in raw):
            raise WireError(f'{w} field "replicas" must be a list of 1..{MAX_REPLICAS} node ids '
                            f'(integers 1..{MAX_NODE_ID}), first = preferred leader')
        return cls(name, partition, list(raw), limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"name": self.name, "partition": self.partition,
                                  "replicas": list(self.replicas)}
        return _admin_frame(self.T, rid, fields, self.timeout_ms)


TopicRequest = Metadata | TopicCreate | TopicAlter | TopicDelete | TopicMove
TOPIC_TYPES = tuple(c.T for c in (Metadata, TopicCreate, TopicAlter, TopicDelete, TopicMove))
