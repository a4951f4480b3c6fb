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


def decompress(codec: int, data: Buffer) -> bytes:
    """The records of a batch compressed with ``codec``; raises :class:`RecordError`."""
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == SNAPPY:
            if is_xerial(data):
                return _xerial_decompress(data)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - each codec has its own error types
        raise RecordError(f"cannot decompress codec {codec}: {exc}") from None
    raise RecordError(f"unknown compression codec {codec}")


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


def _xerial_decompress(data: Buffer) -> bytes:
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
        out += cramjam.snappy.decompress_raw(view[position:position + length])
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
