"""Client requests as typed values: parsed once from a frame (every field's type and range
checked, WireError/BAD_REQUEST naming the field otherwise) and encoded back by clients.

Each request class has `T` (its type tag), `parse(frame, limits)` for the node and `to_frame(rid)`
for clients; fields have the wire's names. `Limits` carries the node settings a parse depends on
(default and largest timeouts, the frame limit), so the protocol needs nothing of the node.

Topic and partition (issue 26): every request that touches a partition's log carries `topic`
(default `DEFAULT_TOPIC`, "default") and `partition` (default 0); each is written on the wire only
when it is not the default, so the frames of clients that predate topics are unchanged. The node
resolves (topic, partition) to the partition's Raft group through its applied controller
metadata. `group` names a Raft group directly (for tests and internal tools): None (the default,
never written) means "resolve topic/partition"; when a frame carries it, it wins. Group 0 is the
controller (`CONTROLLER_GROUP`); the default topic's partition is a group >= 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from raft.protocol.fields import get_bytes, get_int, get_opt_int, get_str
from raft.protocol.framing import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION, WireError
from raft.core.types import Acks

SINGLE_GROUP = 0  # kept for callers of the single-group era: the group a frame without one had
CONTROLLER_GROUP = 0  # the controller's Raft group (raft/controller/)
DEFAULT_TOPIC = "default"  # the topic of requests that name none (raft.controller.state)
MAX_TOPIC_NAME_CHARS = 249  # Kafka's bound; the characters are the controller's rule
MAX_PARTITION = 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
DEFAULT_FETCH_MAX_BYTES = 1 << 20
# Room for the reply envelope around fetched payloads.
FETCH_FRAME_OVERHEAD = 64 * 1024
_ACKS = {a.value: a for a in Acks}
_ACK_VALUES = {a: a.value for a in Acks}
_ACK_NAMES = [a.value for a in Acks]


@dataclass(slots=True, frozen=True)
class Limits:
    """The node's settings that bound a request's fields (raft.node.config.NodeConfig)."""

    default_timeout_ms: int = 5000
    max_timeout_ms: int = 120_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_fetch_wait_ms: int = 60_000

    @property
    def fetch_max_bytes(self) -> int:
        """The largest fetch reply payload: the frame limit less room for the envelope."""
        return self.max_frame_bytes - min(FETCH_FRAME_OVERHEAD, self.max_frame_bytes // 8)

    def timeout_ms(self, frame: dict[str, Any], where: str) -> int:
        return get_int(frame, "timeout_ms", default=self.default_timeout_ms, minimum=1,
                       maximum=self.max_timeout_ms, where=where)


def acks_named(name: str | Acks) -> Acks:
    """The Acks for its wire name (a dict lookup: Acks(name) costs ~20x more on a client's
    produce path); ValueError naming the choices otherwise."""
    acks = _ACKS.get(name)
    if acks is None and isinstance(name, Acks):
        return name
    if acks is None:
        raise ValueError(f"acks must be one of {_ACK_NAMES}, got {name!r}")
    return acks


def group_of(frame: dict[str, Any], where: str) -> int | None:
    """The Raft group a frame names explicitly (None: resolve its topic and partition)."""
    if frame.get("group") is None:
        return None
    return get_int(frame, "group", minimum=0, maximum=I64_MAX, where=where)


def topic_name(value: Any, where: str, key: str = "topic") -> str:
    """A topic name field: a string of 1..249 characters (which characters is the controller's
    rule, answered as a verdict, not a hang-up)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TOPIC_NAME_CHARS:
        got = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
        raise WireError(f'{where} field "{key}" must be a topic name (a string of 1..'
                        f'{MAX_TOPIC_NAME_CHARS} characters), got {got}')
    return value


def topic_of(frame: dict[str, Any], where: str) -> str:
    """The request's topic (DEFAULT_TOPIC when the frame names none)."""
    value = frame.get("topic")
    return DEFAULT_TOPIC if value is None else topic_name(value, where)


def partition_of(frame: dict[str, Any], where: str, key: str = "partition") -> int:
    """The request's partition of its topic (0 when the frame names none)."""
    return get_int(frame, key, default=0, minimum=0, maximum=MAX_PARTITION, where=where)


def request_frame(t: str, rid: int, fields: dict[str, Any], group: int | None = None,
                  topic: str = DEFAULT_TOPIC, partition: int = 0,
                  partition_key: str = "partition") -> dict[str, Any]:
    """A request frame; group, topic and partition only when they are not the defaults."""
    out = {"v": PROTOCOL_VERSION, "t": t, "id": rid, **fields}
    if group is not None:
        out["group"] = group
    if topic != DEFAULT_TOPIC:
        out["topic"] = topic
    if partition:
        out[partition_key] = partition
    return out


@dataclass(slots=True)
class Produce:
    """Append one batch through the leader; answered once `acks` is satisfied."""

    T: ClassVar[str] = "produce"
    payload: bytes
    count: int
    acks: Acks = Acks.QUORUM
    timeout_ms: int | None = None  # the node's default when None
    producer_id: int = 0
    sequence: int = -1
    timestamp_ms: int | None = None  # the leader's clock when None
    group: int | None = None  # explicit Raft group (tests, tools); None: by topic/partition
    topic: str = DEFAULT_TOPIC
    partition: int = 0

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> Produce:
        # The hot path: the common, valid fields are taken with one type test each; anything
        # else goes through the checkers, which say what is wrong.
        w = "produce"
        get = frame.get
        acks = get("acks")
        acks = _ACKS.get(acks) if type(acks) is str else None
        if acks is None:
            acks = Acks(get_str(frame, "acks", default="quorum", choices=_ACK_NAMES, where=w))
        timeout_ms = get("timeout_ms")
        if not (type(timeout_ms) is int and 1 <= timeout_ms <= limits.max_timeout_ms):
            timeout_ms = limits.timeout_ms(frame, w)
        payload = get("payload")
        if type(payload) is not bytes:
            payload = get_bytes(frame, "payload", where=w)
        count = get("count")
        if not (type(count) is int and 1 <= count <= 2**31 - 1):
            count = get_int(frame, "count", minimum=1, maximum=2**31 - 1, where=w)
        producer_id = get("producer_id", 0)
        if not (type(producer_id) is int and 0 <= producer_id <= I64_MAX):
            producer_id = get_int(frame, "producer_id", default=0, minimum=0, maximum=I64_MAX,
                                  where=w)
        sequence = get("sequence", -1)
        if not (type(sequence) is int and -1 <= sequence <= I64_MAX):
            sequence = get_int(frame, "sequence", default=-1, minimum=-1, maximum=I64_MAX,
                               where=w)
        timestamp_ms = get("timestamp_ms")
        if not (type(timestamp_ms) is int and I64_MIN <= timestamp_ms <= I64_MAX):
            timestamp_ms = get_int(frame, "timestamp_ms", default=int(time.time() * 1000),
                                   minimum=I64_MIN, maximum=I64_MAX, where=w)
        group = None if get("group") is None else group_of(frame, w)
        topic = get("topic")
        topic = DEFAULT_TOPIC if topic is None else topic_name(topic, w)
        partition = get("partition")
        if partition is not None:
            partition = partition_of(frame, w)
        return cls(payload, count, acks, timeout_ms, producer_id, sequence, timestamp_ms, group,
                   topic, partition or 0)

    def to_frame(self, rid: int) -> dict[str, Any]:
        # The client's hot path: one dict, built in place (no request_frame copy), and the
        # acks name by a dict lookup (an enum's .value is a slower descriptor).
        out: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": "produce", "id": rid,
                               "acks": _ACK_VALUES[self.acks], "payload": self.payload,
                               "count": self.count}
        if self.timeout_ms is not None:
            out["timeout_ms"] = self.timeout_ms
        if self.producer_id:
            out["producer_id"] = self.producer_id
            out["sequence"] = self.sequence
        if self.timestamp_ms is not None:
            out["timestamp_ms"] = self.timestamp_ms
        if self.group is not None:
            out["group"] = self.group
        if self.topic != DEFAULT_TOPIC:
            out["topic"] = self.topic
        if self.partition:
            out["partition"] = self.partition
        return out


@dataclass(slots=True)
class Fetch:
    """Committed DATA batches from `offset`, long-polling up to `max_wait_ms`."""

    T: ClassVar[str] = "fetch"
    offset: int
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    max_wait_ms: int = 0
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    partition: int = 0

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> Fetch:
        w = "fetch"
        offset = get_int(frame, "offset", minimum=I64_MIN, maximum=I64_MAX, where=w)
        # Capped, not refused: the reply itself must fit the frame limit, and a long poll
        # is bounded by the node's setting.
        max_bytes = min(limits.fetch_max_bytes,
                        get_int(frame, "max_bytes", default=DEFAULT_FETCH_MAX_BYTES, minimum=1,
                                maximum=I64_MAX, where=w))
        max_wait_ms = min(limits.max_fetch_wait_ms,
                          get_int(frame, "max_wait_ms", default=0, minimum=0, maximum=I64_MAX,
                                  where=w))
        return cls(offset, max_bytes, max_wait_ms, group_of(frame, w), topic_of(frame, w),
                   partition_of(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {"offset": self.offset, "max_bytes": self.max_bytes,
                                           "max_wait_ms": self.max_wait_ms}, self.group,
                             self.topic, self.partition)


@dataclass(slots=True)
class Status:
    """The node's view of one partition's group (the default topic's unless named), its peers
    and links, and a line per group it runs (`partitions`) and the controller's state."""

    T: ClassVar[str] = "status"
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    partition: int = 0

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> Status:
        w = "status"
        return cls(group_of(frame, w), topic_of(frame, w), partition_of(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {}, self.group, self.topic, self.partition)


@dataclass(slots=True)
class TransferLeader:
    """Hand leadership to `to` (None: the most caught-up voter) and wait until it moved."""

    T: ClassVar[str] = "transfer_leader"
    to: int | None = None
    timeout_ms: int | None = None
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    partition: int = 0

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> TransferLeader:
        w = "transfer_leader"
        return cls(get_opt_int(frame, "to", where=w), limits.timeout_ms(frame, w),
                   group_of(frame, w), topic_of(frame, w), partition_of(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.to is not None:
            fields["to"] = self.to
        if self.timeout_ms is not None:
            fields["timeout_ms"] = self.timeout_ms
        return request_frame(self.T, rid, fields, self.group, self.topic, self.partition)


@dataclass(slots=True)
class AddNode:
    """Add a node as a learner (promoted to voter once caught up)."""

    T: ClassVar[str] = "add_node"
    node_id: int
    address: str
    group: int | None = None

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> AddNode:
        w = "add_node"
        address = get_str(frame, "address", where=w)
        return cls(get_int(frame, "node_id", minimum=1, where=w), address, group_of(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {"node_id": self.node_id, "address": self.address},
                      self.group)


@dataclass(slots=True)
class RemoveNode:
    """Remove a node from the configuration."""

    T: ClassVar[str] = "remove_node"
    node_id: int
    group: int | None = None

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> RemoveNode:
        w = "remove_node"
        return cls(get_int(frame, "node_id", minimum=1, where=w), group_of(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {"node_id": self.node_id}, self.group)


@dataclass(slots=True)
class RawRequest:
    """A request given as a type name and raw fields, for one this package has no type for
    (a newer node's, a test's). Clients send the typed ones: they own the field names."""

    t: str
    fields: dict[str, Any]
    group: int | None = None

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.t, rid, self.fields, self.group)


def type_of(request: Any) -> str:
    """The wire type tag of a typed request (`T`; the shared-shape ones carry their own `t`)."""
    t = getattr(request, "t", None)
    return t if isinstance(t, str) else request.T
