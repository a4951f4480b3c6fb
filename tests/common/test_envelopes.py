"""Envelopes written and read by hand are the protobuf messages of the schema: what protobuf
serializes, the hand reader takes apart, and what the hand writer builds, protobuf parses."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError

from kbroker.handler.v1 import handler_pb2
from services.common.envelopes import (
    decode_handler_call,
    decode_handler_reply,
    encode_handler_call,
    encode_handler_reply,
    split_bytes_field,
    with_bytes_field,
)

SIZES = [0, 1, 127, 128, 16_383, 16_384, 300_000]


@pytest.mark.parametrize("size", SIZES)
def test_a_hand_written_call_is_the_schema_message(size: int) -> None:
    payload = random.Random(size).randbytes(size)
    data = encode_handler_call(2**40 + 3, "Produce", payload, [("client-id", "c"), ("k", "v")])
    parsed = handler_pb2.HandlerCall.FromString(data)
    assert parsed.call_id == 2**40 + 3 and parsed.method == "Produce"
    assert parsed.request == payload
    assert [(m.key, m.value) for m in parsed.metadata] == [("client-id", "c"), ("k", "v")]


@pytest.mark.parametrize("size", SIZES)
def test_a_protobuf_call_is_read_by_hand_with_its_request_as_a_view(size: int) -> None:
    payload = random.Random(size).randbytes(size)
    # The request in the middle of the message, as protobuf itself writes it.
    data = handler_pb2.HandlerCall(
        call_id=9, method="Fetch", request=payload,
        metadata=[handler_pb2.MetadataEntry(key="a", value="b")]).SerializeToString()
    call, request = decode_handler_call(data)
    # A view of the received bytes, not a copy (protobuf leaves an empty field out).
    assert isinstance(request, memoryview) and (request.obj is data or size == 0)
    assert bytes(request) == payload
    assert (call.call_id, call.method, call.request) == (9, "Fetch", b"")
    assert [(m.key, m.value) for m in call.metadata] == [("a", "b")]


def test_replies_round_trip_with_and_without_a_response() -> None:
    reply = handler_pb2.HandlerReply(call_id=5)
    reply.trailing_metadata.add(key="kbroker-remote-ms", value="12")
    data = encode_handler_reply(reply, b"\x01\x02response")
    assert handler_pb2.HandlerReply.FromString(data).response == b"\x01\x02response"
    head, response = decode_handler_reply(data)
    assert head.call_id == 5 and bytes(response) == b"\x01\x02response"
    assert [(m.key, m.value) for m in head.trailing_metadata] == [("kbroker-remote-ms", "12")]
    failed = encode_handler_reply(handler_pb2.HandlerReply(
        call_id=6, status_code=12, status_details="no such method"))
    head, response = decode_handler_reply(failed)
    assert (head.call_id, head.status_code, head.status_details) == (6, 12, "no such method")
    assert bytes(response) == b""


def test_the_last_of_a_repeated_bytes_field_wins_as_in_protobuf() -> None:
    data = with_bytes_field(with_bytes_field(b"\x08\x07", 3, b"first"), 3, b"second")
    assert handler_pb2.HandlerCall.FromString(data).request == b"second"
    rest, value = split_bytes_field(data, 3)
    assert bytes(value) == b"second" and rest == b"\x08\x07"


def test_every_wire_type_is_skipped() -> None:
    # field 1 varint, field 2 fixed64, field 4 fixed32, field 5 bytes, then field 3 bytes
    data = (b"\x08\x96\x01" + b"\x11" + bytes(8) + b"\x25" + bytes(4) + b"\x2a\x02hi"
            + b"\x1a\x03abc")
    rest, value = split_bytes_field(data, 3)
    assert bytes(value) == b"abc" and rest == data[:-5]


@pytest.mark.parametrize("data", [
    b"\x1a\x05ab",            # length past the end
    b"\x08",                  # varint cut short
    b"\x08" + b"\xff" * 11,   # varint too long
    b"\x0b",                  # start group: not used by proto3
    b"\x11\x00",              # fixed64 cut short
])
def test_bytes_that_are_not_a_message_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        split_bytes_field(data, 3)
