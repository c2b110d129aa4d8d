"""Disk faults for an open LmdbLog, injected by wrapping its LMDB environment (test helper).

`inject(log, exc, at=...)` makes the log's next write transaction fail with `exc`, an exception
as py-lmdb raises it (lmdb.Error for an I/O error, lmdb.DiskError for ENOSPC):
- at="write": the first put, delete or drop inside the transaction raises (for a delete, after
  the first key really was deleted inside the transaction, so the abort has something to undo);
- at="delete": the same, but only deletes (the on-disk cut of a truncation) fail;
- at="commit": the body runs, then the commit fails (the transaction is aborted instead).
Read transactions and later write transactions pass through untouched. LMDB itself is not
patched: the real transaction is aborted, so the disk keeps exactly what it had.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

import lmdb


def io_error(where: str = "mdb_cursor_del") -> lmdb.Error:
    return lmdb.Error(f"{where}: Input/output error (errno {errno.EIO})")


def enospc(where: str = "mdb_txn_commit") -> lmdb.Error:
    return lmdb.DiskError(f"{where}: No space left on device")


class _Fault:
    def __init__(self, exc: BaseException, at: str) -> None:
        assert at in ("write", "delete", "commit"), at
        self.exc, self.at = exc, at
        self.fired = 0
        self.armed = True

    def fire(self) -> None:
        self.armed = False
        self.fired += 1
        raise self.exc


class _Cursor:
    def __init__(self, cur: Any, fault: _Fault) -> None:
        self._cur, self._fault = cur, fault

    def delete(self, *a: Any, **kw: Any) -> Any:
        if self._fault.armed and self._fault.at in ("write", "delete"):
            self._cur.delete(*a, **kw)  # a partial cut inside the transaction, then the error
            self._fault.fire()
        return self._cur.delete(*a, **kw)

    def put(self, *a: Any, **kw: Any) -> Any:
        if self._fault.armed and self._fault.at == "write":
            self._fault.fire()
        return self._cur.put(*a, **kw)

    def putmulti(self, items: Any, *a: Any, **kw: Any) -> Any:
        if self._fault.armed and self._fault.at == "write":
            items = list(items)
            self._cur.putmulti(items[:1], *a, **kw)
            self._fault.fire()
        return self._cur.putmulti(items, *a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def __iter__(self) -> Any:
        return iter(self._cur)


class _Txn:
    def __init__(self, txn: Any, fault: _Fault) -> None:
        self._txn, self._fault = txn, fault

    def __enter__(self) -> _Txn:
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> bool:
        if et is not None or (self._fault.armed and self._fault.at == "commit"):
            self._txn.abort()
            if et is None:
                self._fault.fire()
            return False
        self._txn.commit()
        return False

    def cursor(self, *a: Any, **kw: Any) -> _Cursor:
        return _Cursor(self._txn.cursor(*a, **kw), self._fault)

    def put(self, *a: Any, **kw: Any) -> Any:
        if self._fault.armed and self._fault.at == "write":
            self._fault.fire()
        return self._txn.put(*a, **kw)

    def delete(self, *a: Any, **kw: Any) -> Any:
        if self._fault.armed and self._fault.at in ("write", "delete"):
            self._fault.fire()
        return self._txn.delete(*a, **kw)

    def drop(self, *a: Any, **kw: Any) -> Any:
        if self._fault.armed and self._fault.at in ("write", "delete"):
            self._txn.drop(*a, **kw)  # the whole drop happened in the transaction: abort undoes it
            self._fault.fire()
        return self._txn.drop(*a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class _Env:
    def __init__(self, env: Any, fault: _Fault) -> None:
        self._env, self._fault = env, fault

    def begin(self, *a: Any, **kw: Any) -> Any:
        txn = self._env.begin(*a, **kw)
        if kw.get("write") and self._fault.armed:
            return _Txn(txn, self._fault)
        return txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


@contextlib.contextmanager
def inject(log: Any, exc: BaseException, *, at: str = "write") -> Iterator[_Fault]:
    """While inside, the next write transaction of `log` (an LmdbLog) fails with `exc`."""
    fault = _Fault(exc, at)
    real = log._env
    log._env = _Env(real, fault)
    try:
        yield fault
    finally:
        log._env = real
