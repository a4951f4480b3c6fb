"""Kafka request and response headers.

    RequestHeader v1 => request_api_key INT16, request_api_version INT16, correlation_id INT32,
                        client_id NULLABLE_STRING
    RequestHeader v2 => v1 + TAG_BUFFER          (requests of a flexible version)
    ResponseHeader v0 => correlation_id INT32
    ResponseHeader v1 => correlation_id INT32 + TAG_BUFFER   (responses of a flexible version,
                                                              except ApiVersions: always v0)

The client id stays a legacy (int16-sized) string even in v2, as in Kafka. Decoding uses kio's
native readers (skipping unknown tagged fields of v2, see tagged_fields); the response header is
small enough to write by hand.
"""

from __future__ import annotations

import struct

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader

from .api_versions import API_VERSIONS_KEY
from .tagged_fields import tolerant_reader

_PREFIX = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")
_EMPTY_TAG_BUFFER = b"\x00"

_read_v1 = entity_reader(RequestHeaderV1)
_read_v2 = tolerant_reader(RequestHeaderV2, request_header=True)

RequestHeader = RequestHeaderV1 | RequestHeaderV2


def peek(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id): the fixed start of every request header version,
    readable before the version (and so the header's own version) is known.

    Raises ``struct.error`` for a frame shorter than 8 bytes.
    """
    return _PREFIX.unpack_from(frame, 0)


def read_request_header(frame: bytes, flexible: bool) -> tuple[RequestHeader, int]:
    """The header (v2 if the request version is flexible, else v1) and the body's offset."""
    return (_read_v2 if flexible else _read_v1)(frame, 0)


def response_header(api_key: int, correlation_id: int, flexible: bool) -> bytes:
    """The encoded response header for a response body of the given flexibility."""
    if flexible and api_key != API_VERSIONS_KEY:
        return _CORRELATION.pack(correlation_id) + _EMPTY_TAG_BUFFER
    return _CORRELATION.pack(correlation_id)
