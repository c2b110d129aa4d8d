"""Subscription requests as typed values (docs/SUBSCRIPTIONS.md): `sub_open`, `sub_commit`,
`sub_reset`, `sub_pin`, `sub_release`, `sub_delete`, `sub_get` share one shape (`SubRequest`,
which fields each reads is in `_SPECS`); `sub_list` and `sub_commit_many` have their own.

Only field types and ranges are checked here (a wrong type hangs up, as for every request); a
name of the wrong shape or an unknown subscription are verdicts of the node (typed error
replies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from raft.protocol.fields import get_int, get_str
from raft.protocol.framing import WireError
from raft.protocol.requests import (DEFAULT_TOPIC, I64_MAX, Limits, group_of, partition_of,
                                    request_frame, topic_of)
from raft.core.subscription_table import MAX_LEASE_MS, AutoReset, Member

AUTO_RESET_VALUES = ("", *(p.value for p in AutoReset))
# "member": what a topic subscription's member asks (docs/SUBSCRIPTIONS.md); absent = classic.
MEMBER_VALUES = {"sub_open": ("", Member.WATCH.value, Member.TAKE.value),
                 "sub_release": ("", Member.LEAVE.value)}

LIST_DEFAULT_LIMIT = 1000
LIST_MAX_LIMIT = 10_000
# Items per sub_commit_many: half the accumulator's operations per entry (2048), so one request
# never needs more than one entry's room, and a reply stays far below the frame limit (a
# subscription map is a few hundred bytes).
MAX_COMMIT_ITEMS = 1000

Position = int | str  # an offset, or "start" / "end"


@dataclass(slots=True, frozen=True)
class _Spec:
    consumer: bool = False
    position: bool = False
    lease: bool = False
    initial: str | None = None  # the field naming a position: "from" (default "start") or "to"
    auto_reset: bool = False  # "auto_reset": the reset policy an open stores (absent: keep it)
    expect: bool = False  # "expect": a reset applies only if the position is still this
    member: bool = False  # "member": a topic subscription member's watch/take/leave


_SPECS: dict[str, _Spec] = {
    "sub_open": _Spec(consumer=True, lease=True, initial="from", auto_reset=True, member=True),
    "sub_commit": _Spec(consumer=True, position=True, lease=True),
    "sub_reset": _Spec(consumer=True, initial="to", expect=True),
    "sub_pin": _Spec(consumer=True, initial="from"),
    "sub_release": _Spec(consumer=True, member=True),
    "sub_delete": _Spec(),
    "sub_get": _Spec(),
}
SUB_TYPES = tuple(_SPECS)


def _position_of(frame: dict[str, Any], key: str, where: str, default: Any) -> Position:
    """A position given as "start", "end" or an offset (int)."""
    value = frame.get(key, default)
    if isinstance(value, str) and value in ("start", "end"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= I64_MAX:
        return value
    raise WireError(f'{where} field "{key}" must be "start", "end" or an offset >= 0, '
                    f'got {value!r}')


@dataclass(slots=True)
class SubRequest:
    """One operation on one subscription; `t` says which (a key of _SPECS)."""

    t: str
    name: str
    timeout_ms: int | None = None
    consumer: str = ""
    position: int | None = None  # sub_commit: the next offset to deliver
    initial: Position | None = None  # sub_open/sub_pin: "from"; sub_reset: "to"
    lease_ms: int = 0
    auto_reset: str = ""  # sub_open: "none", "earliest" or "latest"; "" = leave it as it is
    expect: int = -1  # sub_reset: apply only at this position (-1: unconditional)
    member: str = ""  # sub_open: "watch"/"take"; sub_release: "leave"; "" = classic
    group: int | None = None
    topic: str = DEFAULT_TOPIC  # the topic partition whose log keeps the subscription
    partition: int = 0

    @classmethod
    def parse_as(cls, t: str, frame: dict[str, Any], limits: Limits) -> SubRequest:
        spec = _SPECS[t]
        req = cls(t, get_str(frame, "name", where=t), limits.timeout_ms(frame, t))
        if spec.consumer:
            req.consumer = get_str(frame, "consumer", default="", where=t)
        if spec.position:
            req.position = get_int(frame, "position", minimum=0, maximum=I64_MAX, where=t)
        if spec.initial is not None:
            # `from` (first use) defaults to the log start; a reset's `to` is required.
            req.initial = _position_of(frame, spec.initial, t,
                                       "start" if spec.initial == "from" else None)
        if spec.lease:
            req.lease_ms = get_int(frame, "lease_ms", default=0, minimum=0,
                                   maximum=MAX_LEASE_MS, where=t)
        if spec.auto_reset:
            req.auto_reset = get_str(frame, "auto_reset", default="", where=t)
            if req.auto_reset not in AUTO_RESET_VALUES:
                raise WireError(f'{t} field "auto_reset" must be one of '
                                f'{", ".join(AUTO_RESET_VALUES[1:])}, got {req.auto_reset!r}')
        if spec.expect:
            req.expect = get_int(frame, "expect", default=-1, minimum=-1, maximum=I64_MAX,
                                 where=t)
        if spec.member:
            req.member = get_str(frame, "member", default="", where=t)
            if req.member not in MEMBER_VALUES[t]:
                raise WireError(f'{t} field "member" must be one of '
                                f'{", ".join(MEMBER_VALUES[t][1:])}, got {req.member!r}')
        req.group = group_of(frame, t)
        req.topic = topic_of(frame, t)
        req.partition = partition_of(frame, t)
        return req

    def to_frame(self, rid: int) -> dict[str, Any]:
        spec = _SPECS[self.t]
        fields: dict[str, Any] = {"name": self.name}
        if self.timeout_ms is not None:
            fields["timeout_ms"] = self.timeout_ms
        if spec.consumer:
            fields["consumer"] = self.consumer
        if spec.position:
            fields["position"] = self.position
        if spec.initial is not None and self.initial is not None:
            fields[spec.initial] = self.initial
        if spec.lease:
            fields["lease_ms"] = self.lease_ms
        if spec.auto_reset and self.auto_reset:
            fields["auto_reset"] = self.auto_reset
        if spec.expect and self.expect >= 0:
            fields["expect"] = self.expect
        if spec.member and self.member:
            fields["member"] = self.member
        return request_frame(self.t, rid, fields, self.group, self.topic, self.partition)


@dataclass(slots=True)
class SubList:
    """A page of subscriptions whose names start with `prefix`, after `after`."""

    T: ClassVar[str] = "sub_list"
    prefix: str = ""
    after: str = ""
    limit: int = LIST_DEFAULT_LIMIT
    timeout_ms: int | None = None
    group: int | None = None
    topic: str = DEFAULT_TOPIC  # the topic partition whose log keeps the subscription
    partition: int = 0

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> SubList:
        w = cls.T
        return cls(get_str(frame, "prefix", default="", where=w),
                   get_str(frame, "after", default="", where=w),
                   get_int(frame, "limit", default=LIST_DEFAULT_LIMIT, minimum=1,
                           maximum=LIST_MAX_LIMIT, where=w),
                   limits.timeout_ms(frame, w), group_of(frame, w), topic_of(frame, w),
                   partition_of(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"prefix": self.prefix, "after": self.after,
                                  "limit": self.limit}
        if self.timeout_ms is not None:
            fields["timeout_ms"] = self.timeout_ms
        return request_frame(self.T, rid, fields, self.group, self.topic, self.partition)


@dataclass(slots=True)
class CommitItem:
    """One commit of a sub_commit_many: a sub_commit's fields."""

    name: str
    position: int
    consumer: str = ""
    lease_ms: int = 0

    def to_map(self) -> dict[str, Any]:
        return {"name": self.name, "position": self.position, "consumer": self.consumer,
                "lease_ms": self.lease_ms}


@dataclass(slots=True)
class SubCommitMany:
    """Many subscriptions' commits in one frame. `items` is None when their count is outside
    1..MAX_COMMIT_ITEMS: the node answers that with a BAD_REQUEST reply (the connection stays
    usable) without looking at the items."""

    T: ClassVar[str] = "sub_commit_many"
    items: list[CommitItem] | None
    count: int
    timeout_ms: int | None = None
    group: int | None = None
    topic: str = DEFAULT_TOPIC  # the topic partition whose log keeps the subscription
    partition: int = 0

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> SubCommitMany:
        w = cls.T
        items = frame.get("commits")
        if not isinstance(items, list):
            raise WireError(f'{w} field "commits" must be a list of maps {{"name", "position", '
                            f'"consumer", "lease_ms"}}, got {type(items).__name__}')
        req = cls(None, len(items), limits.timeout_ms(frame, w), group_of(frame, w),
                  topic_of(frame, w), partition_of(frame, w))
        if not 1 <= len(items) <= MAX_COMMIT_ITEMS:
            return req
        parsed = []
        for i, item in enumerate(items):
            where = f"{w} commits[{i}]"
            if not isinstance(item, dict):
                raise WireError(f"{where} must be a map, got {type(item).__name__}")
            parsed.append(CommitItem(
                get_str(item, "name", where=where),
                get_int(item, "position", minimum=0, maximum=I64_MAX, where=where),
                get_str(item, "consumer", default="", where=where),
                get_int(item, "lease_ms", default=0, minimum=0, maximum=MAX_LEASE_MS,
                        where=where)))
        req.items = parsed
        return req

    def to_frame(self, rid: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"commits": [i.to_map() for i in self.items or ()]}
        if self.timeout_ms is not None:
            fields["timeout_ms"] = self.timeout_ms
        return request_frame(self.T, rid, fields, self.group, self.topic, self.partition)
