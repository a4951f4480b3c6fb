"""Building v2 record batches for tests, the way a producer does (CRC32C over the bytes after
the CRC field)."""

from __future__ import annotations

import struct
import time

import crc32c


def _varint(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)  # zigzag
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(data: bytes | None) -> bytes:
    if data is None:
        return _varint(-1)
    return _varint(len(data)) + data


def record_batch(
    values: list[bytes],
    *,
    keys: list[bytes | None] | None = None,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
    producer_id: int = -1,
) -> bytes:
    """One uncompressed magic-2 batch holding ``values`` (one record each)."""
    if not values:
        raise ValueError("a batch holds at least one record")
    keys = keys or [None] * len(values)
    timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    records = bytearray()
    for delta, (key, value) in enumerate(zip(keys, values, strict=True)):
        body = (
            b"\x00"  # attributes
            + _varint(0)  # timestamp delta
            + _varint(delta)  # offset delta
            + _bytes_field(key)
            + _bytes_field(value)
            + _varint(0)  # headers
        )
        records += _varint(len(body)) + body
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            0,  # attributes
            len(values) - 1,  # last offset delta
            timestamp,  # base timestamp
            timestamp,  # max timestamp
            producer_id,
            -1,  # producer epoch
            -1,  # base sequence
            len(values),
        )
        + bytes(records)
    )
    crc = crc32c.crc32c(after_crc)
    header_rest = struct.pack(">ibI", 0, 2, crc)  # partition leader epoch, magic, crc
    batch_length = len(header_rest) + len(after_crc)
    return struct.pack(">qi", base_offset, batch_length) + header_rest + after_crc


def batch_offsets(records: bytes) -> list[tuple[int, int]]:
    """(base offset, record count) of each whole batch in ``records``."""
    out = []
    pos = 0
    while pos + 61 <= len(records):
        base_offset, length = struct.unpack_from(">qi", records, pos)
        if pos + 12 + length > len(records):
            break
        (count,) = struct.unpack_from(">i", records, pos + 57)
        out.append((base_offset, count))
        pos += 12 + length
    return out
