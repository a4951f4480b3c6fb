"""A raw Kafka wire client for tests: frames requests with kio, reads responses."""

from __future__ import annotations

import io
import socket
import struct

from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32


def encode_request(request: object, correlation_id: int, client_id: str = "wire-test") -> bytes:
    cls = type(request)
    header_cls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    header = header_cls(request_api_key=cls.__api_key__, request_api_version=cls.__version__,
                        correlation_id=i32(correlation_id), client_id=client_id)
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(cls)(buf, request)
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def read_response(sock: socket.socket, request_cls: type) -> tuple[int, object]:
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    body = recv_exact(sock, size)
    response_cls = load_payload_module(request_cls.__api_key__, request_cls.__version__,
                                       EntityType.response).__dict__[
        request_cls.__name__.replace("Request", "Response")]
    # ApiVersions responses always use header v0 (KIP-511).
    flexible_header = response_cls.__flexible__ and request_cls.__api_key__ != 18
    header_cls = ResponseHeaderV1 if flexible_header else ResponseHeaderV0
    header, used = entity_reader(header_cls)(body, 0)
    response, _ = entity_reader(response_cls)(body, used)
    return int(header.correlation_id), response


def version(value: int) -> i16:
    return i16(value)
