"""Unit tests of services.log.log_validator: validation of appended batches, the key check of
compacted topics, and patching offsets and timestamps."""

from __future__ import annotations

import datetime
import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from services.common.errors import ErrorCode, KafkaError, RecordValidationError
from services.common.records.compression import MAX_DECOMPRESSED_BYTES
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record_batch import (
    CONTROL_BIT,
    CRC_OFFSET,
    HEADER_SIZE,
    LENGTH_OFFSET,
    MAGIC_OFFSET,
    TIMESTAMP_TYPE_BIT,
    compute_crc,
    iter_batches,
    read_header,
)
from services.log.log_validator import (
    assign_offsets,
    check_keys,
    stored_batch_problem,
    validate_append,
)

from ..record_batches import build_batch, compressed_batch, values

LIMIT = 1_048_588


def error_of(records: bytes, max_message_bytes: int = LIMIT) -> ErrorCode:
    with pytest.raises(KafkaError) as caught:
        validate_append(records, max_message_bytes)
    return caught.value.code


def test_a_valid_batch_is_accepted_with_its_header() -> None:
    batch = build_batch(values(3), base_timestamp=1000, timestamp_step=5)
    [found] = validate_append(batch, LIMIT)
    assert found.position == 0
    assert found.header.size == len(batch)
    assert found.header.record_count == 3
    assert found.header.last_offset_delta == 2
    assert found.header.max_timestamp == 1010


def test_a_batch_written_by_kio_is_accepted() -> None:
    when = TZAwareMicros.parse(datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC))
    new = NewRecordBatch(
        producer_id=i64(-1), producer_epoch=i16(-1), base_sequence=i32(-1), attributes=i16(0),
        records=tuple(
            Record(attributes=i8(0), timestamp=when, offset=i64(i), key=None, value=b"x" * i,
                   headers=())
            for i in range(4)
        ),
    )
    out = io.BytesIO()
    write_batch(out, new)
    [found] = validate_append(out.getvalue(), LIMIT)
    assert found.header.record_count == 4


def test_concatenated_batches_are_split_by_their_lengths() -> None:
    first, second = build_batch(values(2)), build_batch(values(5, size=30))
    found = validate_append(first + second, LIMIT)
    assert [b.position for b in found] == [0, len(first)]
    assert [b.header.record_count for b in found] == [2, 5]


@given(st.data())
def test_a_flipped_byte_under_the_crc_is_corrupt_message(data: st.DataObject) -> None:
    batch = bytearray(build_batch(values(3)))
    position = data.draw(st.integers(CRC_OFFSET, len(batch) - 1))
    batch[position] ^= data.draw(st.integers(1, 255))
    assert error_of(bytes(batch)) == ErrorCode.corrupt_message


@pytest.mark.parametrize("keep", [1, 16, 17, HEADER_SIZE - 1, HEADER_SIZE, -1])
def test_a_truncated_batch_is_corrupt_message(keep: int) -> None:
    batch = build_batch(values(3))
    whole = build_batch(values(1))
    cut = batch[:keep] if keep >= 0 else batch[:-1]
    # A truncated batch after a good one: the good one must not be accepted alone.
    assert error_of(whole + cut) == ErrorCode.corrupt_message


def test_a_batch_length_below_the_header_is_corrupt_message() -> None:
    batch = bytearray(build_batch(values(1)))
    struct.pack_into(">i", batch, LENGTH_OFFSET, 20)
    assert error_of(bytes(batch)) == ErrorCode.corrupt_message


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_magic_other_than_2_is_unsupported(magic: int) -> None:
    assert error_of(build_batch(values(2), magic=magic)) == (
        ErrorCode.unsupported_for_message_format
    )


def test_a_small_legacy_message_is_unsupported_not_corrupt() -> None:
    # offset, size 14, crc, magic 1, attributes, timestamp... cut short as a v0/v1 message is.
    legacy = struct.pack(">qiIbb", 0, 14, 0, 1, 0) + b"\x00" * 12
    assert error_of(legacy) == ErrorCode.unsupported_for_message_format


def test_a_batch_over_max_message_bytes_is_too_large() -> None:
    batch = build_batch(values(4, size=100))
    validate_append(batch, len(batch))
    assert error_of(batch, len(batch) - 1) == ErrorCode.message_too_large


@pytest.mark.parametrize(
    "overrides",
    [
        {"record_count": -1},
        {"record_count": 0},
        {"record_count": 4},
        {"last_offset_delta": 1},
        {"last_offset_delta": -1},
        {"last_offset_delta": 999, "record_count": 1000},
        {"base_offset": 5},
        {"producer_id": 7, "producer_epoch": 0, "base_sequence": -1},
    ],
)
def test_inconsistent_headers_are_invalid_record(overrides: dict[str, int]) -> None:
    assert error_of(build_batch(values(3), **overrides)) == ErrorCode.invalid_record


def test_an_idempotent_batch_with_a_sequence_is_accepted() -> None:
    validate_append(build_batch(values(3), producer_id=7, producer_epoch=0, base_sequence=0),
                    LIMIT)


def test_a_transaction_marker_is_an_intact_batch_the_key_check_skips() -> None:
    marker = EndTransactionMarker(type=ControlRecordType.COMMIT, coordinator_epoch=3)
    batch = build_end_transaction_batch(marker, producer_id=7, producer_epoch=1, timestamp=1000)
    assert stored_batch_problem(batch, 0, 0) is None
    check_keys(batch, list(iter_batches(batch)), "t-0")  # its key is a control key, never checked


def test_an_empty_append_is_invalid_record() -> None:
    assert error_of(b"") == ErrorCode.invalid_record


def test_a_corrupt_batch_wins_over_an_earlier_invalid_one() -> None:
    # Framing, size and CRC of every batch are checked before record counts, as in Kafka.
    invalid = build_batch(values(2), record_count=5)
    corrupt = bytearray(build_batch(values(2)))
    corrupt[-1] ^= 1
    assert error_of(invalid + bytes(corrupt)) == ErrorCode.corrupt_message


def test_assigning_offsets_patches_base_offsets_and_keeps_the_crc() -> None:
    records = build_batch(values(3)) + build_batch(values(2))
    batches = validate_append(records, LIMIT)
    buffer = bytearray(records)
    assert assign_offsets(buffer, batches, 100, None) == 105
    headers = [batch.header for batch in iter_batches(buffer)]
    assert [h.base_offset for h in headers] == [100, 103]
    for batch in iter_batches(buffer):
        assert stored_batch_problem(buffer, batch.position, 0) is None
    # Only the base offsets changed.
    second = batches[1].position
    assert buffer[8:second] == records[8:second]
    assert buffer[second + 8:] == records[second + 8:]
    # An independent decoder sees the assigned offsets.
    decoded, _size = read_batch(bytes(buffer), batches[1].position)
    assert [r.offset for r in decoded.records] == [103, 104]


def test_log_append_time_stamps_attributes_and_max_timestamp_with_a_new_crc() -> None:
    records = build_batch(values(3), base_timestamp=1000)
    batches = validate_append(records, LIMIT)
    buffer = bytearray(records)
    assign_offsets(buffer, batches, 0, 5_000)
    header = read_header(buffer)
    assert header.attributes & TIMESTAMP_TYPE_BIT
    assert header.max_timestamp == 5_000
    assert header.base_timestamp == 1000  # as the Java broker's in-place path leaves it
    assert header.crc == compute_crc(buffer, 0, len(buffer)) != read_header(records).crc


def test_create_time_clears_a_client_set_log_append_time_bit() -> None:
    records = build_batch(values(2), attributes=TIMESTAMP_TYPE_BIT)
    batches = validate_append(records, LIMIT)
    buffer = bytearray(records)
    assign_offsets(buffer, batches, 0, None)
    header = read_header(buffer)
    assert not header.attributes & TIMESTAMP_TYPE_BIT
    assert header.crc == compute_crc(buffer, 0, len(buffer))


def test_stored_batch_problems_are_reported() -> None:
    batch = build_batch(values(2), base_offset=10)
    assert stored_batch_problem(batch, 0, 10) is None
    assert stored_batch_problem(batch, 0, 11) is not None  # offsets went backwards
    assert stored_batch_problem(batch[:-1], 0, 0) is not None
    damaged = bytearray(batch)
    damaged[MAGIC_OFFSET] = 1
    assert stored_batch_problem(damaged, 0, 0) is not None
    damaged = bytearray(batch)
    damaged[-1] ^= 0xFF
    assert stored_batch_problem(damaged, 0, 0) == "CRC mismatch"


def test_keyless_records_fail_the_compacted_topic_check_each_by_its_index() -> None:
    good = build_batch(values(3))
    check_keys(good, list(iter_batches(good)), "t-0")
    for bad, keyless in ((build_batch(values(3), keys=[b"a", None, None]), [4, 5]),
                         (compressed_batch([(b"a", b"1"), (None, b"2")], "zstd"), [4])):
        records = good + bad
        with pytest.raises(RecordValidationError) as raised:
            check_keys(records, list(iter_batches(records)), "t-0")
        assert raised.value.errno == ErrorCode.invalid_record.value == 87
        assert [index for index, _ in raised.value.record_errors] == keyless
        assert all("t-0" in why and "key" in why for _, why in raised.value.record_errors)
    many = build_batch(values(5), keys=[None] * 5)
    with pytest.raises(RecordValidationError) as raised:
        check_keys(many, list(iter_batches(many)), "t-0")
    assert len(raised.value.record_errors) == 5
    assert "5 record(s) rejected" in str(raised.value) and "and 2 more" in str(raised.value)
    control = build_batch(values(1), keys=[None], attributes=CONTROL_BIT)
    check_keys(control, list(iter_batches(control)), "t-0")
    # A few KB of zstd that would decompress to gigabytes: refused before they are made.
    bomb = compressed_batch([(b"a", bytes(MAX_DECOMPRESSED_BYTES + 1))], "zstd")
    with pytest.raises(KafkaError) as raised:
        check_keys(bomb, list(iter_batches(bomb)), "t-0")
    assert raised.value.errno == ErrorCode.corrupt_message.value
    broken = bytearray(compressed_batch([(b"a", b"1")], "gzip"))
    broken[-6] ^= 0xFF  # the gzip trailer's CRC
    with pytest.raises(KafkaError) as raised:
        check_keys(broken, list(iter_batches(broken)), "t-0")
    assert raised.value.errno == ErrorCode.corrupt_message.value
