"""Fuzzing the Kafka request decoder (frames, headers, bodies, tagged fields): arbitrary bytes
and damaged valid requests of every API and version are refused cleanly or decoded into a
handler request, never crash, never hang, never allocate out of proportion to the frame."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.frontend.api_versions import SUPPORTED_APIS

from .kafka_requests import check_request_frame, decoder, valid_frames
from .mutations import mutated

FUZZ = settings(max_examples=300, deadline=1000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(autouse=True, scope="module")
def traced() -> Iterator[None]:
    decoder()  # warmed up before memory is watched
    tracemalloc.start()
    yield
    tracemalloc.stop()


def test_every_valid_frame_decodes() -> None:
    frames = valid_frames()
    assert len(frames) > len(SUPPORTED_APIS)
    for frame in frames:
        check_request_frame(frame)


@FUZZ
@given(st.binary(max_size=256))
def test_arbitrary_bytes(frame: bytes) -> None:
    check_request_frame(frame)


@FUZZ
@given(st.sampled_from(sorted(SUPPORTED_APIS)), st.integers(-1, 20), st.binary(max_size=200))
def test_arbitrary_body_after_a_plausible_header(api_key: int, version: int, body: bytes) -> None:
    check_request_frame(struct.pack(">hhi", api_key, version, 1) + body)


@settings(FUZZ, max_examples=1500)
@given(mutated(valid_frames()))
def test_damaged_valid_requests(frame: bytes) -> None:
    check_request_frame(frame)


# Lengths and counts that once made the decoder allocate for them before reading (a compact
# array of 2^32 - 2 elements asked for 32 GiB and aborted the process).
_HUGE_LENGTHS = (struct.pack(">i", 0x7FFFFFFF), b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07")


def test_huge_lengths_at_every_position_of_every_valid_frame() -> None:
    for frame in valid_frames():
        for position in range(8, len(frame)):
            for length in _HUGE_LENGTHS:
                check_request_frame(frame[:position] + length + frame[position + len(length):])
