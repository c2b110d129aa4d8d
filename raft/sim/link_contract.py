"""What the `link` profile uses of the mirror contract (REPL-DESIGN.md; storage/mirrored.py and
raft/core/mirror.py), in one place: how the link makes a MIRRORED proposal from a source
fetch-reply batch, where it resumes (the sink leader core's `visible_end`), what a
MIRROR_POSITION answer tells it, and how the checker reads a sink log's visible batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raft.core.ready import ProduceAnswer
from raft.core.types import ErrorCode
from storage import mirrored as _mirrored
from storage.batch import Batch, BatchKind


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

    @classmethod
    def of_reply(cls, d: dict[str, Any]) -> "VisibleBatch":
        """From a fetch reply's batch (storage.mirrored.fetch, the node's fetch)."""
        return cls(d["base_offset"], d["count"], d["timestamp_ms"], bytes(d["payload"]))


def translated_config(translated: bool) -> dict[str, Any]:
    """RaftConfig keywords for a mirror's group."""
    return {"translated": True} if translated else {}


def mirrored_proposal(src: VisibleBatch) -> Batch:
    """The batch the link proposes for one source batch: MIRRORED, tagged with the source's
    visible base, the source's count and timestamp."""
    return _mirrored.mirrored(src.base_offset, src.count, src.timestamp_ms, src.payload)


def visible_of(b: Batch) -> VisibleBatch | None:
    """The visible batch a sink log batch is, or None (the sink's own NOOP/CONFIG/CONTROL)."""
    if b.kind != BatchKind.MIRRORED:
        return None
    return VisibleBatch(_mirrored.decode_tag(b.payload), b.count, b.timestamp_ms,
                        _mirrored.records_of(b))


def visible_end(core: Any) -> int:
    """Where the link resumes from (minus one): the sink leader's visible end."""
    return int(core.visible_end)


def position_refusal(a: ProduceAnswer) -> int | None:
    """The sink's visible end when `a` refuses a MIRRORED proposal by the position rule."""
    return a.visible_end if a.error == ErrorCode.MIRROR_POSITION else None
