"""Arrow columns -> raftlog record payloads in bulk (no Python object per row).

A records payload (storage/records.py) is one msgpack array of `[key, value, headers]`. We emit
the msgpack bytes column-wise with Arrow compute kernels: every row is the concatenation of
`0x93` (fixarray of 3), the key (nil or bin32), the value (bin32) and the headers (nil, or a
packed list for the rare rows that carry headers). `binary_join_element_wise` concatenates those
per-row pieces in C++, and the joined column's data buffer *is* the payload body. bin32 is valid
msgpack for any length (decoders do not require the shortest form), which keeps every header a
fixed 5 bytes and so computable with numpy.

The DataFrame follows Spark's Kafka sink convention: `value` (binary or string), optional `key`
(binary or string) and `headers` (array<struct<key: string, value: binary>>).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ALLOWED_COLUMNS = ("key", "value", "headers")
_EMPTY = pa.scalar(b"", pa.binary())
_NIL = pa.scalar(b"\xc0", pa.binary())
_ARRAY_PREFIX = b"\x93"


class SchemaError(ValueError):
    """The DataFrame does not follow the Kafka sink convention."""


def check_columns(names: list[str], types: dict[str, str] | None = None) -> None:
    """Raise SchemaError naming every column the sink cannot write."""
    extra = [n for n in names if n not in ALLOWED_COLUMNS]
    if extra:
        raise SchemaError(
            f"raftlog cannot write column(s) {', '.join(map(repr, extra))}: a DataFrame for "
            f"raftlog has a `value` column (binary or string) and optionally `key` and "
            f"`headers` (Kafka sink convention); select or drop the others, e.g. "
            f"df.selectExpr('to_json(struct(*)) AS value')")
    if "value" not in names:
        raise SchemaError("raftlog needs a `value` column (binary or string); rename or build one "
                          "with df.selectExpr('... AS value')")
    for name, typ in (types or {}).items():
        if name in ("key", "value") and typ not in ("binary", "string"):
            raise SchemaError(f"column `{name}` has type {typ}; raftlog expects binary or string "
                              f"(cast it: df.withColumn('{name}', col('{name}').cast('binary')))")


def _as_binary(col: pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_binary(col.type):
        return col
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or \
            pa.types.is_large_binary(col.type):
        return col.cast(pa.binary())
    raise SchemaError(f"expected a binary or string column, got {col.type}")


def _len_headers(marker: int, lengths: np.ndarray, lead: bytes = b"") -> pa.Array:
    """A binary column whose row i is lead + marker + big-endian u32 lengths[i]."""
    n = len(lengths)
    w = len(lead) + 5
    mat = np.empty((n, w), dtype=np.uint8)
    for j, b in enumerate(lead):
        mat[:, j] = b
    mat[:, len(lead)] = marker
    mat[:, len(lead) + 1:] = lengths.astype(">u4").view(np.uint8).reshape(n, 4)
    offsets = np.arange(0, n * w + 1, w, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(mat.reshape(-1))])


def _lengths(col: pa.Array) -> np.ndarray:
    offs = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1,
                         offset=col.offset * 4)
    return np.diff(offs).astype(np.int64)


def _headers_column(col: pa.Array) -> pa.Array:
    """Packed headers per row (nil where null/empty). Rows with headers go through Python:
    headers are rare in bulk loads, and their nested shape has no flat fast path."""
    if col.null_count == len(col):
        return pa.nulls(len(col), pa.binary()).fill_null(_NIL)
    out = []
    for h in col.to_pylist():
        if not h:
            out.append(b"\xc0")
        else:
            pairs = [[e["key"], e["value"].encode() if isinstance(e["value"], str)
                      else e["value"]] for e in h]  # a null header value stays nil
            out.append(msgpack.packb(pairs, use_bin_type=True))
    return pa.array(out, pa.binary())


def encode_rows(batch: pa.RecordBatch) -> pa.Array:
    """One binary array: row i is the msgpack encoding of record i (without the array header)."""
    names = batch.schema.names
    check_columns(names)
    value = _as_binary(batch.column(names.index("value")))
    if value.null_count:
        raise SchemaError(f"{value.null_count} row(s) have a null `value`; raftlog records need "
                          f"a value (filter them out or fill them, e.g. coalesce(value, ''))")
    n = len(value)
    vhdr = _len_headers(0xC6, _lengths(value))
    if "key" in names:
        key = _as_binary(batch.column(names.index("key")))
        khdr = _len_headers(0xC6, _lengths(key), _ARRAY_PREFIX)
        if key.null_count:
            khdr = pc.if_else(key.is_null(), pa.scalar(b"\x93\xc0", pa.binary()), khdr)
            key = key.fill_null(_EMPTY)
        pieces = [khdr, key]
    else:
        pieces = [pa.scalar(b"\x93\xc0", pa.binary())]
    if "headers" in names:
        hcol = batch.column(names.index("headers"))
        hdrs = _headers_column(hcol) if n else pa.array([], pa.binary())
    else:
        hdrs = _NIL
    joined = pc.binary_join_element_wise(*pieces, vhdr, value, hdrs, _EMPTY)
    return joined


def _body(joined: pa.Array) -> pa.Buffer | bytes:
    """The concatenated row encodings of `joined` (a zero-copy view of its data buffer)."""
    if not len(joined):
        return b""
    offs = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=len(joined) + 1,
                         offset=joined.offset * 4)
    return joined.buffers()[2].slice(int(offs[0]), int(offs[-1] - offs[0]))


def payload_of(joined: pa.Array) -> bytes:
    """The records payload (msgpack array32 header + bodies) for a slice of encode_rows()."""
    return _flush([joined]).payload


@dataclass(slots=True)
class Chunk:
    payload: bytes
    count: int


def chunks(batches: Iterator[pa.RecordBatch], batch_bytes: int) -> Iterator[Chunk]:
    """Records payloads of about `batch_bytes` each (a row larger than that goes alone)."""
    pending: list[pa.Array] = []
    pending_bytes = 0
    for rb in batches:
        if rb.num_rows == 0:
            continue
        joined = encode_rows(rb)
        sizes = _lengths(joined)
        start = 0
        n = len(joined)
        while start < n:
            room = batch_bytes - pending_bytes
            cum = np.cumsum(sizes[start:])
            take = int(np.searchsorted(cum, room, side="right"))
            if take == 0 and not pending:
                take = 1  # a single row over the budget travels alone
            if take == 0:
                yield _flush(pending)
                pending, pending_bytes = [], 0
                continue
            piece = joined.slice(start, take)
            pending.append(piece)
            pending_bytes += int(cum[take - 1])
            start += take
            if start < n or pending_bytes >= batch_bytes:
                yield _flush(pending)
                pending, pending_bytes = [], 0
    if pending:
        yield _flush(pending)


def _flush(pieces: list[pa.Array]) -> Chunk:
    count = sum(len(p) for p in pieces)
    body = b"".join(_body(p) for p in pieces)
    return Chunk(b"\xdd" + count.to_bytes(4, "big") + body, count)
