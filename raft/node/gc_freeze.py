"""Keep the cyclic garbage collector off the node's groups after groups are created or deleted.

At start the node freezes what is alive once its state is loaded (raft.node.serve
`tune_interpreter`: `gc.freeze()` moves every tracked object into the permanent generation,
which collections skip). Groups created later (a topic of 1,000 partitions: about 300 objects
a group) were not frozen: every generation-2 collection walked them again, 0.1-0.3 s of CPU on
this 2-core machine with 1,000 of them, in the middle of serving (issue 28, seen with
`RAFTLOG_SLOW_STEP_MS`; measured in docs/MULTIRAFT.md, "GC after bulk group creation").

So once a burst of group creation or deletion settles (a whole SETTLE_S window with no change,
or MAX_WAIT_S after its first change, whichever comes first) the node collects once and freezes again:
one collection of what is new, then none of it while it stays. New groups go on creating
long-lived state for a few seconds after they are added (they elect, lead, quiesce: measured
about 90 objects a group after the first refreeze), so a second refreeze follows FOLLOW_UP_S
later unless another burst has begun.

Deleted groups need care: an object in the permanent generation is never examined by the
collector, so a deleted group's reference cycles (callbacks that point back at their owner,
trio tasks) would stay in memory for good, one group's worth per deletion (measured: without
care, about 130,000 objects and 24 MB kept per 1,000 partitions deleted). After a burst that
deleted groups, the refreeze first unfreezes everything, so that one full collection can free
them: a pause of one full collection (every live object walked once; 0.1-0.4 s of CPU with
1,000 partitions live and 1,000 just deleted), once per topic deletion rather than every few
seconds. A process that never froze (tests, the in-process cluster) is left alone.
"""

from __future__ import annotations

import gc
import logging
import time

import trio

log = logging.getLogger("raftlog.node")

# A burst is over when no group was added or removed for this long...
SETTLE_S = 1.0
# ...or this long after its first change, if groups keep coming (a steady trickle of creations
# still gets frozen now and then).
MAX_WAIT_S = 10.0
# The second refreeze, for what the new groups created once they ran.
FOLLOW_UP_S = 5.0


class GcRefreezer:
    """Told of every group added and removed (raft.node.registry), refreezes after a burst;
    see the module docstring."""

    def __init__(self, settle_s: float = SETTLE_S, max_wait_s: float = MAX_WAIT_S,
                 follow_up_s: float = FOLLOW_UP_S) -> None:
        self._settle_s = settle_s
        self._max_wait_s = max_wait_s
        self._follow_up_s = follow_up_s
        self._changed = trio.Event()
        self._changes = 0
        self._removed = False  # a group was removed since the last refreeze
        self.refreezes = 0
        self.last_ms = 0.0  # the last refreeze's CPU time (collection included)

    def changed(self, *, removed: bool) -> None:
        """A group was added (removed=False) or removed (True)."""
        self._removed = self._removed or removed
        self._changes += 1
        self._changed.set()

    async def run(self) -> None:
        """Until cancelled: after each burst of changes has settled, `refreeze`."""
        while True:
            await self._changed.wait()
            first, seen = trio.current_time(), -1
            while seen != self._changes and trio.current_time() - first < self._max_wait_s:
                seen = self._changes
                await trio.sleep(self._settle_s)
            self._changed = trio.Event()
            removed, self._removed = self._removed, False
            self.refreeze(removed=removed)
            with trio.move_on_after(self._follow_up_s):
                await self._changed.wait()
            if not self._changed.is_set():
                self.refreeze(removed=False)

    def refreeze(self, *, removed: bool) -> bool:
        """Collect once and freeze what is alive (after unfreezing, when groups were removed,
        so their cycles can be freed). False, nothing done: the process never froze."""
        if gc.get_freeze_count() == 0:
            return False
        started = time.thread_time()
        if removed:
            gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        self.refreezes += 1
        self.last_ms = (time.thread_time() - started) * 1000
        log.info("gc_refrozen ms=%.1f frozen=%d collected=%d unfrozen_first=%s", self.last_ms,
                 gc.get_freeze_count(), collected, removed)
        return True
