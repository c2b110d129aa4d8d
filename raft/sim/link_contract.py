"""What the `link` profile uses of the mirror contract (REPL-DESIGN.md, built by mirror-data), in
one place: how the link makes a MIRRORED proposal from a source fetch-reply batch, where it
resumes (the sink leader's `visible_end`), what a MIRROR_POSITION answer tells it, and how the
checker reads a sink log's visible batches.

Until the contract is merged (`storage.mirrored` absent) the harness runs on a stand-in so it
can be built and exercised: the link proposes the source's batches as plain DATA (no producer
id), the visible base of each is remembered by (payload, timestamp, count) for the run
(`reset_shim`), the sink groups are plain, and the position is read by scanning the sink
leader's log. The stand-in has NO position rule: it shows what the checker
finds without one (duplicates after retried fetches), which is the mutant the real rule gets.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from raft.core.ready import ProduceAnswer
from storage.api import LogStorage
from storage.batch import Batch, BatchKind

try:  # the contract (mirror-data's branch)
    _mirrored: Any = importlib.import_module("storage.mirrored")
    CONTRACT = hasattr(BatchKind, "MIRRORED")
except ImportError:  # pragma: no cover (before the merge)
    _mirrored = None
    CONTRACT = False

_shim_bases: dict[tuple[bytes, int, int], int] = {}


def reset_shim() -> None:
    """A new run: forget the stand-in's visible bases."""
    _shim_bases.clear()


@dataclass(slots=True, frozen=True)
class VisibleBatch:
    """One batch as a consumer sees it: the source's fetch-reply fields."""

    base_offset: int
    count: int
    timestamp_ms: int
    payload: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


def translated_config(translated: bool) -> dict[str, Any]:
    """RaftConfig keywords for a mirror's group."""
    return {"translated": True} if translated and CONTRACT else {}


def mirrored_proposal(src: VisibleBatch) -> Batch:
    """The batch the link proposes for one source batch: MIRRORED, tagged with the source's
    visible base, the source's count and timestamp."""
    if CONTRACT:
        return _mirrored.mirrored(src.base_offset, src.count, src.timestamp_ms, src.payload)
    _shim_bases[(src.payload, src.timestamp_ms, src.count)] = src.base_offset
    return Batch.create(src.payload, src.count, timestamp_ms=src.timestamp_ms)


def visible_of(b: Batch) -> VisibleBatch | None:
    """The visible batch a sink log batch is, or None (the sink's own NOOP/CONFIG/CONTROL)."""
    if CONTRACT:
        if b.kind != BatchKind.MIRRORED:
            return None
        return VisibleBatch(_mirrored.decode_tag(b.payload), b.count, b.timestamp_ms,
                            _mirrored.records_of(b))
    if b.kind != BatchKind.DATA:
        return None
    base = _shim_bases[(b.payload, b.timestamp_ms, b.count)]
    return VisibleBatch(base, b.count, b.timestamp_ms, b.payload)


def visible_end(core: Any, log: LogStorage) -> int:
    """Where the link resumes from (minus one): the sink leader's visible end."""
    if CONTRACT:
        return int(core.visible_end)
    end, off = -1, log.start_offset
    while off <= log.dirty_offset:
        batches = log.read(off, 1 << 22)
        for b in batches:
            v = visible_of(b)
            if v is not None:
                end = v.last_offset
        off = batches[-1].last_offset + 1
    return end


def position_refusal(a: ProduceAnswer) -> int | None:
    """The sink's visible end when `a` refuses a MIRRORED proposal by the position rule."""
    if not CONTRACT or a.error.name != "MIRROR_POSITION":
        return None
    return a.visible_end  # type: ignore[attr-defined]


# The stand-in's position rule, applied by the link itself (False: none, to see the checker
# find the duplicates). With the contract the core applies the rule and this is not used.
SHIM_RULE = True


def shim_refuses(core: Any, log: LogStorage, src: VisibleBatch) -> bool:
    """Before the contract: would the position rule refuse `src` at this sink leader?"""
    return not CONTRACT and SHIM_RULE and src.base_offset <= visible_end(core, log)
