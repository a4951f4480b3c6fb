"""Unknown tagged fields (KIP-482): every API's newest flexible version, sent to a real frontend
with tags its schema does not define in the request header, the body and every nested struct,
is answered as the same request without them; a tagged section that does not fit still closes
the connection.

Requests are encoded here field by field with kio's own field writers, so the unknown tags are
put in place without the frontend's reader (services/frontend/tagged_fields.py) taking part."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_field_writer
from kio.serial.writers import write_int8, write_unsigned_varint
from kio.static.constants import EntityType
from kio.static.primitive import Records

from services.frontend import converter, tagged_fields
from services.frontend.api_versions import SUPPORTED_APIS

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire, frame
from .sample_requests import metadata_v12
from .test_service import frontend

NEWEST = [converter.load_schema(api.schema_name, api.max_version, EntityType.request)
          for api in SUPPORTED_APIS.values()]
FLEXIBLE_NEWEST = [cls for cls in NEWEST if cls.__flexible__]
# Tags no schema defines: the first one a struct leaves free, and one of a three-byte varint.
UNKNOWN_PAYLOADS = (b"", b"\x00\xff unknown \x7f")
FAR_TAG = 1 << 20


def sample(cls: type) -> Any:
    """A request entity with every field (tagged ones included) set to a plain value."""
    values = {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if isinstance(kind, EntityField):
            value: Any = sample(kind.type_)
        elif isinstance(kind, EntityTupleField):
            value = (sample(kind.type_),)
        else:
            value = _primitive(get_schema_field_type(field), kind.type_)
            if isinstance(kind, PrimitiveTupleField):
                value = (value,)
        values[field.name] = value
    return cls(**values)


def _primitive(kafka_type: str, type_: type) -> Any:
    match kafka_type:
        case "string":
            return type_("t")
        case "bytes" | "records":
            return Records(b"x") if type_ is Records else b"x"
        case "bool":
            return True
        case "uuid":
            return uuid.UUID("6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f1")
        case "timedelta_i32" | "timedelta_i64":
            return type_(datetime.timedelta(milliseconds=1))
        case "datetime_i64":
            return type_(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
        case "float64":
            return type_(1.0)
        case _:
            return type_(1)


def encode(entity: Any, *, unknown_tags: bool, request_header: bool = False,
           nullable: bool = False) -> bytes:
    """``entity`` in Kafka's wire format, as kio writes it, plus (``unknown_tags``) two tagged
    fields its schema does not define in its own and every nested tagged section."""
    cls = type(entity)
    out = io.BytesIO()
    if nullable:
        write_int8(out, 1)
    tagged: dict[int, bytes] = {}
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        value = getattr(entity, field.name)
        if tag is not None and (value == field.default or (
                field.default is dataclasses.MISSING
                and value == get_tagged_field_default(field))):
            continue
        kind = classify_field(field)
        if isinstance(kind, EntityField):
            data = encode(value, unknown_tags=unknown_tags,
                          nullable=tag is None and is_optional(field))
        elif isinstance(kind, EntityTupleField):
            items = io.BytesIO()
            write_unsigned_varint(items, len(value) + 1)
            data = items.getvalue() + b"".join(
                encode(item, unknown_tags=unknown_tags) for item in value)
        else:
            buffer = io.BytesIO()
            get_field_writer(field, cls.__flexible__, request_header, tag is not None)(
                buffer, value)
            data = buffer.getvalue()
        if tag is None:
            out.write(data)
        else:
            tagged[tag] = data
    if not cls.__flexible__:
        return out.getvalue()
    if unknown_tags:
        free = min(set(range(len(tagged) + 1)) - set(tagged))
        tagged[free] = UNKNOWN_PAYLOADS[0]
        tagged[FAR_TAG] = UNKNOWN_PAYLOADS[1]
    write_unsigned_varint(out, len(tagged))
    for tag in sorted(tagged):
        write_unsigned_varint(out, tag)
        write_unsigned_varint(out, len(tagged[tag]))
        out.write(tagged[tag])
    return out.getvalue()


def request_frame(entity: Any, correlation_id: int, *, unknown_tags: bool) -> bytes:
    cls = type(entity)
    header = RequestHeaderV2(request_api_key=cls.__api_key__,
                             request_api_version=cls.__version__,
                             correlation_id=correlation_id, client_id="tagged-test")
    return frame(encode(header, unknown_tags=unknown_tags, request_header=True)
                 + encode(entity, unknown_tags=unknown_tags))


def kio_encoded(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


@pytest.mark.parametrize("cls", FLEXIBLE_NEWEST, ids=lambda c: f"{c.__name__}-v{c.__version__}")
def test_the_test_encoder_writes_what_kio_writes_and_kio_refuses_unknown_tags(cls: type) -> None:
    entity = sample(cls)
    plain = encode(entity, unknown_tags=False)
    assert plain == kio_encoded(entity)
    tagged = encode(entity, unknown_tags=True)
    assert len(tagged) > len(plain)
    # kio itself refuses them (what tagged_fields works around): if a kio upgrade skips unknown
    # tags natively, this fails and the workaround can go.
    with pytest.raises(KeyError, match="Unknown tagged field tag"):
        entity_reader(cls)(tagged, 0)
    read = tagged_fields.tolerant_reader(cls)
    assert read(tagged, 0) == (entity, len(tagged))
    assert read(plain, 0) == (entity, len(plain))


def test_the_newest_versions_without_tagged_fields_are_the_ones_kafka_never_made_flexible(
        ) -> None:
    assert sorted(c.__name__ for c in NEWEST if not c.__flexible__) == [
        "OffsetDeleteRequest", "SaslHandshakeRequest"]


def test_every_api_newest_version_with_unknown_tags_is_answered_as_without_them() -> None:
    # A Fetch naming a session the frontend never opened is answered without the handler:
    # the sample's is a full, sessionless one.
    entities = [dataclasses.replace(e, session_id=0, session_epoch=-1)
                if cls.__api_key__ == 1 else e
                for cls, e in ((cls, sample(cls)) for cls in FLEXIBLE_NEWEST)]
    handler = FakeHandler()

    async def exchange(service: Any, unknown_tags: bool) -> tuple[list[bytes], list[Any]]:
        """Each request on its own connection: the raw responses and the handler calls made."""
        handler.calls.clear()
        handler.next_offset.clear()
        responses = []
        for i, entity in enumerate(entities):
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(request_frame(entity, 100 + i, unknown_tags=unknown_tags))
            responses.append(await wire.read_frame())
            await wire.close()
        return responses, [(rpc, request) for rpc, request, _ in handler.calls]

    async def main() -> None:
        async with frontend(handler) as service:
            plain, plain_calls = await exchange(service, unknown_tags=False)
            tagged, tagged_calls = await exchange(service, unknown_tags=True)
        for i, cls in enumerate(FLEXIBLE_NEWEST):
            assert tagged[i] == plain[i], cls.__name__
            (correlation_id,) = struct.unpack_from(">i", plain[i])
            assert correlation_id == 100 + i
        assert tagged_calls == plain_calls
        forwarded = {SUPPORTED_APIS[cls.__api_key__].rpc for cls in FLEXIBLE_NEWEST} - {None}
        assert {rpc for rpc, _ in plain_calls} >= forwarded

    asyncio.run(main())


def test_response_encoding_is_unchanged_by_unknown_request_tags() -> None:
    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(request_frame(metadata_v12("a"), 5, unknown_tags=True))
            from kio.schema.metadata.v12.response import MetadataResponse
            # read_response checks the v1 header's empty tag buffer and no trailing bytes.
            correlation_id, response = await wire.read_response(MetadataResponse)
            assert correlation_id == 5
            assert [t.name for t in response.topics] == ["a"]
            await wire.close()

    asyncio.run(main())


def _malformed() -> dict[str, bytes]:
    good = request_frame(metadata_v12("a"), 9, unknown_tags=False)[4:]
    # The body's last byte is its empty tagged section (count 0).
    assert good[-1] == 0
    body = good[:-1]
    return {
        "unknown tag larger than the frame": frame(body + b"\x01\x05\x40" + b"z" * 8),
        "more tags counted than present": frame(body + b"\x02\x05\x01z"),
        "tag without a size": frame(body + b"\x01\x05"),
        "unknown tag in the header larger than the frame": frame(
            struct.pack(">hhih", 3, 12, 9, -1) + b"\x01\x07\x7f" + b"z" * 4),
    }


@pytest.mark.parametrize("name", sorted(_malformed()))
def test_malformed_tagged_section_closes_the_connection(name: str) -> None:
    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            bad = await KafkaWire.connect(service.kafka_port)
            await bad.send(_malformed()[name])
            assert await bad.closed_by_peer(), name
            await bad.close()
            good = await KafkaWire.connect(service.kafka_port)
            assert (await good.request(metadata_v12("b"), 3)).topics[0].name == "b"
            await good.close()

    asyncio.run(main())
