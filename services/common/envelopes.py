"""Call-stream envelopes (``HandlerCall``, ``HandlerReply``) around one large serialized message,
written and read without copying that message more often than gRPC itself does.

An envelope is a protobuf message with small fields (a call id, a method name, metadata) and one
``bytes`` field holding another serialized message - on the produce and fetch paths, hundreds of
KB of record batches. Built the ordinary way the payload is copied into the envelope, copied
again when the envelope is serialized, and twice more on the other side (parsing the envelope,
reading the field). Protobuf lets a message's fields come in any order, so instead:

- writing: the small fields are serialized by protobuf and the payload field is appended by hand
  (``key``, ``length``, bytes): one join;
- reading: the top-level fields are walked (a few varints; the payload is skipped by its length),
  the payload is handed on as a ``memoryview`` of the received bytes, and protobuf parses the
  small rest.

Both sides stay valid protobuf: anything that speaks the schema (grpcurl, another language) can
send and read these envelopes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError

from kbroker.handler.v1 import handler_pb2
from kbroker.log.v1 import log_pb2

from .call_streams import Batches
from .varints import VarintError, decode_uvarint, encode_uvarint

_LENGTH_DELIMITED = 2


def with_bytes_field(head: bytes, field_number: int,
                     payload: bytes | memoryview | tuple[Sequence[bytes | memoryview], int],
                     ) -> bytes:
    """``head`` (a serialized message without the field) with the bytes field
    ``field_number`` set to ``payload``: bytes, or (pieces, their size) joined in the same
    single copy (a message spliced around its record batches, see
    :mod:`services.common.payloads`)."""
    key = encode_uvarint(field_number << 3 | _LENGTH_DELIMITED)
    if isinstance(payload, tuple):
        pieces, size = payload
        return b"".join((head, key, encode_uvarint(size), *pieces))
    return b"".join((head, key, encode_uvarint(len(payload)), payload))


def split_bytes_field(data: bytes, field_number: int) -> tuple[bytes, memoryview]:
    """(the message without the bytes field ``field_number``, that field's value as a view of
    ``data``; empty if absent). A field given twice takes its last value, as protobuf does.

    Raises ``DecodeError`` for bytes that are not a protobuf message."""
    end = len(data)
    position = 0
    value: tuple[int, int] | None = None
    rest: list[bytes] = []
    kept_from = 0
    try:
        while position < end:
            field_start = position
            key, position = decode_uvarint(data, position, end)
            wire_type = key & 7
            if wire_type == 0:
                _, position = decode_uvarint(data, position, end)
            elif wire_type == 1:
                position += 8
            elif wire_type == _LENGTH_DELIMITED:
                length, position = decode_uvarint(data, position, end)
                value_start = position
                position += length
                if key >> 3 == field_number and position <= end:
                    value = (value_start, position)
                    rest.append(data[kept_from:field_start])
                    kept_from = position
            elif wire_type == 5:
                position += 4
            else:
                raise DecodeError(f"unsupported wire type {wire_type}")
            if position > end:
                raise DecodeError("truncated field")
    except VarintError as exc:
        raise DecodeError(str(exc)) from None
    if value is None:
        return data, memoryview(b"")
    rest.append(data[kept_from:end])
    return b"".join(rest), memoryview(data)[value[0]:value[1]]


# --- KafkaHandlerStream.Exchange -----------------------------------------------------------

_CALL_REQUEST_FIELD = handler_pb2.HandlerCall.DESCRIPTOR.fields_by_name["request"].number
_REPLY_RESPONSE_FIELD = handler_pb2.HandlerReply.DESCRIPTOR.fields_by_name["response"].number

Metadata = Sequence[tuple[str, str]]


def encode_handler_call(call_id: int, method: str,
                        request: bytes | tuple[Sequence[bytes | memoryview], int],
                        metadata: Metadata = (),
                        file_records: Sequence[handler_pb2.RequestFileRecords] = ()) -> bytes:
    """A serialized ``HandlerCall`` carrying ``request`` (a serialized request message, or its
    pieces and size) and naming ``file_records``."""
    head = handler_pb2.HandlerCall(
        call_id=call_id, method=method,
        metadata=[handler_pb2.MetadataEntry(key=k, value=v) for k, v in metadata],
        file_records=file_records)
    return with_bytes_field(head.SerializeToString(), _CALL_REQUEST_FIELD, request)


def decode_handler_call(data: bytes) -> tuple[handler_pb2.HandlerCall, memoryview]:
    """The ``HandlerCall`` without its request, and the request's bytes (a view of ``data``).
    Raises ``DecodeError``."""
    rest, request = split_bytes_field(data, _CALL_REQUEST_FIELD)
    return handler_pb2.HandlerCall.FromString(rest), request


def encode_handler_reply(reply: handler_pb2.HandlerReply,
                         response: bytes | tuple[Sequence[bytes | memoryview], int] = b"",
                         ) -> bytes:
    """``reply`` (without a response) serialized with ``response`` (a serialized response, or
    its pieces and size) as its response."""
    head = reply.SerializeToString()
    empty = response[1] == 0 if isinstance(response, tuple) else not response
    return head if empty else with_bytes_field(head, _REPLY_RESPONSE_FIELD, response)


def decode_handler_reply(data: bytes) -> tuple[handler_pb2.HandlerReply, memoryview]:
    """The ``HandlerReply`` without its response, and the response's bytes (a view of
    ``data``). Raises ``DecodeError``."""
    rest, response = split_bytes_field(data, _REPLY_RESPONSE_FIELD)
    return handler_pb2.HandlerReply.FromString(rest), response


# --- batches (a repeated bytes field holding whole messages) -----------------------------


def protobuf_batches(field_number: int) -> Batches:
    """Batches of a stream whose messages define ``repeated bytes batch = field_number``: a
    message that begins with that field is a batch, each occurrence a serialized message (and
    it holds nothing else); any other message is one call or answer."""
    key = field_number << 3 | _LENGTH_DELIMITED
    key_bytes = encode_uvarint(key)

    def join(messages: Sequence[bytes]) -> bytes:
        parts: list[bytes] = []
        for message in messages:
            parts += (key_bytes, encode_uvarint(len(message)), message)
        return b"".join(parts)

    def split(data: Any) -> list[memoryview] | None:
        if not data or data[0] != key_bytes[0]:
            return None
        view = memoryview(data)
        end = len(data)
        position = 0
        messages: list[memoryview] = []
        try:
            while position < end:
                found, position = decode_uvarint(data, position, end)
                if found != key:
                    raise DecodeError(f"field key {found} in a batch")
                length, position = decode_uvarint(data, position, end)
                if position + length > end:
                    raise DecodeError("truncated batch")
                messages.append(view[position:position + length])
                position += length
        except VarintError as exc:
            raise DecodeError(str(exc)) from None
        return messages

    return Batches(join, split)


# How KafkaHandlerStream.Exchange batches its calls and replies (HandlerCall.batch,
# HandlerReply.batch).
EXCHANGE_BATCHES = protobuf_batches(
    handler_pb2.HandlerCall.DESCRIPTOR.fields_by_name["batch"].number)

# How LogService.AppendStream batches its requests and answers (AppendStreamRequest.batch,
# AppendStreamResponse.batch).
APPEND_BATCHES = protobuf_batches(
    log_pb2.AppendStreamRequest.DESCRIPTOR.fields_by_name["batch"].number)
