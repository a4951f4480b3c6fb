"""Record batches (Kafka's ``DefaultRecordBatch``, magic 2) seen from the broker: headers only.

A produce request carries one or more record batches, concatenated. Every batch starts with a
61-byte header (big-endian), followed by the records, which this module never decodes:

    RecordBatch =>
      baseOffset            i64   offset of the first record; the broker assigns it
      batchLength           i32   bytes after this field (the batch is batchLength + 12 bytes)
      partitionLeaderEpoch  i32
      magic                 i8    2
      crc                   u32   CRC32C (Castagnoli) of attributes .. end of batch
      attributes            i16   bits 0-2 compression, 3 timestamp type (1 = LogAppendTime),
                                  4 transactional, 5 control, 6 delete horizon
      lastOffsetDelta       i32   offset of the last record minus baseOffset
      baseTimestamp         i64
      maxTimestamp          i64
      producerId            i64
      producerEpoch         i16
      baseSequence          i32
      recordCount           i32
      records               [Record]

The CRC does not cover baseOffset, batchLength or partitionLeaderEpoch, so the broker assigns
offsets by patching baseOffset in place and the CRC stays valid. Stamping LogAppendTime changes
attributes and maxTimestamp, which the CRC covers, so it is recomputed then.

Validation of a leader append mirrors the Java broker (``UnifiedLog.analyzeAndValidateRecords``
then ``LogValidator``): first every batch's framing, magic, client base offset, size and CRC,
then every batch's offset range and record count. Any failure rejects the whole partition
append; nothing of it may be stored.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

from services.common.errors import ErrorCode, KafkaError

MAGIC = 2

# baseOffset + batchLength: the bytes before what batchLength counts.
LOG_OVERHEAD = 12
HEADER_SIZE = 61
# The smallest legal batchLength: a header and no records.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
RECORD_COUNT_OFFSET = 57

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# none, gzip, snappy, lz4, zstd
MAX_COMPRESSION_ID = 4

# Every record takes at least seven bytes (length, attributes, timestamp delta, offset delta,
# key length, value length and header count varints), so an uncompressed batch cannot hold more
# records than that allows.
MIN_RECORD_SIZE = 7

NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_LENGTH = struct.Struct(">i")
_MAGIC = struct.Struct(">b")

assert _HEADER.size == HEADER_SIZE


class BatchHeader(NamedTuple):
    """The decoded 61-byte header of one record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


class Batch(NamedTuple):
    """A batch located in a buffer or file: where it starts, and its header."""

    position: int
    header: BatchHeader


def read_header(buffer: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """The header of the batch at ``position``; the caller ensures 61 bytes are there."""
    return BatchHeader._make(_HEADER.unpack_from(buffer, position))


def batch_length_at(buffer: bytes | bytearray | memoryview, position: int) -> int:
    """The batchLength field of the batch at ``position`` (12 bytes must be there)."""
    return _LENGTH.unpack_from(buffer, position + LENGTH_OFFSET)[0]


def compute_crc(buffer: bytes | bytearray | memoryview, position: int, size: int) -> int:
    """CRC32C of the part of the batch at ``position`` that the crc field covers."""
    view = memoryview(buffer)
    return crc32c(view[position + ATTRIBUTES_OFFSET:position + size])


def _corrupt(message: str) -> KafkaError:
    return KafkaError(ErrorCode.corrupt_message, message)


def _invalid(message: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_record, message)


def validate_append(
    records: bytes | bytearray | memoryview, max_message_bytes: int
) -> list[Batch]:
    """Validate the batches of one partition's append, as a leader receives them from clients.

    Returns every batch with its position in ``records``. Raises :class:`KafkaError` with:
    CORRUPT_MESSAGE for a truncated or undersized batch, a CRC mismatch or an unknown compression
    codec; UNSUPPORTED_FOR_MESSAGE_FORMAT for magic other than 2; MESSAGE_TOO_LARGE for a batch
    over ``max_message_bytes``; INVALID_RECORD for no batches at all, a non-zero client base
    offset, an offset range that disagrees with the record count, or an idempotent batch without
    a sequence number (the Java broker's ``InvalidRecordException`` cases). A partial batch at
    the end is refused rather than dropped (the Java broker trims it silently), so that a
    damaged request is never half-stored.
    """
    view = memoryview(records)
    end = len(view)
    if end == 0:
        raise _invalid("an append needs at least one record batch")
    batches: list[Batch] = []
    position = 0
    while position < end:
        remaining = end - position
        # Magic sits at byte 16 in every message format, so old formats are recognised even
        # when their (smaller) header would not pass the v2 size checks.
        if remaining <= MAGIC_OFFSET:
            raise _corrupt(f"truncated record batch at byte {position}")
        magic = _MAGIC.unpack_from(view, position + MAGIC_OFFSET)[0]
        if magic != MAGIC:
            raise KafkaError(
                ErrorCode.unsupported_for_message_format,
                f"record batch magic {magic} is not supported (only {MAGIC})",
            )
        if remaining < HEADER_SIZE:
            raise _corrupt(f"truncated record batch header at byte {position}")
        header = read_header(view, position)
        if header.batch_length < MIN_BATCH_LENGTH:
            raise _corrupt(f"record batch length {header.batch_length} is below the minimum")
        size = header.size
        if size > remaining:
            raise _corrupt(
                f"truncated record batch at byte {position}: {size} bytes declared, "
                f"{remaining} present"
            )
        if header.base_offset != 0:
            raise _invalid(f"the base offset of a produced batch must be 0, not "
                           f"{header.base_offset}")
        if size > max_message_bytes:
            raise KafkaError(
                ErrorCode.message_too_large,
                f"record batch of {size} bytes exceeds max.message.bytes {max_message_bytes}",
            )
        if compute_crc(view, position, size) != header.crc:
            raise _corrupt(f"record batch at byte {position} fails its CRC check")
        if header.compression > MAX_COMPRESSION_ID:
            raise _corrupt(f"unknown compression codec {header.compression}")
        batches.append(Batch(position, header))
        position += size
    for batch in batches:
        _check_counts(batch.header)
    return batches


def _check_counts(header: BatchHeader) -> None:
    if header.last_offset_delta < 0:
        raise _invalid(f"record batch has a negative offset range ({header.last_offset_delta})")
    if header.record_count <= 0:
        raise _invalid(f"invalid record count {header.record_count}")
    if header.last_offset_delta + 1 != header.record_count:
        raise _invalid(
            f"offset range of {header.last_offset_delta + 1} disagrees with record count "
            f"{header.record_count}"
        )
    if header.compression == 0 and (
        header.record_count * MIN_RECORD_SIZE > header.size - HEADER_SIZE
    ):
        raise _invalid(
            f"{header.record_count} records cannot fit in {header.size - HEADER_SIZE} bytes"
        )
    if header.producer_id >= 0 and header.base_sequence < 0 and not header.is_control:
        raise _invalid(
            f"invalid sequence number {header.base_sequence} for producer {header.producer_id}"
        )


def assign_offsets(
    buffer: bytearray,
    batches: list[Batch],
    first_offset: int,
    log_append_time_ms: int | None,
) -> int:
    """Patch the batches in ``buffer`` so they hold offsets from ``first_offset`` on.

    With ``log_append_time_ms`` (message.timestamp.type=LogAppendTime) each batch gets the
    LogAppendTime attribute and that maxTimestamp, which readers report for every record; like
    the Java broker's in-place path, baseTimestamp is left as the producer wrote it. Without it
    (CreateTime) a LogAppendTime bit set by a client is cleared. Returns the next offset.
    """
    offset = first_offset
    for position, header in batches:
        _INT64.pack_into(buffer, position + BASE_OFFSET_OFFSET, offset)
        attributes = header.attributes
        if log_append_time_ms is not None:
            if not (attributes & TIMESTAMP_TYPE_BIT) or header.max_timestamp != log_append_time_ms:
                _INT16.pack_into(buffer, position + ATTRIBUTES_OFFSET,
                                 attributes | TIMESTAMP_TYPE_BIT)
                _INT64.pack_into(buffer, position + MAX_TIMESTAMP_OFFSET, log_append_time_ms)
                _restamp_crc(buffer, position, header.size)
        elif attributes & TIMESTAMP_TYPE_BIT:
            _INT16.pack_into(buffer, position + ATTRIBUTES_OFFSET, attributes & ~TIMESTAMP_TYPE_BIT)
            _restamp_crc(buffer, position, header.size)
        offset += header.last_offset_delta + 1
    return offset


def _restamp_crc(buffer: bytearray, position: int, size: int) -> None:
    _UINT32.pack_into(buffer, position + CRC_OFFSET, compute_crc(buffer, position, size))


def stored_batch_problem(
    buffer: bytes | bytearray | memoryview, position: int, expected_offset: int
) -> str | None:
    """Why the stored batch at ``position`` is not intact, or None if it is.

    For log recovery: the batch must be complete, framed, magic 2, match its CRC, have a sane
    offset range and not go back below ``expected_offset`` (offsets only grow in a log).
    """
    remaining = len(buffer) - position
    if remaining < HEADER_SIZE:
        return f"{remaining} bytes of a batch header"
    header = read_header(buffer, position)
    if header.batch_length < MIN_BATCH_LENGTH:
        return f"batch length {header.batch_length}"
    if header.magic != MAGIC:
        return f"magic {header.magic}"
    if header.size > remaining:
        return f"{remaining} of {header.size} bytes"
    if header.last_offset_delta < 0 or header.record_count < 0:
        return "negative offset range or record count"
    if header.base_offset < expected_offset:
        return f"base offset {header.base_offset} below {expected_offset}"
    if compute_crc(buffer, position, header.size) != header.crc:
        return "CRC mismatch"
    return None


def iter_batches(buffer: bytes | bytearray | memoryview) -> Iterator[Batch]:
    """Every complete batch in ``buffer``, by header framing alone (no CRC check)."""
    view = memoryview(buffer)
    position = 0
    while len(view) - position >= HEADER_SIZE:
        header = read_header(view, position)
        if header.batch_length < MIN_BATCH_LENGTH or position + header.size > len(view):
            return
        yield Batch(position, header)
        position += header.size
