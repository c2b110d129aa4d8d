"""Frames: the one implementation of raftlog's framing, for every speaker of the protocol.

Frame = 4-byte big-endian unsigned length N, then N bytes of msgpack encoding a map (bin type on,
raw off). Every map carries `"v": 1` and a type tag `"t"`. One listening port serves both peers and
clients; the first frame of a connection (`hello`) says which one is talking.

Why frames are checked strictly here rather than in the node: every byte that arrives comes from
an untrusted socket. The decoder refuses an oversized frame from its 4-byte header alone (the body
is never buffered, so a hostile length cannot make us allocate it), and each decoding step raises
`WireError` with a message that says what the sender did wrong. The node turns that into an
`{"t": "error"}` frame and closes the connection; everyone else keeps being served.

`FrameDecoder` is sans-IO (bytes in, frames out) so that the trio reader (raft.protocol.streams),
the blocking socket reader (raft.protocol.blocking, for Spark threads and the bench's parent) and
the bench's pipelined generators share one parser and one set of limits.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from raft.core.types import ErrorCode

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
_LEN = struct.Struct(">I")
LEN_SIZE = _LEN.size
pack_length = _LEN.pack


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


# -- encoding ---------------------------------------------------------------------------------------

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


# A bytes value at least this large is sent as its own piece by encode_frame_pieces.
PIECE_BYTES = 64 * 1024
_BIN32_HEAD = struct.Struct(">BI")


def encode_frame_pieces(obj: dict[str, Any]) -> list[bytes]:
    """A frame (length prefix first) as pieces to write in order: the same bytes as
    encode_frame, but each bytes value of PIECE_BYTES or more is a piece of its own, the object
    itself, not copied into the packed body. A blocking sender of large payloads (a Spark
    task's staged batches) copied each one three times to frame it (packb's buffer, its bytes,
    the prefix join). msgpack packs such a value as bin32 either way."""
    if "v" not in obj:
        obj = {"v": PROTOCOL_VERSION, **obj}
    pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack
    n = len(obj)
    small = [bytes([0x80 | n]) if n < 16 else
             b"\xde" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdf" + n.to_bytes(4, "big")]
    pieces: list[bytes] = []
    for key, value in obj.items():
        small.append(pack(key))
        if type(value) is bytes and len(value) >= PIECE_BYTES:
            small.append(_BIN32_HEAD.pack(0xC6, len(value)))
            pieces.append(b"".join(small))
            pieces.append(value)
            small = []
        else:
            small.append(pack(value))
    if small:
        pieces.append(b"".join(small))
    return [_LEN.pack(sum(len(p) for p in pieces)), *pieces]


# -- decoding ---------------------------------------------------------------------------------------

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
    # `type(v) is int`: msgpack keeps true and 1 apart, Python does not (True == 1).
    if type(v) is not int or v != PROTOCOL_VERSION:
        raise WireError(f'unsupported protocol version "v"={v!r}; this server speaks v='
                        f'{PROTOCOL_VERSION} (add "v": 1 to every frame)')
    t = obj.get("t")
    if not isinstance(t, str):
        raise WireError(f'frame needs a string type tag "t", got {t!r}')
    return obj


# A frame body at least this large is gathered as the reads it arrives in and joined once when
# it is whole, instead of being appended to the decoder's buffer read by read: a bytearray grows
# to the exact size on a large append, so a 576 KiB recovery chunk arriving in 64 KiB reads was
# copied again at every read, 2-5x per byte, and once more out of the buffer (issue 28: 22% of a
# recovering follower's CPU).
GATHER_BYTES = 64 * 1024


class FrameDecoder:
    """Bytes in, frames out, with a size limit; no I/O.

    Holds at most one frame plus what arrived after it. The length header is checked before any
    body byte is kept, so an oversized frame costs 4 bytes of memory, not N. Consumed bytes are
    dropped lazily (once they are half the buffer), so many small frames in one read cost no
    copy per frame. A body of GATHER_BYTES or more is kept as the reads that carry it (what one
    read holds beyond it goes to the buffer) and joined once: one copy per byte, whatever the
    number of reads."""

    __slots__ = ("_buf", "_pos", "max_frame_bytes", "_parts", "_need", "_got")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame_bytes = max_frame_bytes
        self._parts: list[bytes] | None = None  # the large body being gathered, read by read
        self._need = 0  # bytes it still lacks
        self._got = 0  # bytes of it gathered

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._need:
            if type(data) is not bytes:  # the caller may reuse its buffer: keep our own copy
                data = bytes(data)
            n = len(data)
            if n <= self._need:
                self._parts.append(data)  # type: ignore[union-attr]
                self._need -= n
                self._got += n
                return
            self._parts.append(data[:self._need])  # type: ignore[union-attr]
            self._got += self._need
            data = data[self._need:]  # the next frame(s): the body is whole, taken first
            self._need = 0
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data
        if self._parts is None:
            self._gather()

    def _gather(self) -> None:
        """If the buffer starts with a large frame it does not hold whole, move its body bytes
        out of the buffer and gather the rest read by read (the buffer holds nothing past it)."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < LEN_SIZE:
            return
        (n,) = _LEN.unpack_from(buf, pos)
        have = len(buf) - pos - LEN_SIZE
        if n < GATHER_BYTES or n > self.max_frame_bytes or have >= n:
            return  # small, refused by _next_span, or already whole
        with memoryview(buf) as view:
            self._parts = [bytes(view[pos + LEN_SIZE:])]
        self._need, self._got = n - have, have
        del buf[:]
        self._pos = 0

    def _gathered(self) -> bytes | None:
        """The gathered large body once whole (joined: its one copy), else None."""
        if self._parts is None or self._need:
            return None
        parts, self._parts, self._got = self._parts, None, 0
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._gather()  # the buffer may start with the next large frame
        return body

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as a frame."""
        gathered = LEN_SIZE + self._got if self._parts is not None else 0
        return len(self._buf) - self._pos + gathered

    @property
    def held(self) -> int:
        """Bytes of memory the buffer holds (consumed ones not yet dropped included)."""
        return len(self._buf) + self._got

    def wanted(self) -> int:
        """How many more bytes the frame in progress needs (at least 1): a reader sizes its
        next read by it, so a large frame is read in few calls."""
        if self._need:
            return self._need
        have = len(self._buf) - self._pos
        if have < LEN_SIZE:
            return LEN_SIZE - have
        (n,) = _LEN.unpack_from(self._buf, self._pos)
        return max(1, LEN_SIZE + n - have)

    def _next_span(self) -> tuple[int, int] | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < LEN_SIZE:
            return None
        (n,) = _LEN.unpack_from(buf, pos)
        if n > self.max_frame_bytes:
            raise FrameTooLarge(n, self.max_frame_bytes)
        start = pos + LEN_SIZE
        if len(buf) - start < n:
            return None
        self._pos = start + n
        return start, start + n

    def next_body(self) -> bytes | None:
        """The next whole frame's body (one copy out of the buffer, or the join of a gathered
        one), or None for now."""
        if self._parts is not None:
            return self._gathered()
        span = self._next_span()
        if span is None:
            return None
        with memoryview(self._buf) as view:  # one copy, not two (a bytearray slice copies)
            return bytes(view[span[0]:span[1]])

    def next_frame(self) -> dict[str, Any] | None:
        """The next whole frame decoded straight from the buffer (no copy of the body), or
        None for now."""
        if self._parts is not None:
            body = self._gathered()
            return None if body is None else decode_body(body)
        span = self._next_span()
        if span is None:
            return None
        with memoryview(self._buf) as view:
            return decode_body(view[span[0]:span[1]])

    def truncated(self) -> WireError:
        """What to raise when the connection ends with part of a frame buffered."""
        if self._parts is not None:
            return WireError(f"connection closed inside a frame: got {self._got} of "
                             f"{self._got + self._need} body bytes")
        have = len(self._buf) - self._pos
        if have < LEN_SIZE:
            return WireError(f"connection closed inside a frame header ({have} of "
                             f"{LEN_SIZE} bytes)")
        (n,) = _LEN.unpack_from(self._buf, self._pos)
        return WireError(f"connection closed inside a frame: got {have - LEN_SIZE} of {n} body "
                         f"bytes")
