"""The node's store: many logs in one environment, group commit across them (storage/lmdb_store.py
and its in-memory twin storage.memory.MemoryStore).

Every rule runs on both implementations. "Reopen" is what a process crash and restart does: for
LMDB, closing the store without flushing and opening the directory again; for memory, crash().
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import lmdb
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from hypothesis.stateful import run_state_machine_as_test

from storage import open_store
from storage.api import LEGACY_GROUP, DiskFull, Meta, StorageIOError
from storage.batch import HEADER_SIZE, Batch
from storage.lmdb_log import LmdbLog
from storage import open_store as open_lmdb_store
from storage.memory import MemoryStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmdb_inject  # noqa: E402

IMPLS = ["memory", "lmdb"]


def batch(base: int, count: int = 1, term: int = 1, fill: bytes = b"x",
          size: int = 32) -> Batch:
    return Batch.create(fill * size, count).placed(base, term)


def make(impl: str, path: Path) -> Any:
    return open_store(None if impl == "memory" else path, map_size=1 << 20)


def reopen(impl: str, store: Any, path: Path) -> Any:
    """A crash and a restart: everything past each log's flushed offset is gone."""
    if impl == "memory":
        store.crash()
        return store
    store.close()
    return make(impl, path)


def fill(log: Any, n: int, fill_byte: bytes, term: int = 1) -> None:
    base = log.dirty_offset + 1
    log.append([batch(base + i, 1, term, fill_byte) for i in range(n)])


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param


def test_a_store_flush_gives_every_log_its_own_flushed_offset(impl: str, tmp_path: Path) -> None:
    store = make(impl, tmp_path)
    logs = {g: store.open_log(g) for g in (0, 1, 2, 7)}
    fill(logs[0], 3, b"a")
    fill(logs[1], 5, b"b")
    fill(logs[7], 1, b"h")  # group 2 has nothing dirty
    before = store.commits
    got = store.flush(logs.values())
    assert got == {0: 2, 1: 4, 2: -1, 7: 0}
    assert store.commits == before + 1
    assert {g: log.flushed_offset for g, log in logs.items()} == got
    assert all(log.unflushed_bytes == 0 for log in logs.values())
    # Nothing to write: no commit at all.
    assert store.flush(logs.values()) == got and store.commits == before + 1
    store.close()


@pytest.mark.parametrize("n", [1, 8, 64])
def test_flushing_many_logs_takes_exactly_one_commit(impl: str, tmp_path: Path, n: int) -> None:
    """Group commit across logs: at the same write rate, fsyncs do not grow with the logs."""
    store = make(impl, tmp_path)
    logs = [store.open_log(g) for g in range(n)]
    for round_ in range(3):
        for i, log in enumerate(logs):
            fill(log, 1 + i % 3, bytes([65 + i % 26]))
        before = store.commits
        got = store.flush(logs)
        assert store.commits - before == 1, f"round {round_}: {store.commits - before} commits"
        assert got == {g: log.dirty_offset for g, log in enumerate(logs)}
    store.close()


def test_a_crash_after_a_store_flush_loses_exactly_each_logs_unflushed_part(
        impl: str, tmp_path: Path) -> None:
    store = make(impl, tmp_path)
    logs = {g: store.open_log(g) for g in (0, 1, 2)}
    fill(logs[0], 4, b"a")
    fill(logs[1], 2, b"b")
    store.flush([logs[0], logs[1]])  # group 2 not asked: nothing of it is durable
    fill(logs[0], 3, b"A")  # after the flush: lost by the crash
    fill(logs[2], 5, b"c")
    want = {g: log.read(log.start_offset, 1 << 20)[:log.flushed_offset + 1]
            for g, log in logs.items()}
    store = reopen(impl, store, tmp_path)
    logs = {g: store.open_log(g) for g in (0, 1, 2)}
    assert {g: log.dirty_offset for g, log in logs.items()} == {0: 3, 1: 1, 2: -1}
    assert {g: log.flushed_offset for g, log in logs.items()} == {0: 3, 1: 1, 2: -1}
    assert {g: log.read(0, 1 << 20) for g, log in logs.items()} == want
    store.close()


def test_drop_log_removes_its_data_durably_and_leaves_the_others(impl: str,
                                                                tmp_path: Path) -> None:
    store = make(impl, tmp_path)
    logs = {g: store.open_log(g) for g in (0, 1, 2, 3)}
    for g, log in logs.items():
        fill(log, 3 + g, bytes([97 + g]))
        log.save_meta(Meta(term=10 + g, voted_for=g))
    store.flush(logs.values())
    kept = {g: (log.read(0, 1 << 20), log.load_meta().term) for g, log in logs.items()}
    old_incarnation = logs[2].incarnation
    store.drop_log(2)
    store.drop_log(0)
    assert store.group_ids() == [1, 3]
    store = reopen(impl, store, tmp_path)
    assert store.group_ids() == [1, 3]
    for g in (1, 3):
        log = store.open_log(g)
        assert (log.read(0, 1 << 20), log.load_meta().term) == kept[g]
        assert log.open_findings == []
    again = store.open_log(2)  # a new, empty log with a new identity
    assert (again.dirty_offset, again.load_meta().term) == (-1, 0)
    assert again.incarnation != old_incarnation
    assert store.open_log(0).dirty_offset == -1
    store.close()


def test_the_dirty_tails_of_all_logs_share_one_node_wide_limit(impl: str, tmp_path: Path) -> None:
    """A store's max_tail_bytes bounds every log's unflushed bytes together (a thousand
    partitions do not hold a thousand times one log's limit in memory): an append past it is
    refused TailFull, whichever log holds the dirty bytes, and a flush, a drop or a close of
    the logs that hold them frees room."""
    from storage.api import TailFull
    size = batch(0).size
    store = open_store(None if impl == "memory" else tmp_path, map_size=1 << 20,
                       max_tail_bytes=3 * size)
    a, b, c = (store.open_log(g) for g in (2, 3, 4))
    a.append([batch(0), batch(1)])
    b.append([batch(0)])
    assert store.tail_budget.used == 3 * size
    with pytest.raises(TailFull, match="node-wide"):
        c.append([batch(0)])  # c has nothing dirty of its own: the node's limit refuses it
    store.flush([a])
    c.append([batch(0)])
    with pytest.raises(TailFull):
        a.append([batch(2), batch(3)])
    store.drop_log(3)  # b's dirty batch goes with it
    a.append([batch(2)])
    assert store.tail_budget.used == 2 * size  # a's new batch and c's
    store.flush([a, c])
    assert store.tail_budget.used == 0
    store.close()


def test_a_reopened_store_finds_its_groups(impl: str, tmp_path: Path) -> None:
    store = make(impl, tmp_path)
    assert store.group_ids() == []
    for g in (5, 0, 1 << 40, 2):
        store.open_log(g)
    store = reopen(impl, store, tmp_path)
    assert store.group_ids() == [0, 2, 5, 1 << 40]
    store.close()


def test_a_log_is_open_once_per_store(impl: str, tmp_path: Path) -> None:
    store = make(impl, tmp_path)
    log = store.open_log(4)
    with pytest.raises(Exception, match="already open"):
        store.open_log(4)
    log.close()
    assert store.open_log(4) is not None
    store.close()


def test_a_flush_fault_fails_the_whole_store_flush_and_changes_no_log(
        impl: str, tmp_path: Path) -> None:
    store = make(impl, tmp_path)
    logs = [store.open_log(g) for g in (0, 1, 2)]
    for i, log in enumerate(logs):
        fill(log, 2, bytes([65 + i]))
    store.flush(logs[:1])
    fill(logs[0], 2, b"z")
    before = [(log.flushed_offset, log.dirty_offset, log.unflushed_bytes) for log in logs]
    commits = store.commits
    for exc in (DiskFull, StorageIOError):
        if impl == "memory":
            logs[2].fail_next("flush", exc)
            with pytest.raises(exc):
                store.flush(logs)
        else:
            raw = lmdb_inject.enospc() if exc is DiskFull else lmdb_inject.io_error()
            with lmdb_inject.inject(logs[0], raw, at="commit"), pytest.raises(exc):
                store.flush(logs)
        assert [(log.flushed_offset, log.dirty_offset, log.unflushed_bytes)
                for log in logs] == before
        assert store.commits == commits
    assert store.flush(logs) == {0: 3, 1: 1, 2: 1}  # and the next one takes it all
    store = reopen(impl, store, tmp_path)
    assert [store.open_log(g).dirty_offset for g in (0, 1, 2)] == [3, 1, 1]
    store.close()


# -- LMDB only -----------------------------------------------------------------------------------
def test_a_store_flush_credits_each_log_only_what_its_transaction_held(tmp_path: Path) -> None:
    """Appends made while a store flush commits stay dirty: no log is told its dirty offset is
    flushed, and no log is credited another's offset (the mutants in tests/raft/test_mutants.py
    switch either rule off)."""
    store = open_lmdb_store(tmp_path)
    a, b, c = (store.open_log(g) for g in (0, 1, 2))
    fill(a, 3, b"a")
    fill(b, 6, b"b")
    fill(c, 1, b"c")
    started, go = threading.Event(), threading.Event()
    real = store._write_locked

    def gated(what: str, body: Any, env: Any = None) -> Any:
        started.set()
        assert go.wait(30)
        return real(what, body, env)

    store._write_locked = gated  # type: ignore[method-assign]
    result: list[dict[int, int]] = []
    t = threading.Thread(target=lambda: result.append(store.flush([a, b, c])))
    t.start()
    assert started.wait(30)
    fill(a, 2, b"A")  # while the transaction commits: not in it
    fill(c, 4, b"C")
    go.set()
    t.join(30)
    store._write_locked = real  # type: ignore[method-assign]
    assert result == [{0: 2, 1: 5, 2: 0}]
    assert (a.flushed_offset, b.flushed_offset, c.flushed_offset) == (2, 5, 0)
    assert (a.dirty_offset, c.dirty_offset) == (4, 4)
    assert a.unflushed_bytes == 2 * batch(0).size and c.unflushed_bytes == 4 * batch(0).size
    store.close()
    store = open_lmdb_store(tmp_path)  # what was credited is exactly what is on disk
    assert [store.open_log(g).dirty_offset for g in (0, 1, 2)] == [2, 5, 0]
    store.close()


def _dump(path: Path, name: bytes) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), subdir=True, max_dbs=4, readonly=True, lock=False)
    try:
        db = env.open_db(name, create=False)
        with env.begin(db=db) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def _names(path: Path) -> set[bytes]:
    env = lmdb.open(str(path), subdir=True, max_dbs=4, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(k) for k, _ in txn.cursor()}
    finally:
        env.close()


def test_a_directory_written_by_a_single_log_opens_as_the_legacy_group_unchanged(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path)
    log.append([batch(0, 2, 1), batch(2, 1, 2)])
    log.flush()
    log.save_meta(Meta(term=2, voted_for=1))
    incarnation = log.incarnation
    log.close()
    before = (_dump(tmp_path, b"log"), _dump(tmp_path, b"meta"))
    # (`heads`: the records' headers, storage/lmdb_heads.py; keyed as `log`.)
    assert _names(tmp_path) == {b"log", b"meta", b"heads"}
    assert set(_dump(tmp_path, b"heads")) == set(before[0])
    store = open_lmdb_store(tmp_path)
    # The legacy key space is the default topic's partition (issue 26), not the controller's.
    assert store.group_ids() == [LEGACY_GROUP] and LEGACY_GROUP != 0
    g0 = store.open_log(LEGACY_GROUP)
    assert (g0.dirty_offset, g0.incarnation, g0.load_meta().term) == (2, incarnation, 2)
    assert g0.open_findings == []
    store.close()
    # Opening wrote nothing: no migration, not even the group DBs.
    assert (_dump(tmp_path, b"log"), _dump(tmp_path, b"meta")) == before
    assert _names(tmp_path) == {b"log", b"meta", b"heads"}
    # Other groups (the controller, group 0, among them) live elsewhere; the legacy DBs keep
    # today's keys exactly.
    store = open_lmdb_store(tmp_path)
    other, controller = store.open_log(9), store.open_log(0)
    fill(other, 4, b"n")
    fill(controller, 2, b"c")
    store.flush([other, controller, store.open_log(LEGACY_GROUP)])
    store.close()
    assert (_dump(tmp_path, b"log"), _dump(tmp_path, b"meta")) == before
    assert {k[:8] for k in _dump(tmp_path, b"glog")} == {(0).to_bytes(8, "big"),
                                                          (9).to_bytes(8, "big")}
    log = LmdbLog(tmp_path)  # and the single-log API still opens it as the legacy group
    assert log.read(0, 1 << 20) == [batch(0, 2, 1), batch(2, 1, 2)]
    log.close()


def test_damage_in_one_logs_records_is_found_and_cut_for_that_log_only(tmp_path: Path) -> None:
    store = open_lmdb_store(tmp_path)
    logs = {g: store.open_log(g) for g in (0, 1, 2, 3)}
    for g, log in logs.items():
        fill(log, 6, bytes([97 + g]))
    store.flush(logs.values())
    log2 = logs[2]
    db, key = log2._log_db, log2._space.key(3)

    def rot(txn: Any) -> None:  # a flipped bit in the header of group 2's batch at offset 3
        raw = bytearray(txn.get(key, db=db))
        raw[HEADER_SIZE - 1] ^= 0x01
        txn.put(key, bytes(raw), db=db)

    with store._write_lock:
        store._write_locked("rot (test)", rot)
    store.close()
    store = open_lmdb_store(tmp_path)
    logs = {g: store.open_log(g) for g in (0, 1, 2, 3)}
    assert logs[2].dirty_offset == 2 and logs[2].lost_position == (5, 1)
    assert any("offset 3" in f for f in logs[2].open_findings)
    for g in (0, 1, 3):
        assert logs[g].dirty_offset == 5 and logs[g].open_findings == []
        assert logs[g].lost_position is None
        assert logs[g].read(0, 1 << 20) == [batch(i, 1, 1, bytes([97 + g])) for i in range(6)]
    store.close()


def test_map_growth_serves_every_log_of_the_store(tmp_path: Path) -> None:
    store = open_lmdb_store(tmp_path, map_size=1 << 16)
    logs = [store.open_log(g) for g in range(4)]
    for log in logs:
        log.append([batch(i, 1, 1, size=4096) for i in range(20)])
    assert store.flush(logs) == {g: 19 for g in range(4)}
    assert store.env.info()["map_size"] > 1 << 16
    assert all(len(log.read(0, 1 << 30)) == 20 for log in logs)
    store.close()


# -- many logs against a model -------------------------------------------------------------------
GROUPS = (0, 1, 2)


class StoreMachine(RuleBasedStateMachine):
    """Appends, store flushes of any subset, suffix truncations, drops and crashes across three
    logs, against a model: per log, its batches and how many of them are flushed."""

    impl = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.dir: Path | None = None
        self.model: dict[int, list[Batch]] = {g: [] for g in GROUPS}
        self.flushed: dict[int, int] = {g: -1 for g in GROUPS}

    @initialize()
    def setup(self) -> None:
        import tempfile

        if self.impl == "lmdb":
            self.dir = Path(tempfile.mkdtemp(prefix="raftlog-store-"))
        self.store = make(self.impl, self.dir or Path("."))
        self.logs = {g: self.store.open_log(g) for g in GROUPS}

    def teardown(self) -> None:
        import shutil

        if hasattr(self, "store"):
            self.store.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _dirty(self, g: int) -> int:
        return self.model[g][-1].last_offset if self.model[g] else -1

    @rule(g=st.sampled_from(GROUPS), counts=st.lists(st.integers(1, 3), min_size=1, max_size=3),
          bump=st.booleans())
    def append(self, g: int, counts: list[int], bump: bool) -> None:
        base = self._dirty(g) + 1
        term = (self.model[g][-1].term if self.model[g] else 1) + int(bump)
        new = []
        for n in counts:
            new.append(Batch.create(bytes([g, base % 251]) * 5, n).placed(base, term))
            base += n
        self.logs[g].append(new)
        self.model[g].extend(new)

    @rule(which=st.sets(st.sampled_from(GROUPS)))
    def flush(self, which: set[int]) -> None:
        before = self.store.commits
        got = self.store.flush([self.logs[g] for g in sorted(which)])
        dirty = {g for g in which if self._dirty(g) > self.flushed[g]}
        assert self.store.commits - before == (1 if dirty else 0)
        for g in which:
            self.flushed[g] = self._dirty(g)
        assert got == {g: self.flushed[g] for g in which}

    @rule(g=st.sampled_from(GROUPS), data=st.data())
    def flush_one(self, g: int, data: st.DataObject) -> None:
        assert self.logs[g].flush() == self._dirty(g)
        self.flushed[g] = self._dirty(g)

    @rule(g=st.sampled_from(GROUPS), data=st.data())
    def truncate_suffix(self, g: int, data: st.DataObject) -> None:
        after = data.draw(st.sampled_from([-1] + [b.last_offset for b in self.model[g]]))
        self.logs[g].truncate_suffix(after)
        self.model[g] = [b for b in self.model[g] if b.last_offset <= after]
        self.flushed[g] = min(self.flushed[g], after)

    @rule(g=st.sampled_from(GROUPS))
    def drop_and_recreate(self, g: int) -> None:
        """A topic deleted and created again: the new log starts empty, the others are as
        they were."""
        self.store.drop_log(g)
        self.logs[g] = self.store.open_log(g)
        self.model[g], self.flushed[g] = [], -1

    @rule()
    def crash(self) -> None:
        self.store = reopen(self.impl, self.store, self.dir or Path("."))
        self.logs = {g: self.store.open_log(g) for g in GROUPS}
        for g in GROUPS:
            self.model[g] = [b for b in self.model[g] if b.last_offset <= self.flushed[g]]

    @invariant()
    def logs_match_the_model(self) -> None:
        if not hasattr(self, "logs"):
            return
        for g, log in self.logs.items():
            assert log.flushed_offset == self.flushed[g], g
            assert log.dirty_offset == self._dirty(g), g
            assert log.read(0, 1 << 30) == self.model[g], g
        # The node-wide tail budget counts exactly the unflushed bytes of the logs held.
        unflushed = sum(b.size for g in GROUPS for b in self.model[g]
                        if b.last_offset > self.flushed[g])
        assert self.store.tail_budget.used == unflushed


class MemoryStoreMachine(StoreMachine):
    impl = "memory"


class LmdbStoreMachine(StoreMachine):
    impl = "lmdb"


@pytest.mark.parametrize("machine", [MemoryStoreMachine, LmdbStoreMachine], ids=IMPLS)
def test_many_logs_against_a_model(machine: type[StoreMachine]) -> None:
    run_state_machine_as_test(machine, settings=settings(
        max_examples=60, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_memory_store_of_a_lone_log() -> None:
    """A MemoryLog made on its own belongs to a one-log store (LEGACY_GROUP, the default topic's
    partition): the runtime flushes every log through a store."""
    from storage.memory import MemoryLog

    log = MemoryLog()
    fill(log, 2, b"q")
    assert isinstance(log.store, MemoryStore) and log.store.flush([log]) == {LEGACY_GROUP: 1}
