"""Fuzzing record batches: arbitrary bytes and damaged valid batches (every codec, control and
transactional batches), with and without their CRC made right again, give the Kafka error or
a clean refusal, never another exception."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .mutations import mutated
from .record_batches import check_records, recrc, valid_batches

FUZZ = settings(max_examples=400, deadline=1000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_every_valid_batch_is_accepted() -> None:
    for batch in valid_batches():
        check_records(batch)


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    check_records(data)


@FUZZ
@given(mutated(valid_batches()))
def test_damaged_batches(data: bytes) -> None:
    check_records(data)


@settings(FUZZ, max_examples=1000)
@given(mutated(valid_batches()).map(recrc))
def test_damaged_batches_with_a_correct_crc(data: bytes) -> None:
    check_records(data)
