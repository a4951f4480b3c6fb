"""The batches of a coordinator partition: what the runtime appends the log node accepts as it
is, and what it reads back (control batches skipped, compressed ones read, a torn tail
ignored)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record import build_batch
from services.common.records.record_batch import RecordError, batches_end, set_base_offset
from services.handler.coordinator.partition import read_records
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


def test_control_batches_are_skipped_and_compressed_ones_read() -> None:
    marker = build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.ABORT, coordinator_epoch=0),
        producer_id=1, producer_epoch=0, timestamp=0)
    compressed = compressed_batch([(b"k", b"v")], "gzip")
    kept = build_batch([(b"key", b"value")], 0)
    got = list(read_records(marker + compressed + kept))
    assert [(g.key, g.value) for g in got] == [(b"k", b"v"), (b"key", b"value")]


def test_a_batch_of_another_magic_is_an_error() -> None:
    with pytest.raises(RecordError):
        list(read_records(build_test_batch([b"v"], magic=1)))
