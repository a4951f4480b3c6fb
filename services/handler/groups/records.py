"""The record batches that carry the records of ``__consumer_offsets`` (their formats are in
:mod:`..coordinator_records`): v2 record batches (magic 2, CRC32C), uncompressed; reading skips
control batches and, with a warning, compressed ones (nothing of ours writes them).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from crc32c import crc32c

from ..coordinator.schema import Reader, RecordFormatError, varint

log = logging.getLogger(__name__)


# --- record batches ----------------------------------------------------------------------------

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = _BATCH_HEADER.size  # 61
LOG_OVERHEAD = 12
_CRC_COVERS_FROM = 21
_COMPRESSION_MASK = 0x07
_CONTROL_BIT = 0x20


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch as read back: its offset, key and value (None: a tombstone)."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = -1


@dataclass(slots=True)
class BatchBuilder:
    """Records to append together as one v2 batch (all or nothing)."""

    records: list[tuple[bytes, bytes | None]] = field(default_factory=list)

    def add(self, key: bytes, value: bytes | None) -> None:
        self.records.append((key, value))

    def __len__(self) -> int:
        return len(self.records)

    def build(self, timestamp: int) -> bytes:
        return build_batch(self.records, timestamp)


def _nullable(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def build_batch(records: list[tuple[bytes, bytes | None]], timestamp: int) -> bytes:
    """One uncompressed v2 batch of ``records`` (key, value) stamped ``timestamp``; offsets
    are assigned by the log node."""
    if not records:
        raise ValueError("a batch needs at least one record")
    body = bytearray()
    for delta, (key, value) in enumerate(records):
        record = b"\x00" + varint(0) + varint(delta) + _nullable(key) + _nullable(value) + \
            varint(0)
        body += varint(len(record)) + record
    count = len(records)
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, timestamp, timestamp, -1, -1, -1,
                            count) + bytes(body)
    crc = crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, the rest
    return struct.pack(">qiibI", 0, length, -1, 2, crc) + after_crc


def read_records(data: bytes) -> Iterator[Record]:
    """The records of a run of whole v2 batches, in offset order. Control batches are skipped,
    as are compressed batches (logged); a truncated tail ends the run."""
    view = memoryview(data)
    pos = 0
    while pos + BATCH_HEADER_SIZE <= len(view):
        (base_offset, length, _epoch, magic, _crc, attributes, _last_delta, base_timestamp,
         _max_ts, _pid, _pepoch, _seq, count) = _BATCH_HEADER.unpack_from(view, pos)
        end = pos + LOG_OVERHEAD + length
        if length < BATCH_HEADER_SIZE - LOG_OVERHEAD or end > len(view):
            return
        if magic != 2:
            raise RecordFormatError(f"record batch of magic {magic}")
        if attributes & _CONTROL_BIT:
            pos = end
            continue
        if attributes & _COMPRESSION_MASK:
            log.warning("skipping a compressed batch at offset %d of the offsets topic",
                        base_offset)
            pos = end
            continue
        r = Reader(view[pos + BATCH_HEADER_SIZE:end])
        for _ in range(count):
            size = r.varint()
            start = r.pos
            r.int8()  # attributes
            timestamp_delta = r.varint()
            offset_delta = r.varint()
            key_size = r.varint()
            key = None if key_size < 0 else bytes(r._take(key_size))
            value_size = r.varint()
            value = None if value_size < 0 else bytes(r._take(value_size))
            for _header in range(r.varint()):
                r._take(r.varint())
                header_value = r.varint()
                if header_value >= 0:
                    r._take(header_value)
            if r.pos - start != size:
                raise RecordFormatError("record length does not match its content")
            yield Record(base_offset + offset_delta, key, value, base_timestamp + timestamp_delta)
        pos = end


def batches_end(data: bytes) -> int | None:
    """The offset after the last whole batch of ``data`` (None when there is none)."""
    view = memoryview(data)
    pos = 0
    end_offset = None
    while pos + BATCH_HEADER_SIZE <= len(view):
        header = _BATCH_HEADER.unpack_from(view, pos)
        base_offset, length, last_delta = header[0], header[1], header[6]
        end = pos + LOG_OVERHEAD + length
        if length < BATCH_HEADER_SIZE - LOG_OVERHEAD or end > len(view):
            break
        end_offset = base_offset + last_delta + 1
        pos = end
    return end_offset
