"""Record batches as a fuzz target: what the log node does with a produced partition's bytes
(``validate_append``, then for a compacted topic ``check_keys``), what recovery and follower
appends do with stored bytes (``stored_batch_problem``), and what every reader of records does
(``iter_batches``, ``decode_records`` with decompression, ``read_end_transaction_marker``).

Bad bytes must give the Kafka error (:class:`KafkaError`: CORRUPT_MESSAGE, INVALID_RECORD,
...) at the validator, :class:`RecordError` in the record readers, and a reason string from
``stored_batch_problem``; any other exception is a crash."""

from __future__ import annotations

import contextlib
import functools

from services.common.errors import KafkaError
from services.common.records.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
    read_end_transaction_marker,
)
from services.common.records.record import Record, decode_records, encode_batch, iter_record_times
from services.common.records.record_batch import (
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    BatchHeader,
    RecordError,
    iter_batches,
    read_header,
    update_crc,
)
from services.log.log_validator import check_keys, stored_batch_problem, validate_append

MAX_MESSAGE_BYTES = 1 << 20


@functools.cache
def valid_batches() -> tuple[bytes, ...]:
    """Batches of every codec, with and without keys, headers, a producer and a transaction,
    and a control batch."""
    records = [Record(0, 0, b"k0", b"v0"), Record(1, 3, None, b"v1" * 20, b"\x02\x02h\x02v"),
               Record(2, -1, b"k2", None)]
    out = []
    for codec in (NONE, GZIP, SNAPPY, LZ4, ZSTD):
        out.append(encode_batch(BatchHeader(attributes=codec, last_offset_delta=2,
                                            base_timestamp=1000, max_timestamp=1003),
                                records))
        out.append(encode_batch(BatchHeader(attributes=codec | TRANSACTIONAL_BIT,
                                            last_offset_delta=0, producer_id=5,
                                            producer_epoch=1, base_sequence=0),
                                records[:1]))
    out.append(encode_batch(BatchHeader(attributes=SNAPPY, last_offset_delta=2), records,
                            xerial=True))
    out.append(build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.COMMIT, coordinator_epoch=3),
        producer_id=5, producer_epoch=1, timestamp=1000))
    out.append(out[0] + out[2])  # two batches in one append
    return tuple(out)


def recrc(data: bytes) -> bytes:
    """``data`` with the CRC of its first batch made right again, so a damage reaches the
    checks behind the CRC."""
    if len(data) < HEADER_SIZE:
        return data
    buffer = bytearray(data)
    size = read_header(buffer, 0).size
    if HEADER_SIZE <= size <= len(buffer):
        update_crc(buffer, 0, size)
    return bytes(buffer)


def check_records(data: bytes) -> None:
    """Run ``data`` through every record batch reader; fail on anything but their errors."""
    try:
        batches = validate_append(data, MAX_MESSAGE_BYTES)
    except KafkaError:
        batches = None
    if batches is not None:
        with contextlib.suppress(KafkaError):
            check_keys(data, batches, "fuzz-0")
    stored_batch_problem(data, 0, 0)  # a reason or None, never a raise
    for position, header in iter_batches(data):
        batch = memoryview(data)[position:position + header.size]
        with contextlib.suppress(RecordError):
            decode_records(batch, header)
        with contextlib.suppress(RecordError):
            list(iter_record_times(batch, header))
        if header.is_control:
            with contextlib.suppress(RecordError):
                read_end_transaction_marker(batch, header)
