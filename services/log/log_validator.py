"""What a log node checks of the record batches it is given, and how it stamps them (Kafka's
``LogValidator`` and the checks of ``UnifiedLog.analyzeAndValidateRecords``). The batch format
is :mod:`services.common.records`; records are never decoded here except for the key check of
compacted topics.

Validation of a leader append mirrors the Java broker: first every batch's framing, magic,
client base offset, size and CRC, then every batch's offset range and record count. Any failure
rejects the whole partition append; nothing of it may be stored.

Offsets are assigned by patching each batch's baseOffset in place, outside the CRC. Stamping
LogAppendTime changes attributes and maxTimestamp, which the CRC covers, so it is recomputed
then.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.errors import ErrorCode, KafkaError, RecordValidationError
from services.common.records.compression import MAX_CODEC
from services.common.records.record import iter_key_lengths, records_payload
from services.common.records.record_batch import (
    CONTROL_BIT,
    HEADER_SIZE,
    MAGIC,
    MAGIC_OFFSET,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    Batch,
    BatchHeader,
    Buffer,
    RecordError,
    compute_crc,
    magic_at,
    read_header,
    restamp,
    set_base_offset,
)

# Every record takes at least seven bytes (length, attributes, timestamp delta, offset delta,
# key length, value length and header count varints), so an uncompressed batch cannot hold more
# records than that allows.
MIN_RECORD_SIZE = 7


def _corrupt(message: str) -> KafkaError:
    return KafkaError(ErrorCode.corrupt_message, message)


def _invalid(message: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_record, message)


def validate_append(records: Buffer, max_message_bytes: int,
                    coordinator: bool = False) -> list[Batch]:
    """Validate the batches of one partition's append, as a leader receives them from clients
    (or, with ``coordinator``, from a coordinator: Kafka's AppendOrigin COORDINATOR, whose
    batches with a producer id need no sequence number).

    Returns every batch with its position in ``records``. Raises :class:`KafkaError` with:
    CORRUPT_MESSAGE for a truncated or undersized batch, a CRC mismatch or an unknown compression
    codec; UNSUPPORTED_FOR_MESSAGE_FORMAT for magic other than 2; MESSAGE_TOO_LARGE for a batch
    over ``max_message_bytes``; INVALID_RECORD for no batches at all, a non-zero client base
    offset, an offset range that disagrees with the record count, a control batch (only the
    log node writes transaction markers), a transactional batch without a producer id, or a
    client's batch with a producer id and no sequence number (the Java broker's
    ``InvalidRecordException`` cases). A partial batch at the end is refused rather than
    dropped (the Java broker trims it silently), so that a damaged request is never
    half-stored.
    """
    view = memoryview(records)
    end = len(view)
    if end == 0:
        raise _invalid("an append needs at least one record batch")
    batches: list[Batch] = []
    position = 0
    while position < end:
        remaining = end - position
        # Old formats are recognised by their magic even when their (smaller) header would not
        # pass the v2 size checks.
        if remaining <= MAGIC_OFFSET:
            raise _corrupt(f"truncated record batch at byte {position}")
        header = read_header(view, position) if remaining >= HEADER_SIZE else None
        magic = magic_at(view, position) if header is None else header.magic
        if magic != MAGIC:
            raise KafkaError(
                ErrorCode.unsupported_for_message_format,
                f"record batch magic {magic} is not supported (only {MAGIC})",
            )
        if header is None:
            raise _corrupt(f"truncated record batch header at byte {position}")
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
        if header.compression > MAX_CODEC:
            raise _corrupt(f"unknown compression codec {header.compression}")
        batches.append(Batch(position, header))
        position += size
    for batch in batches:
        _check_counts(batch.header, coordinator)
    return batches


def _check_counts(header: BatchHeader, coordinator: bool) -> None:
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
    attributes = header.attributes
    if attributes & (CONTROL_BIT | TRANSACTIONAL_BIT):
        if attributes & CONTROL_BIT:
            raise _invalid("clients are not allowed to write control records")
        if header.producer_id < 0:
            raise _invalid("a transactional record batch needs a producer id")
    if header.producer_id >= 0 and header.base_sequence < 0 and not coordinator:
        raise _invalid(
            f"invalid sequence number {header.base_sequence} for producer {header.producer_id}"
        )


def check_keys(records: Buffer, batches: Sequence[Batch], partition: str) -> None:
    """Kafka's rule for compacted topics (``LogValidator.validateKey``): every record needs a
    key. Raises :class:`RecordValidationError` (INVALID_RECORD, the append refused whole)
    naming each record without one by its index among the records appended, so that a client
    fails exactly those; INVALID_RECORD for records that cannot be decoded (as Kafka's
    ``InvalidRecordException``), CORRUPT_MESSAGE for a payload that does not decompress.
    Control batches are not checked."""
    view = memoryview(records)
    keyless: list[tuple[int, str]] = []
    index = 0
    for position, header in batches:
        if header.is_control:
            index += header.record_count
            continue
        try:
            payload = records_payload(view[position:position + header.size], header)
        except RecordError as exc:
            raise _corrupt(str(exc)) from None
        try:
            for length in iter_key_lengths(payload, header.record_count):
                if length < 0:
                    keyless.append((index, f"compacted topic partition {partition} cannot "
                                           f"accept a record without a key"))
                index += 1
        except RecordError as exc:
            raise _invalid(f"invalid record: {exc}") from None
    if keyless:
        raise RecordValidationError(ErrorCode.invalid_record, keyless)


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
        set_base_offset(buffer, position, offset)
        attributes = header.attributes
        if log_append_time_ms is not None:
            if not (attributes & TIMESTAMP_TYPE_BIT) or header.max_timestamp != log_append_time_ms:
                restamp(buffer, position, header.size, attributes | TIMESTAMP_TYPE_BIT,
                        log_append_time_ms)
        elif attributes & TIMESTAMP_TYPE_BIT:
            restamp(buffer, position, header.size, attributes & ~TIMESTAMP_TYPE_BIT,
                    header.max_timestamp)
        offset += header.last_offset_delta + 1
    return offset


def stored_batch_problem(buffer: Buffer, position: int, expected_offset: int) -> str | None:
    """Why the stored batch at ``position`` is not intact, or None if it is.

    For log recovery and follower appends: the batch must be complete, framed, magic 2, match
    its CRC, have a sane offset range and not go back below ``expected_offset`` (offsets only
    grow in a log).
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
