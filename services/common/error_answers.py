"""The answer to a Kafka request that failed as a whole, for any API, built from the message
schema (Kafka's ``AbstractRequest.getErrorResponse``): the response names every item the
request named, in the response's own shape, and every item carries the error code.

Used by the handler (an API failing a whole request, an unexpected failure) and by the
frontend (no handler answered). The shape is derived once per API from the generated messages
of ``kbroker.kafka.v1``:

- at each level the response's error code field (``error_code``, else its one
  ``*_error_code`` field) gets the code, and ``error_message`` the message if one is given;
- the fields that name an item (:data:`IDENTITY_FIELDS`: topic names and ids, partition
  indexes, group and member ids, config resources, coordinator keys, ...) are copied from
  the request item to the response item (on the request itself only names, not numbers: an
  InitProducerId's producer id is no item's name); a request's ``partition`` answers as
  ``partition_index``;
- each repeated entity of the response that holds an error code somewhere below is filled
  from the request's repeated field that matches it best: an entity list sharing identity
  fields (``topics`` -> ``responses``), or a list of plain values whose name says which field
  they name (``partition_indexes`` -> ``partition_index``, ``groups`` -> ``group_id``,
  ``coordinator_keys`` -> ``key``);
- numbers Kafka answers as unknown (-1) in an error answer, whether or not its schema says so
  (:data:`UNKNOWN_SUFFIXES`: offsets, epochs, watermarks, node, leader, producer and
  generation ids, ports), are -1;
- every other field is left unset, so the frontend encodes Kafka's default for the client's
  version.

Version-specific spellings of one request (DeleteTopics' ``topic_names`` before v6) are
rewritten by the frontend into the newest spelling before anything else sees the request.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kbroker.kafka.v1 import kafka_pb2

# Fields that name an item of a request rather than say something about it.
IDENTITY_FIELDS = frozenset({
    "name", "topic", "topic_id", "index", "partition", "partition_index", "group_id",
    "member_id", "group_instance_id", "key", "resource_type", "resource_name",
    "transactional_id", "producer_id", "user", "entity_type", "entity_name",
})
# Numbers that an error answer gives as unknown (-1), by how their names end.
UNKNOWN_SUFFIXES = ("offset", "epoch", "watermark", "node_id", "leader_id", "controller_id",
                    "producer_id", "generation_id", "port")
_INTEGERS = frozenset({FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64,
                       FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64})
# A request field spelled differently in the response.
_ALIASES = {"partition": "partition_index"}
_ERROR_MESSAGE = "error_message"
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


@dataclass(slots=True)
class _Plan:
    """How to build one response entity from one request entity."""

    copies: list[tuple[str, str]] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    # Record batches: empty, not null (a null Fetch partition's records is a protocol error to
    # librdkafka; Kafka answers an errored partition with no records).
    empty: list[str] = field(default_factory=list)
    code: str | None = None
    message: bool = False
    # (request field, response field, plan of entity elements | None, key of plain elements)
    lists: list[tuple[str, str, _Plan | None, str | None]] = field(default_factory=list)


def response_type(request: Message) -> type[Message]:
    """The response message class of a ``kbroker.kafka.v1`` request."""
    name = type(request).DESCRIPTOR.name
    return getattr(kafka_pb2, name.removesuffix("Request") + "Response")  # type: ignore[no-any-return]


def error_response(request: Message, code: int, message: str | None = None) -> Message:
    """The response to ``request`` in which every item it names carries ``code`` (and
    ``message`` where the response has room for one)."""
    response = response_type(request)()
    _fill(_plan(type(request).DESCRIPTOR, response.DESCRIPTOR), request, response, code,
          message)
    return response


def _fill(plan: _Plan, request: Message, response: Message, code: int,
          message: str | None) -> None:
    for name in plan.unknowns:
        setattr(response, name, -1)
    for name in plan.empty:
        setattr(response, name, b"")
    for source, target in plan.copies:
        if request.HasField(source):
            setattr(response, target, getattr(request, source))
    if plan.code is not None:
        setattr(response, plan.code, code)
    if plan.message and message is not None:
        setattr(response, _ERROR_MESSAGE, message)
    for source, target, sub, key in plan.lists:
        items = getattr(response, target)
        for value in getattr(request, source):
            item = items.add()
            if sub is not None:
                _fill(sub, value, item, code, message)
            else:
                assert key is not None
                setattr(item, key, value)
                _fill(_plan(None, item.DESCRIPTOR), request, item, code, message)


@functools.cache
def _plan(request: Descriptor | None, response: Descriptor) -> _Plan:
    """The plan for a response entity; with no request entity (an item named by a plain
    value), just its error code and message."""
    plan = _Plan(code=_code_field(response), message=_ERROR_MESSAGE in response.fields_by_name)
    plan.unknowns = [f.name for f in response.fields
                     if not f.is_repeated and f.type in _INTEGERS
                     and f.name.endswith(UNKNOWN_SUFFIXES)]
    plan.empty = [f.name for f in response.fields
                  if f.name == "records" and f.type == FieldDescriptor.TYPE_BYTES]
    if request is None:
        return plan
    top_level = request.containing_type is None
    for name, f in request.fields_by_name.items():
        if f.type == _MESSAGE or f.is_repeated or name not in IDENTITY_FIELDS:
            continue
        if top_level and f.type != FieldDescriptor.TYPE_STRING:
            continue  # a number on the request itself (a producer id) is no item's name
        target = _ALIASES.get(name, name) if name not in response.fields_by_name else name
        if target in response.fields_by_name and not response.fields_by_name[target].is_repeated:
            plan.copies.append((name, target))
    for target in response.fields:
        if not target.is_repeated or target.type != _MESSAGE:
            continue
        element = target.message_type
        if not _holds_error_code(element):
            continue
        # The request's list most like it: entities by similarity, plain values by name.
        best, best_score = None, 0
        for source in request.fields:
            if not source.is_repeated:
                continue
            if source.type == _MESSAGE:
                score = _similarity(source.message_type, element)
            else:
                score = 1 if _key_of_plain(source.name, element) else 0
            if score > best_score:
                best, best_score = source, score
        if best is None:
            continue
        if best.type == _MESSAGE:
            plan.lists.append((best.name, target.name, _plan(best.message_type, element), None))
        else:
            plan.lists.append((best.name, target.name, None, _key_of_plain(best.name, element)))
    return plan


def _code_field(message: Descriptor) -> str | None:
    if "error_code" in message.fields_by_name:
        return "error_code"
    codes = [n for n in message.fields_by_name if n.endswith("_error_code")]
    return codes[0] if len(codes) == 1 else None


@functools.cache
def _holds_error_code(message: Descriptor) -> bool:
    if _code_field(message) is not None:
        return True
    return any(f.type == _MESSAGE and f.message_type is not message
               and _holds_error_code(f.message_type) for f in message.fields)


def _similarity(request: Descriptor, response: Descriptor) -> int:
    """How alike a request entity and a response entity are: identity fields in common (a
    request's ``partition`` matching a response's ``partition_index``), plus, one level down,
    the similarity of the lists they have in common by name."""
    score = 0
    for name in request.fields_by_name:
        if name in IDENTITY_FIELDS and (name in response.fields_by_name
                                        or _ALIASES.get(name) in response.fields_by_name):
            score += 2
    for f in request.fields:
        other = response.fields_by_name.get(f.name)
        if other is not None and f.is_repeated and other.is_repeated and \
                f.type == _MESSAGE and other.type == _MESSAGE:
            score += 1 + _similarity(f.message_type, other.message_type)
    return score


def _singular(word: str) -> str:
    for suffix in ("xes", "s"):
        if word.endswith(suffix):
            return word[: -len(suffix)] + ("x" if suffix == "xes" else "")
    return word


def _key_of_plain(list_name: str, element: Descriptor) -> str | None:
    """The field of a response element that a request's list of plain values names:
    ``partition_indexes`` -> ``partition_index``, ``coordinator_keys`` -> ``key``,
    ``topic_names`` -> ``name``, ``groups`` and ``groups_names`` -> ``group_id``,
    ``partitions`` -> ``partition_index``."""
    words = list_name.split("_")
    singular = "_".join([*words[:-1], _singular(words[-1])])
    candidates = [singular, _singular(words[-1]), _singular(words[0]) + "_id"]
    for candidate in candidates:
        candidate = _ALIASES.get(candidate, candidate) if candidate not in \
            element.fields_by_name else candidate
        if candidate in element.fields_by_name and candidate in IDENTITY_FIELDS:
            return candidate
    return None


# --- reading the error codes of a response ------------------------------------------------------

# A way down a message to an error code: (field name, repeated) per step, the last the code.
_Path = tuple[tuple[str, bool], ...]


@functools.cache
def _error_code_paths(descriptor: Descriptor) -> tuple[_Path, ...]:
    """Every path of message fields from ``descriptor`` to an error code field, the
    shortest first (a top-level code before the items')."""
    paths: list[_Path] = []

    def walk(message: Descriptor, prefix: _Path, depth: int) -> None:
        code = _code_field(message)
        for f in message.fields:
            step = ((f.name, bool(f.is_repeated)),)
            if f.name == code:
                paths.append(prefix + step)
            elif f.type == _MESSAGE and depth < 6:
                walk(f.message_type, prefix + step, depth + 1)

    walk(descriptor, (), 0)
    return tuple(sorted(paths, key=len))


def error_codes(response: Message) -> list[int]:
    """The distinct non-zero error codes of a response, a top-level code first, walking only
    the fields that lead to one."""
    out: dict[int, None] = {}
    for path in _error_code_paths(response.DESCRIPTOR):
        _codes_at(response, path, out)
    return list(out)


def _codes_at(message: Message, path: _Path, out: dict[int, None]) -> None:
    name, repeated = path[0]
    if len(path) == 1:
        code = getattr(message, name)
        if code:
            out[code] = None
        return
    rest = path[1:]
    if repeated:
        for item in getattr(message, name):
            _codes_at(item, rest, out)
    elif message.HasField(name):
        _codes_at(getattr(message, name), rest, out)
