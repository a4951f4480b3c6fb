"""The compression codecs of a record batch (Kafka's ``CompressionType``): attributes bits 0-2
name the codec that compresses the batch's records as a whole (the header stays plain).
Codecs, as the Java client writes and reads them:

- 0 none.
- 1 gzip: one gzip stream.
- 2 snappy: raw snappy (what librdkafka writes) or the xerial framing of the Java client
  (``\\x82SNAPPY\\x00``, two i32 versions, then blocks of i32 length + raw snappy). Both are
  read; :func:`compress` writes the framing it is asked for, so a rewritten batch keeps the
  framing it came in.
- 3 lz4: an LZ4 frame. Written as Kafka's ``KafkaLZ4BlockOutputStream`` does: independent
  64 KiB blocks, no checksums (older Java readers refuse linked blocks).
- 4 zstd: one zstd frame.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import cramjam

from .record_batch import Buffer, RecordError

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
# The highest codec id Kafka knows.
MAX_CODEC = ZSTD

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
# Magic, FLG (version 01, independent blocks), BD (64 KiB blocks), header checksum.
_LZ4_FRAME_HEADER = bytes.fromhex("04224d18604082")
_LZ4_BLOCK = 64 * 1024
_LZ4_UNCOMPRESSED = 0x80000000
_LZ4_END_MARK = b"\x00\x00\x00\x00"
# Kafka's default levels for the codecs that have one.
_GZIP_LEVEL = 6
_ZSTD_LEVEL = 3

_INT32 = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")


# The most the records of one batch may decompress to. Kafka bounds a batch's compressed size
# (max.message.bytes) but not what it expands to; a few KB of zstd can claim gigabytes, which
# would take a log node's memory (a compacted topic's append decodes its records' keys). A
# batch beyond this is refused as corrupt, having cost at most this much memory.
MAX_DECOMPRESSED_BYTES = 256 << 20
# The first output buffer tried, as a multiple of the compressed size (grown 8-fold when short).
_FIRST_RATIO = 8
_MIN_FIRST_BYTES = 64 << 10


def decompress(codec: int, data: Buffer, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The records of a batch compressed with ``codec``, at most ``limit`` bytes of them;
    raises :class:`RecordError` (also for more than ``limit`` bytes)."""
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return _bounded(cramjam.gzip.decompress_into, data, limit)
        if codec == SNAPPY:
            if is_xerial(data):
                return _xerial_decompress(data, limit)
            return _snappy_raw(data, limit)
        if codec == LZ4:
            return _bounded(cramjam.lz4.decompress_into, data, limit)
        if codec == ZSTD:
            return _bounded(cramjam.zstd.decompress_into, data, limit)
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - each codec has its own error types
        raise RecordError(f"cannot decompress codec {codec}: {exc}") from None
    raise RecordError(f"unknown compression codec {codec}")


def _too_large(limit: int) -> RecordError:
    return RecordError(f"the records decompress to more than {limit} bytes")


def _bounded(decompress_into: Callable[[Buffer, bytearray], int], data: Buffer,
             limit: int) -> bytes:
    """Decompress into buffers of growing size, never more than ``limit`` bytes: a codec
    stops with "failed to write whole buffer" as soon as its output does not fit."""
    size = min(max(len(data) * _FIRST_RATIO, _MIN_FIRST_BYTES), limit)
    while True:
        out = bytearray(size)
        try:
            written = decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            if "whole buffer" not in str(exc):
                raise
            if size >= limit:
                raise _too_large(limit) from None
            size = min(size * 8, limit + 1)
            continue
        if written > limit:
            raise _too_large(limit)
        return bytes(memoryview(out)[:written])


def _snappy_raw(data: Buffer, limit: int) -> bytes:
    """Raw snappy states its decompressed length first: checked before anything is made."""
    if cramjam.snappy.decompress_raw_len(data) > limit:
        raise _too_large(limit)
    return bytes(cramjam.snappy.decompress_raw(data))


def compress(codec: int, data: bytes, xerial: bool = False) -> bytes:
    """``data`` compressed with ``codec`` the way Kafka writes it (snappy in the xerial
    framing if ``xerial``)."""
    if codec == NONE:
        return data
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data, level=_GZIP_LEVEL))
    if codec == SNAPPY:
        if not xerial:
            return bytes(cramjam.snappy.compress_raw(data))
        out = bytearray(_XERIAL_HEADER)
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[start:start + _XERIAL_BLOCK]))
            out += _INT32.pack(len(block)) + block
        return bytes(out)
    if codec == LZ4:
        return _lz4_frame(data)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL))
    raise ValueError(f"unknown compression codec {codec}")


def is_xerial(data: Buffer) -> bool:
    """Whether snappy-compressed ``data`` is in the xerial framing."""
    return bytes(data[:len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC


def _xerial_decompress(data: Buffer, limit: int) -> bytes:
    view = memoryview(data)
    out = bytearray()
    position = len(_XERIAL_HEADER)
    while position < len(view):
        if position + 4 > len(view):
            raise RecordError("truncated xerial snappy block length")
        (length,) = _INT32.unpack_from(view, position)
        position += 4
        if length < 0 or position + length > len(view):
            raise RecordError("truncated xerial snappy block")
        block = view[position:position + length]
        if len(out) + cramjam.snappy.decompress_raw_len(block) > limit:
            raise _too_large(limit)
        out += cramjam.snappy.decompress_raw(block)
        position += length
    return bytes(out)


def _lz4_frame(data: bytes) -> bytes:
    out = bytearray(_LZ4_FRAME_HEADER)
    view = memoryview(data)
    for start in range(0, len(view), _LZ4_BLOCK):
        chunk = view[start:start + _LZ4_BLOCK]
        packed = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(packed) < len(chunk):
            out += _UINT32_LE.pack(len(packed)) + packed
        else:
            out += _UINT32_LE.pack(len(chunk) | _LZ4_UNCOMPRESSED) + chunk
    out += _LZ4_END_MARK
    return bytes(out)
