"""Which Produce requests the frontend may send to another handler after one failed
mid-request: those whose every batch is idempotent, read from the batch headers alone."""

from __future__ import annotations

import pytest

from services.common.records.record_batch import BatchHeader, pack_batch
from services.frontend.produce_resend import ProduceResend, all_idempotent

from .sample_requests import idempotent_batch, produce_v9_request

PLAIN = pack_batch(BatchHeader(record_count=1), b"\x00" * 8)


def _message_set_v1() -> bytes:
    """An old-format (magic 1) message set of one message: no producer id at all."""
    message = bytes([0, 0, 0, 0, 1, 0]) + (0).to_bytes(8, "big") + b"\xff" * 8
    return (0).to_bytes(8, "big") + len(message).to_bytes(4, "big") + message


@pytest.mark.parametrize(("records", "expected"), [
    (idempotent_batch(7, 0), True),
    (idempotent_batch(7, 0) + idempotent_batch(7, 1, records=3), True),
    (PLAIN, False),
    (idempotent_batch(7, 0) + PLAIN, False),
    (pack_batch(BatchHeader(producer_id=7, base_sequence=-1, record_count=1), b"\x00" * 8),
     False),
    (idempotent_batch(7, 0)[:-1], False),  # cut short
    (idempotent_batch(7, 0) + b"\x00" * 20, False),  # a partial batch after a whole one
    (_message_set_v1(), False),
    (b"", False),
    (None, False),
], ids=["one", "two", "no-producer", "mixed", "no-sequence", "cut", "trailing", "magic-1",
        "empty", "null"])
def test_all_idempotent(records: bytes | None, expected: bool) -> None:
    assert all_idempotent(records) is expected
    if records:
        assert all_idempotent(memoryview(records)) is expected


NAMES = ("topic_data", "partition_data", "records")


def test_a_produce_is_resent_only_when_every_partitions_batches_are_idempotent() -> None:
    resend = ProduceResend(produce_v9_request(partitions=3, producer_id=7), NAMES)
    assert not resend.resent  # not asked: sent once
    assert resend() and resend.resent

    plain = ProduceResend(produce_v9_request(partitions=3), NAMES)
    assert not plain() and not plain.resent
