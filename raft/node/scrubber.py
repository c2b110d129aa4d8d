"""One group's background scrub: re-reads its flushed log at a bounded rate to find damage early.

A flushed batch can rot on disk long after it was written and checked. Reads check every
checksum, but a batch nobody reads (old data, or data only a failover would send) could stay
damaged until the moment it is needed, perhaps after the other copies are gone too. The scrubber
walks the flushed log from its start to its flushed offset and over again, one bounded slice at a
time in a worker thread (never on the event loop). The node's one scheduler
(raft.node.scrub_scheduler) visits every group's scrubber in turn, several small logs per call,
sleeping between calls so the bytes the whole node reads average `scrub_rate` MiB/s; this
module keeps one group's place, its pass timing and what it found. A damaged batch it finds is recorded by storage (never served again
until repaired) and the core, which polls storage's damage version each tick, stops counting it
and has it re-fetched (raft/core/repair.py); the scrubber wakes the core (`wake`), since a
quiesced core is not ticked.

`status` shows where it is, how many passes it completed and what it found.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from raft.node.scrub_scheduler import NodeScrubber
from storage.api import LogStorage, ScrubSlice

log = logging.getLogger("raftlog.node")

MIB = 1 << 20
# A pass over a small log is not started again sooner than this (else a log of a few batches
# would be re-read thousands of times a second, all within the byte rate).
MIN_PASS_S = 1.0
# ... and a pass over a log that has not changed since the previous pass (an idle partition:
# same start, same flushed offset) not sooner than this: on a node of 1,000 idle partitions a
# pass a second each would be 1,000 worker-thread reads a second for nothing new. Rot in such
# a log is still found, within a minute plus the pass.
IDLE_PASS_S = 60.0


@dataclass(slots=True)
class ScrubStats:
    position: int = 0  # the offset the next slice starts at
    passes: int = 0  # complete passes over the flushed log
    bytes_read: int = 0
    found: int = 0  # damaged batches found, all passes
    last_found: str = ""
    last_pass_s: float = 0.0  # how long the last complete pass took


class ScrubHost(Protocol):
    """What the scrubber needs of its group (raft.node.group.RaftGroup)."""

    node_id: int
    closing: bool
    log: LogStorage | None

    async def run_io(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def fail(self, exc: BaseException, where: str) -> None: ...

    def kick(self) -> None: ...

    def wake(self) -> None: ...


class Scrubber:
    """One group's scrub: where it is in its log, when it is due, what it found. The node's one
    scheduler (raft.node.scrub_scheduler.NodeScrubber) visits it; `run` scrubs this group
    alone (a group started without a node)."""

    def __init__(self, group: ScrubHost, rate_mib_s: float, slice_bytes: int) -> None:
        if rate_mib_s < 0 or slice_bytes < 1:
            raise ValueError("the scrub rate must be >= 0 and the slice at least one byte")
        self._group = group
        self.rate = rate_mib_s  # the node's rate (the scheduler's), shown in status
        self.slice_bytes = slice_bytes
        self.stats = ScrubStats()
        self.due = float("-inf")  # trio time before which the scheduler does not visit it
        self._pass_started: float | None = None  # None until the first visit
        self._last_shape: tuple[int, int] | None = None  # (start, flushed) at the last wrap

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {"rate_mib_s": self.rate, "position": s.position, "passes": s.passes,
                "bytes_read": s.bytes_read, "found": s.found, "last_found": s.last_found,
                "last_pass_s": round(s.last_pass_s, 3)}

    # -- what the scheduler calls (raft.node.scrub_scheduler.ScrubTarget) ----------------------
    def begin(self, now: float) -> tuple[LogStorage, int] | None:
        group = self._group
        storage = group.log
        if group.closing or storage is None:
            return None
        if self._pass_started is None:
            self._pass_started = now
            self.stats.position = storage.start_offset
        return storage, self.stats.position

    async def run_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._group.run_io(fn, *args)

    def failed(self, exc: BaseException) -> None:
        """A read the disk refuses: this group's node cannot trust it."""
        self._group.fail(exc, "scrub")
        self.due = float("inf")

    def done(self, got: ScrubSlice, now: float) -> None:
        group = self._group
        s = self.stats
        s.bytes_read += got.bytes_read
        s.position = got.next_offset
        for d in got.damaged:
            s.found += 1
            s.last_found = d.describe()
            log.error("scrub_found_damage node=%d %s: not served or counted until "
                      "re-fetched from a member with a good copy (docs/DISK-LOSS.md)",
                      group.node_id, d.describe())
        if got.damaged:
            # The core looks for new damage on its ticks; a quiesced core is not ticked.
            group.wake()
        if not got.wrapped:
            return  # the pass goes on at its next visit
        started = now if self._pass_started is None else self._pass_started
        took = now - started
        if got.bytes_read or s.bytes_read:
            s.passes += 1
            s.last_pass_s = took
        wait = MIN_PASS_S - took
        storage = group.log
        shape = None if storage is None else (storage.start_offset, storage.flushed_offset)
        if shape == self._last_shape and not s.found:
            wait = max(wait, IDLE_PASS_S - took)
        self._last_shape = shape
        self.due = now + max(wait, 0.0)
        self._pass_started = self.due

    async def run(self) -> None:
        """Scrub this group alone until cancelled (at this scrubber's rate); returns at once
        when off."""
        scheduler = NodeScrubber(self.rate, self.slice_bytes)
        scheduler.add(self)
        await scheduler.run()
