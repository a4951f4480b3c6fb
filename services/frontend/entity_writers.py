"""Compiled writers of Kafka answers: the bytes of :func:`kio.serial.entity_writer`, written in
fewer and larger pieces, from kio entities or straight from the handler's protobuf answer.

kio's writer walks each entity field by field, a closure and a ``buffer.write`` per value.
Answers with thousands of values (Metadata of a large cluster, a Produce answer for many
partitions) spent most of their encoding there, and as much again building the kio entities
from the handler's message. This module generates one Python function per class instead:

- :func:`entity_writer` writes a kio entity: runs of fixed-width fields are packed with one
  ``struct.Struct``, arrays of fixed-width values with one ``pack`` call, and nested entities
  call their own compiled function;
- :func:`message_writer` writes the answer of a kio class straight from its protobuf message,
  each value read as the converter reads it (:func:`~.converter.message_fields`), without
  building the entities: nested messages are written by their own compiled function, and only
  an unset nested message or an empty array takes the converter's value for it.

Byte payloads (fetched record batches) are written as they are, so the frame writer keeps large
ones as separate buffers without copying them. The output is kio's, byte for byte
(``tests/frontend/test_entity_writers.py`` compares them on random entities of every schema and
on random messages of every answer), including its errors for values the wire cannot carry: a
struct error for an integer out of range, kio's ``OutOfBoundValue`` for an over-long legacy
string, ``TypeError`` for None where the schema forbids null. Tagged fields (flexible versions)
are written with kio's own field writers, in tag order, left out when they hold their default,
as kio leaves them out. A class the compiler does not know how to write falls back to kio.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any

from google.protobuf.descriptor import Descriptor
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

from services.common.varints import encode_uvarint as uvarint

from . import converter

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
    "uuid": ("16s", "(UUID_ZERO if ({1} := {0}) is None else {1}.bytes)"),
}
# What may be null without being a string, bytes, array or entity (as kio allows it). In these
# expressions ``{1}`` names a temporary holding the value.
_NULLABLE_FIXED = {
    "uuid": "(UUID_ZERO if ({1} := {0}) is None else {1}.bytes)",
    "datetime_i64": "(-1 if ({1} := {0}) is None else round({1}.timestamp() * 1000))"}
_NULL_ENTITY, _ENTITY = struct.pack(">b", -1), struct.pack(">b", 1)


class _UnsupportedFieldError(Exception):
    """A field the compiler does not write: the class is written by kio."""


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


class _Collect:
    """A buffer of what a writer wrote (for a tagged field's size)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)


def _tagged_section(tagged: list[tuple[int, str, Writer, Any, Any]]) -> Writer:
    """The tagged fields of a flexible entity, written as kio writes them: each field whose
    value is not its default, in tag order, as (tag, size, value); their count first."""

    def write(buffer: Any, values: Any) -> None:
        parts = []
        for tag, name, writer, default, implicit in tagged:
            value = getattr(values, name)
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


_HELPERS: dict[str, Any] = {
    "UUID_ZERO": uuid_zero.bytes, "compact": _compact, "nullable_compact": _nullable_compact,
    "legacy_string": _legacy_string, "legacy_bytes": _legacy_bytes, "uvarint": uvarint,
    "pack": struct.pack, "NULL_ENTITY": _NULL_ENTITY, "ENTITY": _ENTITY,
    "Values": types.SimpleNamespace,
}


class _Source:
    """The source of one generated writer: its statements, the names they use, and the
    fixed-width values waiting to be packed together."""

    def __init__(self, argument: str, flexible: bool) -> None:
        self.flexible = flexible
        self.ns: dict[str, Any] = dict(_HELPERS)
        self.lines = [f"def write(buffer, {argument}):", "    w = buffer.write"]
        self._run: list[tuple[str, str]] = []
        self._temporaries = 0

    def name(self, value: object) -> str:
        key = f"_{len(self.ns)}"
        self.ns[key] = value
        return key

    def temporary(self) -> str:
        self._temporaries += 1
        return f"v{self._temporaries}"

    def line(self, text: str, depth: int = 1) -> None:
        self.flush()
        self.lines.append("    " * depth + text)

    def fixed(self, fmt: str, expr: str) -> None:
        self._run.append((fmt, expr))

    def flush(self) -> None:
        if self._run:
            packer = self.name(struct.Struct(">" + "".join(fmt for fmt, _ in self._run)))
            exprs = ", ".join(expr for _, expr in self._run)
            self._run = []
            self.line(f"w({packer}.pack({exprs}))")

    def finish(self, label: str) -> Writer:
        self.flush()
        exec("\n".join(self.lines), self.ns)
        write = self.ns["write"]
        write.__name__ = write.__qualname__ = label
        return write  # type: ignore[no-any-return]

    # -- a kio value -----------------------------------------------------------------------

    def value(self, field: dataclasses.Field[Any], value: str, depth: int = 1) -> None:
        """Write ``value`` (an expression of the kio value of ``field``) as kio does."""
        kind = classify_field(field)
        optional = is_optional(field)
        if isinstance(kind, PrimitiveField):
            kafka_type = get_schema_field_type(field)
            fixed = _FIXED.get(kafka_type)
            if fixed is None:
                self.line(self._variable(kafka_type, optional, value), depth)
                return
            if optional and kafka_type not in _NULLABLE_FIXED:
                raise _UnsupportedFieldError
            template = _NULLABLE_FIXED[kafka_type] if optional else fixed[1]
            expr = template.format(value, self.temporary())
            if depth == 1:
                self.fixed(fixed[0], expr)
            else:  # within a block: packed on its own
                self.line(f"w(pack('>{fixed[0]}', {expr}))", depth)
            return
        if isinstance(kind, EntityField):
            sub = self.name(entity_writer(kind.type_))
            if optional:
                v = self.temporary()
                self.line(f"{v} = {value}", depth)
                self.line(f"if {v} is None:", depth)
                self.line("w(NULL_ENTITY)", depth + 1)
                self.line("else:", depth)
                self.line("w(ENTITY)", depth + 1)
                self.line(f"{sub}(buffer, {v})", depth + 1)
            else:
                self.line(f"{sub}(buffer, {value})", depth)
            return
        items = self.temporary()
        self.line(f"{items} = {value}", depth)
        self.line(f"if {items} is None:", depth)
        self.line("w(b'\\x00')" if self.flexible else "w(b'\\xff\\xff\\xff\\xff')", depth + 1)
        self.line("else:", depth)
        self.array_length(items, depth + 1)
        if isinstance(kind, EntityTupleField):
            sub = self.name(entity_writer(kind.type_))
            self.line(f"for x in {items}:", depth + 1)
            self.line(f"{sub}(buffer, x)", depth + 2)
        elif isinstance(kind, PrimitiveTupleField):
            kafka_type = get_schema_field_type(field)
            fixed = _FIXED.get(kafka_type)
            if fixed is not None:
                fmt, expr = fixed
                values = items if expr == "{}" else (
                    f"[{expr.format('x', self.temporary())} for x in {items}]")
                self.line(f"if {items}:", depth + 1)
                self.line(f"w(pack('>' + {fmt!r} * len({items}), *{values}))", depth + 2)
            else:
                self.line(f"for x in {items}:", depth + 1)
                self.line(self._variable(kafka_type, False, "x"), depth + 2)
        else:  # pragma: no cover - kio knows no other kind
            raise _UnsupportedFieldError

    def array_length(self, items: str, depth: int) -> None:
        self.line(f"w(uvarint(len({items}) + 1))" if self.flexible
                  else f"w(len({items}).to_bytes(4, 'big', signed=True))", depth)

    def _variable(self, kafka_type: str, optional: bool, value: str) -> str:
        """The statement writing a variable-width value (a string or bytes)."""
        if kafka_type not in ("string", "bytes", "records"):
            raise _UnsupportedFieldError
        if self.flexible:
            return f"{'nullable_compact' if optional else 'compact'}(w, {value})"
        writer = "legacy_string" if kafka_type == "string" else "legacy_bytes"
        return f"{writer}(w, {value}, {optional})"

    def tagged(self, cls: type, fields: list[tuple[dataclasses.Field[Any], str]]) -> None:
        """The tagged section of a flexible entity (``fields``: the tagged fields with the
        expressions of their values), or nothing for one that is not."""
        if not self.flexible:
            if fields:
                raise ValueError(f"{cls.__name__}: tagged fields on a non-flexible entity")
            return
        if not fields:
            self.fixed("B", "0")
            return
        section = self.name(_tagged_section(sorted(
            (get_field_tag(field), field.name,
             get_field_writer(field, flexible=True, is_request_header=False, is_tag=True),
             field.default, _implicit_default(field)) for field, _ in fields)))
        values = ", ".join(f"{field.name}={value}" for field, value in fields)
        self.line(f"{section}(buffer, Values({values}))")


@functools.cache
def entity_writer(cls: type) -> Writer:
    """``write(buffer, entity)`` for entities of kio class ``cls``: what kio's writer writes,
    with ``buffer.write`` called with whole runs of fields."""
    try:
        source = _Source("e", bool(cls.__flexible__))  # type: ignore[attr-defined]
        tagged = []
        for field in dataclasses.fields(cls):
            if get_field_tag(field) is not None:
                tagged.append((field, f"e.{field.name}"))
            elif cls.__name__ == "RequestHeader" and field.name == "client_id":
                raise _UnsupportedFieldError  # kio's special case: left to kio
            else:
                source.value(field, f"e.{field.name}")
        source.tagged(cls, tagged)
        return source.finish(f"write_{cls.__name__}")
    except _UnsupportedFieldError:
        return kio_entity_writer(cls)


def message_writer(cls: type) -> Writer:
    """``write(buffer, message)`` for a kio request or response class ``cls``: what kio's
    writer writes for the entity the converter makes of ``message`` (its protobuf form),
    without making it."""
    return _message_writer(cls, converter.message_type_of(cls))


@functools.cache
def _message_writer(cls: type, desc: Descriptor) -> Writer:
    try:
        source = _Source("m", bool(cls.__flexible__))  # type: ignore[attr-defined]
        tagged = []
        kio_fields = {field.name: field for field in dataclasses.fields(cls)}
        for fields in converter.message_fields(cls, desc, source.ns):
            field = kio_fields[fields.name]
            if get_field_tag(field) is not None:
                tagged.append((field, fields.value))
            elif fields.entity is None:
                source.value(field, fields.value)
            elif fields.array:
                # Their messages one by one; an empty or null array as the converter has it.
                sub = source.name(_message_writer(fields.entity, fields.message_type))
                items = source.temporary()
                source.line(f"{items} = m.{fields.pname}")
                null = f" and not m.{fields.pname}_is_null" if fields.nullable else ""
                source.line(f"if {items}{null}:")
                source.array_length(items, 2)
                source.line(f"for x in {items}:", 2)
                source.line(f"{sub}(buffer, x)", 3)
                source.line("else:")
                source.value(field, fields.value, 2)
            else:
                # The nested message; unset, what the converter takes for it.
                sub = source.name(_message_writer(fields.entity, fields.message_type))
                source.line(f"if m.HasField({fields.pname!r}):")
                if fields.nullable:
                    source.line("w(ENTITY)", 2)
                source.line(f"{sub}(buffer, m.{fields.pname})", 2)
                source.line("else:")
                source.value(field, fields.value, 2)
        source.tagged(cls, tagged)
        return source.finish(f"write_{cls.__name__}_message")
    except _UnsupportedFieldError:
        convert = converter.from_proto_fn(cls) if hasattr(cls, "__api_key__") else None
        if convert is None:
            raise
        write = kio_entity_writer(cls)
        return lambda buffer, message: write(buffer, convert(message))


def _implicit_default(field: dataclasses.Field[Any]) -> Any:
    """What a tagged field holds when left at its default, when it declares none."""
    if field.default is not MISSING:
        return MISSING
    return get_tagged_field_default(field)
