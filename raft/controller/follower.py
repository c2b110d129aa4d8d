"""The metadata kept current from the controller group's log: what every node runs.

Like the loads table (raft/core/loads.py, LoadIndex), the metadata is built by applying the
controller log's committed batches in order, and starts from the state stored with the log
start when retention has cut the log (section.py). The runtime calls `catch_up(commit_index)`
whenever group 0's commit index moves, then reconciles its groups against `metadata`
(reconcile.py) and acts on the results it got back (a leader answers the admin request whose
entry it was with that entry's verdict).

Pure: it reads a LogStorage it is handed (a MemoryLog in tests and the simulation). A batch
damaged on this node is waited for (the core repairs it from another member) rather than
skipped, since skipping a controller entry would diverge from the other nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from raft.controller.commands import is_controller_payload
from raft.controller.section import SECTION_NAME
from raft.controller.state import ApplyResult, ClusterMetadata
from raft.core.snapshot import section_raw
from storage.api import LogStorage
from storage.batch import BatchKind, CorruptBatch


class MetadataGap(RuntimeError):
    """The controller log starts past what the metadata holds and no metadata was stored with
    that start: the node cannot rebuild the cluster's metadata. Fail-stop."""


@dataclass(slots=True, frozen=True)
class Applied:
    """One controller entry applied by catch_up, with its verdict."""

    offset: int
    result: ApplyResult


class MetadataFollower:
    """ClusterMetadata applied up to the controller log's commit index, read from `log`."""

    def __init__(self, log: LogStorage) -> None:
        self.log = log
        self.metadata = ClusterMetadata()
        self.position = 0  # the next offset to read
        self._restore()

    def _restore(self) -> None:
        start = self.log.start_offset
        raw = section_raw(self.log.snapshot, SECTION_NAME)
        if raw is not None:
            self.metadata = ClusterMetadata.from_snapshot(raw)
        elif start > 0:
            raise MetadataGap(f"the controller log starts at {start} with no metadata stored "
                              f"with that start: this node cannot rebuild the cluster's "
                              f"metadata; register the controller snapshot section "
                              f"(raft.controller.section.SECTION in group 0's RaftConfig."
                              f"snapshot_sections) before cutting the log")
        self.position = start

    def catch_up(self, commit_index: int, max_batches: int = 1024) -> list[Applied]:
        """Apply committed batches up to `commit_index` (at most `max_batches`, so a caller on
        an event loop bounds its work); the controller entries applied, with their verdicts.
        UnsupportedCommand propagates: stop and upgrade this node."""
        out: list[Applied] = []
        left = max_batches
        while self.position <= commit_index and left > 0:
            if self.position < self.log.start_offset:
                self._restore()  # a state transfer moved the start past us
                continue
            if self.position > self.log.dirty_offset:
                break
            try:
                batches = self.log.read(self.position, 4 << 20, left)
            except CorruptBatch:
                break  # damaged here: wait for the repair, never skip a controller entry
            if not batches:
                break
            for batch in batches:
                if batch.last_offset > commit_index:
                    return out
                if batch.kind == BatchKind.CONTROL and batch.base_offset > self.metadata.applied \
                        and is_controller_payload(batch.payload):
                    result = self.metadata.apply_payload(batch.base_offset, batch.payload)
                    out.append(Applied(batch.base_offset, result))
                self.position = batch.last_offset + 1
            left -= len(batches)
        return out
