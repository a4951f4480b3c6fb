"""The compiled entity writers write what kio's writer writes, byte for byte: random entities of
every request, response and header schema kio has (each version), with nulls, empty and long
strings, tagged fields at and off their defaults, and the values kio refuses refused alike."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import pkgutil
import random
import uuid
from typing import Any

import kio.schema
import pytest
from google.protobuf.message import Message
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer as kio_entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.errors import OutOfBoundValue

from services.frontend.converter import from_proto_fn, to_proto_fn
from services.frontend.entity_writers import entity_writer, message_writer
from services.frontend.framing import FrameWriter

RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
UNSIGNED = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}


def schema_classes() -> list[type]:
    """Every top-level entity class of kio's schemas (requests, responses, headers)."""
    found = []
    for module in pkgutil.walk_packages(kio.schema.__path__, "kio.schema."):
        if module.ispkg or module.name.rsplit(".", 1)[1] not in ("request", "response",
                                                                 "header"):
            continue
        loaded = importlib.import_module(module.name)
        for value in vars(loaded).values():
            if (isinstance(value, type) and dataclasses.is_dataclass(value)
                    and value.__module__ == loaded.__name__
                    and hasattr(value, "__api_key__") or (
                        isinstance(value, type) and value.__module__ == loaded.__name__
                        and value.__name__.endswith("Header"))):
                found.append(value)
    return sorted(found, key=lambda cls: (cls.__module__, cls.__name__))


CLASSES = schema_classes()


def random_value(kafka_type: str, rng: random.Random) -> Any:
    if kafka_type in RANGES:
        bits = RANGES[kafka_type]
        return rng.choice([0, -1, 1, -(1 << bits - 1), (1 << bits - 1) - 1,
                           rng.randrange(-(1 << bits - 1), 1 << bits - 1)])
    if kafka_type in UNSIGNED:
        return rng.choice([0, 1, (1 << UNSIGNED[kafka_type]) - 1,
                           rng.randrange(1 << UNSIGNED[kafka_type])])
    if kafka_type == "float64":
        return rng.choice([0.0, -1.5, rng.uniform(-1e9, 1e9)])
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "string":
        return "".join(rng.choice("abcé-_.") for _ in range(rng.choice([0, 3, 20, 140])))
    if kafka_type in ("bytes", "records"):
        return rng.randbytes(rng.choice([0, 5, 130, 300]))
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    if kafka_type == "error_code":
        return rng.choice(list(ErrorCode))
    if kafka_type == "timedelta_i32":
        return datetime.timedelta(milliseconds=rng.randrange(-(1 << 31), 1 << 31))
    if kafka_type == "timedelta_i64":
        return datetime.timedelta(milliseconds=rng.randrange(-(1 << 40), 1 << 40))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randrange(1 << 41) / 1000,
                                               datetime.UTC)
    raise AssertionError(f"no random value for {kafka_type}")


def random_entity(cls: type, rng: random.Random, depth: int = 0) -> Any:
    values = {}
    for field in dataclasses.fields(cls):
        optional = is_optional(field)
        if get_field_tag(field) is not None and field.default is not dataclasses.MISSING \
                and rng.random() < 0.4:
            values[field.name] = field.default  # a tagged field left out
            continue
        if optional and rng.random() < 0.25:
            values[field.name] = None
            continue
        kind = classify_field(field)
        if isinstance(kind, PrimitiveField):
            values[field.name] = random_value(get_schema_field_type(field), rng)
        elif isinstance(kind, EntityField):
            values[field.name] = random_entity(kind.type_, rng, depth + 1)
        else:
            count = 0 if depth > 3 else rng.choice([0, 1, 3])
            if isinstance(kind, EntityTupleField):
                values[field.name] = tuple(random_entity(kind.type_, rng, depth + 1)
                                           for _ in range(count))
            else:
                values[field.name] = tuple(random_value(get_schema_field_type(field), rng)
                                           for _ in range(count))
    return cls(**values)


def kio_bytes(cls: type, entity: Any) -> bytes:
    out = io.BytesIO()
    kio_entity_writer(cls)(out, entity)
    return out.getvalue()


def compiled_bytes(cls: type, entity: Any) -> bytes:
    out = FrameWriter()
    entity_writer(cls)(out, entity)
    return b"".join(out.finish()[1:])


def test_every_kio_schema_is_covered() -> None:
    names = {cls.__module__ for cls in CLASSES}
    assert len(CLASSES) > 500
    assert "kio.schema.metadata.v12.response" in names
    assert "kio.schema.fetch.v16.response" in names
    assert "kio.schema.response_header.v1.header" in names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__module__[len("kio.schema."):])
def test_random_entities_are_written_as_kio_writes_them(cls: type) -> None:
    rng = random.Random(cls.__module__)
    for _ in range(8):
        entity = random_entity(cls, rng)
        assert compiled_bytes(cls, entity) == kio_bytes(cls, entity)


def test_a_large_answer_keeps_its_record_batches_as_separate_buffers() -> None:
    from kio.schema.fetch.v12.response import (
        FetchableTopicResponse,
        FetchResponse,
        PartitionData,
    )

    batches = memoryview(bytes(range(256)) * 256)
    entity = random_entity(FetchResponse, random.Random(1))
    partition = random_entity(PartitionData, random.Random(2))
    entity = dataclasses.replace(entity, responses=(FetchableTopicResponse(
        topic="t", partitions=(dataclasses.replace(partition, records=batches),)),))
    out = FrameWriter()
    entity_writer(FetchResponse)(out, entity)
    assert any(chunk is batches for chunk in out.finish())
    assert compiled_bytes(FetchResponse, entity) == kio_bytes(FetchResponse, entity)


def test_values_the_wire_cannot_carry_are_refused_as_kio_refuses_them() -> None:
    from kio.schema.metadata.v5.response import MetadataResponse, MetadataResponseBroker

    broker = random_entity(MetadataResponseBroker, random.Random(3))
    for bad, error in [(dataclasses.replace(broker, node_id=1 << 31), Exception),
                       (dataclasses.replace(broker, host="h" * 40000), OutOfBoundValue),
                       (dataclasses.replace(broker, host=None), TypeError)]:
        entity = dataclasses.replace(random_entity(MetadataResponse, random.Random(4)),
                                     brokers=(bad,))
        with pytest.raises(error):
            kio_bytes(MetadataResponse, entity)
        with pytest.raises(error):
            compiled_bytes(MetadataResponse, entity)


def answer_classes() -> list[type]:
    """The request and response class of every API version the frontend serves."""
    from kio.static.constants import EntityType

    from services.frontend.api_versions import SUPPORTED_APIS
    from services.frontend.converter import load_schema

    return [load_schema(api.schema_name, version, kind) for api in SUPPORTED_APIS.values()
            for version in range(api.min_version, api.max_version + 1)
            for kind in (EntityType.request, EntityType.response)]


ANSWERS = answer_classes()


def clear_some(message: Message, rng: random.Random) -> None:
    """Leave fields of ``message`` and of the messages in it unset, at random, and mark some
    arrays null though they have items (the null flag wins)."""
    for field, value in message.ListFields():
        null_flag = f"{field.name}_is_null"
        if rng.random() < 0.2:
            message.ClearField(field.name)
        elif null_flag in message.DESCRIPTOR.fields_by_name and rng.random() < 0.2:
            setattr(message, null_flag, True)
        elif field.message_type is not None:
            for item in value if field.is_repeated else [value]:
                clear_some(item, rng)


@pytest.mark.parametrize("cls", ANSWERS, ids=lambda cls: cls.__module__[len("kio.schema."):])
def test_answers_written_from_their_messages_are_what_kio_writes_of_the_conversion(
        cls: type) -> None:
    convert_to, convert_from = to_proto_fn(cls), from_proto_fn(cls)
    rng = random.Random(cls.__module__)
    for round_ in range(8):
        message = convert_to(random_entity(cls, rng))
        if round_ % 2:
            clear_some(message, rng)
        out = FrameWriter()
        try:
            expected = kio_bytes(cls, convert_from(message))
        except Exception as exc:  # noqa: BLE001 - the same must fail the same way
            with pytest.raises(type(exc)):
                message_writer(cls)(out, message)
            continue
        message_writer(cls)(out, message)
        assert b"".join(out.finish()[1:]) == expected


def test_every_answer_is_written_from_its_message_by_a_compiled_writer() -> None:
    assert len(ANSWERS) > 300
    assert all(message_writer(cls).__name__ == f"write_{cls.__name__}_message"
               for cls in ANSWERS)
