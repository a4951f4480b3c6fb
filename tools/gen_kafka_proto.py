"""Generate ``proto/kbroker/kafka/v1/kafka.proto`` from kio's Kafka message schemas.

Each Kafka API gets one version-free request message and one response message: the union of
the fields of every version kio knows, nested entities as nested messages. Field numbers are
assigned in order of first appearance (oldest version first), so a newer kio only appends.

Mapping of Kafka types (the same rules live in ``services/frontend/converter.py``):

    int8/int16/int32/error_code -> int32      int64 -> int64      uint16 -> uint32
    bool -> bool   float64 -> double   string -> string   bytes/records -> bytes
    uuid -> string (canonical text)   timedelta_i32/i64, datetime_i64 -> int64 named <name>_ms
    array -> repeated; a nullable array gets a companion ``bool <name>_is_null``

Every singular field is ``optional`` so that an unset field takes the Kafka default of the
client's version when encoded, rather than protobuf's zero value.

Run through ``make proto``; the output is committed and ``tests/test_proto_contracts.py``
checks it is current.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
import typing
from pathlib import Path

from kio.schema.index import schema_name_map

# The client-facing APIs the broker models; each gets <Api>Request and <Api>Response.
APIS = [
    "produce", "fetch", "list_offsets", "metadata", "offset_commit", "offset_fetch",
    "find_coordinator", "join_group", "heartbeat", "leave_group", "sync_group",
    "describe_groups", "list_groups", "api_versions", "create_topics", "delete_topics",
    "delete_records", "init_producer_id", "offset_for_leader_epoch", "describe_configs",
    "alter_configs", "create_partitions", "delete_groups", "incremental_alter_configs",
    "offset_delete", "describe_cluster", "describe_producers",
]

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


class Field:
    def __init__(self, name: str, ptype: str, repeated: bool, nullable: bool, number: int):
        self.name, self.ptype, self.repeated, self.nullable, self.number = (
            name, ptype, repeated, nullable, number)


class Message:
    def __init__(self, name: str):
        self.name = name
        self.fields: dict[str, Field] = {}
        self.next_number = 1

    def add(self, name: str, ptype: str, repeated: bool, nullable: bool, where: str) -> None:
        known = self.fields.get(name)
        if known is None:
            self.fields[name] = Field(name, ptype, repeated, nullable, self.next_number)
            self.next_number += 1
            if repeated and nullable:
                self.add(name + "_is_null", "bool", False, False, where)
            return
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


def collect(entity: type, top: Message, nested: dict[str, Message], where: str) -> None:
    hints = typing.get_type_hints(entity)
    target = top if entity.__name__ == top.name else nested.setdefault(
        entity.__name__, Message(entity.__name__))
    for f in dataclasses.fields(entity):
        hint, nullable = unwrap_optional(hints[f.name])
        repeated = typing.get_origin(hint) is tuple
        if repeated:
            hint, elem_nullable = unwrap_optional(typing.get_args(hint)[0])
        kafka_type = f.metadata.get("kafka_type")
        if dataclasses.is_dataclass(hint):
            collect(hint, top, nested, where)
            ptype = hint.__name__
        elif kafka_type in SCALARS:
            ptype = SCALARS[kafka_type]
        else:
            raise SystemExit(f"{where}: unsupported field {f.name}: {hints[f.name]}")
        target.add(proto_field_name(f.name, kafka_type), ptype, repeated, nullable, where)


def render(messages: list[tuple[Message, dict[str, Message]]]) -> str:
    out = [
        "// Generated by tools/gen_kafka_proto.py from kio's Kafka message schemas.",
        "// Do not edit by hand: run `make proto`.",
        "//",
        "// One version-free message per Kafka request and response: the union of every",
        "// version's fields. The frontend converts the client's wire version to and from these.",
        'syntax = "proto3";',
        "",
        "package kbroker.kafka.v1;",
        "",
    ]

    def field_line(f: Field, indent: str) -> str:
        if f.repeated:
            return f"{indent}repeated {f.ptype} {f.name} = {f.number};"
        return f"{indent}optional {f.ptype} {f.name} = {f.number};"

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


def build() -> str:
    messages = []
    for api in APIS:
        versions = sorted(schema_name_map[api])
        for kind in ("request", "response"):
            top = Message(camel(api) + camel(kind))
            nested: dict[str, Message] = {}
            for version in versions:
                path = schema_name_map[api][version][
                    next(k for k in schema_name_map[api][version] if k.name == kind)]
                module, cls_name = path.split(":")
                entity = getattr(importlib.import_module(module), cls_name)
                # kio names the top-level class e.g. ProduceRequest; use our own name.
                top_alias = Message(entity.__name__)
                top_alias.fields, top_alias.next_number = top.fields, top.next_number
                collect(entity, top_alias, nested, f"{api} v{version} {kind}")
                top.fields, top.next_number = top_alias.fields, top_alias.next_number
            nested.pop(top.name, None)
            messages.append((top, nested))
    return render(messages) + "\n"


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(
        "proto/kbroker/kafka/v1/kafka.proto")
    target.write_text(build())


if __name__ == "__main__":
    main()
