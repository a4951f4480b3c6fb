"""Kafka's framing on TCP: every request and response is ``Size => INT32`` followed by Size
bytes. Reading enforces the size limit (socket.request.max.bytes); writing collects the
serialised pieces of a response so large payloads (record batches) are sent as they are,
never copied into one buffer.
"""

from __future__ import annotations

import asyncio
import struct

SIZE = struct.Struct(">i")

# Pieces at least this large go to the socket as their own buffer; smaller ones are coalesced.
_SEPARATE_CHUNK_BYTES = 16 * 1024


class FrameError(Exception):
    """The peer sent something that is not a frame we accept; the connection must close."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """The next frame's body, or None when the peer closed the connection between frames.

    Raises :class:`FrameError` for a negative or too large size and for a frame cut short.
    """
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise FrameError("connection closed inside a size prefix") from None
    (size,) = SIZE.unpack(prefix)
    if size < 0 or size > max_bytes:
        raise FrameError(f"frame size {size} outside 0..{max_bytes}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        raise FrameError(f"connection closed after {len(e.partial)} of {size} bytes") from None


class FrameWriter:
    """A write-only sink for kio's entity writers that yields the finished frame as a list of
    buffers (for ``writelines``): small pieces coalesced, large ones passed through untouched.
    """

    __slots__ = ("_chunks", "_size", "_small")

    def __init__(self) -> None:
        self._chunks: list[bytes | bytearray] = []
        self._small = bytearray()
        self._size = 0

    def write(self, data: bytes) -> int:
        n = len(data)
        self._size += n
        if n >= _SEPARATE_CHUNK_BYTES:
            if self._small:
                self._chunks.append(self._small)
                self._small = bytearray()
            self._chunks.append(data)
        else:
            self._small += data
        return n

    @property
    def size(self) -> int:
        """Bytes written so far (the frame's size, without its prefix)."""
        return self._size

    def finish(self) -> list[bytes | bytearray]:
        """The whole frame, size prefix first."""
        if self._small:
            self._chunks.append(self._small)
            self._small = bytearray()
        return [SIZE.pack(self._size), *self._chunks]
