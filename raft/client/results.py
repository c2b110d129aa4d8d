"""What the client's operations return: the offsets of a produced batch and the records of a
fetch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False  # the cluster already had this batch (an idempotent retry)


@dataclass(slots=True, frozen=True)
class FetchedRecord:
    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] | None = None
    timestamp_ms: int = 0


@dataclass(slots=True)
class FetchResult:
    records: list[FetchedRecord]
    high_watermark: int
    start_offset: int
    next_offset: int


__all__ = ["FetchResult", "FetchedRecord", "ProduceResult"]
