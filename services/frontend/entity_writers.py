"""Compiled writers of kio entities: the bytes of :func:`kio.serial.entity_writer`, written in
fewer and larger pieces.

kio's writer walks each entity field by field, a closure and a ``buffer.write`` per value.
Answers with thousands of values (Metadata of a large cluster, a Produce answer for many
partitions) spent most of their encoding there. :func:`entity_writer` generates one Python
function per entity class instead: runs of fixed-width fields are packed with one
``struct.Struct``, arrays of fixed-width values with one ``pack`` call, and nested entities
call their own compiled function. Byte payloads (fetched record batches) are still written as
they are, so the frame writer keeps large ones as separate buffers without copying them.

The output is kio's, byte for byte (``tests/frontend/test_entity_writers.py`` compares both on
random entities of every schema), including its errors for values the wire cannot carry: a
struct error for an integer out of range, kio's ``OutOfBoundValue`` for an over-long legacy
string, ``TypeError`` for None where the schema forbids null. Tagged fields (flexible versions)
are written with kio's own field writers, in tag order, left out when they hold their
default, as kio leaves them out. A class the compiler does not know how to write falls back to
kio's writer.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any

from kio.serial import entity_writer as kio_entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_field_writer
from kio.serial.errors import OutOfBoundValue
from kio.static.constants import uuid_zero

Writer = Callable[[Any, Any], None]

# Fixed-width Kafka types: their struct format and the expression of the value to pack
# (``{}`` the field's value).
_FIXED: dict[str, tuple[str, str]] = {
    "int8": ("b", "{}"), "int16": ("h", "{}"), "int32": ("i", "{}"), "int64": ("q", "{}"),
    "uint8": ("B", "{}"), "uint16": ("H", "{}"), "uint32": ("I", "{}"), "uint64": ("Q", "{}"),
    "float64": ("d", "{}"), "bool": ("?", "{}"),
    "error_code": ("h", "{}.value"),
    "timedelta_i32": ("i", "round({}.total_seconds() * 1000)"),
    "timedelta_i64": ("q", "round({}.total_seconds() * 1000)"),
    "datetime_i64": ("q", "round({}.timestamp() * 1000)"),
    "uuid": ("16s", "(UUID_ZERO if {0} is None else {0}.bytes)"),
}
# What may be null without being a string, bytes, array or entity (as kio allows it).
_NULLABLE_FIXED = {"uuid": "(UUID_ZERO if {0} is None else {0}.bytes)",
                   "datetime_i64": "(-1 if {0} is None else round({0}.timestamp() * 1000))"}
_NULL_ENTITY, _ENTITY = struct.pack(">b", -1), struct.pack(">b", 1)
_SMALL_UVARINTS = [bytes([n]) for n in range(128)]


class _UnsupportedFieldError(Exception):
    """A field the compiler does not write: the class is written by kio."""


def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint."""
    if value < 128:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 128:
        out.append(0x80 | value & 0x7F)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encoded(value: str | bytes | memoryview) -> bytes | memoryview:
    return value.encode() if isinstance(value, str) else value


def _compact(w: Callable[[Any], Any], value: str | bytes | memoryview | None) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    data = _encoded(value)
    w(uvarint(len(data) + 1))
    w(data)


def _nullable_compact(w: Callable[[Any], Any], value: str | bytes | memoryview | None) -> None:
    if value is None:
        w(b"\x00")
        return
    data = _encoded(value)
    w(uvarint(len(data) + 1))
    w(data)


def _legacy_string(w: Callable[[Any], Any], value: str | None, nullable: bool = False) -> None:
    if value is None:
        if not nullable:
            raise TypeError("Unexpectedly received None value")
        w(b"\xff\xff")
        return
    data = value.encode()
    if len(data) > 0x7FFF:
        raise OutOfBoundValue(
            f"String is too long for legacy string format ({len(data)} > {0x7FFF})")
    w(len(data).to_bytes(2, "big"))
    w(data)


def _legacy_bytes(w: Callable[[Any], Any], value: bytes | memoryview | None,
                  nullable: bool = False) -> None:
    if value is None:
        if not nullable:
            raise TypeError("Unexpectedly received None value")
        w(b"\xff\xff\xff\xff")
        return
    if len(value) > 0x7FFFFFFF:
        raise OutOfBoundValue(
            f"Bytes is too long for legacy string format ({len(value)} > {0x7FFFFFFF})")
    w(len(value).to_bytes(4, "big"))
    w(value)


def _tagged_section(tagged: list[tuple[int, str, Writer, Any, Any]]) -> Writer:
    """The tagged fields of a flexible entity, written as kio writes them: each field whose
    value is not its default, in tag order, as (tag, size, value); their count first."""

    def write(buffer: Any, entity: Any) -> None:
        parts = []
        for tag, name, writer, default, implicit in tagged:
            value = getattr(entity, name)
            if value == default or (default is MISSING and value == implicit):
                continue
            out = _Collect()
            writer(out, value)
            data = b"".join(out.parts)
            parts += [uvarint(tag), uvarint(len(data)), data]
        buffer.write(uvarint(len(parts) // 3))
        for part in parts:
            buffer.write(part)

    return write


class _Collect:
    """A buffer of what a writer wrote (for a tagged field's size)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)


@functools.cache
def entity_writer(cls: type) -> Writer:
    """``write(buffer, entity)`` for entities of kio class ``cls``: what kio's writer writes,
    with ``buffer.write`` called with whole runs of fields."""
    try:
        return _compile(cls)
    except _UnsupportedFieldError:
        return kio_entity_writer(cls)


def _compile(cls: type) -> Writer:
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    ns: dict[str, Any] = {"UUID_ZERO": uuid_zero.bytes, "compact": _compact,
                          "nullable_compact": _nullable_compact,
                          "legacy_string": _legacy_string, "legacy_bytes": _legacy_bytes,
                          "uvarint": uvarint, "pack": struct.pack,
                          "NULL_ENTITY": _NULL_ENTITY, "ENTITY": _ENTITY}
    lines = ["def write(buffer, e):", "    w = buffer.write"]
    run: list[tuple[str, str]] = []  # fixed-width fields waiting to be packed together
    tagged: list[tuple[int, str, Writer, Any, Any]] = []

    def name(value: object) -> str:
        key = f"_{len(ns)}"
        ns[key] = value
        return key

    def flush() -> None:
        if run:
            packer = name(struct.Struct(">" + "".join(fmt for fmt, _ in run)))
            lines.append(f"    w({packer}.pack({', '.join(expr for _, expr in run)}))")
            run.clear()

    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        if tag is not None:
            tagged.append((tag, field.name,
                           get_field_writer(field, flexible=flexible, is_request_header=False,
                                            is_tag=True),
                           field.default, _implicit_default(field)))
            continue
        if cls.__name__ == "RequestHeader" and field.name == "client_id":
            raise _UnsupportedFieldError  # kio's special case: left to kio
        value = f"e.{field.name}"
        kind = classify_field(field)
        optional = is_optional(field)
        if isinstance(kind, PrimitiveField):
            kafka_type = get_schema_field_type(field)
            fixed = _FIXED.get(kafka_type)
            if fixed is not None:
                if optional and kafka_type not in _NULLABLE_FIXED:
                    raise _UnsupportedFieldError
                expr = (_NULLABLE_FIXED[kafka_type] if optional else fixed[1]).format(value)
                run.append((fixed[0], expr))
                continue
            flush()
            lines.append(f"    {_variable(kafka_type, flexible, optional, value)}")
            continue
        flush()
        if isinstance(kind, EntityField):
            sub = name(entity_writer(kind.type_))
            if optional:
                lines += [f"    if {value} is None:", "        w(NULL_ENTITY)", "    else:",
                          "        w(ENTITY)", f"        {sub}(buffer, {value})"]
            else:
                lines.append(f"    {sub}(buffer, {value})")
            continue
        # An array: its length (-1 or 0 for null), then each element.
        lines += [f"    items = {value}", "    if items is None:",
                  "        w(b'\\x00')" if flexible else "        w(b'\\xff\\xff\\xff\\xff')",
                  "    else:",
                  "        w(uvarint(len(items) + 1))" if flexible
                  else "        w(len(items).to_bytes(4, 'big', signed=True))"]
        if isinstance(kind, EntityTupleField):
            sub = name(entity_writer(kind.type_))
            lines += ["        for item in items:", f"            {sub}(buffer, item)"]
        elif isinstance(kind, PrimitiveTupleField):
            kafka_type = get_schema_field_type(field)
            fixed = _FIXED.get(kafka_type)
            if fixed is not None:
                fmt, expr = fixed
                values = "items" if expr == "{}" else f"[{expr.format('x')} for x in items]"
                lines += ["        if items:",
                          f"            w(pack('>' + {fmt!r} * len(items), *{values}))"]
            else:
                lines += ["        for item in items:",
                          f"            {_variable(kafka_type, flexible, False, 'item')}"]
        else:  # pragma: no cover - kio knows no other kind
            raise _UnsupportedFieldError
    flush()
    if flexible:
        if tagged:
            lines.append(f"    {name(_tagged_section(sorted(tagged)))}(buffer, e)")
        else:
            lines.append("    w(b'\\x00')")
    elif tagged:
        raise ValueError(f"{cls.__name__}: tagged fields on a non-flexible entity")
    exec("\n".join(lines), ns)
    write = ns["write"]
    write.__name__ = write.__qualname__ = f"write_{cls.__name__}"
    return write  # type: ignore[no-any-return]


def _variable(kafka_type: str, flexible: bool, optional: bool, value: str) -> str:
    """The statement writing a variable-width value (a string or bytes)."""
    if kafka_type not in ("string", "bytes", "records"):
        raise _UnsupportedFieldError
    if flexible:
        return f"{'nullable_compact' if optional else 'compact'}(w, {value})"
    writer = "legacy_string" if kafka_type == "string" else "legacy_bytes"
    return f"{writer}(w, {value}, {optional})"


def _implicit_default(field: dataclasses.Field[Any]) -> Any:
    """What a tagged field holds when left at its default, when it declares none."""
    if field.default is not MISSING:
        return MISSING
    return get_tagged_field_default(field)
