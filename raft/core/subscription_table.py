"""Subscriptions: named consumer positions, replicated with the log, that survive fail-over.

A subscription is a name with a committed *position* (the next offset to deliver) and a little
metadata. Every change to the table is an operation inside a CONTROL entry of the log
(`{"ctl": "sub_ops", "src": [...], "ops": [...]}`), and every node applies *committed* entries in
log order to a `SubscriptionTable`, so every node, and so any leader after a fail-over, holds the
same table; a restart rebuilds it by scanning the log (raft/core/subscription_index.py). Many
consumers' operations share one entry (raft/core/subscription_batcher.py coalesces them on the
leader), so committing positions costs one log entry per short interval, not one per commit.

Operations (each one's verdict is decided here, at apply time, identically on every node; the
leader only answers the requester with the verdict its own apply reached):
- `open`: create the subscription at an initial position if it does not exist (first use), take
  or renew the single-active-consumer lease if asked; the answer is the position to read from.
  Because it goes through the log, the position it answers is linearizable: no committed
  position can be newer than what an `open` that commits after it sees.
- `commit`: move the position forward. A position below the current one is refused
  (POSITION_BEHIND: only a `reset` moves back); a position past the entry's own offset is refused
  (POSITION_PAST_HIGH_WATERMARK: nothing past the log can have been read). Equal is fine (a
  heartbeat that renews the lease). It clears a Spark read pin it reaches.
- `reset`: set the position to anything in range (back or forward); creates the subscription.
  A reset forward records how many offsets it passed over (`skipped_offsets`: the records a
  consumer will never see, plus any control entries among them), so `raftlog subscriptions`
  can say that records were skipped on every node and after any fail-over. A consumer's
  automatic reset (its retention-passed position, docs/SUBSCRIPTIONS.md) is conditional: it
  carries the position it saw, and applies only if the subscription is still there, so two
  consumers resetting at once do not move it twice (the second one reads from the first's).
- the reset policy (`auto_reset`: none, earliest, latest) is stored with the subscription; an
  `open` that names one sets it. The table only stores it: whether a position was passed by
  retention depends on a node's log start, so consumers (which see the log start in a fetch's
  answer) apply it, through a conditional `reset`.
- `pin`: a Spark incremental read fixes the end of its range once, so every re-plan and every
  retry of a failed job reads the same range until a commit reaches the pin.
- `release`: drop the lease the consumer holds. `delete`: drop the subscription (an expiry
  delete carries the last-used stamp it saw and only applies if nothing used it since).

Time: the leader stamps each entry (Batch.timestamp_ms); the table's clock is the largest stamp
applied so far, so lease expiry and "last used" are functions of the log, never of a node's wall
clock, and a new leader with a clock behind the old one cannot revive an expired lease.

Hooks for retention (issue 15): `to_snapshot()` / `from_snapshot()` make the table one section of
the state at the log start, and `holds()` / `min_position()` give the retention floor.

Pure: no sockets, clocks or threads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgpack

from raft.core.types import ErrorCode
from storage.batch import Batch, BatchHead, BatchKind

CTL_OPS = "sub_ops"
SNAPSHOT_SECTION = "subscriptions"  # the section name in the state at the log start
SNAPSHOT_VERSION = 1

MAX_NAME_CHARS = 128
MAX_CONSUMER_CHARS = 128
MAX_SUBSCRIPTIONS = 100_000  # explicit bound on the table; creating more is refused
MAX_LEASE_MS = 10 * 60 * 1000  # a lease is renewed by commits; ten minutes is the longest term
MAX_MEMBERS = 1000  # members of one topic subscription seen at once (docs/SUBSCRIPTIONS.md)
_NAME_CHARS = re.compile(r"[A-Za-z0-9._:-]*\Z")
_CONSUMER_CHARS = re.compile(r"[\x21-\x7e]*\Z")  # printable ASCII, no spaces


class AutoReset(str, Enum):
    """What a consumer does when retention has removed its subscription's position (Kafka's
    auto.offset.reset): stop with an error naming the fix, or reset to the log start / end."""

    NONE = "none"
    EARLIEST = "earliest"
    LATEST = "latest"


class Member(str, Enum):
    """What a topic subscription's member asks of one partition's subscription with an `open`
    (docs/SUBSCRIPTIONS.md, "Subscriptions over a topic"); "" (classic) is a plain open.
    WATCH: be counted as a member here (until the table's clock passes clock + lease_ms), take
    nothing. TAKE: the same, and take or renew this partition's lease unless another member
    holds it (answered OK either way: the answer names the holder). LEAVE (with `release`):
    give up the lease if held and stop being a member here."""

    WATCH = "watch"
    TAKE = "take"
    LEAVE = "leave"


class Op(str, Enum):
    OPEN = "open"
    COMMIT = "commit"
    RESET = "reset"
    PIN = "pin"
    RELEASE = "release"
    DELETE = "delete"


def name_error(name: Any) -> str | None:
    """Why `name` cannot name a subscription, or None. Shared by the node (an immediate typed
    error) and the table (an entry written by another build is judged the same way)."""
    if not isinstance(name, str) or not name:
        return "a subscription name must be a non-empty string"
    if len(name) > MAX_NAME_CHARS:
        return (f"subscription name is {len(name)} characters long; the limit is "
                f"{MAX_NAME_CHARS}")
    if not _NAME_CHARS.match(name):
        bad = sorted({c for c in name if not _NAME_CHARS.match(c)})
        return (f"subscription name {name!r} has characters outside letters, digits and "
                f"'.', '_', ':', '-': {''.join(bad)!r}")
    return None


def consumer_error(consumer: Any) -> str | None:
    """Why `consumer` cannot identify a consumer ("" = none: an operator's reset or delete)."""
    if not isinstance(consumer, str) or len(consumer) > MAX_CONSUMER_CHARS \
            or not _CONSUMER_CHARS.match(consumer):
        return (f"consumer id must be at most {MAX_CONSUMER_CHARS} printable ASCII characters "
                f"without spaces")
    return None


@dataclass(slots=True, frozen=True)
class OpRequest:
    """One operation as it travels in an entry: [op, name, consumer, position, arg] and, only
    when set, a sixth element {"auto_reset": policy, "expect": position, "member": mode}
    (entries written before it existed have five and still apply).
    `arg` is the lease length (ms, 0 = none) for open/commit, the initial position for pin, and
    the last-used guard for delete (-1 = unconditional). `auto_reset` ("" = leave it) is the
    policy an open sets; `expect` (-1 = unconditional) is the position a reset applies at;
    `member` ("" = classic) what a topic subscription's member asks (`Member`)."""

    op: Op
    name: str
    consumer: str = ""
    position: int = -1
    arg: int = 0
    auto_reset: str = ""
    expect: int = -1
    member: str = ""

    def encode(self) -> list[Any]:
        item: list[Any] = [self.op.value, self.name, self.consumer, self.position, self.arg]
        extra: dict[str, Any] = {}
        if self.auto_reset:
            extra["auto_reset"] = self.auto_reset
        if self.expect >= 0:
            extra["expect"] = self.expect
        if self.member:
            extra["member"] = self.member
        if extra:
            item.append(extra)
        return item

    @staticmethod
    def decode(item: Any) -> "OpRequest | None":
        if not isinstance(item, list) or len(item) not in (5, 6):
            return None
        op, name, consumer, position, arg = item[:5]
        extra = item[5] if len(item) == 6 else {}
        try:
            kind = Op(op)
        except ValueError:
            return None
        if not isinstance(name, str) or not isinstance(consumer, str) or any(
                isinstance(v, bool) or not isinstance(v, int) for v in (position, arg)):
            return None
        if not isinstance(extra, dict):
            return None
        policy = extra.get("auto_reset", "")
        expect = extra.get("expect", -1)
        member = extra.get("member", "")
        if policy not in ("", *(p.value for p in AutoReset)) \
                or isinstance(expect, bool) or not isinstance(expect, int) \
                or member not in ("", *(m.value for m in Member)):
            return None
        return OpRequest(kind, name, consumer, position, arg, policy, expect, member)


def encode_entry(src: tuple[int, int, int], ops: list[OpRequest],
                 bound: int | None = None) -> bytes:
    """A CONTROL payload carrying `ops`; `src` (node id, incarnation, sequence) lets the proposer
    find its entry's verdicts when it applies it. `bound`: the largest position the ops may
    set (default: the entry's own offset). A mirror partition's positions are visible offsets,
    unrelated to its log offsets, so its leader sets the visible end + 1 (docs/REPLICATION.md)."""
    obj: dict[str, Any] = {"ctl": CTL_OPS, "src": list(src), "ops": [o.encode() for o in ops]}
    if bound is not None:
        obj["bound"] = bound
    return msgpack.packb(obj, use_bin_type=True)


def make_entry(src: tuple[int, int, int], ops: list[OpRequest], now_ms: int,
               bound: int | None = None) -> Batch:
    """The CONTROL batch the leader proposes, stamped with the leader's clock."""
    return Batch.create(encode_entry(src, ops, bound), 1, kind=BatchKind.CONTROL,
                        timestamp_ms=now_ms)


def decode_entry(payload: bytes) -> tuple[tuple[int, ...], list[OpRequest | None],
                                          int | None] | None:
    """(src, ops, bound) if this CONTROL payload is ours, else None (another CONTROL user's, or
    garbage). An undecodable op decodes as None and is refused when applied."""
    try:
        obj = msgpack.unpackb(payload, raw=False)
    except Exception:
        return None
    if not isinstance(obj, dict) or obj.get("ctl") != CTL_OPS:
        return None
    src = obj.get("src")
    ops = obj.get("ops")
    if not isinstance(ops, list):
        return None
    src_t = tuple(src) if isinstance(src, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in src) else ()
    bound = obj.get("bound")
    if isinstance(bound, bool) or not isinstance(bound, int):
        bound = None
    return src_t, [OpRequest.decode(item) for item in ops], bound


# -- the table ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Subscription:
    name: str
    position: int  # the next offset to deliver
    created_ms: int
    created_offset: int  # offset of the entry that created it
    last_commit_ms: int = -1
    last_committer: str = ""
    last_used_ms: int = -1  # last open/commit/pin: what expiry measures
    lease_holder: str = ""
    lease_until_ms: int = -1
    pin_end: int = -1  # a Spark read's fixed end (exclusive), -1 = none
    commits: int = 0
    auto_reset: str = AutoReset.NONE.value  # what a consumer does when retention passed it
    skipped_offsets: int = 0  # offsets passed over by resets forward, in total
    resets: int = 0  # resets applied (back or forward)
    # A topic subscription's members seen here: member id -> until (table clock, ms).
    members: dict[str, int] = field(default_factory=dict)

    def live_members(self, clock_ms: int) -> list[str]:
        return sorted(m for m, until in self.members.items() if clock_ms < until)

    def leased_to_other(self, consumer: str, clock_ms: int) -> bool:
        return bool(self.lease_holder) and self.lease_holder != consumer \
            and clock_ms < self.lease_until_ms

    def describe(self, clock_ms: int) -> dict[str, Any]:
        leased = bool(self.lease_holder) and clock_ms < self.lease_until_ms
        return {"name": self.name, "position": self.position, "created_ms": self.created_ms,
                "created_offset": self.created_offset, "last_commit_ms": self.last_commit_ms,
                "last_committer": self.last_committer, "last_used_ms": self.last_used_ms,
                "lease_holder": self.lease_holder if leased else None,
                "lease_until_ms": self.lease_until_ms if leased else None,
                "pin_end": self.pin_end if self.pin_end >= 0 else None,
                "commits": self.commits, "auto_reset": self.auto_reset,
                "skipped_offsets": self.skipped_offsets, "resets": self.resets,
                "members": self.live_members(clock_ms)}

    def to_list(self) -> list[Any]:
        return [self.name, self.position, self.created_ms, self.created_offset,
                self.last_commit_ms, self.last_committer, self.last_used_ms, self.lease_holder,
                self.lease_until_ms, self.pin_end, self.commits, self.auto_reset,
                self.skipped_offsets, self.resets,
                [[m, self.members[m]] for m in sorted(self.members)]]

    @staticmethod
    def from_list(item: Any) -> "Subscription":
        """From to_list(); a snapshot written before the reset fields (11 items) or before
        members (14 items) loads with their defaults."""
        if len(item) == 11:
            item = [*item, AutoReset.NONE.value, 0, 0]
        if len(item) == 14:
            item = [*item, []]
        (name, position, created_ms, created_offset, last_commit_ms, last_committer,
         last_used_ms, lease_holder, lease_until_ms, pin_end, commits, auto_reset,
         skipped, resets, members) = item
        sub = Subscription(str(name), int(position), int(created_ms), int(created_offset),
                           int(last_commit_ms), str(last_committer), int(last_used_ms),
                           str(lease_holder), int(lease_until_ms), int(pin_end), int(commits),
                           AutoReset(auto_reset).value, int(skipped), int(resets),
                           {str(m): int(until) for m, until in members})
        if name_error(sub.name) is not None or sub.position < 0:
            raise ValueError(f"subscription {sub.name!r} in the snapshot is malformed")
        return sub


@dataclass(slots=True, frozen=True)
class Outcome:
    """The verdict on one operation: OK (with the subscription as it is after it), or a typed
    error with a message that says what to do."""

    code: ErrorCode
    message: str = ""
    sub: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.code == ErrorCode.OK


@dataclass(slots=True, frozen=True)
class Applied:
    """What applying one of our entries decided: its source tag and one outcome per op."""

    offset: int
    src: tuple[int, ...]
    outcomes: list[Outcome]


class SubscriptionTable:
    """{name: Subscription}, built by `apply`ing committed batches in log order."""

    def __init__(self, start_offset: int = 0) -> None:
        self.subs: dict[str, Subscription] = {}
        self.applied = start_offset - 1  # last offset applied
        self.clock_ms = 0  # the largest entry stamp applied (leader clocks, never ours)
        self._views = True  # build the subscription views of OK verdicts (someone reads them)

    # -- applying ------------------------------------------------------------------------------
    def apply(self, batch: Batch | BatchHead,
              mine: Callable[[tuple[int, ...]], bool] | None = None) -> Applied | None:
        """Apply one committed batch (every batch, in log order, without gaps). Returns the
        verdicts if it was one of our entries (all of them, or those `mine` picks by source
        tag: the others' verdicts are not worth building)."""
        if batch.base_offset != self.applied + 1:
            raise ValueError(f"subscription table applied up to {self.applied} but got a batch "
                             f"at {batch.base_offset}: apply committed batches in order")
        self.applied = batch.last_offset
        if batch.kind != BatchKind.CONTROL:
            return None
        decoded = decode_entry(batch.payload)
        if decoded is None:
            return None
        src, ops, bound = decoded
        self.clock_ms = max(self.clock_ms, batch.timestamp_ms)
        self._views = mine is None or mine(src)
        outcomes = [self._apply_op(op, batch.base_offset, bound) if op is not None else
                    Outcome(ErrorCode.BAD_REQUEST, "malformed subscription operation")
                    for op in ops]
        return Applied(batch.base_offset, src, outcomes) if self._views else None

    def skip_to(self, offset: int) -> None:
        """The log start moved past what we applied (retention or a reset without state):
        continue from `offset` with what we have."""
        if offset - 1 > self.applied:
            self.applied = offset - 1

    def _apply_op(self, op: OpRequest, offset: int, bound: int | None = None) -> Outcome:
        """`offset`: the entry's; `bound`: the largest position it may set (default the same)."""
        created, offset = offset, offset if bound is None else bound
        why = name_error(op.name) or consumer_error(op.consumer)
        if why is not None:
            return Outcome(ErrorCode.INVALID_SUBSCRIPTION_NAME, why)
        sub = self.subs.get(op.name)
        if op.op in (Op.OPEN, Op.RESET, Op.PIN) and sub is None:
            initial = op.arg if op.op == Op.PIN else op.position
            if not 0 <= initial <= offset:
                return Outcome(ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                               f"initial position {initial} is outside [0, {offset}]")
            if len(self.subs) >= MAX_SUBSCRIPTIONS:
                return Outcome(ErrorCode.BAD_REQUEST,
                               f"the cluster holds the maximum of {MAX_SUBSCRIPTIONS} "
                               f"subscriptions; delete unused ones (`raftlog subscriptions "
                               f"delete NAME`) or set --subscription-expiry-ms")
            sub = Subscription(op.name, initial, self.clock_ms, created)
            self.subs[op.name] = sub
        if sub is None:
            return Outcome(ErrorCode.UNKNOWN_SUBSCRIPTION,
                           f"no subscription named {op.name!r}; open it first (a consumer "
                           f"creates it on first use) or check `raftlog subscriptions`")
        return getattr(self, _HANDLERS[op.op])(sub, op, offset)

    def _lease_conflict(self, sub: Subscription, consumer: str) -> Outcome | None:
        if sub.leased_to_other(consumer, self.clock_ms):
            return Outcome(ErrorCode.SUBSCRIPTION_LEASED,
                           f"subscription {sub.name!r} is leased to consumer "
                           f"{sub.lease_holder!r} for another "
                           f"{sub.lease_until_ms - self.clock_ms} ms; stop that consumer (it "
                           f"releases the lease on close) or wait for the lease to expire",
                           sub.describe(self.clock_ms))
        return None

    def _take_lease(self, sub: Subscription, consumer: str, lease_ms: int) -> None:
        if lease_ms > 0 and consumer:
            sub.lease_holder = consumer
            sub.lease_until_ms = self.clock_ms + min(lease_ms, MAX_LEASE_MS)

    def _ok(self, sub: Subscription) -> Outcome:
        return Outcome(ErrorCode.OK, "", sub.describe(self.clock_ms) if self._views else None)

    def _open(self, sub: Subscription, op: OpRequest, offset: int) -> Outcome:
        if op.member:
            return self._member(sub, op)
        conflict = self._lease_conflict(sub, op.consumer)
        if conflict is not None:
            return conflict
        self._take_lease(sub, op.consumer, op.arg)
        sub.last_used_ms = self.clock_ms
        if op.auto_reset:
            sub.auto_reset = op.auto_reset
        return self._ok(sub)

    def _commit(self, sub: Subscription, op: OpRequest, offset: int) -> Outcome:
        conflict = self._lease_conflict(sub, op.consumer)
        if conflict is not None:
            return conflict
        if op.position < sub.position:
            return Outcome(ErrorCode.POSITION_BEHIND,
                           f"position {op.position} is below subscription {sub.name!r}'s "
                           f"position {sub.position}; only a reset moves a subscription back "
                           f"(`raftlog subscriptions reset {sub.name} --to OFFSET`)",
                           sub.describe(self.clock_ms))
        if op.position > offset:
            return Outcome(ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                           f"position {op.position} is past the log end {offset}: nothing "
                           f"there can have been read", sub.describe(self.clock_ms))
        self._take_lease(sub, op.consumer, op.arg)
        sub.position = op.position
        sub.last_commit_ms = sub.last_used_ms = self.clock_ms
        sub.last_committer = op.consumer
        sub.commits += 1
        if 0 <= sub.pin_end <= sub.position:
            sub.pin_end = -1
        return self._ok(sub)

    def _reset(self, sub: Subscription, op: OpRequest, offset: int) -> Outcome:
        conflict = self._lease_conflict(sub, op.consumer)
        if conflict is not None:
            return conflict
        if not 0 <= op.position <= offset:
            return Outcome(ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                           f"reset position {op.position} is outside [0, {offset}]",
                           sub.describe(self.clock_ms))
        if op.expect >= 0 and sub.position != op.expect:
            return self._ok(sub)  # moved since the consumer looked: read from where it is
        sub.skipped_offsets += max(0, op.position - sub.position)
        sub.resets += 1
        sub.position = op.position
        sub.pin_end = -1
        sub.last_commit_ms = sub.last_used_ms = self.clock_ms
        sub.last_committer = op.consumer
        return self._ok(sub)

    def _pin(self, sub: Subscription, op: OpRequest, offset: int) -> Outcome:
        conflict = self._lease_conflict(sub, op.consumer)
        if conflict is not None:
            return conflict
        if sub.pin_end <= sub.position:  # none, or spent (an empty read leaves it there)
            sub.pin_end = min(max(op.position, sub.position), offset)
        sub.last_used_ms = self.clock_ms
        return self._ok(sub)

    def _member(self, sub: Subscription, op: OpRequest) -> Outcome:
        """A topic subscription's member watches or takes this partition: it is counted as a
        member until clock + lease, and with TAKE gets (or renews) the lease unless another
        member's is still running. Never refused for a lease: the answer names the holder, and
        the member plans its next round from it."""
        if not op.consumer or op.arg <= 0 or op.member not in (Member.WATCH, Member.TAKE):
            return Outcome(ErrorCode.BAD_REQUEST,
                           "a topic subscription's member names itself (consumer) and a lease "
                           "(lease_ms > 0), and watches or takes a partition")
        for m in [m for m, until in sub.members.items() if until <= self.clock_ms]:
            del sub.members[m]
        if op.consumer not in sub.members and len(sub.members) >= MAX_MEMBERS:
            return Outcome(ErrorCode.BAD_REQUEST,
                           f"subscription {sub.name!r} has {MAX_MEMBERS} members, the most "
                           f"one subscription takes; use another subscription name for more "
                           f"consumers", sub.describe(self.clock_ms))
        sub.members[op.consumer] = self.clock_ms + min(op.arg, MAX_LEASE_MS)
        if op.member == Member.TAKE and not sub.leased_to_other(op.consumer, self.clock_ms):
            self._take_lease(sub, op.consumer, op.arg)
        sub.last_used_ms = self.clock_ms
        return self._ok(sub)

    def _release(self, sub: Subscription, op: OpRequest, offset: int) -> Outcome:
        if sub.lease_holder == op.consumer and op.consumer:
            sub.lease_holder, sub.lease_until_ms = "", -1
        if op.member == Member.LEAVE:
            sub.members.pop(op.consumer, None)
        return self._ok(sub)

    def _delete(self, sub: Subscription, op: OpRequest, offset: int) -> Outcome:
        if op.arg >= 0 and sub.last_used_ms != op.arg:
            return self._ok(sub)  # an expiry raced a use: it stays
        del self.subs[sub.name]
        return Outcome(ErrorCode.OK, "", None)

    # -- queries -------------------------------------------------------------------------------
    def get(self, name: str) -> Subscription | None:
        return self.subs.get(name)

    def describe(self, name: str) -> dict[str, Any] | None:
        sub = self.subs.get(name)
        return None if sub is None else sub.describe(self.clock_ms)

    def holds(self) -> list[tuple[str, int]]:
        """(holder name, first offset it still needs) for the retention floor, lowest first:
        every subscription needs its position onward."""
        return sorted(((f"subscription {s.name!r}", s.position) for s in self.subs.values()),
                      key=lambda h: (h[1], h[0]))

    def min_position(self) -> tuple[int, str] | None:
        """(position, name) of the subscription furthest behind, or None without any."""
        if not self.subs:
            return None
        sub = min(self.subs.values(), key=lambda s: (s.position, s.name))
        return sub.position, sub.name

    def expired(self, now_ms: int, expiry_ms: int) -> list[tuple[str, int]]:
        """(name, last used stamp) of subscriptions unused for longer than expiry_ms and not
        leased: the leader proposes their deletion, guarded by the stamp."""
        now = max(now_ms, self.clock_ms)
        return sorted((s.name, s.last_used_ms) for s in self.subs.values()
                      if now - max(s.last_used_ms, s.created_ms) > expiry_ms
                      and not (s.lease_holder and now < s.lease_until_ms))

    # -- the state at a log start (retention's snapshot section) -------------------------------
    def to_snapshot(self) -> dict[str, Any]:
        """The whole table as a msgpack-able map (deterministic: sorted by name)."""
        return {"v": SNAPSHOT_VERSION, "applied": self.applied, "clock_ms": self.clock_ms,
                "subs": [self.subs[n].to_list() for n in sorted(self.subs)]}

    @staticmethod
    def from_snapshot(raw: Any) -> "SubscriptionTable":
        """A table from to_snapshot(); ValueError if it is malformed (snapshots come from
        peers)."""
        try:
            if raw.get("v") != SNAPSHOT_VERSION:
                raise ValueError(f"version {raw.get('v')!r}")
            table = SubscriptionTable(int(raw["applied"]) + 1)
            table.clock_ms = int(raw["clock_ms"])
            for item in raw["subs"]:
                sub = Subscription.from_list(item)
                table.subs[sub.name] = sub
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the subscription table in the state at the log start is "
                             f"malformed ({e!r})") from None
        return table


# Looked up by name at each apply (so tests/raft/test_mutants.py can patch a rule).
_HANDLERS = {Op.OPEN: "_open", Op.COMMIT: "_commit", Op.RESET: "_reset", Op.PIN: "_pin",
             Op.RELEASE: "_release", Op.DELETE: "_delete"}


# -- retention's snapshot section (raft/core/snapshot.py, issue 15) -------------------------------------
def section_fresh(ctx: Any, start: int) -> SubscriptionTable:
    return SubscriptionTable(start)


def section_apply(table: SubscriptionTable, batch: Batch) -> None:
    table.apply(batch)


def section_dump(table: SubscriptionTable, start: int) -> dict[str, Any]:
    return table.to_snapshot()


def section_load(raw: Any, ctx: Any) -> SubscriptionTable:
    return SubscriptionTable.from_snapshot(raw)
