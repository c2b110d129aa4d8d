"""The metadata as a section of the state at the log start, so the controller log can be cut.

Retention of the controller log (group 0) drops entries from its front; the state they built
must travel with the new log start, like the producer and loads tables do
(raft/core/snapshot.py). This module gives that section: an empty metadata for an empty log,
folding each committed CONTROL batch of the controller's, and the snapshot map both ways.

It is not registered at import: the section registry is process-wide (every group's snapshots
carry every registered section), and only the controller group holds controller entries. The
runtime passes `SECTION` in group 0's RaftConfig.snapshot_sections instead, so only group 0's
snapshots carry it (docs/DESIGN.md, "Controller").
"""

from __future__ import annotations

from typing import Any

from raft.controller.commands import is_controller_payload
from raft.controller.state import ClusterMetadata
from raft.core.snapshot import Section, SnapshotContext
from storage.batch import Batch, BatchKind

SECTION_NAME = "controller"


def _fresh(ctx: SnapshotContext, start: int) -> ClusterMetadata:
    return ClusterMetadata(applied=start - 1)


def apply_batch(meta: ClusterMetadata, batch: Batch) -> None:
    """Fold one committed batch: a controller command is applied at its offset (a malformed
    one is refused, which changes nothing, the same on every node); other batches are not
    ours. UnsupportedCommand propagates: the node stops and is upgraded, never skips it."""
    if batch.kind != BatchKind.CONTROL or batch.base_offset <= meta.applied:
        return
    if is_controller_payload(batch.payload):
        meta.apply_payload(batch.base_offset, batch.payload)


def _dump(meta: ClusterMetadata, start: int) -> dict[str, Any]:
    return meta.to_snapshot()


def _load(raw: Any, ctx: SnapshotContext) -> ClusterMetadata:
    return ClusterMetadata.from_snapshot(raw)


SECTION = Section(SECTION_NAME, _fresh, apply_batch, _dump, _load)

