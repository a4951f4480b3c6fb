"""The header of a v2 record batch (Kafka's ``DefaultRecordBatch``), read and written without
touching the records; the only place that knows its layout.

A run of record batches (what a produce request carries, a segment file holds and a fetch
returns) is batches back to back. Every batch starts with a 61-byte header (big-endian)::

    RecordBatch =>
      baseOffset            i64   offset of the first record; the broker assigns it
      batchLength           i32   bytes after this field (the batch is batchLength + 12 bytes)
      partitionLeaderEpoch  i32
      magic                 i8    2
      crc                   u32   CRC32C (Castagnoli) of attributes .. end of batch
      attributes            i16   bits 0-2 compression, 3 timestamp type (1 = LogAppendTime),
                                  4 transactional, 5 control, 6 delete horizon
      lastOffsetDelta       i32   offset of the last record minus baseOffset
      baseTimestamp         i64   (the delete horizon when bit 6 is set, KIP-534)
      maxTimestamp          i64
      producerId            i64   -1: none
      producerEpoch         i16
      baseSequence          i32
      recordCount           i32
      records               [Record]   see :mod:`.record`

The CRC does not cover baseOffset, batchLength or partitionLeaderEpoch, so a broker assigns
offsets and stamps leader epochs by patching those fields in place and the CRC stays valid;
changing any other field needs :func:`update_crc`.

Batches are framed by batchLength alone: a walk over a run (:func:`iter_batches`) stops at a
truncated batch or at a length shorter than a bare header, and never checks CRCs. The checks a
broker makes of the batches it is given are the log node's (``services.log.log_validator``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

Buffer = bytes | bytearray | memoryview

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
MAX_TIMESTAMP_OFFSET = 35

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

NO_TIMESTAMP = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_INT8 = struct.Struct(">b")
_UINT32 = struct.Struct(">I")

assert _HEADER.size == HEADER_SIZE


class RecordError(ValueError):
    """Bytes that are not a well-formed batch or record: truncated, overlong varints, a bad
    compressed payload, a control record of the wrong shape."""


class BatchHeader(NamedTuple):
    """The 61-byte header of one record batch. The defaults are those of a new batch without
    a producer; :func:`pack_batch` computes ``batch_length`` and ``crc``."""

    base_offset: int = 0
    batch_length: int = MIN_BATCH_LENGTH
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    magic: int = MAGIC
    crc: int = 0
    attributes: int = 0
    last_offset_delta: int = 0
    base_timestamp: int = NO_TIMESTAMP
    max_timestamp: int = NO_TIMESTAMP
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    record_count: int = 0

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
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def delete_horizon(self) -> int | None:
        """When the log cleaner may drop the batch's tombstones (KIP-534), or None."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None


class Batch(NamedTuple):
    """A batch located in a buffer or file: where it starts, and its header."""

    position: int
    header: BatchHeader


# Bound once: a header is read for every batch on the produce path.
_unpack_header = _HEADER.unpack_from
_new_tuple = tuple.__new__


def read_header(buffer: Buffer, position: int = 0) -> BatchHeader:
    """The header of the batch at ``position``; the caller ensures 61 bytes are there."""
    return _new_tuple(BatchHeader, _unpack_header(buffer, position))


# read_log_overhead(buffer, position) -> (baseOffset, batchLength): the 12 bytes in front of
# every batch (in every message format), for walking batches without reading whole headers.
read_log_overhead = _LOG_OVERHEAD.unpack_from


def magic_at(buffer: Buffer, position: int) -> int:
    """The magic byte of the batch at ``position`` (17 bytes must be there). It sits at the
    same place in every message format, so older formats are recognised by it."""
    magic: int = _INT8.unpack_from(buffer, position + MAGIC_OFFSET)[0]
    return magic


def compute_crc(buffer: Buffer, position: int, size: int) -> int:
    """CRC32C of the part of the ``size``-byte batch at ``position`` that the crc covers."""
    return crc32c(memoryview(buffer)[position + ATTRIBUTES_OFFSET:position + size])


def update_crc(buffer: bytearray, position: int, size: int) -> None:
    """Write the crc of the batch at ``position`` anew, after a covered field changed."""
    _UINT32.pack_into(buffer, position + CRC_OFFSET, compute_crc(buffer, position, size))


# set_base_offset(buffer, position, base_offset) patches baseOffset (outside the CRC). It is a
# batch's first field, so this is packing at the batch's position, with no call in between.
set_base_offset = _INT64.pack_into
assert BASE_OFFSET_OFFSET == 0


def set_partition_leader_epoch(buffer: bytearray, position: int, epoch: int) -> None:
    """Patch partitionLeaderEpoch (outside the CRC)."""
    _INT32.pack_into(buffer, position + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def restamp(buffer: bytearray, position: int, size: int, attributes: int,
            max_timestamp: int) -> None:
    """Patch attributes and maxTimestamp of the ``size``-byte batch at ``position``, and its
    crc, which covers them."""
    _INT16.pack_into(buffer, position + ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(buffer, position + MAX_TIMESTAMP_OFFSET, max_timestamp)
    update_crc(buffer, position, size)


def pack_batch(header: BatchHeader, payload: Buffer) -> bytes:
    """A batch of ``header`` followed by ``payload`` (its records, encoded and compressed as
    the attributes say). batchLength and crc are computed; every other field, recordCount and
    magic included, is written as given."""
    buffer = bytearray(_HEADER.pack(*header._replace(
        batch_length=MIN_BATCH_LENGTH + len(payload), crc=0)))
    buffer += payload
    update_crc(buffer, 0, len(buffer))
    return bytes(buffer)


def iter_batches(buffer: Buffer) -> Iterator[Batch]:
    """Every complete batch in ``buffer``, by header framing alone (no CRC check)."""
    view = memoryview(buffer)
    position = 0
    while len(view) - position >= HEADER_SIZE:
        header = read_header(view, position)
        if header.batch_length < MIN_BATCH_LENGTH or position + header.size > len(view):
            return
        yield Batch(position, header)
        position += header.size


def batches_end(buffer: Buffer) -> int | None:
    """The offset after the last complete batch in ``buffer``; None when there is none."""
    end = None
    for _, header in iter_batches(buffer):
        end = header.next_offset
    return end
