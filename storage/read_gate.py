"""Who may hold an LMDB read transaction, and when nobody may.

Why: a read of flushed batches touches pages of the map that may not be in memory (a catch-up
read of an old offset, retention's plan at the log front, the scrubber's pass over the whole
log). Once the logs outgrow the page cache each such page is a disk read, and a reader that held
the log's `_lock` through them held up every step of the event loop that looked at the log (a
term lookup, an append): the leader's loop stalled 0.4-1.1 s and lost its leadership in the
default `bench produce` run (docs/PERFORMANCE.md, issue 28). So a reader takes the log's lock
only to look at the in-memory view and open its transaction (an MVCC snapshot that matches that
view), then reads with no lock of the log held, inside this gate.

Two things need no read transaction open anywhere in the process: growing the map
(`set_mapsize`) and closing the environment. They take the gate exclusively: new readers wait,
and the exclusive holder waits until the readers inside have left.

Rule that keeps it deadlock-free: a thread inside the gate takes no lock and waits for nothing
but LMDB (the read path collects what it found and records it after leaving). A thread may
enter while holding a log's `_lock` (that is how a read opens its snapshot), so the exclusive
holder must not need a log's `_lock` while it waits for readers; neither the growth nor the
close does.
"""

from __future__ import annotations

import threading


class ReadGate:
    """A count of readers inside, and an exclusive holder that waits for them to leave."""

    __slots__ = ("_cond", "_readers", "_exclusive")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._exclusive = False

    def enter(self) -> None:
        """A read transaction is about to be opened (pair with `leave`, in a finally)."""
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._readers += 1

    def leave(self) -> None:
        """The read transaction opened after `enter` is closed."""
        with self._cond:
            self._readers -= 1
            assert self._readers >= 0, "ReadGate.leave without enter"
            if not self._readers:
                self._cond.notify_all()

    @property
    def readers(self) -> int:
        return self._readers

    def acquire_exclusive(self) -> None:
        """No read transaction is open in this process until `release_exclusive`."""
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True  # from here new readers wait
            while self._readers:
                self._cond.wait()

    def release_exclusive(self) -> None:
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()

    def __enter__(self) -> ReadGate:
        """`with gate:` holds it exclusively (the map growth, the close)."""
        self.acquire_exclusive()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_exclusive()
