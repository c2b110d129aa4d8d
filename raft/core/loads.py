"""Exactly-once staged loads: the replicated state machine behind `df.write.format("raftlog")`.

A Spark job writes through the log in three replicated steps (all ordinary Raft entries):

1. `load_begin` (CONTROL): opens load `load_id`; the offset of this entry is the load's
   *generation* (`gen`). Every writer tags its data with it, so data of an earlier run of the same
   load id (a zombie task, a crashed driver) can never be published by a later run.
2. STAGED batches: each task attempt's records, tagged (load_id, gen, partition, attempt, seq).
   `seq` numbers the attempt's batches from 0, so a client retry that lands twice is deduplicated
   (the first occurrence in log order wins) and a batch lost in a leader change is detected.
3. `load_commit` (CONTROL): publishes exactly the named attempts, each with its batch count. It
   applies only if every named attempt has all its batches in the log before the commit entry;
   otherwise the load is aborted with a reason (the driver reports it; a re-run succeeds).
   `load_abort` (CONTROL, from the driver or the leader's timeout) discards everything.

Every node applies *committed* entries in log order to a `LoadTable`, so every node (and any new
leader) holds the same table, and it is rebuilt after a restart by scanning the log
(`LoadIndex.catch_up`). Consumers read up to the *last stable offset*:
`min(commit index, applied offset, first offset of any open load - 1)` (Kafka's LSO), and a
STAGED batch is shown (as plain records at its offsets) only if its attempt was published.

This module is pure: no sockets, clocks or threads; time comes in as arguments. It reads a
`LogStorage` it is handed, which the simulation and the unit tests give as a MemoryLog.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgpack

from storage.api import LogStorage, OffsetOutOfRange
from storage.batch import Batch, BatchHead, BatchKind, CorruptBatch

DEFAULT_LOAD_TIMEOUT_MS = 60 * 60 * 1000  # an open load idle this long is aborted by the leader

# -- STAGED payload: tag + records ------------------------------------------------------------
_TAG_LEN = struct.Struct("<H")
_TAG_NUMS = struct.Struct("<qiqi")  # gen, partition, attempt, seq
MAX_LOAD_ID_BYTES = 256


@dataclass(slots=True, frozen=True)
class StageTag:
    """`attempt` must identify one task attempt uniquely within the load's generation: Spark's
    taskAttemptId (attemptNumber restarts at 0 when a whole stage is retried)."""

    load_id: str
    gen: int
    partition: int
    attempt: int
    seq: int


def encode_stage_tag(tag: StageTag) -> bytes:
    lid = tag.load_id.encode()
    if not lid or len(lid) > MAX_LOAD_ID_BYTES:
        raise ValueError(f"load id must be 1..{MAX_LOAD_ID_BYTES} UTF-8 bytes, got {len(lid)}")
    return _TAG_LEN.pack(len(lid)) + lid + _TAG_NUMS.pack(tag.gen, tag.partition, tag.attempt,
                                                         tag.seq)


def encode_staged_payload(tag: StageTag, records_payload: bytes) -> bytes:
    """A STAGED batch payload: the tag, then records as `storage.records.encode_records` makes."""
    return encode_stage_tag(tag) + records_payload


def decode_stage_tag(payload: bytes | memoryview) -> tuple[StageTag, int]:
    """(tag, header length); the records start at the header length. ValueError if malformed."""
    if len(payload) < _TAG_LEN.size:
        raise ValueError("staged payload shorter than its tag")
    (n,) = _TAG_LEN.unpack_from(payload, 0)
    end = _TAG_LEN.size + n + _TAG_NUMS.size
    if n == 0 or n > MAX_LOAD_ID_BYTES or len(payload) < end:
        raise ValueError(f"staged payload tag is malformed (load id length {n})")
    lid = bytes(payload[_TAG_LEN.size:_TAG_LEN.size + n]).decode()
    gen, part, att, seq = _TAG_NUMS.unpack_from(payload, _TAG_LEN.size + n)
    return StageTag(lid, gen, part, att, seq), end


# -- CONTROL payloads ---------------------------------------------------------------------------
# A CONTROL payload is a msgpack map whose "ctl" names the operation; load operations start with
# "load_". Other CONTROL users pick other names, and each ignores what it does not know.
CTL_BEGIN = "load_begin"
CTL_COMMIT = "load_commit"
CTL_ABORT = "load_abort"


def encode_begin(load_id: str) -> bytes:
    return msgpack.packb({"ctl": CTL_BEGIN, "load_id": load_id}, use_bin_type=True)


def encode_commit(load_id: str, gen: int, attempts: list[tuple[int, int, int, int]]) -> bytes:
    """attempts: (partition, attempt, batches, rows) for every attempt to publish."""
    return msgpack.packb({"ctl": CTL_COMMIT, "load_id": load_id, "gen": gen,
                          "attempts": [list(a) for a in attempts]}, use_bin_type=True)


def encode_abort(load_id: str, gen: int, reason: str) -> bytes:
    return msgpack.packb({"ctl": CTL_ABORT, "load_id": load_id, "gen": gen, "reason": reason},
                         use_bin_type=True)


def decode_control(payload: bytes) -> dict[str, Any] | None:
    """The control map if this is a load operation, else None (not ours, or garbage)."""
    try:
        obj = msgpack.unpackb(payload, raw=False)
    except Exception:
        return None
    if not isinstance(obj, dict) or not str(obj.get("ctl", "")).startswith("load_"):
        return None
    return obj


# -- the table ----------------------------------------------------------------------------------
class LoadState(str, Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(slots=True)
class AttemptState:
    # seq -> (base offset of its first occurrence, record count)
    seqs: dict[int, tuple[int, int]] = field(default_factory=dict)
    bytes: int = 0

    def rows_below(self, nbatches: int) -> int:
        return sum(c for s, (_, c) in self.seqs.items() if s < nbatches)


@dataclass(slots=True)
class Load:
    load_id: str
    gen: int  # offset of the load_begin entry of the current run
    state: LoadState
    begin_ms: int
    last_activity_ms: int
    attempts: dict[tuple[int, int], AttemptState] = field(default_factory=dict)
    published: frozenset[tuple[int, int]] = frozenset()
    rows: int = 0  # published rows (set at commit)
    end_offset: int = -1  # offset of the entry that closed it
    reason: str = ""

    def describe(self) -> dict[str, Any]:
        return {"load_id": self.load_id, "gen": self.gen, "state": self.state.value,
                "rows": self.rows, "attempts": len(self.attempts),
                "published": len(self.published), "end_offset": self.end_offset,
                "reason": self.reason}


class LoadTable:
    """{load_id: Load}, built by `apply`ing committed batches in log order (every node alike)."""

    def __init__(self, start_offset: int = 0) -> None:
        self.loads: dict[str, Load] = {}
        self.applied = start_offset - 1  # last offset applied
        self._open: dict[str, int] = {}  # load_id -> gen, for open loads only

    # -- applying --------------------------------------------------------------------------
    def apply(self, batch: Batch | BatchHead) -> None:
        """Apply one committed batch; batches must come in log order without gaps."""
        if batch.base_offset != self.applied + 1:
            raise ValueError(f"load table applied up to {self.applied} but got a batch at "
                             f"{batch.base_offset}: apply committed batches in order")
        self.applied = batch.last_offset
        if batch.kind == BatchKind.STAGED:
            self._apply_staged(batch)
        elif batch.kind == BatchKind.CONTROL:
            ctl = decode_control(batch.payload)
            if ctl is not None:
                self._apply_control(batch, ctl)

    def skip_to(self, offset: int) -> None:
        """The log start moved past what we applied (retention): continue from `offset`.
        Loads whose entries were dropped keep the state they had."""
        if offset - 1 > self.applied:
            self.applied = offset - 1

    def _apply_staged(self, batch: Batch) -> None:
        try:
            tag, hdr = decode_stage_tag(batch.payload)
        except ValueError:
            return  # never visible: the fetch filter rejects it the same way
        load = self.loads.get(tag.load_id)
        if load is None or load.state != LoadState.OPEN or load.gen != tag.gen:
            return  # unknown, closed or an earlier run: never visible
        att = load.attempts.setdefault((tag.partition, tag.attempt), AttemptState())
        if tag.seq in att.seqs:
            return  # a retried request that landed twice: the first copy is the one shown
        att.seqs[tag.seq] = (batch.base_offset, batch.count)
        att.bytes += len(batch.payload) - hdr
        load.last_activity_ms = max(load.last_activity_ms, batch.timestamp_ms)

    def _apply_control(self, batch: Batch, ctl: dict[str, Any]) -> None:
        op, lid = ctl.get("ctl"), ctl.get("load_id")
        if not isinstance(lid, str):
            return
        load = self.loads.get(lid)
        if op == CTL_BEGIN:
            if load is not None and load.state == LoadState.COMMITTED:
                return  # re-running a committed load is a no-op
            # A new run replaces an open or aborted one: the old generation's data stays hidden.
            self.loads[lid] = Load(lid, batch.base_offset, LoadState.OPEN, batch.timestamp_ms,
                                   batch.timestamp_ms)
            self._open[lid] = batch.base_offset
            return
        gen = ctl.get("gen")
        if load is None or load.state != LoadState.OPEN or load.gen != gen:
            return  # late or duplicate: outcome() tells the requester what happened instead
        if op == CTL_ABORT:
            self._close(load, LoadState.ABORTED, batch.base_offset,
                        str(ctl.get("reason") or "aborted"))
        elif op == CTL_COMMIT:
            self._commit(load, batch.base_offset, ctl.get("attempts") or [])

    def _commit(self, load: Load, offset: int, attempts: list) -> None:
        published: set[tuple[int, int]] = set()
        rows = 0
        for item in attempts:
            try:
                part, att, nbatches, nrows = (int(x) for x in item)
            except (TypeError, ValueError):
                self._close(load, LoadState.ABORTED, offset, f"malformed commit entry {item!r}")
                return
            st = load.attempts.get((part, att))
            have = 0 if st is None else sum(1 for s in st.seqs if 0 <= s < nbatches)
            if have != nbatches:
                self._close(load, LoadState.ABORTED, offset,
                            f"partition {part} attempt {att}: the log holds {have} of its "
                            f"{nbatches} batches (lost in a leader change?); re-run the job "
                            f"with the same loadId")
                return
            if st is not None and st.rows_below(nbatches) != nrows:
                self._close(load, LoadState.ABORTED, offset,
                            f"partition {part} attempt {att}: the log holds "
                            f"{st.rows_below(nbatches)} rows, the task reported {nrows}")
                return
            if (part, att) in published or any(p == part for p, _ in published):
                self._close(load, LoadState.ABORTED, offset,
                            f"partition {part} named twice in one commit")
                return
            published.add((part, att))
            rows += nrows
        # Keep only what the filter needs: the published attempts' batches 0..n-1.
        keep: dict[tuple[int, int], AttemptState] = {}
        for item in attempts:
            part, att, nbatches = int(item[0]), int(item[1]), int(item[2])
            st = load.attempts.get((part, att)) or AttemptState()
            keep[(part, att)] = AttemptState({s: v for s, v in st.seqs.items() if s < nbatches},
                                             st.bytes)
        load.attempts = keep
        load.published = frozenset(published)
        load.rows = rows
        self._close(load, LoadState.COMMITTED, offset, "")

    def _close(self, load: Load, state: LoadState, offset: int, reason: str) -> None:
        load.state, load.end_offset, load.reason = state, offset, reason
        if state == LoadState.ABORTED:
            load.attempts = {}
        self._open.pop(load.load_id, None)

    # -- the state at a log start (raft/core/snapshot.py) ---------------------------------------
    def dump(self) -> dict[str, Any]:
        """The whole table as a msgpack-able map (LoadTable.load reads it back)."""
        return {"applied": self.applied, "loads": [
            [ld.load_id, ld.gen, ld.state.value, ld.begin_ms, ld.last_activity_ms,
             [[p, a, [[s, b, c] for s, (b, c) in st.seqs.items()], st.bytes]
              for (p, a), st in ld.attempts.items()],
             [list(x) for x in sorted(ld.published)], ld.rows, ld.end_offset, ld.reason]
            for ld in self.loads.values()]}

    @staticmethod
    def load(d: dict[str, Any]) -> "LoadTable":
        """A table from dump(); ValueError if it is malformed."""
        try:
            t = LoadTable(int(d["applied"]) + 1)
            for (lid, gen, state, begin, last, attempts, published, rows, end,
                 reason) in d["loads"]:
                ld = Load(str(lid), int(gen), LoadState(state), int(begin), int(last),
                          {(int(p), int(a)): AttemptState(
                              {int(s): (int(b), int(c)) for s, b, c in seqs}, int(nbytes))
                           for p, a, seqs, nbytes in attempts},
                          frozenset((int(p), int(a)) for p, a in published), int(rows),
                          int(end), str(reason))
                t.loads[ld.load_id] = ld
                if ld.state == LoadState.OPEN:
                    t._open[ld.load_id] = ld.gen
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the loads table in the state at the log start is malformed "
                             f"({e!r})") from None
        return t

    def prune_below(self, offset: int) -> None:
        """Retention dropped everything before `offset`: a closed load that ended there has no
        staged batch left to show or hide, so only its outcome is kept (a re-run of a committed
        load id must still be a no-op)."""
        for ld in self.loads.values():
            if ld.state != LoadState.OPEN and 0 <= ld.end_offset < offset and ld.attempts:
                ld.attempts = {}

    # -- queries ---------------------------------------------------------------------------
    def open_loads(self) -> dict[str, int]:
        """{load_id: gen} of the open loads (gen = the offset of its load_begin entry)."""
        return dict(self._open)

    def first_open_offset(self) -> int | None:
        return min(self._open.values()) if self._open else None

    def stable_offset(self, commit_index: int) -> int:
        """The consumer-visible high watermark (last stable offset)."""
        hw = min(commit_index, self.applied)
        first = self.first_open_offset()
        return hw if first is None else min(hw, first - 1)

    def visible(self, batch: Batch) -> bytes | None:
        """The records payload a consumer sees for this batch, or None if it sees nothing.
        Call only for batches at or below `stable_offset`."""
        if batch.kind == BatchKind.DATA:
            return batch.payload
        if batch.kind != BatchKind.STAGED:
            return None
        try:
            tag, hdr = decode_stage_tag(batch.payload)
        except ValueError:
            return None
        load = self.loads.get(tag.load_id)
        if load is None or load.state != LoadState.COMMITTED or load.gen != tag.gen:
            return None
        st = load.attempts.get((tag.partition, tag.attempt))
        first = None if st is None else st.seqs.get(tag.seq)
        if first is None or first[0] != batch.base_offset:
            return None
        return batch.payload[hdr:]

    def get(self, load_id: str) -> Load | None:
        return self.loads.get(load_id)

    def stage_error(self, load_id: str, gen: int) -> str | None:
        """Why a staged write for (load_id, gen) is pointless, or None if it may be written.
        Only a hint for early rejection: correctness comes from `apply`/`visible`."""
        load = self.loads.get(load_id)
        if load is None or load.gen < gen:
            return None  # its begin is not applied here yet
        if load.gen > gen:
            return f"load {load_id!r} was restarted (generation {load.gen}, not {gen})"
        if load.state != LoadState.OPEN:
            return f"load {load_id!r} is already {load.state.value}"
        return None

    def expired(self, now_ms: int, timeout_ms: int) -> list[tuple[str, int]]:
        """(load_id, gen) of open loads idle longer than timeout_ms: the leader aborts them."""
        return [(lid, gen) for lid, gen in self._open.items()
                if now_ms - self.loads[lid].last_activity_ms > timeout_ms]


# -- catching up from a log ---------------------------------------------------------------------
# What the table reads the payload of; of every other batch the header is enough (read_heads).
_LOAD_KINDS = frozenset((BatchKind.STAGED, BatchKind.CONTROL))


class LoadIndex:
    """A LoadTable kept current from a LogStorage: the node calls `catch_up` before serving
    fetches and load requests, and on its timer. After a restart it rebuilds from the log start
    (a full scan; fine for logs of a few GB, documented in docs/SPARK.md)."""

    def __init__(self, log: LogStorage) -> None:
        self.log = log
        self.table = LoadTable(log.start_offset)
        self._restore()

    def _restore(self) -> None:
        """Start over from the state stored with the log start (the table as of the log start;
        after a restart, or after a state transfer moved the start past what we applied)."""
        from raft.core.snapshot import LOADS, section_raw

        raw = section_raw(self.log.snapshot, LOADS)
        if raw is not None:
            self.table = LoadTable.load(raw)
            if self.table.applied + 1 != self.log.start_offset:
                raise ValueError(f"the loads table stored with the log start was applied up "
                                 f"to {self.table.applied}, not to the log start "
                                 f"{self.log.start_offset} - 1")
        else:
            # A log that starts at 0, or (before state transfers carried the table) one reset
            # without it: continue from the start with what we have.
            self.table.skip_to(self.log.start_offset)

    def catch_up(self, commit_index: int, max_bytes: int = 64 << 20,
                 max_batches: int | None = None) -> bool:
        """Apply committed batches up to `commit_index`, reading at most about max_bytes (and
        max_batches, when given: a caller on an event loop bounds both). True if fully caught
        up."""
        t = self.table
        budget = max_bytes
        left = max_batches if max_batches is not None else 1 << 62
        while t.applied < commit_index and budget > 0 and left > 0:
            if t.applied + 1 < self.log.start_offset:
                self._restore()
                t = self.table
                continue
            if t.applied + 1 > self.log.dirty_offset:
                return False
            try:
                batches = self.log.read_heads(t.applied + 1, min(budget, 16 << 20), left,
                                              _LOAD_KINDS)
            except CorruptBatch:
                return False  # damaged here (raft/core/repair.py fetches it again): wait for it
            except OffsetOutOfRange:
                # The log moved under us: a state transfer's reset, run by the storage worker
                # while this runs on the event loop, moved its start past what we read from
                # (CI: a node back from a state transfer stopped on this). Not a fault: the
                # next call sees the new start and restores the table stored with it.
                return False
            if not batches:
                return False
            for b in batches:
                if b.last_offset > commit_index:
                    return t.applied >= commit_index
                if b.base_offset != t.applied + 1:
                    return False  # the log moved under us: the next call reads afresh
                t.apply(b)
                budget -= b.size
            left -= len(batches)
        return t.applied >= commit_index

    def stable_offset(self, commit_index: int) -> int:
        return self.table.stable_offset(commit_index)

    def visible_batches(self, batches: list[Batch], stable: int) -> list[tuple[Batch, bytes]]:
        """The batches (with their consumer payload) a consumer may see, all <= stable."""
        out = []
        for b in batches:
            if b.last_offset > stable:
                break
            payload = self.table.visible(b)
            if payload is not None:
                out.append((b, payload))
        return out
