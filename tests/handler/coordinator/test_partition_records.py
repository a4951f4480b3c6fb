"""The batches of a coordinator partition: what the runtime appends the log node accepts as it
is, and what it reads back (transaction markers as markers, other control batches skipped,
transactional records with their producer, compressed ones read, markers the cleaner emptied
skipped, a torn tail ignored)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record import build_batch, encode_batch
from services.common.records.record_batch import (
    RecordError,
    batches_end,
    read_header,
    set_base_offset,
)
from services.handler.coordinator.partition import (
    LoggedMarker,
    LoggedRecord,
    TransactionalRecords,
    read_records,
    transactional_batch,
)
from services.log.log_validator import validate_append

from ...record_batches import build_batch as build_test_batch
from ...record_batches import compressed_batch

blobs = st.binary(max_size=64)


@given(items=st.lists(st.tuples(blobs.filter(bool), st.none() | blobs), min_size=1,
                      max_size=8), base=st.integers(0, 2**40))
def test_batches_are_valid_for_the_log_node_and_read_back(
        items: list[tuple[bytes, bytes | None]], base: int) -> None:
    batch = bytearray(build_batch(items, 1_700_000_000_000))
    validate_append(bytes(batch), 1 << 20)
    set_base_offset(batch, 0, base)  # as the log node assigns it
    got = list(read_records(bytes(batch)))
    assert [(g.offset, g.key, g.value) for g in got] == [
        (base + i, k, v) for i, (k, v) in enumerate(items)]
    assert batches_end(bytes(batch)) == base + len(items)
    assert list(read_records(bytes(batch)[:-1])) == []  # a torn batch yields nothing


def test_markers_are_read_as_markers_and_compressed_batches_read() -> None:
    marker = build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.ABORT, coordinator_epoch=0),
        producer_id=1, producer_epoch=0, timestamp=0)
    commit = bytearray(build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.COMMIT, coordinator_epoch=3),
        producer_id=7, producer_epoch=2, timestamp=0))
    set_base_offset(commit, 0, 3)
    compressed = bytearray(compressed_batch([(b"k", b"v")], "gzip"))
    set_base_offset(compressed, 0, 1)
    kept = bytearray(build_batch([(b"key", b"value")], 0))
    set_base_offset(kept, 0, 2)
    got = list(read_records(marker + compressed + kept + commit))
    assert got == [LoggedMarker(0, 1, False), LoggedRecord(1, b"k", b"v"),
                   LoggedRecord(2, b"key", b"value"), LoggedMarker(3, 7, True)]


def test_a_marker_the_cleaner_emptied_is_skipped() -> None:
    marker = build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.COMMIT, coordinator_epoch=0),
        producer_id=9, producer_epoch=1, timestamp=0)
    emptied = bytearray(encode_batch(read_header(marker, 0), []))  # what the cleaner leaves
    set_base_offset(emptied, 0, 4)
    kept = bytearray(build_batch([(b"key", b"value")], 0))
    set_base_offset(kept, 0, 5)
    assert list(read_records(bytes(emptied + kept))) == [LoggedRecord(5, b"key", b"value")]


def test_transactional_batches_are_valid_for_the_log_node_and_carry_their_producer() -> None:
    batch = bytearray(transactional_batch(TransactionalRecords(
        producer_id=42, producer_epoch=3, records=[(b"a", b"1"), (b"b", None)]), 5))
    validate_append(bytes(batch), 1 << 20)
    set_base_offset(batch, 0, 10)
    assert list(read_records(bytes(batch))) == [LoggedRecord(10, b"a", b"1", 42),
                                                LoggedRecord(11, b"b", None, 42)]
    with pytest.raises(ValueError):
        transactional_batch(TransactionalRecords(producer_id=1, producer_epoch=0, records=[]), 0)


def test_a_batch_of_another_magic_is_an_error() -> None:
    with pytest.raises(RecordError):
        list(read_records(build_test_batch([b"v"], magic=1)))
