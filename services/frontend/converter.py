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
import types
import typing
import uuid
from collections.abc import Callable
from functools import cache
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial.readers import tz_aware_from_i64
from kio.static.constants import EntityType

from kbroker.kafka.v1 import kafka_pb2

NIL_UUID = "00000000-0000-0000-0000-000000000000"

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


def _text_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(text) if text else uuid.UUID(int=0)


def _text_uuid_or_none(text: str) -> uuid.UUID | None:
    return None if not text or text == NIL_UUID else uuid.UUID(text)


def _error_code(value: int) -> ErrorCode:
    # A code kio does not know cannot be encoded; the client sees the generic server error.
    return _ERROR_CODES.get(value, ErrorCode.unknown_server_error)


# Per kio ``kafka_type``: (kio -> protobuf, protobuf -> kio, protobuf -> kio for a nullable
# value or an array element, as kio reads a nil UUID in an array as None too). Other types
# (integers, strings, bytes, records, booleans) pass as they are.
_CONVERSIONS: dict[str, tuple[Callable[[Any], Any], ...]] = {
    "error_code": (int, _error_code, _error_code),
    "uuid": (str, _text_uuid, _text_uuid_or_none),
    "timedelta_i32": (_td_ms, _ms_td, _ms_td),
    "timedelta_i64": (_td_ms, _ms_td, _ms_td),
    "datetime_i64": (_dt_ms, tz_aware_from_i64, _ms_dt_or_none),
}
_MILLIS_TYPES = ("timedelta_i32", "timedelta_i64", "datetime_i64")


# -- schema introspection -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    """One kio field, classified for conversion."""

    name: str               # kio attribute
    pname: str              # protobuf field
    conversions: tuple[Callable[[Any], Any], ...] | None  # from _CONVERSIONS; None: as is
    array: bool
    nullable: bool          # the value (the array itself, for arrays) may be None
    entity: type | None     # the nested kio class
    default: object         # dataclasses.MISSING when the version declares none
    batches: bool = False   # record batches (kio's ``records`` type)


def _unwrap_optional(hint: object) -> tuple[object, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            return inner[0], True
    return hint, False


def _fields_of(cls: type) -> list[_Field]:
    out = []
    for f in dataclasses.fields(cls):
        hint, nullable = _unwrap_optional(f.type)
        array = typing.get_origin(hint) is tuple
        if array:
            hint, _ = _unwrap_optional(typing.get_args(hint)[0])
        kafka_type = f.metadata.get("kafka_type") or ""
        pname = f.name
        if kafka_type in _MILLIS_TYPES and not pname.endswith("_ms"):
            pname += "_ms"
        default: object = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append(_Field(f.name, pname, _CONVERSIONS.get(kafka_type), array, nullable,
                          hint if dataclasses.is_dataclass(hint) else None,  # type: ignore[arg-type]
                          default, kafka_type == "records"))
    return out


def _api_kind(cls: type) -> tuple[str, EntityType]:
    kind = cls.__type__  # type: ignore[attr-defined]
    if kind not in (EntityType.request, EntityType.response):
        raise TypeError(f"{cls.__qualname__} is not a request or response entity")
    return api_key_map[cls.__api_key__], kind  # type: ignore[attr-defined]


def proto_class(api: str, kind: EntityType) -> type[Message]:
    """The protobuf message class of an API's requests or responses (``metadata`` ->
    ``MetadataRequest``)."""
    camel = "".join(part[:1].upper() + part[1:] for part in api.split("_"))
    return getattr(kafka_pb2, camel + ("Request" if kind is EntityType.request else "Response"))


def load_schema(api: str, version: int, kind: EntityType) -> type:
    """kio's entity class for an API (kio name, e.g. ``metadata``), version and kind."""
    module, _, name = schema_name_map[api][version][kind].partition(":")
    return getattr(importlib.import_module(module), name)


@cache
def _newest_fields(api: str, kind: EntityType) -> dict[str, dict[str, tuple[_Field, type]]]:
    """For every entity class name of an API, each field's classification in the newest kio
    version having it, with the class that version declares it in."""
    newest: dict[str, dict[str, tuple[_Field, type]]] = {}

    def walk(cls: type) -> None:
        known = newest.setdefault(cls.__name__, {})
        for f in _fields_of(cls):
            known.setdefault(f.name, (f, cls))
            if f.entity is not None:
                walk(f.entity)

    for version in sorted(schema_name_map[api], reverse=True):
        walk(load_schema(api, version, kind))
    return newest


# -- compilation --------------------------------------------------------------------------------
#
# Compilation is top-down from a request or response class, since a nested kio class does not
# say whether it belongs to a request or a response; each nested class appears in exactly one
# top-level message, so caching per class is sound. The frontend compiles every class it uses
# at start-up, before it serves (one thread).

_TO: dict[type, Callable[[Any], Any]] = {}
_FROM: dict[type, Callable[[Message], Any]] = {}
# The same, for messages whose record batches travel beside them (left out on the way to
# protobuf, taken from a feed on the way back): see services.common.payloads.
_TO_WITHOUT_BATCHES: dict[type, Callable[[Any], Any]] = {}
_FROM_WITH_BATCHES: dict[type, Callable[[Message], Any]] = {}


class _BatchFeed:
    """The record batches of the message being converted, handed out in order (conversions
    are synchronous and on one thread: one feed serves them all)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: Any = iter(())

    def take(self) -> Any:
        return next(self._items, None)


_FEED = _BatchFeed()


def _proto_field(desc: Descriptor, cls: type, f: _Field) -> FieldDescriptor:
    try:
        return desc.fields_by_name[f.pname]
    except KeyError:
        raise RuntimeError(
            f"{desc.full_name} has no field {f.pname} for {cls.__module__}.{cls.__qualname__}"
            f".{f.name}: kafka.proto is older than kio (run make proto)") from None


def _call(fn: Callable[[Any], Any], ns: dict[str, object]) -> str:
    """An expression template (``{}`` = the argument) calling ``fn``, bound in ``ns``."""
    name = f"_f{len(ns)}"
    ns[name] = fn
    return name + "({})"


def _compile_to(cls: type, desc: Descriptor, context: tuple[str, EntityType],
                message: type[Message] | None = None,
                without_batches: bool = False) -> Callable[[Any], Any]:
    """kio entity -> protobuf: the message itself for a top-level class (``message``), the
    constructor arguments (a dict) for a nested one; ``without_batches``: record batches
    left unset."""
    cache = _TO_WITHOUT_BATCHES if without_batches else _TO
    known = cache.get(cls)
    if known is not None:
        return known
    fill = _fill(cls, desc, context)
    ns: dict[str, object] = {"FILL": fill, "MESSAGE": message}
    lines = ["def convert(e):", "    kw = dict(FILL)" if fill else "    kw = {}"]
    for f in _fields_of(cls):
        pfield = _proto_field(desc, cls, f)
        null_flag = f.pname + "_is_null"
        if f.batches and without_batches:
            continue
        if f.entity is not None:
            elem = _call(_compile_to(f.entity, pfield.message_type, context,
                                     without_batches=without_batches), ns)
        elif f.conversions is not None:
            elem = _call(f.conversions[0], ns)
        else:
            elem = "{}"
        lines.append(f"    v = e.{f.name}")
        if f.array:
            value = "list(v)" if elem == "{}" else f"[{elem.format('x')} for x in v]"
            if f.nullable:
                lines += ["    if v is None:", f"        kw[{null_flag!r}] = True", "    else:",
                          f"        kw[{f.pname!r}] = {value}",
                          f"        kw[{null_flag!r}] = False"]
            else:
                lines.append(f"    kw[{f.pname!r}] = {value}")
                if null_flag in desc.fields_by_name:
                    lines.append(f"    kw[{null_flag!r}] = False")
        elif f.nullable:
            lines += ["    if v is not None:", f"        kw[{f.pname!r}] = {elem.format('v')}"]
        else:
            lines.append(f"    kw[{f.pname!r}] = {elem.format('v')}")
    lines.append("    return kw" if message is None else "    return MESSAGE(**kw)")
    fn = cache[cls] = _define(lines, ns, f"to_proto_{cls.__name__}")
    return fn


def _fill(cls: type, desc: Descriptor, context: tuple[str, EntityType]) -> dict[str, object]:
    """Protobuf values for the fields this version lacks, from the newest declared default."""
    present = {f.name for f in dataclasses.fields(cls)}
    fill: dict[str, object] = {}
    for name, (f, owner) in _newest_fields(*context).get(cls.__name__, {}).items():
        if name in present or f.default is dataclasses.MISSING:
            continue
        pfield = _proto_field(desc, owner, f)
        if f.default is None:
            if f.array:
                fill[f.pname + "_is_null"] = True
            continue
        if f.entity is not None:
            convert = _compile_to(f.entity, pfield.message_type, context)
        else:
            convert = f.conversions[0] if f.conversions is not None else _identity
        if not f.array:
            fill[f.pname] = convert(f.default)
        elif f.default:
            fill[f.pname] = [convert(x) for x in f.default]  # type: ignore[attr-defined]
    return fill


def _compile_from(cls: type, desc: Descriptor,
                  with_batches: bool = False) -> Callable[[Message], Any]:
    """protobuf -> kio entity of class ``cls``; ``with_batches``: record batches taken from
    the feed rather than the message (None standing for an unset field)."""
    cache = _FROM_WITH_BATCHES if with_batches else _FROM
    known = cache.get(cls)
    if known is not None:
        return known
    ns: dict[str, object] = {"CLS": cls}
    args = [f"        {f.name}={_from_expr(f, _proto_field(desc, cls, f), ns, with_batches)},"
            for f in _fields_of(cls)]
    fn = cache[cls] = _define(["def convert(m):", "    return CLS(", *args, "    )"], ns,
                              f"from_proto_{cls.__name__}")
    return fn


def _from_expr(f: _Field, pfield: FieldDescriptor, ns: dict[str, object],
               with_batches: bool = False) -> str:
    """Expression building the kio value of ``f`` from message ``m``."""
    access = f"m.{f.pname}"
    if f.batches and with_batches and not f.array:
        ns["FEED"] = _FEED
        fallback = None if f.nullable else (b"" if f.default is dataclasses.MISSING
                                            else f.default)
        fb = f"_fb{len(ns)}"
        ns[fb] = fallback
        return f"(_b if (_b := FEED.take()) is not None else {fb})"
    if f.entity is not None:
        sub = _compile_from(f.entity, pfield.message_type, with_batches)
        elem = _call(sub, ns)
        if f.nullable:
            zero: object = None
        elif f.array:
            zero = ()
        else:
            zero = sub(message_factory.GetMessageClass(pfield.message_type)())
        unset: object = _NO_VALUE  # a message field is always tested for presence
    else:
        convert = _identity
        if f.conversions is not None:
            convert = f.conversions[2 if f.nullable or f.array else 1]
        elem = "{}" if convert is _identity else _call(convert, ns)
        unset = convert(pfield.default_value)
        zero = None if f.nullable else () if f.array else unset
    fallback = zero if f.default is dataclasses.MISSING else f.default
    fb = f"_fb{len(ns)}"
    ns[fb] = fallback

    if f.array:
        # Bind the container once (each attribute access builds a new wrapper); slicing
        # copies a repeated scalar field in one call, far quicker than iterating it.
        var = f"_r{len(ns)}"
        if elem == "{}":
            value = f"tuple({var}[:])"
        else:
            value = f"tuple([{elem.format('x')} for x in {var}])"
        empty = "()" if _same(fallback, ()) else fb
        if f.nullable and empty != "()":
            empty = f"(() if m.HasField({f.pname + '_is_null'!r}) else {fb})"
        value = f"({value} if ({var} := {access}) else {empty})"
        return f"(None if m.{f.pname}_is_null else {value})" if f.nullable else value
    value = elem.format(access)
    if _same(unset, fallback):
        # protobuf's unset value already converts to the fallback: no presence test.
        return value
    return f"({value} if m.HasField({f.pname!r}) else {fb})"


@dataclasses.dataclass(frozen=True, slots=True)
class MessageField:
    """A kio field as read from a message ``m`` of the class's protobuf form."""

    name: str                       # kio attribute
    pname: str                      # protobuf field
    value: str                      # expression of its kio value, the conversion's
    entity: type | None             # the nested kio class
    message_type: Descriptor | None  # its protobuf message type
    array: bool
    nullable: bool


def message_fields(cls: type, desc: Descriptor, ns: dict[str, object]) -> list[MessageField]:
    """Each field of kio class ``cls`` with the expression that reads its value from a message
    ``m`` of type ``desc`` as the compiled conversion does, the names it uses bound in
    ``ns``."""
    out = []
    for f in _fields_of(cls):
        pfield = _proto_field(desc, cls, f)
        out.append(MessageField(f.name, f.pname, _from_expr(f, pfield, ns), f.entity,
                                pfield.message_type if f.entity is not None else None,
                                f.array, f.nullable))
    return out


def message_type_of(cls: type) -> Descriptor:
    """The protobuf message type of a kio request or response class."""
    return proto_class(*_api_kind(cls)).DESCRIPTOR


def _define(lines: list[str], ns: dict[str, object], name: str) -> Callable[..., Any]:
    exec("\n".join(lines), ns)
    fn = ns["convert"]
    fn.__name__ = fn.__qualname__ = name  # type: ignore[attr-defined]
    return fn  # type: ignore[return-value]


def _identity(x: object) -> object:
    return x


_NO_VALUE = object()


def _same(a: object, b: object) -> bool:
    """Equal, without letting False stand for 0 or an int for a float."""
    return type(a) is type(b) and a == b or (
        type(a) in (int, float) and type(b) in (int, float) and a == b
        and isinstance(a, bool) == isinstance(b, bool))


def to_proto_fn(cls: type, without_batches: bool = False) -> Callable[[Any], Message]:
    """The compiled kio -> protobuf function of a request or response class (of any
    version); ``without_batches``: the message leaves its record batches unset (they travel
    beside it, see :func:`batches_of`)."""
    fn = (_TO_WITHOUT_BATCHES if without_batches else _TO).get(cls)
    if fn is None:
        api, kind = _api_kind(cls)
        message = proto_class(api, kind)
        fn = _compile_to(cls, message.DESCRIPTOR, (api, kind), message, without_batches)
    return fn


def from_proto_fn(cls: type) -> Callable[[Message], Any]:
    """The compiled protobuf -> kio function of a request or response class (of one
    version)."""
    fn = _FROM.get(cls)
    if fn is None:
        fn = _compile_from(cls, proto_class(*_api_kind(cls)).DESCRIPTOR)
    return fn


def from_proto_with_batches_fn(cls: type) -> Callable[[Message, Any], Any]:
    """The compiled protobuf -> kio function of a request or response class (of one version)
    whose record batches travel beside the message: ``convert(message, batches)``, the
    batches in message order (None: unset), put in the entity as they are (views stay
    views: the answer is written to the socket from them)."""
    fn = _FROM_WITH_BATCHES.get(cls)
    if fn is None:
        fn = _compile_from(cls, proto_class(*_api_kind(cls)).DESCRIPTOR, with_batches=True)

    def convert(message: Message, batches: Any) -> Any:
        _FEED._items = iter(batches)
        try:
            return fn(message)
        finally:
            _FEED._items = iter(())

    return convert


def batches_of(entity: Any, names: tuple[str, ...]) -> list[Any]:
    """The record batches of a kio entity along the field ``names`` (the message fields down
    to the batches, as :class:`services.common.payloads.PayloadPath` names them), in order;
    None for a null."""
    level = [entity]
    for name in names[:-1]:
        following = []
        for item in level:
            value = getattr(item, name)
            if isinstance(value, tuple):
                following.extend(value)
            elif value is not None:
                following.append(value)
        level = following
    return [getattr(item, names[-1]) for item in level]


def to_proto(entity: Any) -> Message:
    """The protobuf message of a kio request or response entity (of any version)."""
    return to_proto_fn(type(entity))(entity)


def from_proto(message: Message, cls: type) -> Any:
    """The kio entity of class ``cls`` (a request or response of one version) holding
    ``message``'s fields."""
    return from_proto_fn(cls)(message)


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


def _fetch_response(version: int, response: Message) -> None:
    # KAFKA_STORAGE_ERROR is a Fetch answer from v6; older clients may not know it (it would
    # be a fatal unknown error there), so they get NOT_LEADER_OR_FOLLOWER, which makes them
    # refresh metadata and fetch again (Kafka's maybeDownConvertStorageError).
    if version <= 5:
        for topic in response.responses:  # type: ignore[attr-defined]
            for partition in topic.partitions:
                if partition.error_code == ErrorCode.kafka_storage_error.value:
                    partition.error_code = ErrorCode.not_leader_or_follower.value


_RESPONSE_QUIRKS: dict[int, Callable[[int, Message], None]] = {1: _fetch_response}


def normalise_response(api_key: int, version: int, response: Message) -> None:
    """Rewrite, in place, what the handler answered into what a client of ``version`` can
    read where the two differ in meaning (error codes older versions do not know)."""
    quirk = _RESPONSE_QUIRKS.get(api_key)
    if quirk is not None:
        quirk(version, response)
