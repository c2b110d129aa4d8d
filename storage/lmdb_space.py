"""Where one log lives inside the node's LMDB environment: two DB handles and a key prefix.

Group LEGACY_GROUP (1, the default topic's partition, storage.api) owns the DBs `log` and `meta`
with an empty prefix (today's format 2 layout, unchanged). Every other group (the controller,
group 0, too) shares the DBs `glog` and `gmeta`, its keys prefixed with its 8-byte big-endian
group id (storage/lmdb_format.py's docstring has the layout and why not a named DB per group).

A shared DB means a cursor can walk out of a log's keys into its neighbour's: every cursor move
a log makes goes through the helpers here, which stop at the log's own key range. With an empty
prefix they are the plain cursor moves, so the legacy group behaves exactly as before.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lmdb

KEY = struct.Struct(">Q")
GROUP = struct.Struct(">Q")
MAX_GROUP = (1 << 63) - 1  # the next prefix of the largest group must still fit 8 bytes


def group_prefix(group_id: int) -> bytes:
    if not 0 <= group_id <= MAX_GROUP:
        raise ValueError(f"group id {group_id} is out of range 0..{MAX_GROUP}")
    return GROUP.pack(group_id)


@dataclass(slots=True, frozen=True)
class KeySpace:
    """One log's keys: `prefix + offset` in `log_db` (and the same key in `heads_db`, the
    records' headers: storage/lmdb_heads.py), `prefix + name` in `meta_db`."""

    group_id: int
    log_db: Any
    meta_db: Any
    prefix: bytes = b""
    heads_db: Any = None

    @property
    def shared(self) -> bool:
        """True when other logs' keys live in the same DBs (groups >= 1)."""
        return bool(self.prefix)

    def key(self, offset: int) -> bytes:
        return self.prefix + KEY.pack(offset)

    def meta_key(self, name: bytes) -> bytes:
        return self.prefix + name

    def offset(self, k: bytes | memoryview) -> int | None:
        """The offset a log key names, or None when the key belongs to another log."""
        k = bytes(k)
        n = len(self.prefix)
        if len(k) != n + KEY.size or not k.startswith(self.prefix):
            return None
        return KEY.unpack_from(k, n)[0]

    # -- cursor moves bounded by the log's key range ----------------------------------------------
    def _mine(self, cur: lmdb.Cursor) -> bool:
        k = cur.key()
        return bool(k) and self.offset(k) is not None

    def first(self, cur: lmdb.Cursor) -> bool:
        """Put `cur` on the log's first key; False when the log holds none."""
        if not self.prefix:
            return cur.first()
        return cur.set_range(self.prefix) and self._mine(cur)

    def last(self, cur: lmdb.Cursor) -> bool:
        """Put `cur` on the log's last key; False when the log holds none."""
        if not self.prefix:
            return cur.last()
        after = GROUP.pack(self.group_id + 1)
        found = cur.prev() if cur.set_range(after) else cur.last()
        return found and self._mine(cur)

    def at_or_after(self, cur: lmdb.Cursor, offset: int) -> bool:
        """Put `cur` on the log's first key at or after `offset`; False when there is none."""
        return cur.set_range(self.key(offset)) and (not self.prefix or self._mine(cur))

    def next(self, cur: lmdb.Cursor) -> bool:
        """Step to the log's next key; False at its end."""
        return cur.next() and (not self.prefix or self._mine(cur))

    def prev(self, cur: lmdb.Cursor) -> bool:
        """Step to the log's previous key; False at its start."""
        return cur.prev() and (not self.prefix or self._mine(cur))

    def seek_le(self, cur: lmdb.Cursor, offset: int) -> bool:
        """Put `cur` on the log's largest key <= `offset`; False when there is none."""
        want = self.key(offset)
        if cur.set_range(want):
            if bytes(cur.key()) == want:
                return True
            return self.prev(cur)
        return self.last(cur)

    def items(self, cur: lmdb.Cursor) -> Iterator[tuple[int, memoryview | bytes]]:
        """(offset, value) from where `cur` stands to the log's end (cur must be on a log key)."""
        while True:
            off = self.offset(cur.key())
            if off is None:
                return
            yield off, cur.value()
            if not cur.next():
                return

    def delete_from(self, cur: lmdb.Cursor, offset: int, trailer: int = 0) -> int:
        """Delete the log's keys at or after `offset`; returns the bytes of the values gone
        (each less `trailer`, the part a batch record adds to the batch)."""
        gone = 0
        if self.at_or_after(cur, offset):
            while cur.key() and self.offset(cur.key()) is not None:
                gone += len(cur.value()) - trailer
                if not cur.delete():
                    break
        return gone

    def clear(self, txn: lmdb.Transaction) -> None:
        """Delete every key of this log, in both DBs (in the caller's transaction)."""
        self.clear_log(txn)
        if not self.prefix:
            txn.drop(self.meta_db, delete=False)
            return
        cur = txn.cursor(db=self.meta_db)
        if cur.set_range(self.prefix):
            while cur.key() and bytes(cur.key()).startswith(self.prefix):
                if not cur.delete():
                    break

    def clear_log(self, txn: lmdb.Transaction) -> None:
        """Delete every batch of this log and its head (its metadata stays)."""
        if not self.prefix:
            txn.drop(self.log_db, delete=False)
            txn.drop(self.heads_db, delete=False)
        else:
            self.delete_from(txn.cursor(db=self.log_db), 0)
            self.delete_from(txn.cursor(db=self.heads_db), 0)
