"""Builds v2 record batches for tests, byte by byte (records use zigzag varints; CRC32C over
the bytes after the CRC field, as a producer computes it), so tests do not depend on the code
under test to produce their input.

    RecordBatch => BaseOffset:int64 BatchLength:int32 PartitionLeaderEpoch:int32 Magic:int8
                   CRC:uint32 Attributes:int16 LastOffsetDelta:int32 BaseTimestamp:int64
                   MaxTimestamp:int64 ProducerId:int64 ProducerEpoch:int16 BaseSequence:int32
                   RecordCount:int32 Records
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from crc32c import crc32c


def varint(value: int) -> bytes:
    """Kafka's signed varint: zigzag, then 7 bits per byte, least significant first."""
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = encoded & 0x7F
        encoded >>= 7
        if encoded:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _nullable(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def record(
    offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None
) -> bytes:
    body = (
        b"\x00" + varint(timestamp_delta) + varint(offset_delta) + _nullable(key)
        + _nullable(value) + varint(0)
    )
    return varint(len(body)) + body


def build_batch(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    base_offset: int = 0,
    base_timestamp: int = 1_700_000_000_000,
    timestamp_step: int = 1,
    attributes: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    magic: int = 2,
    record_count: int | None = None,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """A valid batch of one record per value (record i has key ``keys[i]``, default ``k<i>``,
    and timestamp base + i * step); the keyword overrides make deliberately inconsistent headers
    (the CRC stays right)."""
    if keys is None:
        keys = [f"k{i}".encode() for i in range(len(values))]
    records = b"".join(
        record(i, i * timestamp_step, key, value)
        for i, (key, value) in enumerate(zip(keys, values, strict=True))
    )
    count = len(values) if record_count is None else record_count
    delta = len(values) - 1 if last_offset_delta is None else last_offset_delta
    if max_timestamp is None:
        max_timestamp = base_timestamp + max(0, (len(values) - 1) * timestamp_step)
    after_crc = struct.pack(
        ">hiqqqhii", attributes, delta, base_timestamp, max_timestamp, producer_id,
        producer_epoch, base_sequence, count,
    ) + records
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, partition_leader_epoch, magic,
                       crc32c(after_crc)) + after_crc


def values(n: int, size: int = 10, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}".encode().ljust(size, b".") for i in range(n)]


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
