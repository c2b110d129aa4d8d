"""Record batches: the unit the log stores, replicates and checksums.

The server never decodes records on the hot path: a batch is a small fixed header plus an opaque
payload. The CRC covers everything a producer decides (kind, count, timestamp, producer id,
sequence, payload) but not the base offset and term, which the leader assigns on append. That
way the leader re-homes a batch without re-hashing its payload (Kafka's record-batch CRC makes
the same split).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple


class BatchKind(IntEnum):
    """What a batch carries. Consumers are shown DATA, published STAGED and (in a translated
    group) MIRRORED batches; never the others."""

    DATA = 0
    NOOP = 1  # appended by a new leader so entries of earlier terms can commit
    CONFIG = 2  # cluster membership configuration
    CONTROL = 3  # replicated control records (load publish/abort, producer state, ...)
    # A Spark task attempt's records staged for an exactly-once load (raft/core/loads.py): the payload
    # is a small tag (load id, generation, partition, attempt, sequence) followed by ordinary
    # records. Occupies `count` offsets; consumers see it only once its load published that
    # attempt, and then as plain records at the same offsets.
    STAGED = 4
    # A batch of a mirror partition (cross-cluster replication, docs/REPLICATION.md): the payload
    # is a tag (storage/mirrored.py: the batch's *visible* base offset, the source cluster's)
    # followed by ordinary records. Only translated groups hold them; there every batch a
    # consumer sees is MIRRORED, shown at its visible offsets, not at its log offsets.
    MIRRORED = 5


# Where operators read what a node does about a damaged or lost disk, and what to run.
DISK_LOSS_DOC = "docs/DISK-LOSS.md"


class CorruptBatch(Exception):
    """A stored or received batch failed its checksum or could not be decoded."""

    def __init__(self, offset: int | None, reason: str) -> None:
        where = f"at offset {offset}" if offset is not None else "(offset unknown)"
        super().__init__(
            f"corrupt batch {where}: {reason}; if it was read from this node's log, the node "
            f"stops serving and counting it and re-fetches it from a member with a good copy by "
            f"itself (`raftlog status` shows the damaged range until then; see {DISK_LOSS_DOC}); "
            f"if it arrived over the network, the request is rejected and the sender must resend "
            f"it"
        )
        self.offset = offset
        self.reason = reason


# base_offset, count, term, kind, timestamp_ms, producer_id, sequence, crc, payload_len
_HEADER = struct.Struct("<qIqBqqqII")
HEADER_SIZE = _HEADER.size
# The part the CRC covers besides the payload: kind, count, timestamp_ms, producer_id, sequence.
_CRC_PART = struct.Struct("<BIqqq")

NO_PRODUCER = 0
NO_SEQUENCE = -1


def compute_crc(
    kind: int, count: int, timestamp_ms: int, producer_id: int, sequence: int, payload: bytes
) -> int:
    crc = zlib.crc32(_CRC_PART.pack(kind, count, timestamp_ms, producer_id, sequence))
    return zlib.crc32(payload, crc)


@dataclass(slots=True, frozen=True)
class Batch:
    """`count` records at offsets base_offset .. base_offset + count - 1, written in `term`."""

    base_offset: int
    count: int
    term: int
    kind: BatchKind
    timestamp_ms: int
    producer_id: int
    sequence: int
    payload: bytes
    crc: int

    @staticmethod
    def create(
        payload: bytes,
        count: int,
        *,
        kind: BatchKind = BatchKind.DATA,
        timestamp_ms: int = 0,
        producer_id: int = NO_PRODUCER,
        sequence: int = NO_SEQUENCE,
        base_offset: int = -1,
        term: int = 0,
    ) -> Batch:
        """A new batch with its CRC computed; offset and term are set later by the leader."""
        if count < 1:
            raise ValueError(f"a batch holds at least one record, got count={count}")
        crc = compute_crc(int(kind), count, timestamp_ms, producer_id, sequence, payload)
        # _make, not the frozen dataclass's __init__: one of these per write on the leader
        # (issue 28), and its five object.__setattr__ calls were most of the cost.
        return _make(base_offset, count, term,
                     kind if type(kind) is BatchKind else BatchKind(kind), timestamp_ms,
                     producer_id, sequence, payload, crc)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    @property
    def size(self) -> int:
        """Bytes this batch takes encoded (what byte budgets count)."""
        return HEADER_SIZE + len(self.payload)

    def placed(self, base_offset: int, term: int) -> Batch:
        """The same batch at a leader-assigned offset and term (CRC unchanged by design)."""
        return _make(base_offset, self.count, term, self.kind, self.timestamp_ms,
                     self.producer_id, self.sequence, self.payload, self.crc)

    def verify(self) -> None:
        """Raise CorruptBatch unless the CRC matches."""
        want = compute_crc(int(self.kind), self.count, self.timestamp_ms, self.producer_id,
                           self.sequence, self.payload)
        if want != self.crc:
            raise CorruptBatch(self.base_offset, f"crc mismatch (stored {self.crc:#010x}, "
                                                 f"computed {want:#010x})")

    def encode(self) -> bytes:
        p = self.payload
        if type(p) is memoryview:
            # Decoded with keep (Batch.decode: its payload is the view past the header of the
            # one bytes object that holds the whole encoding): that object is the encoding,
            # unless the batch was placed elsewhere since (its header then differs).
            whole = p.obj
            if type(whole) is bytes and len(whole) == HEADER_SIZE + p.nbytes:
                head = self.header()
                if whole.startswith(head):
                    return whole
            return self.header() + p
        return self.header() + p

    def header(self) -> bytes:
        """The encoded header alone: a writer that appends more after the payload joins the
        pieces in one copy instead of copying the payload twice (storage/lmdb_format.py)."""
        return _HEADER.pack(self.base_offset, self.count, self.term, int(self.kind),
                            self.timestamp_ms, self.producer_id, self.sequence, self.crc,
                            len(self.payload))

    @staticmethod
    def decode(data: bytes | memoryview, *, verify: bool = True, keep: bool = False) -> "Batch":
        """Parse one encoded batch; raises CorruptBatch on a short, long or mis-hashed buffer.

        Hot: every replicated and every recovered batch passes here (tens of thousands per
        recovery chunk of small batches), so it avoids the frozen dataclass's __init__ and the
        enum's lookup (about half the cost) while doing the same checks.

        `keep`: `data` is an immutable bytes object the caller hands over (a follower's batch
        straight out of the AppendEntries it received), so the payload is a read-only view of
        it instead of a copy (issue 28: one copy of every replicated byte less per follower;
        the view holds just the 48-byte header more; `encode` hands `data` back as the batch's
        encoding, no copy). This is the only place that makes a payload a view of a bytes
        object, and the view always runs from the end of the header to the end of `data`
        (what `encode` relies on). Anything else is copied: a view into LMDB's map must not
        outlive its read transaction."""
        # The checks of _checked_header, inline: a call more costs 7% of a decode here.
        if len(data) < HEADER_SIZE:
            raise CorruptBatch(None, f"{len(data)} bytes is shorter than a batch header")
        (base, count, term, kind, ts, pid, seq, crc, plen) = _HEADER.unpack_from(data, 0)
        if len(data) != HEADER_SIZE + plen or kind >= len(_KINDS) or count < 1:
            _checked_header(data)  # raises, saying which
        payload = (memoryview(data)[HEADER_SIZE:] if keep and type(data) is bytes
                   else bytes(data[HEADER_SIZE:]))
        if verify and zlib.crc32(payload, zlib.crc32(_CRC_PART.pack(kind, count, ts, pid, seq))
                                 ) != crc:
            want = compute_crc(kind, count, ts, pid, seq, payload)
            raise CorruptBatch(base, f"crc mismatch (stored {crc:#010x}, computed {want:#010x})")
        return _make(base, count, term, _KINDS[kind], ts, pid, seq, payload, crc)


class BatchHead(NamedTuple):
    """A stored batch's header without its payload: what the load and subscription indexes
    and retention's plan need of a batch whose payload they do not read
    (LogStorage.read_heads). Has the fields and properties of a Batch those readers use
    (offsets, kind, count, size, and the producer's timestamp, id and sequence). A tuple: built
    once per committed batch on the leader's loop, so it must be cheap to make."""

    base_offset: int
    count: int
    term: int
    kind: BatchKind
    size: int  # bytes the batch takes encoded, as Batch.size
    timestamp_ms: int
    producer_id: int
    sequence: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


def _checked_header(data: bytes | memoryview) -> tuple[int, ...]:
    """The header fields of an encoded batch whose length, kind and count make sense
    (CorruptBatch otherwise); the checksum is the caller's."""
    if len(data) < HEADER_SIZE:
        raise CorruptBatch(None, f"{len(data)} bytes is shorter than a batch header")
    fields = _HEADER.unpack_from(data, 0)
    base, count, kind, plen = fields[0], fields[1], fields[3], fields[8]
    if len(data) != HEADER_SIZE + plen:
        raise CorruptBatch(base, f"payload length {plen} does not match the "
                                 f"{len(data) - HEADER_SIZE} bytes present")
    if kind >= len(_KINDS):
        raise CorruptBatch(base, f"unknown batch kind {kind}")
    if count < 1:
        raise CorruptBatch(base, f"record count {count} < 1")
    return fields


def check_encoding(data: bytes | memoryview) -> int:
    """Every check Batch.decode makes, on the encoded batch where it lies (a view into LMDB's
    map: nothing is copied); its record count, or CorruptBatch. What the scrubber needs (it
    copied every byte it checked before), and what a read checks before its one copy, so a
    damaged batch costs none. (zlib hashes a large buffer with the GIL released, and py-lmdb has
    already faulted the value's pages in off the GIL: a cold batch holds up no other thread.)"""
    (base, count, _, kind, ts, pid, seq, crc, _) = _checked_header(data)
    with memoryview(data) as view:
        got = zlib.crc32(view[HEADER_SIZE:], zlib.crc32(_CRC_PART.pack(kind, count, ts, pid, seq)))
    if got != crc:
        raise CorruptBatch(base, f"crc mismatch (stored {crc:#010x}, computed {got:#010x})")
    return count


def head_of(base: int, data: bytes | memoryview, size: int) -> BatchHead | None:
    """The header of the encoded batch stored under `base` (`size` bytes of `data`, whose
    header bytes are known good: checked by their own checksum); None when its offset, kind,
    count or length does not match (read it whole to learn why)."""
    if size < HEADER_SIZE:
        return None
    (b, count, term, kind, ts, pid, seq, _crc, plen) = _HEADER.unpack_from(data, 0)
    if b != base or kind >= len(_KINDS) or count < 1 or size != HEADER_SIZE + plen:
        return None
    return BatchHead(base, count, term, _KINDS[kind], size, ts, pid, seq)


# Batch.decode builds batches through the slots' descriptors: same object, same invariants
# (every field set once, frozen afterwards), without the frozen dataclass's slower __init__.
_KINDS = tuple(BatchKind)
assert all(k.value == i for i, k in enumerate(_KINDS)), "batch kinds must be 0..n-1"
_SLOT_SETTERS = tuple(getattr(Batch, name).__set__ for name in Batch.__slots__)
assert tuple(Batch.__slots__) == ("base_offset", "count", "term", "kind", "timestamp_ms",
                                  "producer_id", "sequence", "payload", "crc")
_new_batch = object.__new__


def _make(base: int, count: int, term: int, kind: BatchKind, ts: int, pid: int, seq: int,
          payload: bytes, crc: int) -> Batch:
    b = _new_batch(Batch)
    s0, s1, s2, s3, s4, s5, s6, s7, s8 = _SLOT_SETTERS
    s0(b, base)
    s1(b, count)
    s2(b, term)
    s3(b, kind)
    s4(b, ts)
    s5(b, pid)
    s6(b, seq)
    s7(b, payload)
    s8(b, crc)
    return b
