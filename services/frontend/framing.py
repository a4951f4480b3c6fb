"""Kafka's framing on TCP: every request and response is ``Size => INT32`` followed by Size
bytes. Reading (with the size limit, socket.request.max.bytes) is :mod:`.network_receive`'s;
writing collects the serialised pieces of a response so large payloads (record batches, or
ranges of segment files: services.common.file_records.FileSlice) are sent as they are, never
copied into one buffer.
"""

from __future__ import annotations

import struct

from services.common.file_records import SLICE_MIN_BYTES

_SIZE = struct.Struct(">i")

# Pieces at least this large go to the socket as their own buffer; smaller ones are coalesced.
# A FileSlice (a range of a segment file, sent from the file) is never smaller.
_SEPARATE_CHUNK_BYTES = 16 * 1024
assert SLICE_MIN_BYTES >= _SEPARATE_CHUNK_BYTES


class FrameError(Exception):
    """The peer sent something that is not a frame we accept; the connection must close."""


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

    def finish(self) -> list[bytes | bytearray]:
        """The whole frame, size prefix first."""
        if self._small:
            self._chunks.append(self._small)
            self._small = bytearray()
        return [_SIZE.pack(self._size), *self._chunks]
