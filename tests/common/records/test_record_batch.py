"""The batch header codec: round trips of every field, the field offsets against the layout, the
in-place patches and the CRC they keep or renew, and walking runs of batches by framing."""

from __future__ import annotations

import struct

from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from services.common.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    BatchHeader,
    batches_end,
    compute_crc,
    iter_batches,
    magic_at,
    pack_batch,
    read_header,
    read_log_overhead,
    restamp,
    set_base_offset,
    set_partition_leader_epoch,
)

from ...record_batches import build_batch, values


def ints(bits: int) -> st.SearchStrategy[int]:
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


headers = st.builds(
    BatchHeader, base_offset=ints(64), partition_leader_epoch=ints(32), magic=ints(8),
    attributes=ints(16), last_offset_delta=ints(32), base_timestamp=ints(64),
    max_timestamp=ints(64), producer_id=ints(64), producer_epoch=ints(16),
    base_sequence=ints(32), record_count=ints(32))


@given(header=headers, payload=st.binary(max_size=200))
def test_every_field_round_trips_and_length_and_crc_are_computed(
        header: BatchHeader, payload: bytes) -> None:
    batch = pack_batch(header, payload)
    read = read_header(batch)
    assert read._replace(batch_length=0, crc=0) == header._replace(batch_length=0, crc=0)
    assert read.size == len(batch) == HEADER_SIZE + len(payload)
    assert read_log_overhead(batch, 0) == (header.base_offset, len(batch) - LOG_OVERHEAD)
    assert read.crc == crc32c(batch[ATTRIBUTES_OFFSET:]) == compute_crc(batch, 0, len(batch))
    assert batch[HEADER_SIZE:] == payload


def test_the_field_offsets_are_those_of_the_layout() -> None:
    header = BatchHeader(partition_leader_epoch=0x0A0B0C0D, magic=2, attributes=0x1234,
                         max_timestamp=0x0102030405060708)
    batch = pack_batch(header, b"")
    assert struct.unpack_from(">i", batch, LENGTH_OFFSET)[0] == HEADER_SIZE - LOG_OVERHEAD
    assert struct.unpack_from(">i", batch, PARTITION_LEADER_EPOCH_OFFSET)[0] == 0x0A0B0C0D
    assert batch[MAGIC_OFFSET] == magic_at(batch, 0) == 2
    assert struct.unpack_from(">I", batch, CRC_OFFSET)[0] == read_header(batch).crc
    assert struct.unpack_from(">h", batch, ATTRIBUTES_OFFSET)[0] == 0x1234
    assert struct.unpack_from(">q", batch, MAX_TIMESTAMP_OFFSET)[0] == 0x0102030405060708
    assert magic_at(b"\x00" * MAGIC_OFFSET + b"\xff", 0) == -1  # signed, as the field is


def test_header_properties() -> None:
    header = BatchHeader(base_offset=10, batch_length=100, attributes=0x3B,
                         last_offset_delta=4, base_timestamp=77)
    assert (header.size, header.last_offset, header.next_offset) == (112, 14, 15)
    assert header.compression == 3
    assert header.is_log_append_time and header.is_transactional and header.is_control
    assert header.delete_horizon is None
    assert header._replace(attributes=DELETE_HORIZON_BIT).delete_horizon == 77


@given(base_offset=ints(64), epoch=ints(32))
def test_base_offset_and_leader_epoch_are_patched_outside_the_crc(
        base_offset: int, epoch: int) -> None:
    original = build_batch(values(3))
    batch = bytearray(original)
    set_base_offset(batch, 0, base_offset)
    set_partition_leader_epoch(batch, 0, epoch)
    header = read_header(batch)
    assert (header.base_offset, header.partition_leader_epoch) == (base_offset, epoch)
    assert header.crc == compute_crc(batch, 0, len(batch)) == read_header(original).crc
    assert batch[MAGIC_OFFSET:] == original[MAGIC_OFFSET:]


def test_restamping_attributes_and_max_timestamp_renews_the_crc() -> None:
    second = bytearray(build_batch(values(2)))
    run = bytearray(build_batch(values(1))) + second
    position = len(run) - len(second)
    restamp(run, position, len(second), 0x08, 5_000)
    header = read_header(run, position)
    assert (header.attributes, header.max_timestamp) == (0x08, 5_000)
    assert header.crc == compute_crc(run, position, len(second)) != read_header(second).crc


def test_runs_are_walked_by_framing_and_stop_at_a_torn_or_undersized_batch() -> None:
    first = build_batch(values(2), base_offset=5)
    second = build_batch(values(3, size=40), base_offset=7)
    run = first + second
    assert [(b.position, b.header.base_offset) for b in iter_batches(run)] == [
        (0, 5), (len(first), 7)]
    assert batches_end(run) == 10
    assert [b.position for b in iter_batches(run[:-1])] == [0]
    assert batches_end(run[:-1]) == 7
    assert batches_end(first[:HEADER_SIZE]) is None
    assert batches_end(b"") is None
    undersized = bytearray(second)
    struct.pack_into(">i", undersized, LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD - 1)
    assert [b.position for b in iter_batches(first + undersized + second)] == [0]
    # Framing alone: a batch whose CRC does not match is still walked over.
    damaged = bytearray(run)
    damaged[-1] ^= 0xFF
    assert batches_end(damaged) == 10
