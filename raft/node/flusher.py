"""The node's flusher: group commit across every Raft group the node runs.

Why node-level: many partitions per node must not mean many fsyncs. Each group asks for a flush
when its core's Ready says so (`request`: non-blocking, idempotent while the ask is pending). One
flush runs at a time; it takes every group that asked since the last one and writes all their
dirty tails with ONE store flush (storage: one write transaction, one fsync), in the flusher's
one worker thread fed by a queue (raft.node.flush_thread; not a trio thread hand-off per flush),
or inline for the in-memory store, as the store's io_mode says. Groups keep appending while it
runs; what they append meanwhile is taken by the next flush.

After the commit each asking group is told exactly its own flushed offset (`on_flushed`: the core
hears `min(flushed, log.flushed_offset)`, since a truncation may have raced the flush) and is
kicked. A full disk writes nothing: every asking group refuses writes (DISK_FULL) and the flush is
retried every DISK_FULL_RETRY_S until space returns. Any other failure is fatal for the node:
every asking group fails (fail-stop; the node stops on the first) and the flusher stops.

Logs from different stores (in-process tests hand each node its own MemoryLog) are flushed one
store after another in the same round; a node's real groups share one store.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import trio

from raft.node import trace
from raft.node.flush_thread import FlushThread
from storage.api import DiskFull, IoMode, LogStorage

if TYPE_CHECKING:
    from raft.node.metrics import NodeMetrics

log = logging.getLogger("raftlog.node")

# With a full disk, a flush is retried this often until space returns (the same pause as
# raft.node.group.DISK_FULL_RETRY_S for metadata saves).
DISK_FULL_RETRY_S = 1.0


class FlushClient(Protocol):
    """What the flusher needs of a group (raft.node.group.RaftGroup)."""

    log: LogStorage | None

    def on_flushed(self, flushed: int) -> None: ...

    def on_flush_disk_full(self, e: DiskFull) -> None: ...

    def fail(self, exc: BaseException, where: str) -> None: ...


class NodeFlusher:
    """One flush at a time for all of a node's groups (see the module docstring)."""

    def __init__(self, metrics: NodeMetrics | None = None) -> None:
        self.metrics = metrics
        self._wanted: dict[int, FlushClient] = {}  # by id(): who asked since the last flush
        self._wake = trio.Event()
        self.flushes = 0  # store flushes done (each one commit, one fsync)
        self._commits_seen: dict[int, int] = {}  # per store: its commits already counted
        self.failure: BaseException | None = None
        self.thread = FlushThread()  # started at the first flush off the loop

    def request(self, group: FlushClient) -> None:
        """`group` has dirty entries to make durable. Non-blocking; asking again before the
        flush that takes it has started changes nothing."""
        self._wanted[id(group)] = group
        self._wake.set()

    def forget(self, group: FlushClient) -> None:
        """`group` stopped (its log is closing or dropped): do not flush it any more."""
        self._wanted.pop(id(group), None)

    @property
    def pending(self) -> int:
        return len(self._wanted)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.thread.close()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            asking, self._wanted = self._wanted, {}
            if not asking:
                continue
            full: list[FlushClient] = []
            if not await self._flush_round(list(asking.values()), full):
                return
            if full:
                # The flusher waits out the pause itself: nothing else could be written
                # meanwhile (the disk is full), and a flush that cannot succeed must not spin.
                await trio.sleep(DISK_FULL_RETRY_S)
                for g in full:
                    self.request(g)

    async def _flush_round(self, asking: list[FlushClient], full: list[FlushClient]) -> bool:
        """Flush every asking group's log (those a full disk refused go to `full`); False once
        a fatal failure stopped the flusher."""
        by_store: dict[int, tuple[Any, list[FlushClient]]] = {}
        for group in asking:
            if group.log is None:
                continue
            store = group.log.store
            by_store.setdefault(id(store), (store, []))[1].append(group)
        for store, groups in by_store.values():
            logs = [g.log for g in groups]
            before = sum(lg.flushed_offset for lg in logs)
            started = time.perf_counter()
            if trace.ENABLED:
                for lg in logs:
                    trace.event("flush_start", lg.group_id, lg.dirty_offset)
            try:
                if store.io_mode is IoMode.INLINE:
                    flushed = store.flush(logs)
                elif trace.ENABLED:
                    flushed = await self.thread.run(_traced_flush, store, logs)
                else:
                    flushed = await self.thread.run(store.flush, logs)
            except DiskFull as e:
                # Nothing was written (storage changes the disk first): every tail is still in
                # memory and the retry takes it. Not a crash.
                for g in groups:
                    g.on_flush_disk_full(e)
                full.extend(groups)
                continue
            except Exception as e:  # an I/O error, an inconsistent log: fail-stop
                log.error("node_flush_failed groups=%d error=%s", len(groups), e)
                self.failure = e
                for g in groups:
                    g.fail(e, "flush")
                return False
            self.flushes += 1
            self._count_fsyncs(store)
            if self.metrics is not None:
                after = sum(flushed[lg.group_id] for lg in logs)
                self.metrics.flush_done(time.perf_counter() - started, after - before)
            if trace.ENABLED:
                for lg in logs:
                    trace.event("flush_end", lg.group_id, flushed[lg.group_id])
            for g in groups:
                g.on_flushed(flushed[g.log.group_id])  # type: ignore[union-attr]
        return True

    def _count_fsyncs(self, store: Any) -> None:
        """Every commit of the store is an fsync (flushes, and the metadata saves and cuts the
        groups made since): the node's raftlog_fsyncs_total."""
        seen = self._commits_seen.get(id(store), 0)
        now = store.commits
        if self.metrics is not None and now > seen:
            self.metrics.fsyncs.inc(now - seen)
        self._commits_seen[id(store)] = now


def _traced_flush(store: Any, logs: list[Any]) -> dict[int, int]:
    """store.flush, with the worker thread's own start and end (raft.node.trace): what the
    loop's flush_start/flush_end add to them is the thread hand-off."""
    started = trace.now()
    covers = [(lg.group_id, lg.dirty_offset) for lg in logs]
    flushed = store.flush(logs)
    ended = trace.now()
    for group_id, dirty in covers:
        trace.event("fsync_start", group_id, dirty, started)
    for lg in logs:
        trace.event("fsync_end", lg.group_id, flushed[lg.group_id], ended)
    return flushed
