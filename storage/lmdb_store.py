"""One LMDB environment per node, hosting the logs of every Raft group the node holds.

Why one environment: many partitions per node must not mean many fsyncs. Every log's dirty tail
is written by `flush(logs)` in ONE write transaction, committed with ONE fsync (group commit
across logs); each log's flushed offset then moves to exactly what that transaction held for it.
The environment also gives one directory lock, one map (grown as a whole) and one file to back up.

Layout (storage/lmdb_format.py): group LEGACY_GROUP (1, the default topic's partition) keeps
today's DBs `log` and `meta`, so a data directory written by a single-log node opens as that group
unchanged; every other group (the controller, group 0, included) shares `glog` and `gmeta`, keys
prefixed with the 8-byte big-endian group id (storage/lmdb_space.py).

Threading (extends storage/lmdb_log.py's rules to many logs):
- `_write_lock` is the store's and every log's write lock: one LMDB writer at a time, which is
  what LMDB allows anyway. A store flush holds it across its one transaction.
- Each log keeps its own `_lock` for its in-memory view and the opening of its read
  transactions, which then run in the store's `read_gate` without it (storage/read_gate.py).
  Growing the map and closing the environment (no read transaction may be open in this process
  for either) hold the gate exclusively; only the writer grows, and the close marks every log
  closed before it waits for the readers.
- Opening or dropping a log holds the write lock (its open-time scan included).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import lmdb

from storage import lmdb_format as fmt
from storage.api import (DEFAULT_MAX_TAIL_BYTES, LEGACY_GROUP, DiskFull, IoMode, LogStore,
                         StorageError, TailBudget)
from storage.dirlock import lock_dir, unlock_dir
from storage.lmdb_space import GROUP, KeySpace, group_prefix
from storage.read_gate import ReadGate

# A storage.lmdb_log.LmdbLog. That module builds on this one (a log is loaded from a store's key
# space), so this one names the class only through the `log_type` a store is opened with.
LmdbLog = Any

log = logging.getLogger("raftlog.storage")

# BENCH ONLY: RAFTLOG_BENCH_FSYNC_DELAY_MS adds a fixed delay to every fsynced transaction, to
# show what deferred flushing buys on a slow (cloud) disk. Never set it in production.
_BENCH_FSYNC_DELAY_S = float(os.environ.get("RAFTLOG_BENCH_FSYNC_DELAY_MS", "0") or 0) / 1000

DEFAULT_MAP_SIZE = 64 << 20
DEFAULT_MAX_MAP_SIZE = 1 << 40
# How much of the newest flushed log an open verifies in full (the rest is the scrubber's).
DEFAULT_VERIFY_TAIL_BYTES = 8 << 20

T = TypeVar("T")
__all__ = ["DEFAULT_MAP_SIZE", "DEFAULT_MAX_MAP_SIZE", "DEFAULT_VERIFY_TAIL_BYTES", "LmdbStore"]


class LmdbStore(LogStore):
    """The node's LMDB environment and the logs in it (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *,
                 max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES,
                 map_size: int = DEFAULT_MAP_SIZE, max_map_size: int = DEFAULT_MAX_MAP_SIZE,
                 verify_tail_bytes: int = DEFAULT_VERIFY_TAIL_BYTES,
                 log_type: type | None = None) -> None:
        # The class of the logs open_log makes (storage.lmdb_log.LmdbLog: storage.open_store and
        # LmdbLog(path) pass it).
        self._log_type = log_type
        self.path = os.fspath(path)
        self._max_tail_bytes = max_tail_bytes
        # Every log's dirty tail together stays under max_tail_bytes (node-wide, not per log).
        self.tail_budget = TailBudget(max_tail_bytes)
        self._verify_tail_bytes = verify_tail_bytes
        self._max_map_size = max(max_map_size, map_size)
        self._write_lock = threading.Lock()
        self.read_gate = ReadGate()
        # Open logs by group. Weak: a log is what its owner holds; one nobody holds can write
        # nothing, and must not keep the store (and the directory lock) alive through a cycle.
        self._logs: weakref.WeakValueDictionary[int, LmdbLog] = weakref.WeakValueDictionary()
        self._closed = False
        # Write transactions committed (each one fsync): raftlog_fsyncs_total, and the tests that
        # show a store flush of many logs is one commit.
        self.commits = 0
        # The directory lock comes first: a second opener must not even open the environment.
        fd = lock_dir(self.path)
        # Released by close(), or when this object is collected without close() (nothing can
        # write through an unreachable store), or by the kernel when the process dies.
        self._release_dir = weakref.finalize(self, unlock_dir, fd)
        try:
            self.env = lmdb.open(self.path, subdir=True, max_dbs=6, map_size=map_size,
                                 lock=True, readahead=False, meminit=False)
        except lmdb.Error as e:
            self._release_dir()
            raise StorageError(f"cannot open the LMDB log at {self.path}: {e}; check the "
                               f"path exists, is writable and is not on a full disk") from e
        try:
            self._log_db = self.env.open_db(b"log")
            self._meta_db = self.env.open_db(b"meta")
            # The records' headers (storage/lmdb_heads.py); an open builds the missing ones.
            self._heads_db = self.env.open_db(b"heads")
            # glog/gmeta are created with the first other group: a single-log directory keeps
            # exactly the DBs it had.
            self._glog_db: Any = None
            self._gmeta_db: Any = None
            self._gheads_db: Any = None
            self._open_group_dbs(create=False)
        except BaseException:
            self.env.close()
            self._release_dir()
            raise

    @property
    def io_mode(self) -> IoMode:
        """Flushes block on fsync: run them in a worker thread (storage/lmdb_log.py's locks let
        the owners append and read meanwhile)."""
        return IoMode.WORKER_THREAD

    def _open_group_dbs(self, *, create: bool) -> bool:
        if self._glog_db is None:
            try:
                self._glog_db = self.env.open_db(b"glog", create=create)
                self._gmeta_db = self.env.open_db(b"gmeta", create=create)
            except lmdb.NotFoundError:
                return False
        if self._gheads_db is None:  # (a store written before the heads DB has no gheads)
            self._gheads_db = self.env.open_db(b"gheads")
        return True

    def _space(self, group_id: int) -> KeySpace:
        if group_id == LEGACY_GROUP:
            return KeySpace(LEGACY_GROUP, self._log_db, self._meta_db, heads_db=self._heads_db)
        prefix = group_prefix(group_id)
        self._open_group_dbs(create=True)
        return KeySpace(group_id, self._glog_db, self._gmeta_db, prefix, self._gheads_db)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"the store at {self.path} is closed; reopen it")

    # -- logs --------------------------------------------------------------------------------
    def open_log(self, group_id: int) -> LmdbLog:
        """Group `group_id`'s log (created empty if absent), checked as LmdbLog's open checks it.
        A log is opened once per store: a second open of an open group is refused."""
        if self._log_type is None:
            raise StorageError(f"the store at {self.path} was opened without a log type; open "
                               f"it with storage.open_store(path)")
        opened = self._log_type.__new__(self._log_type)
        self._attach_log(opened, group_id)
        return opened

    def _attach_log(self, one: LmdbLog, group_id: int) -> None:
        """Load `one` from group `group_id`'s key space (LmdbLog(path) comes here too)."""
        self._check_open()
        with self._write_lock:
            if group_id in self._logs:
                raise StorageError(f"the log of group {group_id} in {self.path} is already "
                                   f"open; use the open one")
            one._attach(self, self._space(group_id), self._max_tail_bytes,
                        self._verify_tail_bytes)
            self._logs[group_id] = one

    def group_ids(self) -> list[int]:
        """The groups whose logs this store holds (open or not), ascending: what a restarting
        node finds on its disk."""
        self._check_open()
        found: list[int] = []
        with self._write_lock, self.env.begin(buffers=True) as txn:
            if txn.cursor(db=self._meta_db).first():
                found.append(LEGACY_GROUP)
            if self._gmeta_db is not None:
                cur = txn.cursor(db=self._gmeta_db)
                ok = cur.first()
                while ok:
                    (gid,) = GROUP.unpack_from(bytes(cur.key()), 0)
                    found.append(gid)
                    ok = cur.set_range(GROUP.pack(gid + 1))
        found.extend(g for g in self._logs if g not in found)  # opened, nothing written yet
        return sorted(set(found))

    def drop_log(self, group_id: int) -> None:
        """Delete group `group_id`'s log, data and metadata, in one fsynced transaction (a
        deleted topic leaves nothing behind). Its open log object is closed first. Dropping a
        group the store does not hold does nothing."""
        self._check_open()
        with self._write_lock:
            held = self._logs.pop(group_id, None)
            if held is not None:
                held._closed_by_store()
            if group_id != LEGACY_GROUP and not self._open_group_dbs(create=False):
                return
            space = self._space(group_id)
            self._write_locked(f"dropping the log of group {group_id}", space.clear, self.env)
        log.info("log_dropped path=%s group=%d", self.path, group_id)

    def flush(self, logs: Iterable[LmdbLog]) -> dict[int, int]:  # type: ignore[override]
        """Write every given log's dirty tail (as of now) in ONE write transaction, committed
        with ONE fsync; return each log's flushed offset by group id. Batches appended while
        this runs stay in their tails. On any failure nothing was written and no log changed."""
        return self._flush([(one, None) for one in logs])

    def _flush(self, wanted: Sequence[tuple[LmdbLog, int | None]]) -> dict[int, int]:
        self._check_open()
        with self._write_lock:
            out: dict[int, int] = {}
            parts = []
            seen: set[int] = set()
            for one, upto in wanted:
                if one._store is not self:
                    raise ValueError(f"{one!r} is not a log of the store at {self.path}")
                if id(one) in seen:
                    continue
                seen.add(id(one))
                part = one._flush_take(upto)
                if part is None:
                    out[one.group_id] = one.flushed_offset
                else:
                    parts.append(part)
            if not parts:
                return out

            def put_all(txn: lmdb.Transaction) -> None:
                for part in parts:
                    part.log._flush_put(txn, part)

            if len(parts) == 1:  # through the log's own seam (tests gate or fault it there)
                parts[0].log._write(f"flush of offsets {parts[0].first}..{parts[0].end}",
                                    put_all)
            else:
                self._write_locked(f"flush of {len(parts)} logs", put_all, parts[0].log._env)
            for part in parts:  # each log moves to exactly what the transaction held for it
                out[part.log.group_id] = part.log._flush_apply(part)
            return out

    # -- LMDB write plumbing -------------------------------------------------------------------
    def _write_locked(self, what: str, body: Callable[[lmdb.Transaction], T],
                      env: Any = None) -> T:
        """Run `body` in one write transaction committed with fsync; grow the map on
        MapFullError (doubling, up to max_map_size) and retry; map a full disk to DiskFull and
        any other failure to StorageIOError. If it raises, the transaction was aborted and the
        disk is unchanged. Caller holds _write_lock. `env` is the environment to write through
        (a log's own reference, which fault-injecting tests wrap)."""
        env = env if env is not None else self.env
        while True:
            try:
                with env.begin(write=True) as txn:
                    out = body(txn)
                self.commits += 1
                if _BENCH_FSYNC_DELAY_S:
                    time.sleep(_BENCH_FSYNC_DELAY_S)  # bench-only emulated slow disk
                return out
            except lmdb.MapFullError:
                self._grow(what)
            except (lmdb.Error, OSError) as e:
                raise fmt.disk_error(self.path, what, e) from e

    def _grow(self, what: str) -> None:
        with self.read_gate:  # no read transaction may be open in this process
            cur = self.env.info()["map_size"]
            if cur >= self._max_map_size:
                raise DiskFull(
                    f"{what}: the LMDB map of {self.path} is full at its limit of "
                    f"{self._max_map_size} bytes; raise max_map_size, truncate the log prefix "
                    f"(retention) or move the data dir to a bigger disk. Nothing flushed before "
                    f"is lost; unflushed batches stay in memory")
            new = min(cur * 2, self._max_map_size)
            self.env.set_mapsize(new)
            log.info("lmdb_map_grown path=%s from=%d to=%d", self.path, cur, new)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Idempotent. Waits for an in-flight flush; every open log is closed (unflushed
        batches are dropped)."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            for one in list(self._logs.values()):
                one._closed_by_store()
            self._logs.clear()
            try:
                with self.read_gate:  # reads already inside finish first
                    self.env.close()
            finally:
                self._release_dir()  # only after LMDB let go of the files

    def _forget(self, group_id: int) -> None:
        """A log closed on its own (LmdbLog.close): the group may be opened again."""
        self._logs.pop(group_id, None)

    def __repr__(self) -> str:
        return f"LmdbStore(path={self.path!r}, groups={sorted(self._logs)})"
