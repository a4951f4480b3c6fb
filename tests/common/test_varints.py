"""Varints: round trips at the edges, and bytes that are not a varint."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.varints import (
    VarintError,
    decode_uvarint,
    decode_varint,
    encode_uvarint,
    encode_varint,
)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_unsigned_round_trip(value: int) -> None:
    data = b"\xaa" + encode_uvarint(value) + b"\xbb"
    assert decode_uvarint(data, 1) == (value, len(data) - 1)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_zigzag_round_trip(value: int) -> None:
    data = encode_varint(value)
    assert decode_varint(memoryview(data), 0) == (value, len(data))


@pytest.mark.parametrize(("value", "encoded"), [
    (0, b"\x00"), (1, b"\x02"), (-1, b"\x01"), (63, b"\x7e"), (-64, b"\x7f"), (64, b"\x80\x01"),
    (2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"), (-(2**63), b"\xff" * 9 + b"\x01"),
])
def test_zigzag_as_kafka_and_protobuf_write_it(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded


def test_unsigned_edges() -> None:
    assert encode_uvarint(127) == b"\x7f" and encode_uvarint(128) == b"\x80\x01"
    assert encode_uvarint(300) == b"\xac\x02"


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff\xff", b"\xff" * 10 + b"\x01"])
def test_not_a_varint(data: bytes) -> None:
    with pytest.raises(VarintError):
        decode_uvarint(data, 0)


def test_end_bounds_the_read() -> None:
    with pytest.raises(VarintError):
        decode_uvarint(b"\x80\x01", 0, end=1)
