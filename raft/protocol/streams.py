"""Frames over a trio stream: the node's connections, its peer links and the trio client.

A thin loop around raft.protocol.framing.FrameDecoder. Cancellation-safe: a read cancelled
inside `receive_some` has taken no bytes, and the bytes of a half-read frame stay in the
decoder, so the next `receive` carries on where a cancelled one stopped (the client's
"whoever waits reads" connection relies on this, raft/client/connection.py).
"""

from __future__ import annotations

from typing import Any

import trio

from raft.protocol.framing import FrameDecoder, decode_body

_READ_CHUNK = 64 * 1024


class FrameReader:
    """Reads frames off a trio stream with a size limit (FrameDecoder's)."""

    __slots__ = ("_stream", "_decoder")

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame_bytes: int) -> None:
        self._stream = stream
        self._decoder = FrameDecoder(max_frame_bytes)

    @property
    def held(self) -> int:
        """Bytes of memory the reader's buffer holds."""
        return self._decoder.held

    def detach_decoder(self) -> FrameDecoder:
        """The decoder, with the bytes read past the last frame, for a reader that takes the
        stream over (raft.node.client_hub); this reader must not be used after."""
        return self._decoder

    async def receive_raw(self) -> bytes | None:
        """The next frame's body, or None on a clean EOF between frames."""
        decoder = self._decoder
        while (body := decoder.next_body()) is None:
            data = await self._stream.receive_some(max(_READ_CHUNK, decoder.wanted()))
            if not data:
                if decoder.buffered:
                    raise decoder.truncated()
                return None
            decoder.feed(data)
        return body

    async def receive(self) -> dict[str, Any] | None:
        """The next decoded frame, or None on a clean EOF between frames."""
        body = await self.receive_raw()
        return None if body is None else decode_body(body)
