"""The open batch of a leader (raft/core/merging.py): client DATA batches proposed since its last
Ready pass, to be appended as one stored batch, and which batches may be merged at all."""

from __future__ import annotations

from raft.core.types import Acks
from storage.batch import NO_PRODUCER, Batch, BatchKind
from storage.records import join_records, records_start


class OpenBatch:
    """Client DATA batches proposed since the last Ready pass that may still be joined."""

    __slots__ = ("batches", "starts", "members", "count", "nbytes", "timestamp_ms", "quorum")

    def __init__(self, request_id: int, batch: Batch, acks: Acks, start: int) -> None:
        self.batches = [batch]
        self.starts = [start]  # where each payload's records begin
        self.members = [(request_id, batch.count, acks)]
        self.count = batch.count
        self.nbytes = batch.size
        self.timestamp_ms = batch.timestamp_ms
        self.quorum = 1 if acks == Acks.QUORUM else 0  # members that will wait for commit

    def add(self, request_id: int, batch: Batch, acks: Acks, start: int) -> None:
        self.batches.append(batch)
        self.starts.append(start)
        self.members.append((request_id, batch.count, acks))
        self.count += batch.count
        self.nbytes += len(batch.payload) - start
        if acks == Acks.QUORUM:
            self.quorum += 1

    def batch(self) -> Batch:
        """The batch to append: the one proposed as it was, or all of them merged."""
        if len(self.batches) == 1:
            return self.batches[0]
        payload = join_records([b.payload for b in self.batches], self.starts, self.count)
        return Batch.create(payload, self.count, timestamp_ms=self.timestamp_ms)


def merge_start(batch: Batch, translated: bool) -> int:
    """Where `batch`'s records begin if it may be merged with others (the rules in raft/core/merging.py); -1
    when it must be appended as a batch of its own."""
    if batch.kind != BatchKind.DATA or batch.producer_id != NO_PRODUCER or translated:
        return -1
    return records_start(batch.payload, batch.count)
