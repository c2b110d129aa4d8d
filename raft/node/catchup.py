"""How fast each follower is catching up, for `status`: a sampler and the "recovery view".

Twice a second the leader remembers each follower's match index and acked bytes; `status` turns
the last few seconds of samples into a catch-up rate, and the distance to the leader's log end
into bytes behind and an ETA. One tracker per Raft group (followers belong to a group).
"""

from __future__ import annotations

import collections
from typing import Any, Protocol

import trio

from raft.core.raft import RaftCore
from raft.core.types import Role
from storage.api import LogStorage
from storage.batch import CorruptBatch


class CatchupSource(Protocol):
    """The group a tracker watches: its core (None until started) and its log."""

    @property
    def core(self) -> RaftCore | None: ...

    @property
    def log(self) -> LogStorage | None: ...

    async def until_input(self, seen: int) -> int: ...


class CatchupTracker:
    def __init__(self, source: CatchupSource) -> None:
        self._source = source
        # Per follower: recent (time, match index, acked bytes) samples for the catch-up rate.
        self._progress_samples: dict[int, collections.deque[tuple[float, int, int]]] = {}
        self._bytes_per_offset = 0.0

    def note_produce(self, payload_bytes: int, count: int) -> None:
        """A produce request's size per offset feeds the running average used for bytes behind."""
        per = (payload_bytes + 64) / count if count > 0 else 0.0
        self._bytes_per_offset = per if not self._bytes_per_offset else \
            0.9 * self._bytes_per_offset + 0.1 * per

    async def run_sampler(self) -> None:
        """Twice a second, remember each follower's match index and acked bytes, so status
        can show a catch-up rate over the last few seconds."""
        seen = -1
        while True:
            await trio.sleep(0.5)
            # A quiesced leader's followers are caught up: nothing to sample until an input.
            seen = await self._source.until_input(seen)
            core = self._source.core
            if core is None or core.role != Role.LEADER:  # followers are a leader's view
                self._progress_samples.clear()
                continue
            now = trio.current_time()
            for f in core.status().followers:
                pr = core.progress(f.node_id)
                q = self._progress_samples.setdefault(f.node_id, collections.deque(maxlen=12))
                q.append((now, f.match_index, pr.acked_bytes if pr is not None else 0))

    def recovery_view(self, followers: list[dict[str, Any]]) -> None:
        """Add bytes behind (estimated from offsets and the average bytes per offset) and the
        catch-up rate to each follower's status entry."""
        log_storage = self._source.log
        dirty = log_storage.dirty_offset if log_storage is not None else -1
        per = self._bytes_per_offset or 0.0
        if not per and log_storage is not None and dirty >= log_storage.start_offset:
            try:
                last = log_storage.read(dirty, 1)  # the last batch stands for the average
            except CorruptBatch:  # damaged (being re-fetched): no estimate this time
                last = []
            per = last[0].size / last[0].count if last else 0.0
        for f in followers:
            behind = max(0, dirty - f["match_index"])
            f["offsets_behind"] = behind
            f["bytes_behind"] = int(behind * per)
            q = self._progress_samples.get(f["node_id"])
            rate_o, rate_b = 0.0, 0.0
            if q and len(q) >= 2 and q[-1][0] > q[0][0]:
                dt = q[-1][0] - q[0][0]
                rate_o = max(0, q[-1][1] - q[0][1]) / dt
                rate_b = max(0, q[-1][2] - q[0][2]) / dt
            f["catchup_offsets_per_s"] = round(rate_o, 1)
            f["catchup_bytes_per_s"] = round(rate_b, 1)
            f["eta_s"] = round(behind / rate_o, 1) if rate_o > 0 and behind else None
