"""Transaction markers: their batches as Kafka lays them out (checked with kio's reader), round
trips, and the control records a reader must tolerate or refuse."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.records.readers import read_batch

from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
    read_end_transaction_marker,
)
from services.common.records.record import Record, encode_batch
from services.common.records.record_batch import (
    CONTROL_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    RecordError,
    read_header,
)

from ...record_batches import build_batch, values

markers = st.builds(EndTransactionMarker, type=st.sampled_from(ControlRecordType),
                    coordinator_epoch=st.integers(-(2**31), 2**31 - 1))


def control_batch(key: bytes | None, value: bytes | None, records: int = 1) -> bytes:
    """A control batch holding ``records`` records of ``key`` and ``value``."""
    return encode_batch(BatchHeader(attributes=CONTROL_BIT, last_offset_delta=records - 1),
                        [Record(i, 0, key, value) for i in range(records)])


def marker_of(batch: bytes) -> EndTransactionMarker | None:
    return read_end_transaction_marker(batch, read_header(batch))


@given(marker=markers, producer_id=st.integers(0, 2**63 - 1),
       producer_epoch=st.integers(0, 2**15 - 1), timestamp=st.integers(0, 2**41),
       leader_epoch=st.integers(-1, 2**31 - 1))
def test_a_marker_batch_round_trips_with_kafkas_layout(
        marker: EndTransactionMarker, producer_id: int, producer_epoch: int, timestamp: int,
        leader_epoch: int) -> None:
    batch = build_end_transaction_batch(marker, producer_id=producer_id,
                                        producer_epoch=producer_epoch, timestamp=timestamp,
                                        partition_leader_epoch=leader_epoch)
    header = read_header(batch)
    assert header.is_control and header.is_transactional and header.compression == 0
    assert header.attributes == TRANSACTIONAL_BIT | CONTROL_BIT
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        producer_id, producer_epoch, -1)
    assert (header.record_count, header.last_offset_delta) == (1, 0)
    assert (header.base_timestamp, header.max_timestamp) == (timestamp, timestamp)
    assert header.partition_leader_epoch == leader_epoch
    assert marker_of(batch) == marker
    # The record as Kafka writes it, read by an independent reader.
    read, size = read_batch(batch, 0)
    assert size == len(batch)
    [record] = read.records
    assert record.key == struct.pack(">hh", 0, marker.type)
    assert record.value == struct.pack(">hi", 0, marker.coordinator_epoch)
    assert record.headers == ()


def test_abort_is_type_0_and_commit_type_1() -> None:
    assert (ControlRecordType.ABORT, ControlRecordType.COMMIT) == (0, 1)
    assert marker_of(control_batch(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x07")) == (
        EndTransactionMarker(type=ControlRecordType.ABORT, coordinator_epoch=7))
    assert marker_of(control_batch(b"\x00\x00\x00\x01", b"\x00\x00\xff\xff\xff\xff")) == (
        EndTransactionMarker(type=ControlRecordType.COMMIT, coordinator_epoch=-1))


def test_newer_versions_are_read_as_version_0() -> None:
    key = struct.pack(">hh", 1, 1) + b"more"
    value = struct.pack(">hi", 3, 12) + b"later fields"
    assert marker_of(control_batch(key, value)) == EndTransactionMarker(
        type=ControlRecordType.COMMIT, coordinator_epoch=12)


@pytest.mark.parametrize("control_type", [2, 3, 6, 99, -1])
def test_other_control_records_are_not_markers(control_type: int) -> None:
    assert marker_of(control_batch(struct.pack(">hh", 0, control_type), None)) is None


@pytest.mark.parametrize(("key", "value"), [
    (None, struct.pack(">hi", 0, 1)),  # no key
    (b"\x00\x00\x00", struct.pack(">hi", 0, 1)),  # a key too short
    (struct.pack(">hh", -1, 0), struct.pack(">hi", 0, 1)),  # a negative key version
    (struct.pack(">hh", 0, 1), None),  # a marker without a value
    (struct.pack(">hh", 0, 1), b"\x00\x00\x00\x00\x01"),  # a value too short
    (struct.pack(">hh", 0, 0), struct.pack(">hi", -2, 1)),  # a negative marker version
])
def test_malformed_control_records_are_errors(key: bytes | None, value: bytes | None) -> None:
    with pytest.raises(RecordError):
        marker_of(control_batch(key, value))


def test_only_a_control_batch_of_one_record_holds_a_marker() -> None:
    with pytest.raises(RecordError):
        marker_of(build_batch(values(1)))
    with pytest.raises(RecordError):
        marker_of(control_batch(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 1), records=2))
