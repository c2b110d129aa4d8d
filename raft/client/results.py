"""What the client's operations return: the offsets of a produced batch and the records of a
fetch."""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.records import undecodable_message


@dataclass(slots=True, frozen=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False  # the cluster already had this batch (an idempotent retry)


@dataclass(slots=True, frozen=True)
class FetchedRecord:
    """One committed record; `partition` and `topic` say where it was read (offsets are per
    partition)."""

    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] | None = None
    timestamp_ms: int = 0
    partition: int = 0
    topic: str = "default"


@dataclass(slots=True, frozen=True)
class UndecodableBatch:
    """A committed batch whose payload is not valid records (storage/records.py): written by
    a faulty client, or before nodes validated payloads. Its offsets hold no readable record;
    the records before and after it read normally."""

    first_offset: int
    last_offset: int
    reason: str  # what is wrong with the payload
    timestamp_ms: int = 0  # the batch's, as for its records had they been readable

    @property
    def offset(self) -> int:
        """Where it sits among records (the first offset it takes)."""
        return self.first_offset

    @property
    def message(self) -> str:
        """The offsets, the reason and what to do, worded as every raftlog reader words it."""
        return undecodable_message(self.first_offset, self.last_offset, self.reason)


@dataclass(slots=True)
class FetchResult:
    """`records` are the decodable records from the offset asked for; `undecodable` names the
    batches in the same range that could not be decoded (usually none). A caller that reads
    on from `next_offset` has seen every offset up to it either as a record, as an
    undecodable batch, or as a control entry (which takes offsets but holds no record)."""

    records: list[FetchedRecord]
    high_watermark: int
    start_offset: int
    next_offset: int
    undecodable: list[UndecodableBatch] = field(default_factory=list)


__all__ = ["FetchResult", "FetchedRecord", "ProduceResult", "UndecodableBatch"]
