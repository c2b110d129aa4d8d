"""Fail any read of an LmdbLog's record values (test helper for the heads DB, issue 28).

`values_untouched(log, allowed)` wraps the log's LMDB environment: while inside, a cursor on the
log DB may not be positioned at all (py-lmdb preloads every page of the value a cursor lands on)
and `txn.get` on it may read only the records whose offsets are in `allowed` (those of kinds a
read asks for in full); `txn.delete(key, db=log_db)` and writes pass (mdb_del touches no
overflow page but the first). Every get is counted in `gets`. The wrapper, not LMDB, refuses:
the test then names the read that should not have happened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_MOVES = ("first", "last", "next", "prev", "set_key", "set_range", "set_range_dup", "value",
          "item", "iternext", "iterprev", "get", "pop", "replace", "next_nodup", "prev_nodup")


class Touched(AssertionError):
    """A record value of the log DB was read."""


class _Refusing:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def __getattr__(self, name: str) -> Any:
        if name in _MOVES:
            raise Touched(f"a cursor on the log DB moved ({name}): it would read a value")
        return getattr(self._cur, name)


class _Txn:
    def __init__(self, txn: Any, log_db: Any, default_db: Any, seen: Seen) -> None:
        self._txn, self._log_db, self._default, self._seen = txn, log_db, default_db, seen

    def __enter__(self) -> _Txn:
        self._txn.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._txn.__exit__(*exc)

    def _is_log(self, db: Any) -> bool:
        return (db if db is not None else self._default) is self._log_db

    def cursor(self, db: Any = None) -> Any:
        cur = self._txn.cursor() if db is None else self._txn.cursor(db=db)
        return _Refusing(cur) if self._is_log(db) else cur

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        if self._is_log(db):
            offset = int.from_bytes(bytes(key)[-8:], "big")
            if offset not in self._seen.allowed:
                raise Touched(f"the record at offset {offset} was read")
            self._seen.gets.append(offset)
        return self._txn.get(key, default, db=db)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class Seen:
    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.gets: list[int] = []


class _Env:
    def __init__(self, env: Any, log_db: Any, seen: Seen) -> None:
        self._env, self._log_db, self._seen = env, log_db, seen

    def begin(self, *a: Any, **kw: Any) -> _Txn:
        return _Txn(self._env.begin(*a, **kw), self._log_db, kw.get("db"), self._seen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


@contextlib.contextmanager
def values_untouched(log: Any, allowed: set[int] | None = None) -> Iterator[Seen]:
    """While inside, `log` (an LmdbLog) may read no record value but those at `allowed`."""
    seen = Seen(set(allowed or ()))
    real = log._env
    log._env = _Env(real, log._log_db, seen)
    try:
        yield seen
    finally:
        log._env = real
