"""One generic converter between kio entities (a class per Kafka API version) and the
version-free protobuf messages of ``kbroker.kafka.v1`` (one per API: the union of every
version's fields), keyed on field names.

The type mapping is the one ``tools/gen_kafka_proto.py`` generated the messages with:

    int8/16/32/64, uint16, bool, float64, string -> the same value
    bytes, records        -> bytes (record batches are passed through, never decoded)
    error_code            -> int32                    (back: kio's ErrorCode)
    uuid                  -> canonical text           (back: "", the nil UUID -> None)
    timedelta_i32/i64     -> int64 ``<name>_ms``      (back: timedelta)
    datetime_i64          -> int64 ``<name>_ms``      (back: aware datetime; -1 -> None when
                                                      the field is nullable)
    entity                -> nested message; arrays -> repeated fields
    nullable array        -> repeated field plus ``bool <name>_is_null``

kio -> protobuf sets every field of the entity's version. A None value is left unset (and a
None array sets ``<name>_is_null``). Fields the version lacks get the default that the newest
kio version having the field declares, when it declares one, so a handler always sees a
complete request whatever version the client spoke. A few wire quirks are normalised after
conversion, in :func:`normalise_request` (e.g. Metadata v0's empty topic list meaning all
topics).

protobuf -> kio builds the entity of the client's version from the fields that version has; a
field the message leaves unset takes that version's kio default or, without one, the zero
value of its type (0, "", False, empty tuple, epoch; None for any nullable field, arrays
included: a handler sends an empty nullable array by setting ``<name>_is_null`` to false).

Speed: the conversion of each entity class is compiled once into a plain Python function (one
expression per field, no per-field dispatch at run time) and cached, as ``dataclasses`` builds
``__init__``. Record batches move as the ``bytes`` objects they already are.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import itertools
import threading
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial.readers import tz_aware_from_i64
from kio.static.constants import EntityType

from kbroker.kafka.v1 import kafka_pb2

__all__ = [
    "NIL_UUID",
    "from_proto",
    "load_schema",
    "normalise_request",
    "proto_class",
    "to_proto",
]

NIL_UUID = "00000000-0000-0000-0000-000000000000"

_MILLIS_KINDS = frozenset({"timedelta_i32", "timedelta_i64", "datetime_i64"})
_ONE_MS = datetime.timedelta(milliseconds=1)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ERROR_CODES: dict[int, ErrorCode] = {int(code): code for code in ErrorCode}


# -- value conversions used by the compiled functions ------------------------------------------

def _td_ms(value: datetime.timedelta) -> int:
    return value // _ONE_MS


def _ms_td(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def _dt_ms(value: datetime.datetime) -> int:
    return (value - _EPOCH) // _ONE_MS


def _ms_dt_or_none(ms: int) -> datetime.datetime | None:
    return None if ms == -1 else tz_aware_from_i64(ms)


def _uuid_text(value: uuid.UUID) -> str:
    return str(value)


def _text_uuid_or_none(text: str) -> uuid.UUID | None:
    if not text or text == NIL_UUID:
        return None
    return uuid.UUID(text)


def _text_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(text) if text else uuid.UUID(int=0)


def _error_code(value: int) -> ErrorCode:
    # A code kio does not know cannot be encoded; the client sees the generic server error.
    return _ERROR_CODES.get(value, ErrorCode.unknown_server_error)


_HELPERS: dict[str, object] = {
    "_td_ms": _td_ms, "_ms_td": _ms_td, "_dt_ms": _dt_ms, "_ms_dt": tz_aware_from_i64,
    "_ms_dt_or_none": _ms_dt_or_none, "_uuid_text": _uuid_text,
    "_text_uuid_or_none": _text_uuid_or_none, "_text_uuid": _text_uuid,
    "_error_code": _error_code,
}


# -- schema introspection -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    """One kio field, classified for conversion."""

    name: str               # kio attribute
    pname: str              # protobuf field
    kind: str               # plain | error | uuid | timedelta | datetime | entity
    array: bool
    nullable: bool          # the value (the array itself, for arrays) may be None
    entity: type | None     # the nested kio class (kind "entity")
    default: object         # dataclasses.MISSING when the version declares none


def _unwrap_optional(hint: object) -> tuple[object, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            return inner[0], True
    return hint, False


def _proto_field_name(name: str, kafka_type: str | None) -> str:
    if kafka_type in _MILLIS_KINDS and not name.endswith("_ms"):
        return name + "_ms"
    return name


_KINDS = {
    "error_code": "error", "uuid": "uuid", "timedelta_i32": "timedelta",
    "timedelta_i64": "timedelta", "datetime_i64": "datetime",
}


def _fields_of(cls: type) -> list[_Field]:
    out = []
    for f in dataclasses.fields(cls):
        hint, nullable = _unwrap_optional(f.type)
        array = typing.get_origin(hint) is tuple
        if array:
            hint, _ = _unwrap_optional(typing.get_args(hint)[0])
        kafka_type = f.metadata.get("kafka_type")
        entity = hint if dataclasses.is_dataclass(hint) else None
        kind = "entity" if entity is not None else _KINDS.get(kafka_type or "", "plain")
        default: object = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append(_Field(f.name, _proto_field_name(f.name, kafka_type), kind, array, nullable,
                          entity, default))  # type: ignore[arg-type]
    return out


def _api_kind(cls: type) -> tuple[str, EntityType]:
    kind = cls.__type__  # type: ignore[attr-defined]
    if kind not in (EntityType.request, EntityType.response):
        raise TypeError(f"{cls.__qualname__} is not a request or response entity")
    return api_key_map[cls.__api_key__], kind  # type: ignore[attr-defined]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def proto_class(api: str, kind: EntityType) -> type[Message]:
    """The protobuf message class of an API's requests or responses (``metadata`` ->
    ``MetadataRequest``)."""
    return getattr(kafka_pb2, _camel(api) + ("Request" if kind is EntityType.request
                                             else "Response"))


def load_schema(api: str, version: int, kind: EntityType) -> type:
    """kio's entity class for an API (kio name, e.g. ``metadata``), version and kind."""
    module, _, name = schema_name_map[api][version][kind].partition(":")
    return getattr(importlib.import_module(module), name)


def _walk(cls: type, seen: dict[str, list[type]]) -> None:
    seen.setdefault(cls.__name__, []).append(cls)
    for f in _fields_of(cls):
        if f.entity is not None:
            _walk(f.entity, seen)


def _newest_fields(api: str, kind: EntityType) -> dict[str, dict[str, tuple[_Field, type]]]:
    """For every entity class name of an API, each field's classification in the newest kio
    version having it, with the class that version declares it in."""
    newest: dict[str, dict[str, tuple[_Field, type]]] = {}
    for version in sorted(schema_name_map[api], reverse=True):
        classes: dict[str, list[type]] = {}
        _walk(load_schema(api, version, kind), classes)
        for name, variants in classes.items():
            known = newest.setdefault(name, {})
            for cls in variants:
                for f in _fields_of(cls):
                    known.setdefault(f.name, (f, cls))
    return newest


# -- compilation --------------------------------------------------------------------------------

class _Compiler:
    """Builds and caches the conversion functions of every kio class.

    Compilation is top-down from a request or response class, since a nested kio class does
    not say whether it belongs to a request or a response; each nested class appears in
    exactly one top-level message, so caching per class is sound. A lock makes a first use
    from several threads safe; compiled functions are read without it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._to: dict[type, Callable[[Any], dict[str, Any]]] = {}
        self._from: dict[type, Callable[[Message], Any]] = {}
        self._newest: dict[tuple[str, EntityType], dict[str, dict[str, tuple[_Field, type]]]] = {}
        self._ids = itertools.count()

    # Public entry points take the top-level class; these are the cached fast paths.
    def to_proto_fn(self, cls: type) -> Callable[[Any], dict[str, Any]]:
        fn = self._to.get(cls)
        if fn is None:
            with self._lock:
                api, kind = _api_kind(cls)
                fn = self._compile_to(cls, proto_class(api, kind).DESCRIPTOR, (api, kind))
        return fn

    def from_proto_fn(self, cls: type) -> Callable[[Message], Any]:
        fn = self._from.get(cls)
        if fn is None:
            with self._lock:
                api, kind = _api_kind(cls)
                fn = self._compile_from(cls, proto_class(api, kind).DESCRIPTOR)
        return fn

    def _newest_of(self, context: tuple[str, EntityType]) -> dict[str, dict[str, Any]]:
        table = self._newest.get(context)
        if table is None:
            table = self._newest[context] = _newest_fields(*context)
        return table

    @staticmethod
    def _proto_field(desc: Descriptor, cls: type, f: _Field) -> FieldDescriptor:
        try:
            return desc.fields_by_name[f.pname]
        except KeyError:
            raise RuntimeError(
                f"{desc.full_name} has no field {f.pname} for {cls.__module__}."
                f"{cls.__qualname__}.{f.name}: kafka.proto is older than kio (run make proto)"
            ) from None

    def _compile_to(self, cls: type, desc: Descriptor,
                    context: tuple[str, EntityType]) -> Callable[[Any], dict[str, Any]]:
        known = self._to.get(cls)
        if known is not None:
            return known
        ns: dict[str, object] = dict(_HELPERS)
        lines = ["def convert(e):"]
        fill = self._fill(cls, desc, context)
        if fill:
            ns["FILL"] = fill
            lines.append("    kw = dict(FILL)")
        else:
            lines.append("    kw = {}")
        for f in _fields_of(cls):
            pfield = self._proto_field(desc, cls, f)
            null_flag = f.pname + "_is_null"
            has_flag = null_flag in desc.fields_by_name
            elem = self._to_template(f, pfield, ns, context)
            lines.append(f"    v = e.{f.name}")
            if f.array:
                value = "list(v)" if elem == "{}" else f"[{elem.format('x')} for x in v]"
                if f.nullable:
                    lines.append("    if v is None:")
                    lines.append(f"        kw[{null_flag!r}] = True")
                    lines.append("    else:")
                    lines.append(f"        kw[{f.pname!r}] = {value}")
                    lines.append(f"        kw[{null_flag!r}] = False")
                else:
                    lines.append(f"    kw[{f.pname!r}] = {value}")
                    if has_flag:
                        lines.append(f"    kw[{null_flag!r}] = False")
            elif f.nullable:
                lines.append("    if v is not None:")
                lines.append(f"        kw[{f.pname!r}] = {elem.format('v')}")
            else:
                lines.append(f"    kw[{f.pname!r}] = {elem.format('v')}")
        lines.append("    return kw")
        fn = self._define(lines, ns, f"to_proto_{cls.__name__}")
        self._to[cls] = fn
        return fn

    def _to_template(self, f: _Field, pfield: FieldDescriptor, ns: dict[str, object],
                     context: tuple[str, EntityType]) -> str:
        """Expression template (``{}`` = the kio value) giving the protobuf value."""
        if f.kind == "entity":
            assert f.entity is not None
            sub = f"_sub{next(self._ids)}"
            ns[sub] = self._compile_to(f.entity, pfield.message_type, context)
            return sub + "({})"
        return _TO_TEMPLATES[f.kind]

    def _fill(self, cls: type, desc: Descriptor,
              context: tuple[str, EntityType]) -> dict[str, object]:
        """Protobuf values for the fields this version lacks, from the newest declared default."""
        present = {f.name for f in dataclasses.fields(cls)}
        fill: dict[str, object] = {}
        for name, (f, owner) in self._newest_of(context).get(cls.__name__, {}).items():
            if name in present or f.default is dataclasses.MISSING:
                continue
            pfield = self._proto_field(desc, owner, f)
            if f.default is None:
                if f.array:
                    fill[f.pname + "_is_null"] = True
                continue
            convert = self._compile_value_to(f, pfield, context)
            if f.array:
                if f.default:
                    fill[f.pname] = [convert(x) for x in f.default]  # type: ignore[attr-defined]
            else:
                fill[f.pname] = convert(f.default)
        return fill

    def _compile_value_to(self, f: _Field, pfield: FieldDescriptor,
                          context: tuple[str, EntityType]) -> Callable[[Any], object]:
        if f.kind == "entity":
            assert f.entity is not None
            return self._compile_to(f.entity, pfield.message_type, context)
        return _TO_FUNCTIONS[f.kind]

    def _compile_from(self, cls: type, desc: Descriptor) -> Callable[[Message], Any]:
        known = self._from.get(cls)
        if known is not None:
            return known
        ns: dict[str, object] = dict(_HELPERS)
        ns["CLS"] = cls
        args = []
        for f in _fields_of(cls):
            pfield = self._proto_field(desc, cls, f)
            args.append(f"{f.name}={self._from_expr(f, pfield, ns)}")
        lines = ["def convert(m):", "    return CLS(", *(f"        {a}," for a in args), "    )"]
        fn = self._define(lines, ns, f"from_proto_{cls.__name__}")
        self._from[cls] = fn
        return fn

    def _from_expr(self, f: _Field, pfield: FieldDescriptor, ns: dict[str, object]) -> str:
        """Expression building the kio value of ``f`` from message ``m``."""
        access = f"m.{f.pname}"
        if f.kind == "entity":
            assert f.entity is not None
            sub_fn = self._compile_from(f.entity, pfield.message_type)
            sub = f"_sub{next(self._ids)}"
            ns[sub] = sub_fn
            elem = sub + "({})"
            if f.nullable:
                zero: object = None
            elif f.array:
                zero = ()
            else:
                zero = sub_fn(message_factory.GetMessageClass(pfield.message_type)())
            unset: object = _NO_VALUE  # a message field is always tested for presence
        else:
            # Array elements convert as nullable values: kio reads a nil UUID in an array as
            # None too.
            name = _FROM_CONVERTERS[(f.kind, f.nullable or f.array)]
            elem = name + "({})" if name else "{}"
            convert = _HELPERS.get(name, _identity) if name else _identity
            unset = convert(pfield.default_value)  # type: ignore[operator]
            zero = None if f.nullable else () if f.array else unset
        fallback = zero if f.default is dataclasses.MISSING else f.default
        fb = f"_fb{next(self._ids)}"
        ns[fb] = fallback

        if f.array:
            # Bind the container once (each attribute access builds a new wrapper); slicing
            # copies a repeated scalar field in one call, far quicker than iterating it.
            var = f"_r{next(self._ids)}"
            if elem == "{}":
                value = f"tuple({var}[:])"
            else:
                value = f"tuple([{elem.format('x')} for x in {var}])"
            null_flag = f.pname + "_is_null"
            if f.nullable:
                if _same(fallback, ()):
                    return f"(None if m.{null_flag} else ({value} if ({var} := {access}) else ()))"
                return (f"(None if m.{null_flag} else ({value} if ({var} := {access}) else "
                        f"(() if m.HasField({null_flag!r}) else {fb})))")
            if _same(fallback, ()):
                return f"({value} if ({var} := {access}) else ())"
            return f"({value} if ({var} := {access}) else {fb})"

        value = elem.format(access)
        if _same(unset, fallback):
            # protobuf's unset value already converts to the fallback: no presence test.
            return value
        return f"({value} if m.HasField({f.pname!r}) else {fb})"

    @staticmethod
    def _define(lines: list[str], ns: dict[str, object], name: str) -> Callable[..., Any]:
        exec("\n".join(lines), ns)
        fn = ns["convert"]
        fn.__name__ = fn.__qualname__ = name  # type: ignore[attr-defined]
        return fn  # type: ignore[return-value]


def _identity(x: object) -> object:
    return x


_NO_VALUE = object()

# kio -> protobuf, per kind: an expression template, ``{}`` standing for the kio value.
_TO_TEMPLATES = {
    "plain": "{}", "error": "int({})", "uuid": "_uuid_text({})", "timedelta": "_td_ms({})",
    "datetime": "_dt_ms({})",
}

# The same conversions as functions, for defaults converted once at compile time.
_TO_FUNCTIONS: dict[str, Callable[[Any], object]] = {
    "plain": _identity, "error": int, "uuid": _uuid_text, "timedelta": _td_ms,
    "datetime": _dt_ms,
}

# protobuf -> kio, per (kind, nullable): the helper applied to the protobuf value ("" = none).
_FROM_CONVERTERS = {
    ("plain", False): "", ("plain", True): "",
    ("error", False): "_error_code", ("error", True): "_error_code",
    ("uuid", False): "_text_uuid", ("uuid", True): "_text_uuid_or_none",
    ("timedelta", False): "_ms_td", ("timedelta", True): "_ms_td",
    ("datetime", False): "_ms_dt", ("datetime", True): "_ms_dt_or_none",
}


def _same(a: object, b: object) -> bool:
    """Equal, without letting False stand for 0 or an int for a float."""
    return type(a) is type(b) and a == b or (
        type(a) in (int, float) and type(b) in (int, float) and a == b
        and isinstance(a, bool) == isinstance(b, bool))


_COMPILER = _Compiler()


def to_proto(entity: Any) -> Message:
    """The protobuf message of a kio request or response entity (of any version)."""
    cls = type(entity)
    kwargs = _COMPILER.to_proto_fn(cls)(entity)
    api, kind = _api_kind(cls)
    return proto_class(api, kind)(**kwargs)


def from_proto(message: Message, cls: type) -> Any:
    """The kio entity of class ``cls`` (a request or response of one version) holding
    ``message``'s fields."""
    return _COMPILER.from_proto_fn(cls)(message)


def to_proto_fn(cls: type) -> Callable[[Any], dict[str, Any]]:
    """The compiled kio -> protobuf-constructor-arguments function of a top-level class."""
    return _COMPILER.to_proto_fn(cls)


def from_proto_fn(cls: type) -> Callable[[Message], Any]:
    """The compiled protobuf -> kio function of a top-level class."""
    return _COMPILER.from_proto_fn(cls)


# -- per-API wire quirks --------------------------------------------------------------------------

def _metadata(version: int, request: Message) -> None:
    # Before v1 the topic list cannot be null and an empty one asks for every topic.
    if version == 0 and not request.topics:  # type: ignore[attr-defined]
        request.topics_is_null = True  # type: ignore[attr-defined]


def _delete_topics(version: int, request: Message) -> None:
    # Before v6 topics are named in topic_names; from v6 in topics (by name or id).
    names = request.topic_names  # type: ignore[attr-defined]
    if names:
        topics = request.topics  # type: ignore[attr-defined]
        for name in names:
            topics.add(name=name)
        del names[:]


_QUIRKS: dict[int, Callable[[int, Message], None]] = {3: _metadata, 20: _delete_topics}


def normalise_request(api_key: int, version: int, request: Message) -> None:
    """Rewrite, in place, the version-specific spellings of one meaning into the one the
    handler understands."""
    quirk = _QUIRKS.get(api_key)
    if quirk is not None:
        quirk(version, request)
