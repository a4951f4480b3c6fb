"""Buffers allocated without zeroing: sized as asked, writable, and refused for a negative
size."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.buffers import unfilled


@given(st.binary(max_size=300_000))
def test_an_unfilled_buffer_holds_what_is_written_into_it(data: bytes) -> None:
    buffer = unfilled(len(data))
    assert type(buffer) is bytearray and len(buffer) == len(data)
    memoryview(buffer)[:] = data
    assert buffer == data


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError):
        unfilled(-1)
    assert unfilled(0) == bytearray()
