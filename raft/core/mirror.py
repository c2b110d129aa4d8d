"""Mirror partitions in the core: the visible end, and the position rule (issue 30).

A *translated* group (RaftConfig.translated: every partition of a topic a link created as a
mirror, forever) shows consumers only MIRRORED batches, at the visible offsets their tags carry
(storage/mirrored.py, docs/REPLICATION.md). The core keeps one number for it, `visible_end`: the
visible offset of the last record of the last MIRRORED batch in the log (-1 when nothing was
mirrored). It moves on every append, leader or follower (`_applied_to_log`), is recomputed on a
suffix truncation, and at the log start comes from the built-in snapshot section `mirror`
(raft/core/snapshot_sections.py), so retention and state transfers never lose it.

The position rule, the link's exactly-once: the leader appends a MIRRORED proposal whose tag
says visible base B only if B > visible_end (gaps are fine: the source's no-ops, control
batches and bootstraps leave them); otherwise it answers MIRROR_POSITION with visible_end, and
the link resumes from there. So a retried or duplicated link append can never place a record
twice, and the link's progress *is* the mirror's log (no separate progress table). A client
produce to a translated group (a promoted mirror) proposes DATA; after the idempotent producer
check the leader converts it to MIRRORED at visible_end + 1. A plain group refuses MIRRORED
proposals. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raft.core.types import ErrorCode
from storage.batch import Batch, BatchKind
from storage.mirrored import (
    MIRROR_SECTION,
    NEXT,
    NO_VISIBLE,
    MalformedTag,
    decode_tag,
    end_at_start,
    retagged,
    run_sync,
    visible_end_upto,
    visible_last,
)

if TYPE_CHECKING:
    from raft.core.snapshot import SnapshotContext, StartState

class Mirror:
    """The mirror half of RaftCore (mixed in): `visible_end` and the propose-time rules. The
    host provides cfg, log, leader and _answer."""

    visible_end: int = NO_VISIBLE

    def _mirror_open(self) -> None:
        """At start: the visible end at the log start; the log rebuild folds the rest."""
        self.visible_end = end_at_start(self.log.snapshot)  # type: ignore[attr-defined]

    def _mirror_applied(self, batch: Batch) -> None:
        """A batch entered the log (leader or follower, in log order)."""
        self.visible_end = visible_last(batch)

    def _mirror_truncated(self, after: int) -> None:
        """The log ends at `after` now: the visible end is the last MIRRORED batch's left."""
        if self.visible_end == NO_VISIBLE:
            return  # (a plain group, or nothing mirrored: nothing to recompute)
        self.visible_end = run_sync(visible_end_upto(self.log, after))  # type: ignore[attr-defined]

    def _mirror_restore(self, state: "StartState") -> None:
        """A state transfer or a cut damaged prefix: the visible end as of the new start."""
        self.visible_end = state.states[MIRROR_SECTION][0]

    def _mirror_propose(self, request_id: int, batch: Batch) -> Batch | None:
        """The batch a translated group's leader appends for this proposal (DATA converted,
        NEXT filled in), or None when it was answered (refused) here. Called after the
        idempotent producer check. A plain group never gets here with anything but a MIRRORED
        batch, which it refuses."""
        answer = self._answer  # type: ignore[attr-defined]
        if not self.cfg.translated:  # type: ignore[attr-defined]
            answer(request_id, ErrorCode.BAD_REQUEST, message=(
                "MIRRORED batches are only for mirror partitions (topics a link created); "
                "produce ordinary records to this topic"))
            return None
        if batch.kind == BatchKind.STAGED:
            answer(request_id, ErrorCode.BAD_REQUEST, message=(
                "Spark loads into a mirror (or promoted) topic are not supported yet; load "
                "into a plain topic"))
            return None
        if batch.kind == BatchKind.CONTROL:
            return batch
        if self.log.first_damaged() is not None:  # type: ignore[attr-defined]
            # A damaged batch may be the last MIRRORED one: its visible end is unknown here.
            answer(request_id, ErrorCode.BACKPRESSURE, message=(
                "this leader holds a damaged batch it cannot read until it is repaired, so it "
                "cannot tell the mirror's visible end; retry shortly"))
            return None
        base = NEXT
        if batch.kind == BatchKind.MIRRORED:
            try:
                base = decode_tag(batch.payload)
            except MalformedTag as e:
                answer(request_id, ErrorCode.BAD_REQUEST, message=str(e))
                return None
        if base == NEXT:
            return retagged(batch, self.visible_end + 1)
        if base <= self.visible_end:  # the position rule
            answer(request_id, ErrorCode.MIRROR_POSITION, visible_end=self.visible_end,
                   message=(f"visible offset {base} is not past the mirror's visible end "
                            f"{self.visible_end}: it is mirrored already; resume from "
                            f"{self.visible_end + 1}"))
            return None
        return batch


# -- the snapshot section: the visible end as of the log start (a one-element list) ------------
def section_fresh(ctx: "SnapshotContext", start: int) -> list[int]:
    return [NO_VISIBLE]


def section_apply(state: list[int], batch: Batch) -> None:
    if batch.kind == BatchKind.MIRRORED:
        state[0] = visible_last(batch)


def section_dump(state: list[int], start: int) -> int:
    return state[0]


def section_load(raw: Any, ctx: "SnapshotContext") -> list[int]:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < NO_VISIBLE:
        raise ValueError(f"the mirror's visible end at the log start must be an integer >= "
                         f"{NO_VISIBLE}, got {raw!r}")
    return [raw]
