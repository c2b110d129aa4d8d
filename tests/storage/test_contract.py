"""One contract suite for both log implementations, checked against a tiny model.

The model is a list of batches plus the flushed offset and the durable start; after a crash
(MemoryLog.crash(), or dropping an LmdbLog without flush and reopening its directory) the log
must equal the model cut at the flushed offset: nothing flushed lost, nothing unflushed kept.

Damage: `damage_and_repair` rots one flushed batch (MemoryLog.flip_bits; for LMDB a byte of
its stored record), and the log must stop serving it (a read stops before it or raises), a
scrub must find exactly it, and `repair` with a good copy must make it whole again. The
directory's identity (incarnation) never changes across crashes and reopens.

Disk faults: `failed_op` makes one mutation fail on the disk (MemoryLog.fail_next; for LMDB a
wrapped environment whose write transaction fails, tests/storage/lmdb_inject.py) with an I/O
error or a full disk, and checks the log is exactly as before (disk first, then memory); the
model is left as it was, so every later rule, crash included, checks that too.

Stores: the same suite runs on logs a store opens (storage/lmdb_store.py, MemoryStore): group 0,
and group 3 between neighbours 2 and 4 that hold flushed data of their own, so a cursor walking
past the log's keys, or a cut, a reset or a crash reaching a neighbour, fails here (the
neighbours are checked whole at every crash and at the end).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    run_state_machine_as_test,
)
from hypothesis.stateful import initialize, invariant, precondition, rule

from storage import open_log, open_store
from storage.api import (
    DiskFull,
    LogStorage,
    Meta,
    OffsetOutOfRange,
    StorageError,
    StorageIOError,
    TailFull,
)
from storage.batch import HEADER_SIZE, Batch, BatchKind, CorruptBatch
from storage.memory import FAULT_OPS, MemoryLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmdb_inject  # noqa: E402

MAX_TAIL = 6000


class LogMachine(RuleBasedStateMachine):
    impl = "memory"
    group: int | None = None  # None: a log on its own; else this group of a store

    def __init__(self) -> None:
        super().__init__()
        self.dir: str | None = None
        self.log: LogStorage
        self.batches: list[Batch] = []
        self.start = 0
        self.start_term = 0
        self.flushed = -1
        self.meta = Meta()
        self.snap: dict | None = None  # the state at the (live) start
        # advance_start moves the live start only: what a crash brings back until persist_start.
        self.retired: list[Batch] = []
        self.durable = (0, 0, None)  # (start, start_term, snapshot) on disk

    # -- plumbing -------------------------------------------------------------------------
    def _open(self) -> LogStorage:
        if self.group is not None:
            return self._open_in_store()
        if self.impl == "memory":
            return MemoryLog(max_tail_bytes=MAX_TAIL)
        return open_log(self.dir, max_tail_bytes=MAX_TAIL, map_size=1 << 16)

    def _open_in_store(self) -> LogStorage:
        assert self.group is not None
        if getattr(self, "store", None) is None:
            self.store = open_store(self.dir, max_tail_bytes=MAX_TAIL, map_size=1 << 16)
        fresh = not self.store.group_ids()
        log = self.store.open_log(self.group)
        self.neighbours = {}
        for g in (self.group - 1, self.group + 1):
            if g < 0:
                continue
            other = self.store.open_log(g)
            if fresh:
                other.append([Batch.create(bytes([g]) * 40, 2).placed(0, 1),
                              Batch.create(bytes([g]) * 9, 1).placed(2, 2)])
                self.store.flush([other])
                other.save_meta(Meta(term=g + 7, voted_for=g))
            self.neighbours[g] = other
        if fresh:
            self.neighbours_held = {g: (o.read(0, 1 << 20), o.load_meta())
                                    for g, o in self.neighbours.items()}
        self._check_neighbours()
        return log

    def _check_neighbours(self) -> None:
        for g, other in self.neighbours.items():
            assert (other.read(0, 1 << 20), other.load_meta()) == self.neighbours_held[g], g
            assert other.damaged() == [] and other.open_findings == []

    @initialize()
    def setup(self) -> None:
        if self.impl == "lmdb":
            self.dir = tempfile.mkdtemp(prefix="raftlog-contract-")
        self.log = self._open()
        assert self.log.incarnation != 0
        self.meta = Meta(incarnation=self.log.incarnation)

    def teardown(self) -> None:
        if getattr(self, "store", None) is not None:
            self._check_neighbours()
            self.store.close()
        elif hasattr(self, "log"):
            self.log.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def dirty(self) -> int:
        return self.batches[-1].last_offset if self.batches else self.start - 1

    def last_term(self) -> int:
        return self.batches[-1].term if self.batches else self.start_term

    def unflushed(self) -> int:
        return sum(b.size for b in self.batches if b.last_offset > self.flushed)

    # -- writes ---------------------------------------------------------------------------
    @rule(specs=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 1500), st.booleans(),
                                   st.sampled_from(list(BatchKind))), min_size=1, max_size=4))
    def append(self, specs: list[tuple[int, int, bool, BatchKind]]) -> None:
        off, term = self.dirty + 1, self.last_term()
        new = []
        for count, plen, bump, kind in specs:
            term += int(bump)
            payload = bytes([off % 251]) * plen
            new.append(Batch.create(payload, count, kind=kind, timestamp_ms=off,
                                    producer_id=off % 3, sequence=off).placed(off, max(term, 1)))
            term = max(term, 1)
            off += count
        size = sum(b.size for b in new)
        pending = self.unflushed()
        if pending and pending + size > MAX_TAIL:
            with pytest.raises(TailFull):
                self.log.append(new)
            return
        self.log.append(new)
        self.batches.extend(new)

    @rule()
    def append_rejects_gap(self) -> None:
        with pytest.raises(ValueError):
            self.log.append([Batch.create(b"g", 1).placed(self.dirty + 2, self.last_term())])

    @rule()
    def flush_all(self) -> None:
        assert self.log.flush() == self.dirty
        self.flushed = self.dirty

    @rule(data=st.data())
    def flush_upto(self, data: st.DataObject) -> None:
        upto = data.draw(st.integers(self.start - 1, self.dirty + 2), label="upto")
        covered = [b.last_offset for b in self.batches if b.last_offset <= upto]
        want = max([self.flushed, *covered])
        assert self.log.flush(upto=upto) == want
        self.flushed = want

    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        ends = [self.start - 1] + [b.last_offset for b in self.batches]
        after = data.draw(st.sampled_from(ends), label="after")
        self.log.truncate_suffix(after)
        self.batches = [b for b in self.batches if b.last_offset <= after]
        self.flushed = min(self.flushed, after)

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate_suffix_mid_batch_rejected(self, data: st.DataObject) -> None:
        multi = [b for b in self.batches if b.count > 1]
        if not multi:
            return
        b = data.draw(st.sampled_from(multi), label="batch")
        with pytest.raises(ValueError):
            self.log.truncate_suffix(b.base_offset)

    @rule(data=st.data())
    def truncate_prefix(self, data: st.DataObject) -> None:
        cands = [b.base_offset for b in self.batches if b.base_offset <= self.flushed + 1]
        if self.flushed == self.dirty:
            cands.append(self.dirty + 1)
        if not cands:
            return
        offset = data.draw(st.sampled_from(cands), label="offset")
        snap = data.draw(st.none() | st.fixed_dictionaries({"at": st.just(offset),
                                                            "tables": st.binary(max_size=9)}),
                         label="snapshot")
        self.log.truncate_prefix(offset, snap)
        if offset > self.start:
            self._advance(offset, snap)
            self._persist()

    def _advance(self, offset: int, snap: dict | None) -> None:
        new_term = [b.term for b in self.batches if b.last_offset == offset - 1][0]
        self.retired += [b for b in self.batches if b.base_offset < offset]
        self.batches = [b for b in self.batches if b.base_offset >= offset]
        self.start, self.start_term, self.snap = offset, new_term, snap

    def _persist(self) -> None:
        self.retired = []
        self.durable = (self.start, self.start_term, self.snap)

    @rule(data=st.data())
    def advance_start(self, data: st.DataObject) -> None:
        """Retention's first half: the readable start moves, the disk does not (yet)."""
        cands = [b.base_offset for b in self.batches
                 if self.start < b.base_offset <= self.flushed + 1]
        if self.flushed == self.dirty and self.dirty + 1 > self.start:
            cands.append(self.dirty + 1)
        if not cands:
            return
        offset = data.draw(st.sampled_from(cands), label="offset")
        snap = {"at": offset}
        # With and without the caller's figure of the dropped bytes (retention's plan has it).
        exact = sum(b.size for b in self.batches if b.base_offset < offset)
        self.log.advance_start(offset, snap, data.draw(st.sampled_from([None, exact]),
                                                        label="dropped_bytes"))
        self._advance(offset, snap)

    @rule()
    def persist_start(self) -> None:
        self.log.persist_start()
        self._persist()

    @precondition(lambda self: self.dirty > self.flushed)
    @rule()
    def truncate_prefix_past_flushed_rejected(self) -> None:
        with pytest.raises(ValueError):
            self.log.truncate_prefix(self.dirty + 1)

    @rule(skip=st.integers(0, 20), term_bump=st.integers(0, 2))
    def reset(self, skip: int, term_bump: int) -> None:
        start, term = self.dirty + 1 + skip, self.last_term() + term_bump
        snap = {"reset": start} if skip % 2 else None
        self.log.reset(start, term, snap)
        self.batches, self.start, self.start_term, self.flushed = [], start, term, start - 1
        self.snap = snap
        self._persist()

    @rule(term=st.integers(0, 50), vote=st.none() | st.integers(1, 5),
          voters=st.lists(st.integers(1, 9), max_size=3), note=st.binary(max_size=8))
    def save_meta(self, term: int, vote: int | None, voters: list[int], note: bytes) -> None:
        meta = Meta(term=term, voted_for=vote,
                    config={"voters": voters, "addresses": {v: f"h:{v}" for v in voters}},
                    extra={"note": note}, incarnation=self.log.incarnation)
        self.log.save_meta(Meta(meta.term, meta.voted_for, meta.config, meta.extra,
                                incarnation=12345))  # storage keeps its own identity
        self.meta = meta

    # -- damage ---------------------------------------------------------------------------
    def _rot(self, b: Batch) -> None:
        """The stored copy of `b` no longer matches its checksums."""
        if isinstance(self.log, MemoryLog):
            self.log.flip_bits(b.base_offset)
            return
        log = self.log
        db = log._log_db  # type: ignore[attr-defined]
        key = log._space.key(b.base_offset)  # type: ignore[attr-defined]

        def rot(txn: object) -> None:
            raw = bytearray(txn.get(key, db=db))  # type: ignore[attr-defined]
            raw[HEADER_SIZE if len(b.payload) else 1] ^= 0x40  # payload, or the header
            txn.put(key, bytes(raw), db=db)  # type: ignore[attr-defined]

        with log._write_lock:  # type: ignore[attr-defined]
            log._write("rotting a batch (test)", rot)  # type: ignore[attr-defined]

    @precondition(lambda self: any(b.last_offset <= self.flushed for b in self.batches))
    @rule(data=st.data())
    def damage_and_repair(self, data: st.DataObject) -> None:
        flushed = [b for b in self.batches if b.last_offset <= self.flushed]
        b = data.draw(st.sampled_from(flushed), label="rotten")
        self._rot(b)
        log = self.log
        before = log.damage_version
        found: list = []
        offset = log.start_offset
        for _ in range(10_000):
            got = log.scrub(offset, data.draw(st.integers(1, 3000), label="slice"))
            found.extend(got.damaged)
            offset = got.next_offset
            if got.wrapped:
                break
        assert [(d.first, d.last, d.term) for d in found] == [(b.base_offset, b.last_offset,
                                                               b.term)]
        assert log.damage_version != before and log.first_damaged() == b.base_offset
        with pytest.raises(CorruptBatch):
            log.read(b.base_offset, 1 << 20)
        if b.base_offset > log.start_offset:
            got = log.read(log.start_offset, 1 << 30)
            assert got and got[-1].last_offset == b.base_offset - 1  # stops before it
        with pytest.raises(ValueError):  # only the very batch is accepted back
            log.repair([b.placed(b.base_offset, b.term + 1)])
        log.repair([b])
        assert log.damaged() == [] and log.read(b.base_offset, 1)[0] == b

    @rule()
    def scrub_finds_nothing_whole(self) -> None:
        got = self.log.scrub(self.log.start_offset, 1 << 30)
        assert got.wrapped and got.damaged == () and self.log.damaged() == []

    # -- disk faults ----------------------------------------------------------------------
    def _state(self) -> tuple:
        """Everything observable about the log, to compare before and after a failed op."""
        log = self.log
        held = log.read(log.start_offset, 1 << 30) if log.dirty_offset >= log.start_offset else []
        return (log.start_offset, log.start_term, log.dirty_offset, log.flushed_offset,
                log.unflushed_bytes, log.last_term(), held, log.load_meta(), log.snapshot,
                log.retained_bytes)

    def _fail(self, op: str, exc_type: type[StorageError], at: str,
              call: Callable[[], object]) -> None:
        before = self._state()
        if self.impl == "memory":
            assert isinstance(self.log, MemoryLog)
            self.log.fail_next(op, exc_type)
            with pytest.raises(exc_type):
                call()
            assert self.log.pending_faults() == {}
        else:
            raw = (lmdb_inject.enospc() if exc_type is DiskFull
                   else lmdb_inject.io_error())
            with lmdb_inject.inject(self.log, raw, at=at) as fault, pytest.raises(exc_type):
                call()
            assert fault.fired == 1
        assert self._state() == before

    @rule(data=st.data(), op=st.sampled_from(FAULT_OPS),
          exc_type=st.sampled_from([StorageIOError, DiskFull]),
          at=st.sampled_from(["write", "commit"]))
    def failed_op(self, data: st.DataObject, op: str, exc_type: type[StorageError],
                  at: str) -> None:
        if op == "flush":
            if self.dirty == self.flushed:
                return  # nothing to write: no disk step to fail
            self._fail(op, exc_type, at, self.log.flush)
        elif op == "truncate_suffix":
            ends = [e for e in [self.start - 1] + [b.last_offset for b in self.batches]
                    if e < self.flushed]
            if not ends:
                return  # only the in-memory tail could be cut
            after = data.draw(st.sampled_from(ends), label="after")
            self._fail(op, exc_type, at, lambda: self.log.truncate_suffix(after))
        elif op == "truncate_prefix":
            cands = [b.base_offset for b in self.batches
                     if self.start < b.base_offset <= self.flushed + 1]
            if self.flushed == self.dirty and self.dirty + 1 > self.start:
                cands.append(self.dirty + 1)
            if not cands:
                return
            offset = data.draw(st.sampled_from(cands), label="offset")
            if data.draw(st.booleans(), label="two steps"):
                # advance_start, then the disk half fails: the live start stays advanced.
                self.log.advance_start(offset, {"at": offset})
                self._advance(offset, {"at": offset})
                self._fail(op, exc_type, at, self.log.persist_start)
            else:
                self._fail(op, exc_type, at, lambda: self.log.truncate_prefix(offset, {"x": 1}))
        elif op == "reset":
            start = self.dirty + 1 + data.draw(st.integers(0, 5), label="skip")
            self._fail(op, exc_type, at, lambda: self.log.reset(start, self.last_term() + 1))
        else:
            meta = Meta(term=self.meta.term + 1, voted_for=1, config={"voters": [1]})
            self._fail(op, exc_type, at, lambda: self.log.save_meta(meta))

    @rule()
    def crash(self) -> None:
        if self.group is not None and self.impl == "memory":
            self.store.crash()  # every log of the store at once
            self.log = self._open()
        elif self.group is not None:
            self.store.close()  # no flush: dirty batches are dropped, as in a process crash
            self.store = None
            self.log = self._open()
        elif self.impl == "memory":
            assert isinstance(self.log, MemoryLog)
            self.log.crash()
        else:
            self.log.close()  # no flush: dirty batches are dropped, as in a process crash
            self.log = self._open()
        self.batches = self.retired + [b for b in self.batches if b.last_offset <= self.flushed]
        self.start, self.start_term, self.snap = self.durable
        self.retired = []

    # -- reads ----------------------------------------------------------------------------
    @rule(data=st.data(), budget=st.integers(0, 5000),
          max_batches=st.one_of(st.none(), st.integers(1, 4)))
    def read(self, data: st.DataObject, budget: int, max_batches: int | None) -> None:
        offset = data.draw(st.integers(self.start - 2, self.dirty + 2), label="offset")
        if offset == self.dirty + 1:
            assert self.log.read(offset, budget, max_batches) == []
            return
        if not (self.start <= offset <= self.dirty):
            with pytest.raises(OffsetOutOfRange):
                self.log.read(offset, budget, max_batches)
            return
        want: list[Batch] = []
        used = 0
        for b in self.batches:
            if b.last_offset < offset:
                continue
            if want and (used + b.size > budget or len(want) == (max_batches or 1 << 30)):
                break
            want.append(b)
            used += b.size
        assert self.log.read(offset, budget, max_batches) == want

    @rule(data=st.data())
    def term_at(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start - 2, self.dirty + 1), label="offset")
        if offset == self.start - 1:
            assert self.log.term_at(offset) == self.start_term
        elif self.start <= offset <= self.dirty:
            want = [b.term for b in self.batches if b.base_offset <= offset <= b.last_offset][0]
            assert self.log.term_at(offset) == want
        else:
            with pytest.raises(OffsetOutOfRange):
                self.log.term_at(offset)

    @invariant()
    def positions_match(self) -> None:
        if not hasattr(self, "log"):
            return
        assert self.log.start_offset == self.start
        assert self.log.start_term == self.start_term
        assert self.log.dirty_offset == self.dirty
        assert self.log.flushed_offset == self.flushed
        assert self.log.flushed_offset <= self.log.dirty_offset
        assert self.log.unflushed_bytes == self.unflushed()
        assert self.log.last_term() == self.last_term()
        assert self.log.load_meta() == self.meta
        assert self.log.snapshot == self.snap
        assert self.log.retained_bytes == sum(b.size for b in self.batches)
        assert self.log.incarnation == self.meta.incarnation  # stable across crash and reopen
        assert self.log.lost_position is None  # nothing here loses flushed batches


class MemoryMachine(LogMachine):
    impl = "memory"


class LmdbMachine(LogMachine):
    impl = "lmdb"


class MemoryStore0Machine(LogMachine):
    impl, group = "memory", 0


class MemoryStore3Machine(LogMachine):
    impl, group = "memory", 3


class LmdbStore0Machine(LogMachine):
    impl, group = "lmdb", 0


class LmdbStore3Machine(LogMachine):
    impl, group = "lmdb", 3


_SETTINGS = settings(max_examples=200, stateful_step_count=25, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("machine", [MemoryMachine, LmdbMachine, MemoryStore0Machine,
                                     MemoryStore3Machine, LmdbStore0Machine, LmdbStore3Machine],
                         ids=["memory", "lmdb", "memory-store-g0", "memory-store-g3",
                              "lmdb-store-g0", "lmdb-store-g3"])
def test_contract(machine: type[LogMachine]) -> None:
    run_state_machine_as_test(machine, settings=_SETTINGS)
