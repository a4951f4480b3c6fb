"""Generate the Kafka contracts from kio's message schemas and the frontend's API table:

- ``proto/kbroker/kafka/v1/kafka.proto``: for each API the broker speaks, one version-free
  request message and one response message, the union of the fields of every version kio
  knows, nested entities as nested messages;
- ``proto/kbroker/handler/v1/kafka_handler.proto``: the ``KafkaHandler`` service, one RPC per
  API that the frontend forwards to handlers.

Field numbers are assigned in order of first appearance (oldest version first), so a newer kio
only appends. Adding an API to ``services/frontend/api_versions.py`` and running ``make proto``
is all the contracts need.

Mapping of Kafka types (the same rules live in ``services/frontend/converter.py``):

    int8/int16/int32/error_code -> int32      int64 -> int64      uint16 -> uint32
    bool -> bool   float64 -> double   string -> string   bytes/records -> bytes
    uuid -> string (canonical text)   timedelta_i32/i64, datetime_i64 -> int64 named <name>_ms
    array -> repeated; a nullable array gets a companion ``bool <name>_is_null``

The messages are proto2, so that every singular field has presence and reads, when unset, as
Kafka's default: the default the newest version having the field declares (``[default = ...]``),
else the zero value. A handler therefore sees Kafka's defaults whether a field came from an old
client version that lacks it or from a hand-written grpcurl request that leaves it out.

Run through ``make proto``; the output is committed and ``tests/test_proto_contracts.py``
checks it is current.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import sys
import types
import typing
from pathlib import Path

from kio.schema.index import schema_name_map

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.frontend.api_versions import SUPPORTED_APIS  # noqa: E402

KAFKA_PROTO = Path("kbroker/kafka/v1/kafka.proto")
HANDLER_PROTO = Path("kbroker/handler/v1/kafka_handler.proto")

SCALARS = {
    "int8": "int32", "int16": "int32", "int32": "int32", "error_code": "int32",
    "int64": "int64", "uint16": "uint32", "bool": "bool", "float64": "double",
    "string": "string", "bytes": "bytes", "records": "bytes", "uuid": "string",
    "timedelta_i32": "int64", "timedelta_i64": "int64", "datetime_i64": "int64",
}
MILLIS_KINDS = {"timedelta_i32", "timedelta_i64", "datetime_i64"}
WIDER = {("int32", "int64"): "int64", ("int64", "int32"): "int64"}


def proto_field_name(kio_name: str, kafka_type: str | None) -> str:
    if kafka_type in MILLIS_KINDS and not kio_name.endswith("_ms"):
        return kio_name + "_ms"
    return kio_name


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def unwrap_optional(hint: object) -> tuple[object, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def proto_default(value: object, ptype: str) -> str | None:
    """A kio default as a proto2 ``default`` option value (None: no option, the zero value
    of the type is the default)."""
    if value is None or value is dataclasses.MISSING or dataclasses.is_dataclass(value):
        return None
    if not value:
        return None
    if isinstance(value, datetime.timedelta):
        value = value // datetime.timedelta(milliseconds=1)
    if isinstance(value, bool):
        return "true" if value else "false"
    if ptype == "string":
        return json.dumps(str(value))
    if ptype in ("int32", "int64", "uint32"):
        return str(int(value))  # type: ignore[call-overload]
    if ptype == "double":
        return repr(float(value))  # type: ignore[arg-type]
    return None


class Field:
    def __init__(self, name: str, ptype: str, repeated: bool, nullable: bool, number: int):
        self.name, self.ptype, self.repeated, self.nullable, self.number = (
            name, ptype, repeated, nullable, number)
        self.default: str | None = None


class Message:
    def __init__(self, name: str):
        self.name = name
        self.fields: dict[str, Field] = {}
        self.next_number = 1

    def add(self, name: str, ptype: str, repeated: bool, nullable: bool, where: str) -> Field:
        known = self.fields.get(name)
        if known is None:
            known = self.fields[name] = Field(name, ptype, repeated, nullable, self.next_number)
            self.next_number += 1
            if repeated and nullable:
                self.add(name + "_is_null", "bool", False, False, where)
            return known
        if known.repeated != repeated:
            raise SystemExit(f"{where}: {name} changes between array and single")
        if known.ptype != ptype:
            wider = WIDER.get((known.ptype, ptype))
            if wider is None:
                raise SystemExit(f"{where}: {name} changes type {known.ptype} -> {ptype}")
            known.ptype = wider
        if nullable and not known.nullable:
            known.nullable = True
            if repeated:
                self.add(name + "_is_null", "bool", False, False, where)
        return known


def collect(entity: type, top: Message, nested: dict[str, Message], where: str) -> None:
    """Add the fields of one version's entity; versions come oldest first, so a field's
    number is that of its first appearance and its default the newest version's."""
    hints = typing.get_type_hints(entity)
    target = top if entity.__name__ == top.name else nested.setdefault(
        entity.__name__, Message(entity.__name__))
    for f in dataclasses.fields(entity):
        hint, nullable = unwrap_optional(hints[f.name])
        repeated = typing.get_origin(hint) is tuple
        if repeated:
            hint, _ = unwrap_optional(typing.get_args(hint)[0])
        kafka_type = f.metadata.get("kafka_type")
        if dataclasses.is_dataclass(hint):
            collect(hint, top, nested, where)
            ptype = hint.__name__
        elif kafka_type in SCALARS:
            ptype = SCALARS[kafka_type]
        else:
            raise SystemExit(f"{where}: unsupported field {f.name}: {hints[f.name]}")
        field = target.add(proto_field_name(f.name, kafka_type), ptype, repeated, nullable,
                           where)
        default = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if repeated:
            if nullable:
                target.fields[field.name + "_is_null"].default = (
                    "true" if default is None else None)
        else:
            field.default = proto_default(default, ptype)


def render_messages(messages: list[tuple[Message, dict[str, Message]]]) -> str:
    out = [
        "// Generated by tools/gen_kafka_proto.py from kio's Kafka message schemas.",
        "// Do not edit by hand: run `make proto`.",
        "//",
        "// One version-free message per Kafka request and response: the union of every",
        "// version's fields. The frontend converts the client's wire version to and from these.",
        "// An unset field reads as Kafka's default (the newest version's).",
        'syntax = "proto2";',
        "",
        "package kbroker.kafka.v1;",
        "",
    ]

    def field_line(f: Field, indent: str) -> str:
        if f.repeated:
            return f"{indent}repeated {f.ptype} {f.name} = {f.number};"
        option = f" [default = {f.default}]" if f.default is not None else ""
        return f"{indent}optional {f.ptype} {f.name} = {f.number}{option};"

    for top, nested in messages:
        out.append(f"message {top.name} {{")
        for name in sorted(nested):
            msg = nested[name]
            out.append(f"  message {name} {{")
            out.extend(field_line(f, "    ") for f in msg.fields.values())
            out.append("  }")
        out.extend(field_line(f, "  ") for f in top.fields.values())
        out.append("}")
        out.append("")
    return "\n".join(out)


def render_service(rpcs: list[str]) -> str:
    out = [
        "// Generated by tools/gen_kafka_proto.py from the frontend's API table",
        "// (services/frontend/api_versions.py). Do not edit by hand: run `make proto`.",
        "//",
        "// The handler: stateless Kafka API logic (Kafka's KafkaApis), one RPC per Kafka API,",
        "// taking and returning the version-free messages of kbroker.kafka.v1. Request context",
        "// travels as gRPC metadata (see handler.proto).",
        'syntax = "proto3";',
        "",
        "package kbroker.handler.v1;",
        "",
        'import "kbroker/kafka/v1/kafka.proto";',
        "",
        "service KafkaHandler {",
    ]
    out += [f"  rpc {rpc}(kbroker.kafka.v1.{rpc}Request) returns "
            f"(kbroker.kafka.v1.{rpc}Response);" for rpc in rpcs]
    out.append("}")
    return "\n".join(out) + "\n"


def api_messages(api: str) -> list[tuple[Message, dict[str, Message]]]:
    versions = sorted(schema_name_map[api])
    messages = []
    for kind in ("request", "response"):
        top = Message(camel(api) + camel(kind))
        nested: dict[str, Message] = {}
        for version in versions:
            path = schema_name_map[api][version][
                next(k for k in schema_name_map[api][version] if k.name == kind)]
            module, cls_name = path.split(":")
            entity = getattr(importlib.import_module(module), cls_name)
            top_alias = Message(entity.__name__)
            top_alias.fields, top_alias.next_number = top.fields, top.next_number
            collect(entity, top_alias, nested, f"{api} v{version} {kind}")
            top.fields, top.next_number = top_alias.fields, top_alias.next_number
        nested.pop(top.name, None)
        messages.append((top, nested))
    return messages


def build() -> tuple[str, str]:
    apis = sorted(SUPPORTED_APIS.values(), key=lambda a: a.key)
    messages = [m for api in apis for m in api_messages(api.schema_name)]
    rpcs = [api.name for api in apis if api.forwarded]
    return render_messages(messages) + "\n", render_service(rpcs)


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "proto"
    kafka, handler = build()
    (root / KAFKA_PROTO).parent.mkdir(parents=True, exist_ok=True)
    (root / HANDLER_PROTO).parent.mkdir(parents=True, exist_ok=True)
    (root / KAFKA_PROTO).write_text(kafka)
    (root / HANDLER_PROTO).write_text(handler)


if __name__ == "__main__":
    main()
