"""Staged-load requests (`load_begin`, `load_stage`, `load_commit`, `load_abort`,
`load_status`, docs/SPARK.md) as typed values, parsed once.

Why a bad field does not raise here as it does for every other request: the load service has
always answered a malformed load request with a BAD_REQUEST *reply* (the connection stays
open) and only after its leader check, so a client talking to a follower learns where the
leader is first. `parse_load` therefore turns a bad field into a `LoadRefused` value that
carries the refusal; the service answers it where the old field checks stood. Only a bad
`group`, `topic` or `topic_partition` (fields every request shares) raises, as it does for
every request.

Topic partition: a load writes to one partition of a topic, named by `topic` and
`topic_partition` (defaults "default" and 0, written only when not the defaults). Not
`partition`, which in `load_stage` and `load_commit`'s attempts is the Spark task's partition.

What stays with the service: whether the load is open (LOAD_CLOSED) and the records rule on
a staged payload (storage.records.check_records), which need the node's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from raft.protocol.fields import get_bytes, get_int, get_str
from raft.protocol.framing import WireError
from raft.protocol.requests import (DEFAULT_TOPIC, group_of, partition_of, request_frame,
                                    topic_of)
from raft.core.types import Acks, ErrorCode

I32_MAX, I64_MAX = 2**31 - 1, 2**63 - 1
MAX_LOAD_ID_BYTES = 256
DEFAULT_STAGE_TIMEOUT_MS = 30_000
DEFAULT_ABORT_REASON = "aborted by the client"
TOPIC_PARTITION_KEY = "topic_partition"  # the wire name of a load's topic partition

Attempt = tuple[int, int, int, int]  # (partition, attempt, batches, rows)


def _load_id(frame: dict[str, Any]) -> str:
    lid = get_str(frame, "load_id")
    if not lid or len(lid.encode()) > MAX_LOAD_ID_BYTES:
        raise WireError(f"load_id must be 1..{MAX_LOAD_ID_BYTES} bytes")
    return lid


@dataclass(slots=True)
class LoadBegin:
    """Open a load (or learn that it already committed)."""

    T: ClassVar[str] = "load_begin"
    load_id: str
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    topic_partition: int = 0  # the topic's partition ("partition" is Spark's, see above)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> LoadBegin:
        return cls(_load_id(frame))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {"load_id": self.load_id}, self.group,
                             self.topic, self.topic_partition, TOPIC_PARTITION_KEY)


@dataclass(slots=True)
class LoadStage:
    """One batch of one task attempt's rows, tagged so a resend is recognised."""

    T: ClassVar[str] = "load_stage"
    load_id: str
    gen: int
    partition: int
    attempt: int
    seq: int
    count: int
    payload: bytes
    acks: Acks = Acks.LEADER
    timeout_ms: int = DEFAULT_STAGE_TIMEOUT_MS
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    topic_partition: int = 0  # the topic's partition ("partition" is Spark's, see above)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> LoadStage:
        # Bounded as the stage tag stores them (raft.core.loads: gen and attempt 64-bit, partition
        # and seq 32-bit): an out-of-range number is the client's error, not the node's.
        # The load id is not length-checked here, as it never was for a stage: a stage for a
        # load that was never begun is LOAD_CLOSED.
        load_id = get_str(frame, "load_id")
        gen = get_int(frame, "gen", minimum=0, maximum=I64_MAX)
        partition = get_int(frame, "partition", minimum=0, maximum=I32_MAX)
        attempt = get_int(frame, "attempt", minimum=0, maximum=I64_MAX)
        seq = get_int(frame, "seq", minimum=0, maximum=I32_MAX)
        count = get_int(frame, "count")
        payload = get_bytes(frame, "payload")
        try:
            acks = Acks(get_str(frame, "acks", default=Acks.LEADER.value))
        except ValueError:
            raise WireError("acks must be quorum, leader or none") from None
        if count < 1:
            raise WireError("count must be >= 1")
        timeout_ms = get_int(frame, "timeout_ms", default=DEFAULT_STAGE_TIMEOUT_MS)
        return cls(load_id, gen, partition, attempt, seq, count, payload, acks, timeout_ms)

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {
            "load_id": self.load_id, "gen": self.gen, "partition": self.partition,
            "attempt": self.attempt, "seq": self.seq, "count": self.count,
            "payload": self.payload, "acks": self.acks.value, "timeout_ms": self.timeout_ms,
        }, self.group,
                             self.topic, self.topic_partition, TOPIC_PARTITION_KEY)


@dataclass(slots=True)
class LoadCommit:
    """Commit a load, naming each partition's winning attempt and what it wrote."""

    T: ClassVar[str] = "load_commit"
    load_id: str
    gen: int
    attempts: list[Attempt]
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    topic_partition: int = 0  # the topic's partition ("partition" is Spark's, see above)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> LoadCommit:
        load_id = _load_id(frame)
        attempts = frame.get("attempts")
        if not isinstance(attempts, list) or not all(
                isinstance(a, list) and len(a) == 4 and all(isinstance(x, int) for x in a)
                for a in attempts):
            raise WireError("attempts must be a list of [partition, attempt, batches, rows]")
        return cls(load_id, get_int(frame, "gen"), [tuple(a) for a in attempts])  # type: ignore[misc]

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {"load_id": self.load_id, "gen": self.gen,
                                           "attempts": [list(a) for a in self.attempts]},
                             self.group,
                             self.topic, self.topic_partition, TOPIC_PARTITION_KEY)


@dataclass(slots=True)
class LoadAbort:
    """Abort a load's generation (its staged rows are never shown)."""

    T: ClassVar[str] = "load_abort"
    load_id: str
    gen: int
    reason: str = DEFAULT_ABORT_REASON
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    topic_partition: int = 0  # the topic's partition ("partition" is Spark's, see above)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> LoadAbort:
        load_id = _load_id(frame)
        return cls(load_id, get_int(frame, "gen"),
                   get_str(frame, "reason", default=DEFAULT_ABORT_REASON))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {"load_id": self.load_id, "gen": self.gen,
                                           "reason": self.reason}, self.group,
                             self.topic, self.topic_partition, TOPIC_PARTITION_KEY)


@dataclass(slots=True)
class LoadStatus:
    """The high watermark and open loads; with a load id, that load too. A load id that is
    not a string asks about no load (as it always has)."""

    T: ClassVar[str] = "load_status"
    load_id: str | None = None
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    topic_partition: int = 0  # the topic's partition ("partition" is Spark's, see above)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> LoadStatus:
        lid = frame.get("load_id")
        return cls(lid if isinstance(lid, str) else None)

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields = {} if self.load_id is None else {"load_id": self.load_id}
        return request_frame(self.T, rid, fields, self.group,
                             self.topic, self.topic_partition, TOPIC_PARTITION_KEY)


@dataclass(slots=True)
class LoadRefused:
    """A load request with a bad field: the service answers `code`/`message` after its
    leader check (see the module docstring)."""

    t: str
    code: ErrorCode
    message: str
    group: int | None = None
    topic: str = DEFAULT_TOPIC
    topic_partition: int = 0  # the topic's partition ("partition" is Spark's, see above)


LoadRequest = LoadBegin | LoadStage | LoadCommit | LoadAbort | LoadStatus | LoadRefused

_PARSERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    c.T: c.parse for c in (LoadBegin, LoadStage, LoadCommit, LoadAbort, LoadStatus)}
LOAD_TYPES: frozenset[str] = frozenset(_PARSERS)


def parse_load(t: str, frame: dict[str, Any]) -> LoadRequest:
    """The typed load request of a frame of load type `t` (KeyError for other types); a bad
    field gives a LoadRefused, a bad group raises WireError."""
    group = group_of(frame, t)
    topic = topic_of(frame, t)
    topic_partition = partition_of(frame, t, TOPIC_PARTITION_KEY)
    try:
        req = _PARSERS[t](frame)
    except WireError as e:
        return LoadRefused(t, e.code, str(e), group, topic, topic_partition)
    req.group, req.topic, req.topic_partition = group, topic, topic_partition
    return req
