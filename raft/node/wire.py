"""The raftlog wire protocol: length-prefixed msgpack frames, shared by peers and clients.

Frame = 4-byte big-endian unsigned length N, then N bytes of msgpack encoding a map (bin type on,
raw off). Every map carries `"v": 1` and a type tag `"t"`. One listening port serves both peers and
clients; the first frame of a connection (`hello`) says which one is talking.

Why frames are checked strictly here rather than in the node: every byte that arrives comes from
an untrusted socket. The reader refuses an oversized frame from its 4-byte header alone (the body
is never buffered, so a hostile length cannot make us allocate it), and each decoding step raises
`WireError` with a message that says what the sender did wrong. The node turns that into an
`{"t": "error"}` frame and closes the connection; everyone else keeps being served.

Peer traffic: `{"v":1,"t":"raft","msgs":[m, ...]}` where each `m` is a map `{"k": <kind>, ...}` with
the fields of a `raft.messages` dataclass; batches travel as `Batch.encode()` bytes and are CRC
checked on receipt.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from typing import Any

import msgpack
import trio

from raft import messages as m
from raft.types import ErrorCode
from storage.batch import Batch, CorruptBatch

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
_LEN = struct.Struct(">I")
LEN_SIZE = _LEN.size
_READ_CHUNK = 64 * 1024


class WireError(Exception):
    """A frame or request the peer sent is unusable. `code` is an ErrorCode name for the error
    frame; `request_id` is set when the offending frame carried a usable `id`."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.BAD_REQUEST,
                 request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class FrameTooLarge(WireError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"frame of {size} bytes exceeds the {limit}-byte limit; send smaller requests (split "
            f"the batch or lower max_bytes) or raise the server's --max-frame-bytes",
            ErrorCode.TOO_LARGE)
        self.size, self.limit = size, limit


class ConnectionClosed(Exception):
    """The remote end closed the connection (cleanly between frames or mid-frame)."""


# -- frames ---------------------------------------------------------------------------------------

def encode_frame(obj: dict[str, Any]) -> bytes:
    """One frame: length prefix + msgpack map. Adds `"v": 1` if the caller left it out."""
    prefix, body = encode_frame_parts(obj)
    return prefix + body


def encode_frame_parts(obj: dict[str, Any]) -> tuple[bytes, bytes]:
    """A frame as (length prefix, body): large frames are sent as two writes rather than
    copied once more to join them."""
    if "v" not in obj:
        obj = {"v": PROTOCOL_VERSION, **obj}
    body = msgpack.packb(obj, use_bin_type=True)
    return _LEN.pack(len(body)), body


def decode_body(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse one frame body into a map with a supported version and a string type tag."""
    try:
        obj = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated exception types
        raise WireError(f"frame body is not valid msgpack ({type(e).__name__}: {e}); frames are "
                        f"a 4-byte big-endian length followed by one msgpack map") from None
    if not isinstance(obj, dict):
        raise WireError(f"frame body must be a msgpack map, got {type(obj).__name__}")
    v = obj.get("v")
    if v != PROTOCOL_VERSION:
        raise WireError(f'unsupported protocol version "v"={v!r}; this server speaks v='
                        f'{PROTOCOL_VERSION} (add "v": 1 to every frame)')
    t = obj.get("t")
    if not isinstance(t, str):
        raise WireError(f'frame needs a string type tag "t", got {t!r}')
    return obj


def error_frame(code: ErrorCode, message: str, request_id: int | None = None) -> dict[str, Any]:
    """The frame sent just before closing a connection that misbehaved."""
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": "error", "code": code.name,
                           "message": message}
    if request_id is not None:
        out["id"] = request_id
    return out


def ok_reply(request_id: int, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "t": "reply", "id": request_id, "ok": True, **fields}


def error_reply(request_id: int, code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code.name, "message": message}
    err.update({k: v for k, v in extra.items() if v is not None})
    return {"v": PROTOCOL_VERSION, "t": "reply", "id": request_id, "ok": False, "error": err}


class FrameReader:
    """Reads frames off a trio stream with a size limit.

    Buffers at most one frame plus one read chunk. The length header is checked before any body
    byte is kept, so an oversized frame costs 4 bytes of memory, not N.
    """

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame_bytes: int) -> None:
        self._stream = stream
        self._max = max_frame_bytes
        self._buf = bytearray()

    async def _fill(self, n: int) -> bool:
        """Buffer at least n bytes; False on EOF before that."""
        while len(self._buf) < n:
            data = await self._stream.receive_some(max(_READ_CHUNK, n - len(self._buf)))
            if not data:
                return False
            self._buf += data
        return True

    async def receive_raw(self) -> bytes | None:
        """The next frame's body, or None on a clean EOF between frames."""
        if not await self._fill(LEN_SIZE):
            if self._buf:
                raise WireError(f"connection closed inside a frame header ({len(self._buf)} of "
                                f"{LEN_SIZE} bytes)")
            return None
        (n,) = _LEN.unpack_from(self._buf, 0)
        if n > self._max:
            raise FrameTooLarge(n, self._max)
        if not await self._fill(LEN_SIZE + n):
            raise WireError(f"connection closed inside a frame: got {len(self._buf) - LEN_SIZE} "
                            f"of {n} body bytes")
        with memoryview(self._buf) as view:  # one copy, not two (a bytearray slice copies)
            body = bytes(view[LEN_SIZE:LEN_SIZE + n])
        del self._buf[:LEN_SIZE + n]
        return body

    async def receive(self) -> dict[str, Any] | None:
        """The next decoded frame, or None on a clean EOF between frames."""
        body = await self.receive_raw()
        return None if body is None else decode_body(body)


# -- field checks -----------------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


def get_int(obj: dict[str, Any], key: str, *, default: int | None = None,
            minimum: int | None = None, maximum: int | None = None,
            request_id: int | None = None, where: str = "request") -> int:
    """A required (or defaulted) integer field, bools refused (msgpack keeps them distinct)."""
    value = obj.get(key)
    if value is None:
        if default is not None:
            return default
        raise WireError(f'{where} is missing integer field "{key}"', request_id=request_id)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f'{where} field "{key}" must be an integer, got {_type_name(value)}',
                        request_id=request_id)
    if minimum is not None and value < minimum:
        raise WireError(f'{where} field "{key}"={value} must be >= {minimum}',
                        request_id=request_id)
    if maximum is not None and value > maximum:
        raise WireError(f'{where} field "{key}"={value} must be <= {maximum}',
                        request_id=request_id)
    return value


def get_opt_int(obj: dict[str, Any], key: str, *, request_id: int | None = None,
                where: str = "request") -> int | None:
    if obj.get(key) is None:
        return None
    return get_int(obj, key, request_id=request_id, where=where)


def get_bytes(obj: dict[str, Any], key: str, *, request_id: int | None = None,
              where: str = "request") -> bytes:
    value = obj.get(key)
    if not isinstance(value, (bytes, bytearray)):
        raise WireError(f'{where} field "{key}" must be msgpack bin (bytes), got '
                        f'{_type_name(value)}', request_id=request_id)
    return bytes(value)


def get_str(obj: dict[str, Any], key: str, *, default: str | None = None,
            choices: Iterable[str] | None = None, request_id: int | None = None,
            where: str = "request") -> str:
    value = obj.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise WireError(f'{where} field "{key}" must be a string, got {_type_name(value)}',
                        request_id=request_id)
    if choices is not None:
        allowed = list(choices)
        if value not in allowed:
            raise WireError(f'{where} field "{key}"={value!r} must be one of {allowed}',
                            request_id=request_id)
    return value


# -- raft messages ----------------------------------------------------------------------------------

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
        # raft.messages uses `from __future__ import annotations`: annotations are strings.
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
        has_default = f.default is not dataclasses.MISSING
        out.append(_Field(f.name, _field_kind(ann), has_default,
                          f.default if has_default else None))
    return tuple(out)


_SCHEMAS: dict[type, tuple[_Field, ...]] = {cls: _schema(cls) for cls in _KIND_OF}
# The "where" of message_from_wire's errors, built once rather than for every message received.
_WHERE: dict[type, str] = {cls: f"raft message {kind}" for cls, kind in _KIND_OF.items()}


class BatchEncodings:
    """Encoded bytes of recently sent batches, shared by a node's peer links.

    A leader sends the same batch objects (read from its dirty tail) to every follower; encoding
    once instead of once per follower saves a copy of every replicated byte. Entries are keyed by
    object identity and hold the object, so an id cannot be reused while its entry lives. Bounded
    in entries and bytes; the oldest entry goes first."""

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


def message_to_wire(msg: m.Message,
                    encodings: BatchEncodings | None = None) -> dict[str, Any]:
    """A raft message as a msgpack-ready map (batches as their encoded bytes)."""
    cls = type(msg)
    out: dict[str, Any] = {"k": _KIND_OF[cls]}
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
        raise WireError(f"raft message must be a map, got {_type_name(obj)}")
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
                                f'{_type_name(value)}')
        elif f.kind == "opt_int":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise WireError(f'{where} field "{f.name}" must be an integer or nil, got '
                                f'{_type_name(value)}')
        elif f.kind == "bool":
            if not isinstance(value, bool):
                raise WireError(f'{where} field "{f.name}" must be a boolean, got '
                                f'{_type_name(value)}')
        elif f.kind == "opt_map":
            # Only the shape here; the core decodes the contents (raft/snapshot.py) and
            # rejects the request if they are malformed.
            if value is not None and not isinstance(value, dict):
                raise WireError(f'{where} field "{f.name}" must be a map or nil, got '
                                f'{_type_name(value)}')
        elif f.kind == "any":
            pass
        else:  # batches
            if not isinstance(value, list):
                raise WireError(f'{where} field "{f.name}" must be an array of encoded batches, '
                                f'got {_type_name(value)}')
            batches = []
            for raw in value:
                if not isinstance(raw, (bytes, bytearray)):
                    raise WireError(f'{where} field "{f.name}" holds a {_type_name(raw)}, '
                                    f'expected encoded batch bytes')
                try:
                    batches.append(Batch.decode(raw, verify=True))
                except CorruptBatch as e:
                    raise WireError(f"{where} carries a damaged batch: {e}") from None
            value = batches
        values[f.name] = value
    return cls(**values)


def raft_frame(msgs: Iterable[m.Message],
               encodings: BatchEncodings | None = None) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "t": "raft",
            "msgs": [message_to_wire(x, encodings) for x in msgs]}


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


# Encoded batches at least this large are written as they are, not copied into a joined piece.
ZERO_COPY_BYTES = 64 * 1024


def encode_raft_frame(msgs: list[m.Message],
                      encodings: BatchEncodings | None = None) -> tuple[bytes, bytes]:
    """A raft frame as (length prefix, body); see the comment above for why not packb."""
    prefix, *pieces = encode_raft_frame_pieces(msgs, encodings)
    return prefix, b"".join(pieces)


def encode_raft_frame_pieces(msgs: list[m.Message],
                             encodings: BatchEncodings | None = None) -> list[bytes]:
    """A whole raft frame (length prefix included) as pieces to write in order: small parts
    joined, encoded batches of ZERO_COPY_BYTES or more left as they are (written straight
    from the encoding, no copy into a frame buffer)."""
    parts = _frame_parts(msgs, encodings)
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
    return [_LEN.pack(sum(len(x) for x in out)), *out]


def _frame_parts(msgs: list[m.Message], encodings: BatchEncodings | None) -> list[bytes]:
    # One Packer per frame: packb builds a Packer per call (about 85% of packing a small value),
    # and a frame packs each field of each message. Not shared between frames: the client
    # encodes from several threads and a Packer is not thread-safe.
    pack = msgpack.Packer(use_bin_type=True).pack
    parts = [_map_header(3), _FRAME_HEAD, _MSGS_KEY, _array_header(len(msgs))]
    for msg in msgs:
        cls = type(msg)
        if not getattr(msg, "batches", None):
            parts.append(pack(message_to_wire(msg)))
            continue
        fields = _SCHEMAS[cls]
        names = _PACKED_NAMES[cls]
        parts.append(_map_header(len(fields) + 1))
        parts.append(_PACKED_KINDS[cls])
        for f in fields:
            value = getattr(msg, f.name)
            parts.append(names[f.name])
            if f.kind != "batches":
                parts.append(pack(value))
                continue
            parts.append(_array_header(len(value)))
            for b in value:
                raw = encodings.encode(b) if encodings is not None else b.encode()
                parts.append(_BIN32.pack(0xC6, len(raw)))
                parts.append(raw)
    return parts


def messages_from_frame(frame: dict[str, Any]) -> list[m.Message]:
    msgs = frame.get("msgs")
    if not isinstance(msgs, list):
        raise WireError(f'raft frame field "msgs" must be an array, got {_type_name(msgs)}')
    return [message_from_wire(x) for x in msgs]


def message_wire_size(msg: m.Message) -> int:
    """A cheap upper-ish estimate of a message's encoded size, for per-peer byte budgets."""
    batches = getattr(msg, "batches", None)
    size = 96 + (sum(b.size + 5 for b in batches) if batches else 0)
    if getattr(msg, "snapshot", None) is not None:
        size += len(msgpack.packb(msg.snapshot, use_bin_type=True))  # rare: a state transfer
    return size
