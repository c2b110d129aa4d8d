"""Raft peer frames: the core's messages (raft.core.messages) on the wire.

`{"v":1,"t":"raft","msgs":[m, ...]}` where each `m` is a map `{"k": <kind>, "g": <group>, ...}`
with the fields of a `raft.core.messages` dataclass; batches travel as `Batch.encode()` bytes and
are CRC checked on receipt. Peer frames use the framing of every other frame
(raft.protocol.framing); they live in the protocol package, not the runtime, because a peer
message is as much a wire format as a client request.

Groups. A node runs many Raft groups over one peer link per node pair, so one frame carries
messages of many groups. The consensus core knows nothing of group ids (as in etcd-io/raft): the
id travels in an envelope around the message, the key "g" of its map (an integer >= 0). "g" is
left out for group 0, so a single-group node's frames are byte for byte what they were before
groups existed, and a frame from such a node decodes as group 0. Encoding takes and decoding
yields (group id, message) pairs (`GroupMessage`); what a node does with a group it does not run
is the runtime's business (raft.node.registry).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from typing import Any

import msgpack

from raft.core import messages as m
from raft.protocol.fields import type_name
from raft.protocol.framing import PROTOCOL_VERSION, WireError, pack_length
from storage.batch import Batch, CorruptBatch

# Short, stable tags: the dataclass names may be refactored, the wire may not.
_KIND_OF: dict[type, str] = {
    m.AppendEntries: "ae",
    m.AppendEntriesReply: "aer",
    m.Heartbeat: "hb",
    m.HeartbeatReply: "hbr",
    m.RequestVote: "rv",
    m.RequestVoteReply: "rvr",
    m.TimeoutNow: "tn",
    m.BootstrapProbe: "bp",
    m.BootstrapProbeReply: "bpr",
}
_TYPE_OF: dict[str, type] = {v: k for k, v in _KIND_OF.items()}


@dataclasses.dataclass(slots=True, frozen=True)
class _Field:
    name: str
    kind: str  # "int", "bool", "opt_int", "batches", "any"
    has_default: bool
    default: Any


def _field_kind(annotation: str) -> str:
    kinds = {"int": "int", "bool": "bool", "int | None": "opt_int", "list[Batch]": "batches",
             "dict | None": "opt_map"}
    # Anything else (a field the core adds later) travels as plain msgpack, unchecked, rather
    # than making the whole package fail to import.
    return kinds.get(annotation, "any")


def _schema(cls: type) -> tuple[_Field, ...]:
    out = []
    for f in dataclasses.fields(cls):
        # raft.core.messages uses `from __future__ import annotations`: annotations are strings.
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
        has_default = f.default is not dataclasses.MISSING
        out.append(_Field(f.name, _field_kind(ann), has_default,
                          f.default if has_default else None))
    return tuple(out)


_SCHEMAS: dict[type, tuple[_Field, ...]] = {cls: _schema(cls) for cls in _KIND_OF}
# The "where" of message_from_wire's errors, built once rather than for every message received.
_WHERE: dict[type, str] = {cls: f"raft message {kind}" for cls, kind in _KIND_OF.items()}

# The envelope: a message and the id of the Raft group it belongs to.
GroupMessage = tuple[int, m.Message]
GROUP_KEY = "g"


class BatchEncodings:
    """Encoded bytes of recently sent batches, shared by a node's peer links.

    A leader sends the same batch objects (read from its dirty tail) to every follower; encoding
    once instead of once per follower saves a copy of every replicated byte. Entries are keyed by
    object identity and hold the object, so an id cannot be reused while its entry lives. Bounded
    in entries and bytes; the oldest entry goes first. Batches of ZERO_COPY_BYTES or more are
    not encoded at all: their header and payload go out as separate pieces (_frame_parts)."""

    def __init__(self, max_entries: int = 512, max_bytes: int = 32 << 20) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("BatchEncodings needs room for at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: dict[int, tuple[Batch, bytes]] = {}
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def encode(self, batch: Batch) -> bytes:
        entry = self._entries.get(id(batch))
        if entry is not None and entry[0] is batch:
            self.hits += 1
            return entry[1]
        self.misses += 1
        data = batch.encode()
        if len(data) > self.max_bytes:
            return data
        self._entries[id(batch)] = (batch, data)
        self._bytes += len(data)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._entries.pop(next(iter(self._entries)))  # dicts keep insertion order
            self._bytes -= len(evicted)
        return data


def message_to_wire(msg: m.Message, encodings: BatchEncodings | None = None,
                    group: int = 0) -> dict[str, Any]:
    """A raft message as a msgpack-ready map (batches as their encoded bytes), in the envelope
    of `group` ("g", left out for group 0: see the module docstring)."""
    cls = type(msg)
    out: dict[str, Any] = {"k": _KIND_OF[cls]}
    if group:
        out[GROUP_KEY] = group
    for f in _SCHEMAS[cls]:
        value = getattr(msg, f.name)
        if f.kind == "batches":
            value = ([encodings.encode(b) for b in value] if encodings is not None
                     else [b.encode() for b in value])
        out[f.name] = value
    return out


def message_from_wire(obj: Any) -> m.Message:
    """Parse and type-check one message map; WireError says which field is wrong."""
    if not isinstance(obj, dict):
        raise WireError(f"raft message must be a map, got {type_name(obj)}")
    kind = obj.get("k")
    cls = _TYPE_OF.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError(f'unknown raft message kind "k"={kind!r}; expected one of '
                        f'{sorted(_TYPE_OF)}')
    where = _WHERE[cls]
    values: dict[str, Any] = {}
    for f in _SCHEMAS[cls]:
        if f.name not in obj:
            if f.has_default:
                continue
            raise WireError(f'{where} is missing field "{f.name}"')
        value = obj[f.name]
        if f.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise WireError(f'{where} field "{f.name}" must be an integer, got '
                                f'{type_name(value)}')
        elif f.kind == "opt_int":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise WireError(f'{where} field "{f.name}" must be an integer or nil, got '
                                f'{type_name(value)}')
        elif f.kind == "bool":
            if not isinstance(value, bool):
                raise WireError(f'{where} field "{f.name}" must be a boolean, got '
                                f'{type_name(value)}')
        elif f.kind == "opt_map":
            # Only the shape here; the core decodes the contents (raft/core/snapshot.py) and
            # rejects the request if they are malformed.
            if value is not None and not isinstance(value, dict):
                raise WireError(f'{where} field "{f.name}" must be a map or nil, got '
                                f'{type_name(value)}')
        elif f.kind == "any":
            pass
        else:  # batches
            if not isinstance(value, list):
                raise WireError(f'{where} field "{f.name}" must be an array of encoded batches, '
                                f'got {type_name(value)}')
            batches = []
            for raw in value:
                if not isinstance(raw, (bytes, bytearray)):
                    raise WireError(f'{where} field "{f.name}" holds a {type_name(raw)}, '
                                    f'expected encoded batch bytes')
                try:
                    batches.append(Batch.decode(raw, verify=True, keep=True))
                except CorruptBatch as e:
                    raise WireError(f"{where} carries a damaged batch: {e}") from None
            value = batches
        values[f.name] = value
    return cls(**values)


def group_message_from_wire(obj: Any) -> GroupMessage:
    """Parse one message map and its envelope: (group id, message). A map without "g" is
    group 0 (what a single-group node sends); a "g" that is not an integer >= 0 is a WireError
    naming the field."""
    if not isinstance(obj, dict):
        raise WireError(f"raft message must be a map, got {type_name(obj)}")
    group = obj.get(GROUP_KEY, 0)
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise WireError(f'raft message field "{GROUP_KEY}" (group id) must be an integer >= 0, '
                        f'got {group!r} ({type_name(group)}); leave it out for group 0')
    return group, message_from_wire(obj)


def raft_frame(items: Iterable[GroupMessage],
               encodings: BatchEncodings | None = None) -> dict[str, Any]:
    """A raft frame of (group id, message) pairs as a msgpack-ready map."""
    return {"v": PROTOCOL_VERSION, "t": "raft",
            "msgs": [message_to_wire(x, encodings, g) for g, x in items]}


# -- the fast raft frame encoder ----------------------------------------------------------------
# Peer links send raft frames through `encode_raft_frame`: the same msgpack document as
# `encode_frame(raft_frame(...))` (decoders cannot tell them apart), but batches are written as
# bin32 headers beside the encoded batch bytes and the whole body is joined once. msgpack's
# packb grows its buffer by reallocation: 5-25x slower for a 512 KiB frame, on the leader's
# event loop, for every chunk of every follower.
_FRAME_HEAD = msgpack.packb({"v": PROTOCOL_VERSION, "t": "raft"}, use_bin_type=True)[1:]
_MSGS_KEY = msgpack.packb("msgs")
_BIN32 = struct.Struct(">BI")
_ARRAY32 = struct.Struct(">BI")
_MAP16 = struct.Struct(">BH")


def _map_header(n: int) -> bytes:
    return bytes((0x80 | n,)) if n < 16 else _MAP16.pack(0xDE, n)


def _array_header(n: int) -> bytes:
    return bytes((0x90 | n,)) if n < 16 else _ARRAY32.pack(0xDD, n)


_PACKED_NAMES = {cls: {f.name: msgpack.packb(f.name) for f in fields}
                 for cls, fields in _SCHEMAS.items()}
_PACKED_KINDS = {cls: msgpack.packb("k") + msgpack.packb(kind) for cls, kind in _KIND_OF.items()}
_PACKED_GROUP_KEY = msgpack.packb(GROUP_KEY)


# Encoded batches at least this large are written as they are, not copied into a joined piece.
ZERO_COPY_BYTES = 64 * 1024


def encode_raft_frame(items: list[GroupMessage],
                      encodings: BatchEncodings | None = None) -> tuple[bytes, bytes]:
    """A raft frame of (group id, message) pairs as (length prefix, body); see the comment
    above for why not packb."""
    prefix, *pieces = encode_raft_frame_pieces(items, encodings)
    return prefix, b"".join(pieces)


def encode_raft_frame_pieces(items: list[GroupMessage],
                             encodings: BatchEncodings | None = None) -> list[bytes]:
    """A whole raft frame of (group id, message) pairs (length prefix included) as pieces to
    write in order: small parts joined, encoded batches of ZERO_COPY_BYTES or more left as
    they are (written straight from the encoding, no copy into a frame buffer)."""
    parts = _frame_parts(items, encodings)
    out: list[bytes] = []
    small: list[bytes] = []
    for part in parts:
        if len(part) >= ZERO_COPY_BYTES:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(part)
        else:
            small.append(part)
    if small:
        out.append(b"".join(small))
    return [pack_length(sum(len(x) for x in out)), *out]


def _frame_parts(items: list[GroupMessage], encodings: BatchEncodings | None) -> list[bytes]:
    # One Packer per frame: packb builds a Packer per call (about 85% of packing a small value),
    # and a frame packs each field of each message. Not shared between frames: the client
    # encodes from several threads and a Packer is not thread-safe.
    pack = msgpack.Packer(use_bin_type=True).pack
    parts = [_map_header(3), _FRAME_HEAD, _MSGS_KEY, _array_header(len(items))]
    for group, msg in items:
        cls = type(msg)
        if not getattr(msg, "batches", None):
            parts.append(pack(message_to_wire(msg, None, group)))
            continue
        fields = _SCHEMAS[cls]
        names = _PACKED_NAMES[cls]
        # The envelope costs one small packed prefix per message of a group other than 0.
        parts.append(_map_header(len(fields) + (2 if group else 1)))
        parts.append(_PACKED_KINDS[cls])
        if group:
            parts.append(_PACKED_GROUP_KEY + pack(group))
        for f in fields:
            value = getattr(msg, f.name)
            parts.append(names[f.name])
            if f.kind != "batches":
                parts.append(pack(value))
                continue
            parts.append(_array_header(len(value)))
            for b in value:
                if len(b.payload) >= ZERO_COPY_BYTES:
                    # Header and payload as two pieces: the payload is written from the
                    # batch itself, never copied into an encoding (the leader of a bulk load
                    # copied every replicated byte once more for that).
                    head = b.header()
                    parts.append(_BIN32.pack(0xC6, len(head) + len(b.payload)))
                    parts.append(head)
                    parts.append(b.payload)
                    continue
                raw = encodings.encode(b) if encodings is not None else b.encode()
                parts.append(_BIN32.pack(0xC6, len(raw)))
                parts.append(raw)
    return parts


def messages_from_frame(frame: dict[str, Any]) -> list[GroupMessage]:
    """A raft frame's (group id, message) pairs, in the order they were sent."""
    msgs = frame.get("msgs")
    if not isinstance(msgs, list):
        raise WireError(f'raft frame field "msgs" must be an array, got {type_name(msgs)}')
    return [group_message_from_wire(x) for x in msgs]


def message_wire_size(msg: m.Message) -> int:
    """A cheap upper-ish estimate of a message's encoded size, for per-peer byte budgets."""
    batches = getattr(msg, "batches", None)
    size = 96 + (sum(b.size + 5 for b in batches) if batches else 0)
    if getattr(msg, "snapshot", None) is not None:
        size += len(msgpack.packb(msg.snapshot, use_bin_type=True))  # rare: a state transfer
    return size
