"""Collection sizes checked against the frame before a request is decoded, as Kafka's readers
check them.

Kafka's generated request readers refuse an array whose length prefix exceeds the bytes that
remain ("Tried to allocate a collection of size N, but there are only M bytes remaining"):
every element takes at least one byte. kio's native reader instead allocates room for the
announced length first, so a small frame announcing 2^32 - 2 elements (a compact array length
of ``ff ff ff ff 0f``) makes it ask for 32 GiB and aborts the whole process.

:func:`size_checker` compiles, per request schema, a walk over the request's bytes that reads
every length, count and tagged-section size (nested structs, arrays of structs and of
primitives, tagged fields) and raises :class:`CollectionSizeError` for a collection longer
than what remains; after it passed, no array kio allocates is larger than the frame. Byte
fields (records included) are skipped by their length, never copied. Anything else malformed
raises kio's read errors, as the decoding itself would.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._parse import get_field_reader
from kio.serial.readers import read_int8, read_int32, read_unsigned_varint

# A walk step: checks one field of ``data`` at ``pos`` (not past ``end``), returns the
# position after it.
_Step = Callable[[Any, int, int], int]


class CollectionSizeError(ValueError):
    """A length prefix that does not fit in what remains of the frame."""


def size_checker(entity_type: type) -> Callable[[Any, int], None]:
    """The check of the request of ``entity_type`` at an offset of a frame."""
    step = _entity_step(entity_type, False)

    def check(frame: Any, offset: int) -> None:
        step(frame, offset, len(frame))

    return check


def _fits(count: int, pos: int, end: int) -> None:
    if count > end - pos:
        raise CollectionSizeError(f"a collection of size {count} with {end - pos} bytes "
                                  "remaining")


@functools.cache
def _entity_step(entity_type: type, nullable: bool) -> _Step:
    flexible = entity_type.__flexible__  # type: ignore[attr-defined]
    steps: list[_Step] = []
    tagged: dict[int, _Step] = {}
    for field in dataclasses.fields(entity_type):
        tag = get_field_tag(field)
        step = _field_step(entity_type, field, flexible, tag is not None)
        if tag is None:
            steps.append(step)
        else:
            tagged[tag] = step

    def walk(data: Any, pos: int, end: int) -> int:
        if nullable:
            marker, size = read_int8(data, pos)
            pos += size
            if marker == -1:
                return pos
        for step in steps:
            pos = step(data, pos, end)
        if not flexible:
            return pos
        count, size = read_unsigned_varint(data, pos)
        pos += size
        _fits(count, pos, end)
        for _ in range(count):
            tag, size = read_unsigned_varint(data, pos)
            pos += size
            length, size = read_unsigned_varint(data, pos)
            pos += size
            _fits(length, pos, end)
            known = tagged.get(tag)
            if known is not None:
                known(data, pos, pos + length)
            pos += length
        return pos

    return walk


def _field_step(entity_type: type, field: dataclasses.Field[Any], flexible: bool,
                is_tag: bool) -> _Step:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        return _entity_step(kind.type_, is_optional(field))
    if isinstance(kind, EntityTupleField):
        return _array_step(_entity_step(kind.type_, False), flexible)
    if not isinstance(kind, PrimitiveTupleField) and get_schema_field_type(field) in (
            "bytes", "records"):
        return _bytes_step(flexible)
    read = get_field_reader(entity_type, field, False, is_tag)
    if isinstance(kind, PrimitiveTupleField):
        count_step = _array_step(None, flexible)

        def check_primitive_array(data: Any, pos: int, end: int) -> int:
            count_step(data, pos, end)  # the count fits: kio may read the array
            _, size = read(data, pos)
            return pos + size

        return check_primitive_array

    def skip_primitive(data: Any, pos: int, end: int) -> int:
        _, size = read(data, pos)
        return pos + size

    return skip_primitive


def _bytes_step(flexible: bool) -> _Step:
    def skip_bytes(data: Any, pos: int, end: int) -> int:
        if flexible:
            length, size = read_unsigned_varint(data, pos)
            length -= 1
        else:
            length, size = read_int32(data, pos)
        pos += size
        if length < 0:  # null
            return pos
        _fits(length, pos, end)
        return pos + length

    return skip_bytes


def _array_step(item: _Step | None, flexible: bool) -> _Step:
    def check_array(data: Any, pos: int, end: int) -> int:
        if flexible:
            length, size = read_unsigned_varint(data, pos)
            count = length - 1
        else:
            count, size = read_int32(data, pos)
        pos += size
        _fits(count, pos, end)
        if item is not None:
            for _ in range(max(count, 0)):
                pos = item(data, pos, end)
        return pos

    return check_array
