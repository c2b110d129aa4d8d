"""The background scrubber: re-reads the flushed log at a bounded rate to find damage early.

A flushed batch can rot on disk long after it was written and checked. Reads check every
checksum, but a batch nobody reads (old data, or data only a failover would send) could stay
damaged until the moment it is needed, perhaps after the other copies are gone too. The scrubber
walks the flushed log from its start to its flushed offset and over again, one bounded slice at a
time in a worker thread (never on the event loop), sleeping between slices so the bytes it reads
average `scrub_rate` MiB/s. A damaged batch it finds is recorded by storage (never served again
until repaired) and the core, which polls storage's damage version each tick, stops counting it
and has it re-fetched (raft/core/repair.py); the scrubber wakes the core (`wake`), since a
quiesced core is not ticked.

`status` shows where it is, how many passes it completed and what it found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from storage.api import LogStorage

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
    def __init__(self, group: ScrubHost, rate_mib_s: float, slice_bytes: int) -> None:
        if rate_mib_s < 0 or slice_bytes < 1:
            raise ValueError("the scrub rate must be >= 0 and the slice at least one byte")
        self._group = group
        self.rate = rate_mib_s
        self.slice_bytes = slice_bytes
        self.stats = ScrubStats()

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {"rate_mib_s": self.rate, "position": s.position, "passes": s.passes,
                "bytes_read": s.bytes_read, "found": s.found, "last_found": s.last_found,
                "last_pass_s": round(s.last_pass_s, 3)}

    async def run(self) -> None:
        """Scrub until cancelled (the group's driver nursery); returns at once when off."""
        if self.rate <= 0:
            return
        group = self._group
        storage = group.log
        assert storage is not None
        self.stats.position = storage.start_offset
        pass_started = time.monotonic()
        last_shape: tuple[int, int] | None = None  # (start, flushed) at the last wrap
        while not group.closing:
            try:
                got = await group.run_io(storage.scrub, self.stats.position, self.slice_bytes)
            except Exception as e:  # a read the disk refuses: the node cannot trust it
                group.fail(e, "scrub")
                return
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
            pause = got.bytes_read / (self.rate * MIB)
            if got.wrapped:
                now = time.monotonic()
                took = now - pass_started
                if got.bytes_read or s.bytes_read:
                    s.passes += 1
                    s.last_pass_s = took
                pause = max(pause, MIN_PASS_S - took)
                shape = (storage.start_offset, storage.flushed_offset)
                if shape == last_shape and not s.found:
                    pause = max(pause, IDLE_PASS_S - took)
                last_shape = shape
                pass_started = now + max(pause, 0.0)
            await trio.sleep(pause)
