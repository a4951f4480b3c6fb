"""The answer to a follower's fetch (``ReplicaFetchResponse``) written and read around its record
batches, which are nearly all of its bytes, without protobuf copying them (the idea of
:mod:`services.common.envelopes`).

    ReplicaFetchResponse => results: repeated ReplicaFetchResult (field 1)
    ReplicaFetchResult   => topic, partition, error_code, error_message, high_watermark,
                            log_start_offset, log_end_offset, records (field 5, bytes)

Written: each result's small fields serialized by protobuf, its records field and the result's
own framing appended by hand, everything in one join (the records are copied once). Read: the
top-level fields walked, each result's records handed on as a ``memoryview`` of the received
bytes and the small rest parsed by protobuf. Both sides stay valid protobuf: grpcurl and any
other client read and write the same messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from kbroker.log.v1 import log_pb2
from services.common.envelopes import split_bytes_field
from services.common.varints import VarintError, decode_uvarint, encode_uvarint

_RESULTS = 1
_RECORDS = 5
_LENGTH_DELIMITED = 2
_RESULT_KEY = encode_uvarint(_RESULTS << 3 | _LENGTH_DELIMITED)
_RECORDS_KEY = encode_uvarint(_RECORDS << 3 | _LENGTH_DELIMITED)


def encode_fetch_response(
        results: Sequence[tuple[log_pb2.ReplicaFetchResult, bytes | memoryview]]) -> bytes:
    """A serialized ``ReplicaFetchResponse`` of ``results``, each a result without records and
    its records (empty: none)."""
    pieces: list[bytes | memoryview] = []
    for result, records in results:
        head = result.SerializeToString()
        size = len(head)
        if records:
            length = encode_uvarint(len(records))
            size += len(_RECORDS_KEY) + len(length) + len(records)
            pieces += (_RESULT_KEY, encode_uvarint(size), head, _RECORDS_KEY, length, records)
        else:
            pieces += (_RESULT_KEY, encode_uvarint(size), head)
    return b"".join(pieces)


def decode_fetch_response(data: bytes) -> list[tuple[log_pb2.ReplicaFetchResult, memoryview]]:
    """Each result of a serialized ``ReplicaFetchResponse`` (its records field left empty) and
    its records, a view of ``data``. Raises ``DecodeError`` for bytes that are not one."""
    results = []
    view = memoryview(data)
    end, position = len(data), 0
    try:
        while position < end:
            key, position = decode_uvarint(data, position, end)
            if key & 7 != _LENGTH_DELIMITED:
                raise DecodeError(f"unexpected wire type {key & 7} in a fetch response")
            length, position = decode_uvarint(data, position, end)
            if position + length > end:
                raise DecodeError("truncated fetch response")
            if key >> 3 == _RESULTS:
                rest, records = split_bytes_field(view[position:position + length], _RECORDS)
                results.append((log_pb2.ReplicaFetchResult.FromString(bytes(rest)), records))
            position += length
    except VarintError as exc:
        raise DecodeError(str(exc)) from None
    return results
