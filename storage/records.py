"""The record encoding inside a DATA batch payload.

Producers encode, consumers decode; the server never does either. A payload is one msgpack
array of records, each `[key, value, headers]` with key `bytes | None`, value `bytes` and
headers `list[[str, bytes]] | None` (the shape of Kafka's records, so Spark's Kafka
conventions map one to one).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack


@dataclass(slots=True, frozen=True)
class Record:
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] | None = None


def encode_records(records: list[Record]) -> bytes:
    return msgpack.packb(
        [[r.key, r.value, [list(h) for h in r.headers] if r.headers else None] for r in records],
        use_bin_type=True,
    )


def encode_values(values: list[bytes]) -> bytes:
    """Fast path for the common case of bare values (no keys, no headers)."""
    return msgpack.packb([[None, v, None] for v in values], use_bin_type=True)


def decode_records(payload: bytes) -> list[Record]:
    out = []
    for key, value, headers in msgpack.unpackb(payload, raw=False, use_list=True):
        out.append(Record(value, key, tuple((k, v) for k, v in headers) if headers else None))
    return out
