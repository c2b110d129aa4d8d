"""The one storage contract both implementations (LMDB and in-memory) keep.

Vocabulary (used the same everywhere in raftlog):
- dirty offset: the last offset appended (readable, not yet durable);
- flushed offset: the last offset fsynced (durable; what a crash or power cut keeps).
Offsets count records from 0. An empty log has dirty = flushed = start_offset - 1.

Appends touch only a bounded in-memory tail (etcd's "unstable" log). `flush()` writes the whole
tail, as of its start, in one fsynced transaction (group commit) and may run in a worker thread
while the event loop keeps appending. A crash loses exactly what lies past the flushed offset,
so process-kill tests exercise the power-loss path for real.

Disk first, then memory: every mutation that touches the disk (flush, truncate_suffix,
truncate_prefix, reset, save_meta) commits its change in one fsynced transaction and only then
changes the in-memory view. If the disk step raises (StorageIOError, DiskFull, ...), the log is
exactly as it was before the call, on disk and in memory, and the exception propagates: the
runtime fail-stops on StorageIOError; DiskFull from a flush may be retried once space is back.
"""

from __future__ import annotations

import abc
import enum
import os
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from storage.batch import DISK_LOSS_DOC, Batch, BatchHead, BatchKind
from storage.damage import Damage

DEFAULT_MAX_TAIL_BYTES = 256 * 1024 * 1024
# The group whose log is the store's legacy key space (LMDB DBs `log` and `meta`, what a data
# directory written before topics holds, and what `LmdbLog(path)` / a lone MemoryLog open): the
# default topic's partition (issue 26, docs/MULTIRAFT.md), so such a directory keeps its data as
# the default topic. Every other group, the controller (group 0) included, lives under a key
# prefix.
LEGACY_GROUP = 1


class StorageError(Exception):
    """Base class of storage errors; messages say what to do next."""


class OffsetOutOfRange(StorageError):
    def __init__(self, offset: int, start: int, dirty: int) -> None:
        super().__init__(
            f"offset {offset} is outside the log [{start}, {dirty + 1}); read from the log start "
            f"offset or up to the dirty offset + 1"
        )
        self.offset, self.start, self.dirty = offset, start, dirty


class TailFull(StorageError):
    """The unflushed tail hit its byte limit: flush before appending more (backpressure)."""

    def __init__(self, unflushed: int, limit: int, what: str = "the in-memory tail") -> None:
        super().__init__(
            f"{unflushed} unflushed bytes reached {what} limit of {limit}; wait for "
            f"the running flush to finish (or raise max_tail_bytes)"
        )


class TailBudget:
    """The unflushed bytes of every log of one store together, under one limit: a node with a
    thousand partitions holds at most `limit` bytes of dirty tails in memory, not a thousand
    times one log's limit. Each log reports every change of its own unflushed bytes
    (`adjust`), so the sum is exact by construction; an append that would pass the limit
    while any tail is dirty is refused TailFull (a flush frees it: leaders flush at once,
    followers within their deferred-flush bound). Thread-safe: appends run on the event loop,
    flushes in worker threads."""

    __slots__ = ("limit", "used", "_lock")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the tail limit must be positive, got {limit}")
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def check(self, size: int) -> None:
        """Raise TailFull if `size` more bytes would pass the limit (one batch larger than the
        limit still goes when nothing else is dirty)."""
        used = self.used
        if used and used + size > self.limit:
            raise TailFull(used + size, self.limit, "the store's (node-wide) tail")

    def adjust(self, delta: int) -> None:
        if delta:
            with self._lock:
                self.used += delta
                assert self.used >= 0, f"tail budget went negative ({self.used})"

    def share(self, owner: object) -> "TailShare":
        """`owner`'s account (its unflushed bytes) in this budget, released when the owner is
        garbage-collected (a log nobody closed must not hold the node's budget forever)."""
        share = TailShare(self)
        weakref.finalize(owner, share.release)
        return share


class TailShare:
    """One log's unflushed bytes, counted in its store's TailBudget. A log sets it on every
    change (under its own lock) and releases it when it drops its tail (closed, dropped, or
    garbage-collected: the owner registers `release` with weakref.finalize)."""

    __slots__ = ("budget", "bytes")

    def __init__(self, budget: TailBudget) -> None:
        self.budget = budget
        self.bytes = 0

    def set(self, nbytes: int) -> None:
        self.budget.adjust(nbytes - self.bytes)
        self.bytes = nbytes

    def release(self) -> None:
        self.set(0)


class CountsTail:
    """A log whose `_unflushed` bytes live in its TailShare (so the store's budget sees every
    change); the log sets `_tail_share` before touching `_unflushed`."""

    _tail_share: TailShare

    @property
    def _unflushed(self) -> int:
        return self._tail_share.bytes

    @_unflushed.setter
    def _unflushed(self, nbytes: int) -> None:
        self._tail_share.set(nbytes)


class DiskFull(StorageError):
    """The disk cannot take the write. Nothing flushed before it is lost, and the operation that
    raised it changed nothing (the unflushed tail is still in memory): retry once space is back."""


class StorageIOError(StorageError):
    """The disk failed a write (an I/O error other than a full disk). The operation that raised
    it changed nothing, on disk or in memory; the runtime fail-stops on it."""


class LogInconsistent(StorageError):
    """The durable log contradicts itself although every stored record passed its checksum
    (batches overlap, the start record disagrees with the first batch, terms go backwards):
    neither a crash nor a damaged disk leaves it so (a software bug does), so it is not repaired
    in place. `offsets` names the offsets involved. (What a damaged disk leaves, flipped bits or
    missing batches, is found by checksums and repaired instead: see DISK_LOSS_DOC.)"""

    def __init__(self, path: str, detail: str, offsets: tuple[int, ...] = ()) -> None:
        super().__init__(
            f"the log at {path} is inconsistent: {detail}. It cannot be repaired in place and "
            f"this node must not serve it: stop the node, move its data directory aside (keep "
            f"it for the bug report) and start the node again on an empty one with the same "
            f"--node-id: it rejoins by itself, as a node that lost its disk (see "
            f"{DISK_LOSS_DOC})")
        self.path, self.detail, self.offsets = path, detail, offsets


class DataDirLocked(StorageError):
    """Another open log (in this or another process) owns the directory."""

    def __init__(self, path: str, pid: int | None) -> None:
        if pid is not None and pid == os.getpid():
            who = f"this process (pid {pid}) already has"
            todo = "close that log first"
        else:
            who = (f"another raftlog process (pid {pid}) is using" if pid is not None
                   else "another raftlog process is using")
            todo = "stop it first, or give this node another --data-dir"
        super().__init__(f"{who} {path}; {todo}")
        self.path, self.pid = path, pid


@dataclass(slots=True)
class Meta:
    """Durable Raft metadata. Saved with fsync before save_meta returns: Raft must never
    forget a term or a vote."""

    term: int = 0
    voted_for: int | None = None
    # The cluster configuration in force when last saved (voters, learners, addresses);
    # a plain msgpack-able dict so storage does not depend on the raft package.
    config: dict | None = None
    extra: dict = field(default_factory=dict)
    # The data directory's identity (its incarnation): a random id storage creates with the
    # directory, and again whenever it finds the metadata missing or damaged (the node then
    # forgot its term and vote, so it must come back as a new member: raft/core/incarnation.py).
    # load_meta fills it in; save_meta keeps the stored one whatever this field says.
    incarnation: int = 0

    def is_empty(self) -> bool:
        """Nothing was ever saved: a new data directory, or one whose metadata was lost."""
        return self.term == 0 and self.voted_for is None and self.config is None


class IoMode(enum.Enum):
    """How a runtime calls a log's blocking work (flush, save_meta, scrub, persist_start, ...).
    Each implementation says which holds for it, so whoever drives a log never has to guess from
    its type."""

    WORKER_THREAD = "worker_thread"  # blocks on the disk; safe in a worker thread while the
    # owning thread appends and reads (the threading rules of storage/lmdb_log.py)
    INLINE = "inline"  # no disk to wait for and not thread-safe: call it on the owning thread


@dataclass(slots=True, frozen=True)
class ScrubSlice:
    """What one `LogStorage.scrub` call read back and checked."""

    next_offset: int  # where the next slice starts (the log start again after a full pass)
    bytes_read: int
    damaged: tuple[Damage, ...]  # damage this slice found (not known before)
    wrapped: bool  # this slice reached the flushed offset: a pass over the log completed


class LogStorage(abc.ABC):
    """The log contract. Implementations: storage.memory.MemoryLog, storage.lmdb_log.LmdbLog.

    Batches are the unit of append, truncation and reads; Raft entries are batches and
    `prev_offset` in replication is always a batch's last offset (or start_offset - 1).
    """

    # Where the log lives on disk (its directory), or None for a log held in memory: what the
    # runtime measures free space under.
    path: str | None = None
    # What the open found wrong and repaired or cut (one line each, for `status`); set by every
    # implementation's open.
    open_findings: list[str]
    # The Raft group whose log this is, within its store (LEGACY_GROUP for a log opened on its
    # own).
    group_id: int = LEGACY_GROUP

    @property
    @abc.abstractmethod
    def store(self) -> LogStore:
        """The store holding this log (LogStore): its flush is the store's, for one log."""

    # -- positions ------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def io_mode(self) -> IoMode:
        """How the blocking calls below are to be run (see IoMode)."""

    @property
    @abc.abstractmethod
    def start_offset(self) -> int:
        """First offset held (after prefix truncation, the new log start)."""

    @property
    @abc.abstractmethod
    def start_term(self) -> int:
        """Term of the entry at start_offset - 1 (0 if there never was one). Lets Raft check
        `prev_offset == start_offset - 1` after a prefix truncation."""

    @property
    @abc.abstractmethod
    def dirty_offset(self) -> int:
        """Last appended offset; start_offset - 1 when empty."""

    @property
    @abc.abstractmethod
    def flushed_offset(self) -> int:
        """Last fsynced offset; always <= dirty_offset."""

    @property
    @abc.abstractmethod
    def unflushed_bytes(self) -> int:
        """Encoded bytes appended but not yet flushed."""

    @property
    @abc.abstractmethod
    def retained_bytes(self) -> int:
        """Encoded bytes of every batch held from start_offset to dirty_offset (what retention
        by size counts)."""

    @property
    @abc.abstractmethod
    def snapshot(self) -> dict | None:
        """The state at the log start (the replicated tables as of start_offset - 1: cluster
        configuration, producer table, loads table, ...) as an opaque msgpack-able map, or None
        when none was given. Storage never looks inside: it keeps the map with the start it
        describes, written in the same transaction (truncate_prefix, reset, persist_start), so
        a crash can never pair a start with another start's state."""

    # -- writes ---------------------------------------------------------------------------
    @abc.abstractmethod
    def append(self, batches: Sequence[Batch]) -> None:
        """Append contiguous batches (the first at dirty_offset + 1, terms never decreasing).
        Readable at once; not durable until flush(). Raises TailFull past the tail limit and
        ValueError for a gap, overlap or term going backwards."""

    @abc.abstractmethod
    def flush(self, upto: int | None = None) -> int:
        """Make everything appended before this call durable in one fsynced transaction;
        return the new flushed offset. Safe to call from a worker thread while the owning
        thread appends; concurrent flushes are serialised. With `upto`, only batches whose
        last offset is <= upto are flushed (lets a simulation model "a flush covers what was
        appended before it started"). Truncations and reset wait for an in-flight flush."""

    @abc.abstractmethod
    def truncate_suffix(self, after_offset: int) -> None:
        """Drop every batch after `after_offset` (a batch's last offset, or start_offset - 1).
        Durable before it returns. flushed_offset becomes min(flushed, after_offset)."""

    @abc.abstractmethod
    def truncate_prefix(self, offset: int, snapshot: dict | None = None) -> None:
        """Retention: drop whole batches that end before `offset` (offset must be a batch base
        or dirty_offset + 1, and <= flushed_offset + 1), and make `snapshot` the state at the
        new start (None: no state is known there). Durable, in one transaction, before it
        returns; if the disk step raises, the log is exactly as before."""

    @abc.abstractmethod
    def advance_start(self, offset: int, snapshot: dict | None = None,
                      dropped_bytes: int | None = None) -> None:
        """The in-memory half of truncate_prefix, for a caller that must not wait for the disk:
        from now on start_offset is `offset`, `snapshot` is the state there and reads below it
        raise OffsetOutOfRange; nothing is written. Cheap; call it from the owning thread. The
        durable log keeps its old start (and that start's state) until persist_start(), so a
        crash in between comes back with the longer log, which is just as consistent.

        `dropped_bytes`: what the batches below `offset` count as (retained_bytes drops by it),
        from a caller that has just read them (retention's plan); without it the log works it
        out, which on disk means walking the log's cold front in the owner's thread. A wrong
        figure is a caller's bug (the simulation checks retention's against the in-memory log,
        which counts for itself; the LMDB log refuses one larger than what it holds flushed)."""

    @abc.abstractmethod
    def persist_start(self) -> None:
        """The disk half: delete the batches below the in-memory start and write that start
        and its snapshot, in one fsynced transaction (nothing to do when the disk already
        agrees). May run in a worker thread while the owner appends and reads. If it raises,
        the disk is unchanged and the in-memory start stays where advance_start put it (reads
        never go below it again); call it again later."""

    @abc.abstractmethod
    def reset(self, start_offset: int, start_term: int, snapshot: dict | None = None) -> None:
        """Drop the whole log and restart it empty at `start_offset` with `snapshot` as the
        state there (a follower that needs offsets below the leader's log start: the state
        transfer). Durable, in one transaction, before it returns."""

    # -- reads ----------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, offset: int, max_bytes: int, max_batches: int | None = None) -> list[Batch]:
        """Batches from the one containing `offset`, stopping before the batch that would pass
        `max_bytes` or, when given, `max_batches` batches (at least one batch is returned
        whenever offset <= dirty_offset). Callers on an event loop bound both: with small
        batches a byte budget alone can mean tens of thousands of batches to decode.
        [] at dirty_offset + 1; OffsetOutOfRange outside [start_offset, dirty_offset + 1].
        A damaged batch is never returned: a batch read back from disk that fails its checksum
        is recorded as damaged (see `damaged`), and the read stops before it, or raises
        CorruptBatch naming its offset when it is the first batch asked for.
        Batches still in memory (the dirty tail) are returned as appended without re-hashing:
        every batch is checked once where it enters the process (Batch.create on the leader,
        the wire decoder for replicated ones), and re-hashing each read would charge the CRC
        again for every follower and consumer of the hot tail."""

    def read_heads(self, offset: int, max_bytes: int, max_batches: int | None,
                   full: frozenset[BatchKind]) -> list[Batch | BatchHead]:
        """As `read`, but batches of a kind not in `full` may come back as their header alone
        (a BatchHead: offsets, kind, count, size), their payload neither read nor re-hashed.
        For the indexes that scan every committed batch for its kind and count (issue 28: the
        load and subscription indexes read every write back twice). The header has its own
        checksum; a damaged payload is found by the reads that serve it and the scrubber.
        This default returns whole batches (an in-memory log has nothing to save)."""
        return list(self.read(offset, max_bytes, max_batches))

    @abc.abstractmethod
    def term_at(self, offset: int) -> int:
        """Term of the entry at `offset`; start_term for start_offset - 1; OffsetOutOfRange
        otherwise."""

    # -- damage and repair (docs/DISK-LOSS.md) ---------------------------------------------
    @property
    @abc.abstractmethod
    def incarnation(self) -> int:
        """This data directory's identity (see Meta.incarnation); never 0."""

    @property
    @abc.abstractmethod
    def lost_position(self) -> tuple[int, int] | None:
        """(offset, term) of the last entry this log once held flushed, when flushed batches
        were lost after it was written (found missing or with a damaged header at open, so the
        log was cut before them); None when nothing flushed was ever lost. Durable. The node
        must not vote for a candidate less up to date than this: those entries may have counted
        toward commits."""

    @property
    @abc.abstractmethod
    def damage_version(self) -> int:
        """Moves whenever new damage is recorded (polled by the core each tick)."""

    @abc.abstractmethod
    def damaged(self) -> list[Damage]:
        """Damaged flushed batches known now, lowest offset first (not served, not counted
        as flushed by the node until repaired)."""

    def first_damaged(self) -> int | None:
        """The lowest damaged offset, or None."""
        got = self.damaged()
        return got[0].first if got else None

    @abc.abstractmethod
    def scrub(self, offset: int, max_bytes: int) -> ScrubSlice:
        """Read back flushed batches from the one holding `offset` (clamped to the log) for
        about `max_bytes`, checking every checksum, and record what is damaged. Safe to call
        from a worker thread while the owner appends (it takes the read lock per slice)."""

    @abc.abstractmethod
    def repair(self, batches: Sequence[Batch]) -> None:
        """Write good copies of damaged batches back, durably, in one transaction: each must be
        exactly a damaged batch (same offsets and term) and pass its checksum (ValueError
        otherwise; nothing is written then). Afterwards they read and count as flushed again."""

    # -- metadata -------------------------------------------------------------------------
    @abc.abstractmethod
    def load_meta(self) -> Meta:
        """The last saved metadata (a fresh Meta() for a new log)."""

    @abc.abstractmethod
    def save_meta(self, meta: Meta) -> None:
        """Persist metadata durably (fsync) before returning."""

    # -- lifecycle ------------------------------------------------------------------------
    @abc.abstractmethod
    def close(self) -> None:
        """Release resources. Unflushed data is NOT flushed: callers flush first if they
        want it kept (a clean shutdown does; a crash does not)."""

    # -- helpers shared by both implementations --------------------------------------------
    def last_term(self) -> int:
        """Term of the last entry (start_term when empty)."""
        return self.term_at(self.dirty_offset)


class LogStore(abc.ABC):
    """Many logs in one storage environment (one per node): storage.lmdb_store.LmdbStore and
    storage.memory.MemoryStore. Every log keeps the LogStorage contract on its own; the store
    adds the flush of many logs in one commit (docs/STORAGE-SAFETY.md, "One environment per
    node")."""

    # Durable commits so far (each one fsync on disk): raftlog_fsyncs_total.
    commits: int = 0

    @property
    @abc.abstractmethod
    def io_mode(self) -> IoMode:
        """How `flush` is to be run (see IoMode)."""

    @abc.abstractmethod
    def open_log(self, group_id: int) -> LogStorage:
        """Group `group_id`'s log, created empty if absent (refused while it is open)."""

    @abc.abstractmethod
    def drop_log(self, group_id: int) -> None:
        """Delete the group's log, data and metadata, durably (one commit)."""

    @abc.abstractmethod
    def group_ids(self) -> list[int]:
        """The groups whose logs the store holds, ascending."""

    @abc.abstractmethod
    def flush(self, logs: Iterable[LogStorage]) -> dict[int, int]:
        """Every given log's dirty tail (as of now) in ONE commit (one fsync); each log's
        flushed offset by group id, moved to exactly what that commit held for it. On failure
        nothing was written and no log changed (DiskFull: retry later)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every log of the store and the store itself (idempotent)."""
