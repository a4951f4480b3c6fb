"""Unknown tagged fields (KIP-482): a reader that skips them, as Kafka does.

A flexible struct ends with a tagged-field section: a count, then per field its tag, its size
and its bytes. Kafka reads the tags it knows and skips the others, in the request header, the
body and every nested struct, so a newer client may add tags an older broker ignores. kio's
native reader raises ``KeyError`` on a tag its schema does not define and has no setting to
skip it.

:func:`tolerant_reader` keeps kio's reader for every request and only when it meets an unknown
tag copies the entity without the unknown tags (:func:`strip_unknown_tags`, a walk over the
schema that reads primitive fields with kio's own field readers) and reads the copy. A request
without unknown tags costs one Python call more; a malformed tagged section (a size past the
end of the frame, a truncated tag) still fails to decode.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from kio.serial import entity_reader
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial._parse import get_field_reader
from kio.serial.readers import read_int8, read_int32, read_unsigned_varint

Reader = Callable[[Any, int], tuple[Any, int]]
# A step copies one field from ``data`` at ``pos`` to ``out`` and returns the position after it.
_Step = Callable[[memoryview, int, bytearray], int]


class MalformedTaggedFieldsError(ValueError):
    """A tagged-field section that does not fit in the buffer."""


def tolerant_reader(entity_type: type, *, request_header: bool = False) -> Reader:
    """kio's reader for ``entity_type`` that skips tagged fields the schema does not define."""
    read = entity_reader(entity_type)

    def read_skipping_unknown_tags(buffer: Any, offset: int) -> tuple[Any, int]:
        try:
            return read(buffer, offset)
        except KeyError:  # kio: "Unknown tagged field tag: N"
            pass
        known, size = strip_unknown_tags(entity_type, buffer, offset,
                                         request_header=request_header)
        entity, _ = read(known, 0)
        return entity, size

    return read_skipping_unknown_tags


def strip_unknown_tags(entity_type: type, buffer: Any, offset: int, *,
                       request_header: bool = False) -> tuple[bytes, int]:
    """(the entity at ``offset`` re-encoded without unknown tagged fields, its size in
    ``buffer``). Bytes that do not parse raise kio's read errors or
    :class:`MalformedTaggedFieldsError`."""
    out = bytearray()
    data = memoryview(buffer)
    end = _entity_steps(entity_type, False, request_header)(data, offset, out)
    return bytes(out), end - offset


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _check(end: int, data: memoryview) -> int:
    if end > len(data):
        raise MalformedTaggedFieldsError(f"field ends at byte {end} of {len(data)}")
    return end


@functools.cache
def _entity_steps(entity_type: type, nullable: bool, request_header: bool) -> _Step:
    """The copier of one entity (its nullable marker, fields and tagged section)."""
    flexible = entity_type.__flexible__  # type: ignore[attr-defined]
    steps: list[_Step] = []
    tagged: dict[int, _Step] = {}
    for field in dataclasses.fields(entity_type):
        tag = get_field_tag(field)
        step = _field_step(entity_type, field, flexible, request_header, tag is not None)
        if tag is None:
            steps.append(step)
        else:
            tagged[tag] = step

    def copy(data: memoryview, pos: int, out: bytearray) -> int:
        if nullable:
            marker, size = read_int8(data, pos)
            out += data[pos:pos + size]
            pos += size
            if marker == -1:
                return pos
        for step in steps:
            pos = step(data, pos, out)
        if not flexible:
            return pos
        count, size = read_unsigned_varint(data, pos)
        pos += size
        kept = bytearray()
        kept_count = 0
        for _ in range(count):
            tag, size = read_unsigned_varint(data, pos)
            pos += size
            length, size = read_unsigned_varint(data, pos)
            pos += size
            end = _check(pos + length, data)
            known = tagged.get(tag)
            if known is not None:
                value = bytearray()
                known(data[:end], pos, value)
                kept += _uvarint(tag) + _uvarint(len(value)) + value
                kept_count += 1
            pos = end
        out += _uvarint(kept_count) + kept
        return pos

    return copy


def _field_step(entity_type: type, field: dataclasses.Field[Any], flexible: bool,
                request_header: bool, is_tag: bool) -> _Step:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        return _entity_steps(kind.type_, is_optional(field), False)
    if isinstance(kind, EntityTupleField):
        return _array_step(_entity_steps(kind.type_, False, False), flexible)
    read = get_field_reader(entity_type, field, request_header, is_tag)

    def copy_primitive(data: memoryview, pos: int, out: bytearray) -> int:
        _, size = read(data, pos)
        end = _check(pos + size, data)
        out += data[pos:end]
        return end

    return copy_primitive


def _array_step(item: _Step, flexible: bool) -> _Step:
    def copy_array(data: memoryview, pos: int, out: bytearray) -> int:
        if flexible:
            length, size = read_unsigned_varint(data, pos)
            count = length - 1
        else:
            count, size = read_int32(data, pos)
        out += data[pos:pos + size]
        pos += size
        if count < -1:
            raise MalformedTaggedFieldsError(f"negative array length {count}")
        for _ in range(max(count, 0)):
            pos = item(data, pos, out)
        return pos

    return copy_array
