"""raftlog storage: the log contract and its two implementations.

`open_store(path)` is how a node gets its storage: one environment hosting the log of every Raft
group it holds (a path gives the LMDB store, None the in-memory twin for simulation and tests).
`open_log(path)` is the single-log case: the store's LEGACY_GROUP (the default topic's
partition, in the key space a data directory written before topics holds), owned by the log.
"""

from __future__ import annotations

import os
from typing import Any

from storage.api import (
    DEFAULT_MAX_TAIL_BYTES,
    LEGACY_GROUP,
    DataDirLocked,
    DiskFull,
    LogInconsistent,
    LogStorage,
    LogStore,
    Meta,
    OffsetOutOfRange,
    StorageError,
    StorageIOError,
    TailFull,
)
from storage.batch import Batch, BatchKind, CorruptBatch
from storage.memory import MemoryLog, MemoryStore

__all__ = [
    "DEFAULT_MAX_TAIL_BYTES", "LEGACY_GROUP", "Batch", "BatchKind", "CorruptBatch", "DataDirLocked", "DiskFull",
    "LogInconsistent", "LogStorage", "LogStore", "MemoryLog", "MemoryStore", "Meta",
    "OffsetOutOfRange", "StorageError", "StorageIOError", "TailFull", "open_log", "open_store",
]


def open_store(path: str | os.PathLike[str] | None, **opts: Any) -> LogStore:
    """The node's store: an LmdbStore on directory `path` (created if missing, locked while
    open), or a MemoryStore for None. Options as for open_log. Its logs: `open_log(group_id)`;
    `group_ids()` says which it holds; `flush(logs)` writes many logs in one fsynced commit."""
    if path is None:
        return MemoryStore(**{k: v for k, v in opts.items() if k == "max_tail_bytes"})
    from storage.lmdb_store import LmdbStore  # lmdb is imported only when it is wanted

    return LmdbStore(path, **opts)


def open_log(path: str | os.PathLike[str] | None, **opts: Any) -> LogStorage:
    """The LMDB log in directory `path` (created if missing), or a MemoryLog for None.
    Options go to the implementation (max_tail_bytes; LMDB also map_size, max_map_size).

    The LMDB log takes an exclusive lock on `<path>/LOCK` for as long as it is open: a second
    opener (in this process or another) gets DataDirLocked at once. Opening a log whose batches
    overlap, with every checksum intact, raises LogInconsistent; what a damaged disk leaves is
    cut or marked for repair instead (docs/DISK-LOSS.md)."""
    if path is None:
        return MemoryLog(**{k: v for k, v in opts.items() if k == "max_tail_bytes"})
    from storage.lmdb_log import (
        LmdbLog,  # lmdb is imported only when a durable log is wanted
    )

    return LmdbLog(path, **opts)
