"""A minimal Kafka client for tests: encodes requests with kio and reads raw responses over an
asyncio stream, so tests can speak to the frontend byte by byte (including garbage)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

TIMEOUT = 10.0


def encode_request(entity: Any, correlation_id: int, client_id: str | None = "test-client",
                   api_version: int | None = None) -> bytes:
    """A whole frame (size prefix included) for a kio request entity."""
    cls = type(entity)
    flexible = cls.__flexible__
    header_cls = RequestHeaderV2 if flexible else RequestHeaderV1
    out = io.BytesIO()
    entity_writer(header_cls)(out, header_cls(
        request_api_key=cls.__api_key__,
        request_api_version=cls.__version__ if api_version is None else api_version,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(cls)(out, entity)
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


class KafkaWire:
    """One client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int) -> KafkaWire:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_frame(self) -> bytes:
        size_bytes = await asyncio.wait_for(self.reader.readexactly(4), TIMEOUT)
        (size,) = struct.unpack(">i", size_bytes)
        return await asyncio.wait_for(self.reader.readexactly(size), TIMEOUT)

    async def read_response(self, response_cls: type, header_flexible: bool | None = None
                            ) -> tuple[int, Any]:
        """(correlation id, decoded response). The header is v1 for flexible responses unless
        ``header_flexible`` says otherwise (ApiVersions: always v0)."""
        body = await self.read_frame()
        if header_flexible is None:
            header_flexible = response_cls.__flexible__ and response_cls.__api_key__ != 18
        (correlation_id,) = struct.unpack_from(">i", body, 0)
        offset = 4
        if header_flexible:
            assert body[4] == 0, "response header v1 carries no tagged fields"
            offset = 5
        entity, size = entity_reader(response_cls)(body, offset)
        assert offset + size == len(body), "response has trailing bytes"
        return correlation_id, entity

    async def request(self, entity: Any, correlation_id: int = 1) -> Any:
        from kio.index import load_response_schema
        await self.send(encode_request(entity, correlation_id))
        response_cls = load_response_schema(type(entity).__api_key__, type(entity).__version__)
        got_id, response = await self.read_response(response_cls)
        assert got_id == correlation_id
        return response

    async def closed_by_peer(self) -> bool:
        """True once the frontend closed the connection (EOF), False if it sent data."""
        try:
            data = await asyncio.wait_for(self.reader.read(1), TIMEOUT)
        except ConnectionResetError:
            return True
        return data == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
