"""Record formats declared as data, and the one codec that reads and writes them (what Kafka's
message generator compiles from its JSON definitions, interpreted at run time).

A record type is a frozen, keyword-only dataclass with class attributes ``__versions__`` and
``__flexible__`` (its valid and its flexible versions, in Kafka's notation: ``"0-4"``, ``"2"``,
``"4+"``, ``"none"``) whose fields are declared with :func:`kafka`: the Kafka type
(``"int8"``, ``"int16"``, ``"int32"``, ``"int64"``, ``"bool"``, ``"string"``, ``"bytes"``,
``"uuid"`` (16 bytes, held as canonical UUID text), a struct, or ``[type]`` for an array),
the versions that have the field, those where it may be
null and, for a tagged field, its tag. A struct is such a dataclass without versions: it takes
its record's. A field whose type is a record type embeds that record as records are stored.

Wire format, as Kafka's::

    Record => version:int16 fields        (in declaration order; fields the version lacks are
                                           left out, and read back as their defaults)
    int8, int16, int32, int64 => big endian;  bool => one byte, 0 or 1;  uuid => 16 bytes
    string, bytes, [T] => int16 (string) or int32 length, -1 null    (non-flexible versions)
                          unsigned varint length + 1, 0 null         (flexible versions)
    nullable struct => int8 -1 (null) or 1, then the struct
    flexible struct => fields, then its tagged fields: a count, then per field in ascending
                       tag order: tag, size, value (count, tag, size unsigned varints)

Tagged fields at their default are not written; unknown tags are skipped when reading, as
Kafka's readers do. Anything unreadable (cut short, a version the type lacks, null where the
schema allows none) raises :class:`RecordFormatError`. The codec keeps nothing but caches of
the declarations, so it is safe from any thread.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, field, fields
from typing import Any, TypeVar

from services.common.varints import VarintError, decode_uvarint, encode_uvarint

__all__ = ["RecordFormatError", "decode", "decode_key", "encode", "kafka", "lowest_version"]

T = TypeVar("T")

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_FIXED = {"int8": struct.Struct(">b"), "int16": _INT16, "int32": _INT32,
          "int64": struct.Struct(">q"), "bool": struct.Struct(">?")}


class RecordFormatError(ValueError):
    """Bytes that are not a record of the expected type."""


@functools.cache
def version_range(text: str) -> range:
    """Versions in Kafka's notation: ``"3"``, ``"0-4"``, ``"2+"`` or ``"none"``."""
    if text == "none":
        return range(0)
    low, _, high = text.rstrip("+").partition("-")
    return range(int(low), 0x8000 if text.endswith("+") else int(high or low) + 1)


def kafka(kind: Any, versions: str = "0+", *, nullable: str = "none", tag: int | None = None,
          default: Any = MISSING) -> Any:
    """A field of a record or struct: its Kafka type, the versions that have it (for a tagged
    field, its tagged versions), those where it may be null, its tag, its default."""
    spec = (kind, version_range(versions), version_range(nullable), tag)
    return field(default=default, metadata={"kafka": spec})


# (name, kind, versions, nullable versions, tag, default) of each field.
_Field = tuple[str, Any, range, range, int | None, Any]


@functools.cache
def _layout(cls: type) -> tuple[_Field, ...]:
    return tuple((f.name, *f.metadata["kafka"], f.default) for f in fields(cls))


@functools.cache
def _versions(cls: type) -> tuple[range, range]:
    return (version_range(cls.__versions__),  # type: ignore[attr-defined]
            version_range(getattr(cls, "__flexible__", "none")))


def _is_record(kind: Any) -> bool:
    return isinstance(kind, type) and hasattr(kind, "__versions__")


# --- reading -------------------------------------------------------------------------------------


class Reader:
    """Reads Kafka primitives from a buffer; raises RecordFormatError past its end."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, size: int) -> memoryview:
        if size < 0 or self.pos + size > len(self.data):
            raise RecordFormatError("truncated record")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def fixed(self, layout: struct.Struct) -> Any:
        return layout.unpack(self._take(layout.size))[0]

    def uvarint(self) -> int:
        try:
            value, self.pos = decode_uvarint(self.data, self.pos)
        except VarintError as exc:
            raise RecordFormatError(str(exc)) from None
        return value


def decode(cls: type[T], data: bytes | memoryview) -> T:
    """The record of type ``cls`` stored as ``data`` (its version first)."""
    return _read_record(Reader(data), cls)


def decode_key(types: Mapping[int, type], data: bytes | memoryview) -> Any:
    """A key whose version says its type (``types``: version -> record type); None for a
    version not in ``types`` (records of other kinds)."""
    if len(data) < 2:
        raise RecordFormatError("truncated record")
    cls = types.get(_INT16.unpack_from(data)[0])
    return None if cls is None else decode(cls, data)


def _read_record(r: Reader, cls: type[T]) -> T:
    version = int(r.fixed(_INT16))
    valid, flexible = _versions(cls)
    if version not in valid:
        raise RecordFormatError(f"{cls.__name__} has no version {version}")
    return _read_struct(r, cls, version, version in flexible)


def _read_struct(r: Reader, cls: type[T], version: int, flexible: bool) -> T:
    values: dict[str, Any] = {}
    tagged: dict[int, tuple[str, Any, bool]] = {}
    for name, kind, present, nullable, tag, _ in _layout(cls):
        if version not in present:
            continue
        if tag is None:
            values[name] = _read(r, kind, version in nullable, version, flexible)
        else:
            tagged[tag] = (name, kind, version in nullable)
    for _ in range(r.uvarint() if flexible else 0):
        tag = r.uvarint()
        data = r._take(r.uvarint())
        if tag in tagged:
            name, kind, can_be_null = tagged[tag]
            values[name] = _read(Reader(data), kind, can_be_null, version, flexible)
    try:
        return cls(**values)
    except TypeError as exc:  # a field without default that the version lacks
        raise RecordFormatError(f"{cls.__name__} v{version}: {exc}") from None


def _read(r: Reader, kind: Any, nullable: bool, version: int, flexible: bool) -> Any:
    if isinstance(kind, str) and kind in _FIXED:
        return r.fixed(_FIXED[kind])
    if kind == "uuid":
        return str(uuid.UUID(bytes=bytes(r._take(16))))
    if _is_record(kind):
        return _read_record(r, kind)
    if not isinstance(kind, str | list):
        if nullable and r.fixed(_FIXED["int8"]) < 0:  # a nullable struct: present or not
            return None
        return _read_struct(r, kind, version, flexible)
    size = r.uvarint() - 1 if flexible else int(r.fixed(_length(kind)))  # -1: null
    if size < 0:
        if not nullable:
            raise RecordFormatError(f"null where {kind} cannot be null")
        return None
    if isinstance(kind, list):
        if size > len(r.data) - r.pos:
            raise RecordFormatError("array longer than the record")
        return tuple(_read(r, kind[0], False, version, flexible) for _ in range(size))
    data = bytes(r._take(size))
    try:
        return data if kind == "bytes" else data.decode()
    except UnicodeDecodeError as exc:
        raise RecordFormatError(f"bad string: {exc}") from None


# --- writing -------------------------------------------------------------------------------------


def lowest_version(value: object) -> int:
    """The lowest version of ``value``'s type that has every field of it not at its default."""
    cls = type(value)
    for version in _versions(cls)[0]:
        if all(version in present or getattr(value, name) == default
               for name, _, present, _, _, default in _layout(cls)):
            return version
    raise ValueError(f"no version of {cls.__name__} holds {value!r}")


def encode(value: object, version: int | None = None) -> bytes:
    """``value`` stored at ``version`` (default: :func:`lowest_version`), version first."""
    out = bytearray()
    _write_record(out, value, version)
    return bytes(out)


def _write_record(out: bytearray, value: object, version: int | None) -> None:
    cls = type(value)
    if version is None:
        version = lowest_version(value)
    valid, flexible = _versions(cls)
    if version not in valid:
        raise ValueError(f"{cls.__name__} has no version {version}")
    out += _INT16.pack(version)
    _write_struct(out, value, version, version in flexible)


def _write_struct(out: bytearray, value: object, version: int, flexible: bool) -> None:
    tagged: dict[int, bytearray] = {}
    for name, kind, present, nullable, tag, default in _layout(type(value)):
        item = getattr(value, name)
        if version not in present or tag is not None and item == default:
            continue
        target = out if tag is None else tagged.setdefault(tag, bytearray())
        _write(target, kind, item, version in nullable, version, flexible)
    if flexible:
        out += encode_uvarint(len(tagged))
        for tag in sorted(tagged):
            out += encode_uvarint(tag) + encode_uvarint(len(tagged[tag])) + tagged[tag]


def _write(out: bytearray, kind: Any, item: Any, nullable: bool, version: int,
           flexible: bool) -> None:
    if isinstance(kind, str) and kind in _FIXED:
        out += _FIXED[kind].pack(item)
    elif kind == "uuid":
        out += uuid.UUID(item).bytes
    elif _is_record(kind):
        _write_record(out, item, None)
    elif not isinstance(kind, str | list):
        if nullable:
            out += _FIXED["int8"].pack(-1 if item is None else 1)
        if item is not None:
            _write_struct(out, item, version, flexible)
    elif item is None:
        if not nullable:
            raise ValueError(f"null where {kind} cannot be null")
        out += encode_uvarint(0) if flexible else _length(kind).pack(-1)
    elif isinstance(kind, list):
        out += encode_uvarint(len(item) + 1) if flexible else _INT32.pack(len(item))
        for each in item:
            _write(out, kind[0], each, False, version, flexible)
    else:
        data = item.encode() if kind == "string" else item
        out += encode_uvarint(len(data) + 1) if flexible else _length(kind).pack(len(data))
        out += data


def _length(kind: Any) -> struct.Struct:
    """The length of a string, bytes or array in non-flexible versions."""
    return _INT16 if kind == "string" else _INT32
