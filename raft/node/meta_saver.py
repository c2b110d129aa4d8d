"""One group's metadata saves (term, vote, configuration history, commit checkpoint), in order,
and the commit checkpoint off the Ready loop.

Why two paths. The core's hard state must be durable before any message that depends on it
leaves (raft/core/ready.py): a new term or vote, a changed configuration history, a changed
standing, a new cluster id. Those saves are URGENT: the Ready loop awaits them before it sends.
Most saves are none of those: every `commit_checkpoint_ticks` a busy group re-saves the same
term, vote and history with a higher commit index, which only spares a restart some catch-up
(the checkpoint is a hint, bounded by the log at the next start). Those saves are LAZY: the
Ready loop hands them to this saver's task and goes on sending.

Why it matters (issue 28). A save is an LMDB write transaction, and a node's store has one
writer at a time: a save waits for the running flush. Under an acks=none or acks=leader flood
the leader's flush carries up to its whole unflushed tail (hundreds of MiB, 1.5 s measured on
this machine), and a checkpoint save awaited in the Ready loop held that group's heartbeats and
appends for as long; its followers timed out, campaigned and deposed a healthy leader, again and
again (the bench's produce workload, docs/PERFORMANCE.md).

Order. All saves go through one lock and each writes the newest hard state known when it runs
(an urgent one is always the newest: it comes from the current Ready), so a lazy save can never
write an older term or vote over a newer one, whichever runs first.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
import trio

from raft.core.ready import HardState
from storage.api import Meta

log = logging.getLogger("raftlog.node")

# The configuration map's entry a lazy save may change (raft/core/confchange.py _config_meta).
CHECKPOINT_KEY = "commit"


def _without_checkpoint(config: dict | None) -> dict | None:
    if config is None:
        return None
    return {k: v for k, v in config.items() if k != CHECKPOINT_KEY}


def checkpoint_only(hs: HardState, saved: Meta) -> bool:
    """Whether `hs` differs from the durable metadata in the commit checkpoint at most."""
    return (hs.term == saved.term and hs.voted_for == saved.voted_for
            and _without_checkpoint(hs.config) == _without_checkpoint(saved.config))


class MetaSaver:
    """The group's `save(hard_state)` (urgent, awaited) and `later(hard_state)` (lazy: the
    task `run` writes the newest one). `write` does one save (the group's, with its disk-full
    handling); `fail` stops the node on any other error, as the Ready loop would."""

    def __init__(self, write: Callable[[HardState], Awaitable[None]],
                 fail: Callable[[BaseException, str], None]) -> None:
        self._write = write
        self._fail = fail
        self._lock = trio.Lock()
        self._lazy: HardState | None = None  # the newest checkpoint not yet written
        self._wake = trio.Event()
        self.lazy_saves = 0  # checkpoint saves written by the task (tests)
        self.superseded = 0  # checkpoints a later save carried instead

    async def put(self, hs: HardState, saved: Meta, urgent: bool = False) -> None:
        """The Ready loop's one call: `hs` is written now (awaited) unless it only moves the
        commit checkpoint past `saved` (the durable metadata) and is not `urgent`."""
        if urgent or not checkpoint_only(hs, saved):
            await self.save(hs)
        else:
            self.later(hs)

    async def save(self, hs: HardState) -> None:
        """Write `hs` durably now (the caller sends what depends on it after)."""
        async with self._lock:
            if self._lazy is not None:
                self._lazy = None  # `hs` is newer and carries a commit index at least as high
                self.superseded += 1
            await self._write(hs)

    def later(self, hs: HardState) -> None:
        """Have `hs` written soon, without waiting (a newer one replaces it if it has not
        started yet)."""
        if self._lazy is not None:
            self.superseded += 1
        self._lazy = hs
        self._wake.set()

    @property
    def pending(self) -> bool:
        return self._lazy is not None

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            async with self._lock:
                hs, self._lazy = self._lazy, None
                if hs is None:
                    continue
                try:
                    await self._write(hs)
                except Exception as e:
                    self._fail(e, "save_meta")
                    return
                self.lazy_saves += 1

    async def flush_pending(self) -> None:
        """Write a checkpoint still waiting (a graceful stop saves everything)."""
        async with self._lock:
            hs, self._lazy = self._lazy, None
            if hs is not None:
                await self._write(hs)

