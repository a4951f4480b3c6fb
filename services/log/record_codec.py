"""The records inside a v2 record batch (Kafka's ``DefaultRecord``) and the batch compression
codecs. Only two places look inside batches: the log cleaner, and the key check of appends to
compacted topics; the produce and fetch paths never do (see :mod:`services.log.record_batch`).

After the 61-byte batch header come ``recordCount`` records, compressed as a whole when the
batch's codec (attributes bits 0-2) is not 0::

    Record =>
      length          varint   bytes of the rest of the record
      attributes      i8       unused (0)
      timestampDelta  varlong  record timestamp minus the batch's baseTimestamp
      offsetDelta     varint   record offset minus the batch's baseOffset
      keyLength       varint   -1: a null key
      key             bytes
      valueLength     varint   -1: a null value (a tombstone)
      value           bytes
      headerCount     varint
      Header          [headerKeyLength varint, headerKey, headerValueLength varint, value]

Varints are zigzag encoded, seven bits a byte, least significant group first. Codecs, as the
Java client writes and reads them:

- 1 gzip: one gzip stream.
- 2 snappy: raw snappy (what librdkafka writes) or the xerial framing of the Java client
  (``\\x82SNAPPY\\x00``, two i32 versions, then blocks of i32 length + raw snappy). Both are
  read; :func:`compress` writes the framing the batch came in.
- 3 lz4: an LZ4 frame. Written as Kafka's ``KafkaLZ4BlockOutputStream`` does: independent
  64 KiB blocks, no checksums (older Java readers refuse linked blocks).
- 4 zstd: one zstd frame.

A batch whose delete-horizon attribute (bit 6, KIP-534) is set carries in ``baseTimestamp`` the
time after which the log cleaner may remove its tombstones; record timestamps stay
``baseTimestamp + timestampDelta``, so the deltas are rewritten with it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import cramjam

from services.common.errors import ErrorCode, KafkaError
from services.common.varints import VarintError, decode_varint, encode_varint

from .record_batch import (
    CONTROL_BIT,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    Batch,
    BatchHeader,
    compute_crc,
)

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
DELETE_HORIZON_BIT = 0x40

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

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT32 = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")


class RecordError(ValueError):
    """Records that cannot be decoded: truncated, overlong varints, or a bad compressed
    payload."""


class Record(NamedTuple):
    """One decoded record; ``headers`` are kept encoded (header count included)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: bytes
    attributes: int = 0


# ----------------------------------------------------------------------------- varints


def read_varint(buffer: bytes, position: int) -> tuple[int, int]:
    """The zigzag varint at ``position`` and the position after it."""
    try:
        return decode_varint(buffer, position)
    except VarintError as exc:
        raise RecordError(str(exc)) from None


write_varint = encode_varint


# ------------------------------------------------------------------------------ codecs


def decompress(codec: int, data: bytes | memoryview) -> bytes:
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


def is_xerial(data: bytes | memoryview) -> bool:
    return bytes(data[:len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC


def _xerial_decompress(data: bytes | memoryview) -> bytes:
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


# ----------------------------------------------------------------------------- records


def records_payload(batch: bytes | memoryview, header: BatchHeader) -> bytes:
    """The uncompressed records of ``batch`` (the whole batch, header first)."""
    return decompress(header.compression, memoryview(batch)[HEADER_SIZE:header.size])


def decode_records(batch: bytes | memoryview, header: BatchHeader) -> list[Record]:
    """Every record of ``batch``; exactly ``recordCount`` records must fill the payload."""
    payload = records_payload(batch, header)
    records: list[Record] = []
    position = 0
    for _ in range(header.record_count):
        length, position = read_varint(payload, position)
        end = position + length
        if length < 1 or end > len(payload):
            raise RecordError(f"record of {length} bytes overruns the batch")
        records.append(_decode_record(payload, position, end))
        position = end
    if position != len(payload):
        raise RecordError(f"{len(payload) - position} bytes after the last record")
    return records


def _decode_record(payload: bytes, position: int, end: int) -> Record:
    attributes = payload[position]
    timestamp_delta, position = read_varint(payload, position + 1)
    offset_delta, position = read_varint(payload, position)
    if position > end:
        raise RecordError("record fields overrun the record")
    key, position = _read_bytes(payload, position, end)
    value, position = _read_bytes(payload, position, end)
    if position >= end:
        raise RecordError("record without a header count")
    return Record(offset_delta, timestamp_delta, key, value, payload[position:end], attributes)


def _read_bytes(payload: bytes, position: int, end: int) -> tuple[bytes | None, int]:
    length, position = read_varint(payload, position)
    if length < 0:
        return None, position
    if position + length > end:
        raise RecordError(f"field of {length} bytes overruns its record")
    return payload[position:position + length], position + length


def encode_record(record: Record) -> bytes:
    """One record, length prefix included."""
    body = b"".join((
        bytes((record.attributes,)),
        write_varint(record.timestamp_delta),
        write_varint(record.offset_delta),
        write_varint(-1) if record.key is None else write_varint(len(record.key)) + record.key,
        write_varint(-1) if record.value is None
        else write_varint(len(record.value)) + record.value,
        record.headers,
    ))
    return write_varint(len(body)) + body


def encode_batch(header: BatchHeader, records: Sequence[Record], xerial: bool = False) -> bytes:
    """A batch with the fields of ``header`` (batchLength, crc and recordCount are computed)
    holding ``records``, compressed with the codec in its attributes; the CRC32C is new."""
    payload = compress(header.compression, b"".join(encode_record(r) for r in records), xerial)
    length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    buffer = bytearray(_HEADER.pack(
        header.base_offset, length, header.partition_leader_epoch, MAGIC, 0,
        header.attributes, header.last_offset_delta, header.base_timestamp,
        header.max_timestamp, header.producer_id, header.producer_epoch,
        header.base_sequence, len(records),
    ))
    buffer += payload
    struct.pack_into(">I", buffer, CRC_OFFSET, compute_crc(buffer, 0, len(buffer)))
    return bytes(buffer)


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (KIP-534), or None when it has none."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_BIT else None


# ------------------------------------------------------------------ compacted-topic check


def check_keys(records: bytes | bytearray | memoryview, batches: Sequence[Batch]) -> None:
    """Kafka's rule for compacted topics (``LogValidator.validateKey``): every record needs a
    key. Raises INVALID_RECORD for a record without one (or records that cannot be decoded,
    as Kafka's ``InvalidRecordException``), CORRUPT_MESSAGE for a payload that does not
    decompress. Control batches are not checked."""
    view = memoryview(records)
    for position, header in batches:
        if header.attributes & CONTROL_BIT:
            continue
        batch = view[position:position + header.size]
        try:
            payload = records_payload(batch, header)
        except RecordError as exc:
            raise KafkaError(ErrorCode.corrupt_message, str(exc)) from None
        try:
            _check_batch_keys(payload, header.record_count)
        except RecordError as exc:
            raise KafkaError(ErrorCode.invalid_record, f"invalid record: {exc}") from None


def _check_batch_keys(payload: bytes, count: int) -> None:
    position = 0
    for _ in range(count):
        length, position = read_varint(payload, position)
        end = position + length
        if length < 1 or end > len(payload):
            raise RecordError(f"record of {length} bytes overruns the batch")
        _, after = read_varint(payload, position + 1)  # timestamp delta
        _, after = read_varint(payload, after)  # offset delta
        key_length, after = read_varint(payload, after)
        if after > end:
            raise RecordError("record fields overrun the record")
        if key_length < 0:
            raise KafkaError(
                ErrorCode.invalid_record,
                "compacted topic cannot accept a record without a key",
            )
        position = end
    if position != len(payload):
        raise RecordError(f"{len(payload) - position} bytes after the last record")

