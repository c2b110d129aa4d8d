"""Retention: which batches at the front of a log may go, and who holds the rest back.

Sans-IO: time, free disk space and the holders come in as arguments; the planner reads the log
it is handed (like raft/core/loads.py) and says where the new log start goes and what the state at it
is (raft/core/snapshot.py). The runtime (raft/node/retention.py) and the simulation (raft/sim) apply
the same plan to their own logs.

What the policy wants gone, batch by batch from the front (whole batches only):
- with `max_bytes` (--retention-bytes): a batch while what stays after it still holds at least
  `max_bytes` (Kafka's rule for segments): the log keeps at least `max_bytes`, rounded up to
  whole batches, so a log of one batch larger than the limit keeps that batch. (Deleting while
  the log held *more* than the limit overshot: one 51 KB batch under a 20 KiB limit went, and
  with it every readable record.)
- with `max_age_ms` (--retention-ms): batches older than that;
- never a batch younger than `min_age_ms` (--retention-min-ms), whatever the size.
A batch's age counts from the largest timestamp at or before it, so one batch with an old (or
zero) timestamp cannot make newer data behind it look old.

What holds the rest back: the retention floor is the minimum of named holders (`Hold`), each the
first offset it still needs (a batch holding any offset a holder needs stays whole):
- always: the commit index and the flushed offset. The commit index holds from itself, not one
  past it: the newest committed batch always stays (Kafka never deletes its active segment),
  so size or age retention never leaves a node with nothing readable and `--from -N` still
  finds the newest records;
- on the leader: every member's (voter or learner) flushed offset as the leader has verified it;
- the first offset of every open Spark load (its staged data), and everything the loads table
  has not applied yet (an unapplied entry may open one);
- anything registered with `Holders.register` (subscriptions, ...).
Members and registered consumers are released by the valves, per batch: a batch older than
`valve_age_ms` (--retention-max-ms), or any batch while free disk space is below
`low_disk_bytes` (--low-disk-mb). The commit index, the flushed offset and open loads are never
released. A released holder is reported (`Decision.skipped`), so status can name it.

Slices: one plan removes at most `slice_bytes` / `slice_batches`, so a single storage transaction
stays short; `Decision.more` says to plan again at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raft.core.snapshot import TERM, SnapshotContext, StartState
from storage.api import LogStorage
from storage.batch import Batch, BatchHead, BatchKind, CorruptBatch

if TYPE_CHECKING:
    from raft.core.loads import LoadTable
    from raft.core.ready import Status

DEFAULT_SLICE_BYTES = 32 << 20
DEFAULT_SLICE_BATCHES = 4096
_READ_BYTES = 32 << 20  # (what the batches count as: DATA batches come as their headers)
_FIRST_READ_BYTES = 4 << 10
# The plan reads the payload of these kinds only (what the start state folds from them: the
# configuration, the loads and subscription tables, a mirror's visible end); of a DATA or NOOP
# batch the header is enough (its timestamp, size, producer id and sequence), so retention no
# longer copies and checksums every byte it deletes. (The disk reads stay: py-lmdb touches every
# page of a value it hands out, off the GIL, so a header read of a cold batch reads it all.)
_PLAN_FULL = frozenset(BatchKind) - {BatchKind.DATA, BatchKind.NOOP}
# Headers cost no copy: one read of them covers this many batches (and up to this many bytes
# of what they count as, which bounds the whole batches read with them).
_HEAD_BATCHES = 1024

# Why a plan stopped where it did (besides a holder's name).
SATISFIED = "policy satisfied"
MIN_AGE = "retention_min_ms"
SLICE = "slice limit"
LOG_END = "log end"
DAMAGED = "a damaged batch (held until repaired, docs/DISK-LOSS.md)"
# Valves.
VALVE_AGE = "retention_max_ms"
VALVE_DISK = "low_disk_mb"


@dataclass(slots=True, frozen=True)
class RetentionPolicy:
    max_bytes: int | None = None  # --retention-bytes
    max_age_ms: int | None = None  # --retention-ms
    min_age_ms: int = 0  # --retention-min-ms
    valve_age_ms: int | None = None  # --retention-max-ms
    low_disk_bytes: int = 0  # --low-disk-mb, in bytes
    slice_bytes: int = DEFAULT_SLICE_BYTES
    slice_batches: int = DEFAULT_SLICE_BATCHES

    @property
    def active(self) -> bool:
        """Does the policy ever want anything deleted? (The defaults keep everything.)"""
        return self.max_bytes is not None or self.max_age_ms is not None

    def validate(self) -> "RetentionPolicy":
        for name in ("max_bytes", "max_age_ms", "valve_age_ms"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"retention {name}={v!r} must be a positive integer or unset")
        for name in ("min_age_ms", "low_disk_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"retention {name}={v!r} must be an integer >= 0")
        if self.slice_bytes < 1 or self.slice_batches < 1:
            raise ValueError("retention slices need room for at least one batch")
        if self.valve_age_ms is not None and self.valve_age_ms <= self.min_age_ms:
            raise ValueError(f"retention_max_ms ({self.valve_age_ms}) must be above "
                             f"retention_min_ms ({self.min_age_ms}): data younger than the "
                             f"minimum is never deleted, so such a valve could never open")
        return self


@dataclass(slots=True, frozen=True)
class Hold:
    """`holder` needs every offset from `offset` on. `valve`: a valve may release it (members,
    consumers); otherwise nothing does (commit index, flushed offset, open loads)."""

    holder: str
    offset: int
    valve: bool


Provider = Callable[[], Iterable[Hold]]


class Holders:
    """Named providers of holds, asked afresh before every plan. Built-in holders are added by
    the runtime; others (subscriptions, ...) register their own under a name."""

    def __init__(self) -> None:
        self._providers: dict[str, Provider] = {}

    def register(self, name: str, provider: Provider) -> None:
        if name in self._providers:
            raise ValueError(f"a retention holder named {name!r} is already registered")
        self._providers[name] = provider

    def unregister(self, name: str) -> None:
        self._providers.pop(name, None)

    def gather(self) -> list[Hold]:
        out: list[Hold] = []
        for provider in self._providers.values():
            out.extend(provider())
        return out


def core_holds(status: "Status") -> list[Hold]:
    """What the core holds back: its commit index and flushed offset, and on the leader every
    member's flushed offset (min(match, verified flushed): what it durably holds of our log).
    The commit index needs its own offset, so the batch holding it (the newest committed batch,
    what consumers read last) is never deleted, whatever the policy says."""
    holds = [Hold("commit index", status.commit_index, False),
             Hold("flushed offset", status.flushed_offset + 1, False)]
    if status.role.value == "leader":
        for f in status.followers:
            kind = "learner" if f.learner else "member"
            holds.append(Hold(f"{kind} {f.node_id}",
                              min(f.match_index, f.flushed_offset) + 1, True))
    return holds


def load_holds(table: "LoadTable") -> list[Hold]:
    """Open Spark loads keep their staged data; entries the table has not applied yet may open
    one, so they are kept too."""
    holds = [Hold("loads table (not applied yet)", table.applied + 1, False)]
    for lid, gen in sorted(table.open_loads().items(), key=lambda kv: kv[1]):
        holds.append(Hold(f"load {lid!r}", gen, False))
    return holds


@dataclass(slots=True)
class Skipped:
    """A holder a valve released for this plan."""

    holder: str
    offset: int
    valve: str


@dataclass(slots=True)
class Decision:
    start: int  # the log start the plan began at
    cut: int  # the new log start (== start: nothing to delete)
    deleted_bytes: int = 0
    deleted_batches: int = 0
    stopped_by: str = SATISFIED
    more: bool = False  # a slice limit stopped it: plan again at once
    skipped: list[Skipped] = field(default_factory=list)


class Planner:
    """Offer the log's batches from its start, in order; each True means "delete it". Stops
    (and keeps answering False) at the first batch it must keep."""

    def __init__(self, policy: RetentionPolicy, *, start: int, total_bytes: int, now_ms: int,
                 free_bytes: int | None, holds: Iterable[Hold]) -> None:
        self.policy = policy
        self.now_ms = now_ms
        self.low_disk = (policy.low_disk_bytes > 0 and free_bytes is not None
                         and free_bytes < policy.low_disk_bytes)
        self._remaining = total_bytes
        self._newest_ts = 0
        self._holds = sorted(holds, key=lambda h: h.offset)
        self._done = False
        self.decision = Decision(start, start)
        self._skipped: set[str] = set()

    def offer(self, b: Batch | BatchHead) -> bool:
        if self._done:
            return False
        why = self._keep_reason(b)
        if why is not None:
            self._done = True
            self.decision.stopped_by = why
            self.decision.more = why == SLICE
            return False
        d = self.decision
        d.cut = b.last_offset + 1
        d.deleted_bytes += b.size
        d.deleted_batches += 1
        self._remaining -= b.size
        return True

    def end_of_log(self) -> None:
        self.stop(LOG_END)

    def stop(self, why: str) -> None:
        """Nothing more may be deleted, for reason `why` (the log ends, a damaged batch)."""
        if not self._done:
            self._done = True
            self.decision.stopped_by = why

    def _keep_reason(self, b: Batch | BatchHead) -> str | None:
        p = self.policy
        self._newest_ts = max(self._newest_ts, b.timestamp_ms)
        age = self.now_ms - self._newest_ts
        want = ((p.max_bytes is not None and self._remaining - b.size >= p.max_bytes)
                or (p.max_age_ms is not None and age > p.max_age_ms))
        if not want:
            return SATISFIED
        if age < p.min_age_ms:
            return MIN_AGE
        valve = VALVE_DISK if self.low_disk else (
            VALVE_AGE if p.valve_age_ms is not None and age > p.valve_age_ms else None)
        for h in self._holds:
            if h.offset > b.last_offset:
                break  # sorted: every later hold needs only what lies beyond this batch
            if not h.valve or valve is None:
                return h.holder
            if h.holder not in self._skipped:
                self._skipped.add(h.holder)
                self.decision.skipped.append(Skipped(h.holder, h.offset, valve))
        d = self.decision
        if d.deleted_batches and (d.deleted_bytes + b.size > p.slice_bytes
                                  or d.deleted_batches >= p.slice_batches):
            return SLICE
        return None


@dataclass(slots=True)
class Plan:
    decision: Decision
    start_term: int  # the log's start term when planned (a reset since makes the plan stale)
    snapshot: dict[str, Any] | None  # the state at decision.cut (None when nothing is cut)
    had_state: bool  # False: the log start had no stored state (an old reset); folded from empty


def plan(log: LogStorage, policy: RetentionPolicy, holds: Iterable[Hold], *, now_ms: int,
         free_bytes: int | None, ctx: SnapshotContext) -> Plan:
    """Plan one slice of retention on `log` and fold what it drops into the state at the new
    start. Reads only committed (so flushed) batches. Raises OffsetOutOfRange if the log start
    moves while it reads (the caller drops the plan)."""
    start, start_term, stored = log.start_offset, log.start_term, log.snapshot
    if policy.max_age_ms is None and log.retained_bytes <= (policy.max_bytes or 0):
        # Within the size limit and no age limit: nothing to read (the size rule keeps at
        # least max_bytes, so it deletes nothing from a log no larger than that).
        return Plan(Decision(start, start), start_term, None, stored is not None or start == 0)
    planner = Planner(policy, start=start, total_bytes=log.retained_bytes, now_ms=now_ms,
                      free_bytes=free_bytes, holds=holds)
    if stored is not None:
        state = StartState.from_snapshot(stored, ctx)
    else:
        state = StartState.fresh(ctx, start)
        state.states[TERM][0] = start_term
    off = start
    budget = _FIRST_READ_BYTES  # most rounds look at a batch or two: read little, then more
    while True:
        try:
            batches = (log.read_heads(off, budget, _HEAD_BATCHES, _PLAN_FULL)
                       if off <= log.flushed_offset else [])
        except CorruptBatch:  # never read past a damaged batch: it holds retention until repaired
            planner.stop(DAMAGED)
            break
        budget = min(budget * 4, _READ_BYTES)
        if not batches:
            planner.end_of_log()
            break
        for b in batches:
            if not planner.offer(b):
                break
            state.apply(b)
        else:
            off = batches[-1].last_offset + 1
            continue
        break
    d = planner.decision
    snap = state.to_snapshot() if d.cut > start else None
    return Plan(d, start_term, snap, stored is not None or start == 0)
