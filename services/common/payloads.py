"""Record batches beside protobuf: messages whose ``bytes`` payloads (record batches, nearly all
of their size) are written into and read out of the serialized message by hand, so protobuf
never copies them.

A Produce request, an append to a log node, a read's answer and a Fetch response each carry
their batches in a ``bytes`` field of messages nested in repeated fields, e.g.

    ProduceRequest => topic_data: [TopicProduceData => partition_data: [PartitionProduceData
                                                      => index, records (bytes)]]

Set the ordinary way, a payload is copied into the message, copied again when it is
serialized, and twice more on the other side (parsing, reading the field). Protobuf lets a
message's fields come in any order, so instead:

- writing (:func:`splice`): the message is serialized by protobuf with its payload fields left
  empty, then walked along the path of the payload field (a few varints per level: the walk
  never looks inside a payload), and each leaf message (the one holding the payload field) gets
  its payload appended as that field, the enclosing messages' lengths written anew. The result
  is a list of pieces, the payloads among them as they are, for one join (or none: gRPC takes
  them joined, the frontend's socket writes take them as they are);
- reading (:func:`split`): the serialized message is walked the same way; each payload is
  handed on as a ``memoryview`` of the received bytes, and the message without its payloads is
  small and parsed by protobuf.

Only messages of large payloads are taken apart so. Protobuf's copies cost by the byte, the
walk in Python by the payload (2-3 us each, about what copying 16 KB of a message not in the
CPU's caches costs): a message of 83 payloads of 3 KB was split in 190 us and parsed whole, its
payloads read, in 55 us; one of a single 256 KB payload split in 4 us and parsed in 39 us, of
four 1 MB payloads in 14 us and 2 ms. So a message is spliced when its payloads come to
:data:`SPLICE_MIN_BYTES` or more and average :data:`SPLICE_MIN_PAYLOAD_BYTES` or more
(:meth:`Detached.serialized`); a receiver, which cannot count the payloads without the walk,
splits what is that large when its first payload is that large, and whatever is
:data:`SPLIT_ALWAYS_BYTES` or more (:func:`parse_message`).

Leaves are the elements of the repeated fields on the path, in order, one payload each; None
stands for a payload field left unset, which proto2 messages tell from an empty one (a Kafka
null from empty records). Both sides stay plain protobuf: a peer that builds or parses
these messages whole (grpcurl, another language, a test) reads and writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from .varints import VarintError, decode_uvarint, encode_uvarint

_LENGTH_DELIMITED = 2
# Payloads of fewer bytes than this, together, are left to protobuf (see the module docstring),
SPLICE_MIN_BYTES = 64 * 1024
# as are payloads of fewer bytes than this on average (the first one, for a receiver),
SPLICE_MIN_PAYLOAD_BYTES = 16 * 1024
# unless the message received is this large: copying it whole would cost more than any walk.
SPLIT_ALWAYS_BYTES = 1024 * 1024

Payload = bytes | bytearray | memoryview
Pieces = list[Payload]
MaybePayload = Payload | None


class PayloadPath:
    """Where a message type carries its payloads: the fields from the message down to a
    ``bytes`` field, each but the last a message field (repeated or not), e.g.
    ``PayloadPath(ProduceRequest.DESCRIPTOR, "topic_data.partition_data.records")``."""

    __slots__ = ("_keys", "descriptor", "names", "numbers")

    def __init__(self, descriptor: Descriptor, dotted: str) -> None:
        names = tuple(dotted.split("."))
        numbers = []
        current: Descriptor | None = descriptor
        for depth, name in enumerate(names):
            if current is None:
                raise ValueError(f"{dotted}: {names[depth - 1]} is not a message field")
            field = current.fields_by_name[name]
            numbers.append(field.number)
            last = depth == len(names) - 1
            if last and field.type != FieldDescriptor.TYPE_BYTES:
                raise ValueError(f"{dotted}: {name} is not a bytes field")
            current = field.message_type
        self.descriptor = descriptor
        self.names = names
        self.numbers = tuple(numbers)
        self._keys = tuple(encode_uvarint(n << 3 | _LENGTH_DELIMITED) for n in numbers)

    def __repr__(self) -> str:
        return f"PayloadPath({self.descriptor.full_name}: {'.'.join(self.names)})"


def splice(head: bytes | memoryview, path: PayloadPath,
           payloads: Iterable[MaybePayload]) -> tuple[Pieces, int]:
    """``head`` (a serialized message whose payload fields are unset) with each leaf message's
    payload taken in order from ``payloads`` (None: left unset): the pieces of the serialized
    message (views of ``head`` and the payloads themselves) and its size.
    Raises ``DecodeError`` if ``head`` is not a serialized message, ``ValueError`` if the
    number of payloads is not the number of leaves."""
    feed = iter(payloads)
    view = memoryview(head)
    try:
        pieces, size = _splice(view, 0, len(view), path, 0, feed)
    except (VarintError, StopIteration) as exc:
        raise (ValueError("fewer payloads than leaf messages") if isinstance(
            exc, StopIteration) else DecodeError(str(exc))) from None
    if next(feed, _END) is not _END:
        raise ValueError("more payloads than leaf messages")
    return pieces, size


def spliced(message: Message, path: PayloadPath, payloads: Iterable[MaybePayload]) -> bytes:
    """``message`` (payload fields unset) serialized with ``payloads`` in them: one join."""
    pieces, _ = splice(message.SerializeToString(), path, payloads)
    return b"".join(pieces)


def split(data: bytes | memoryview,
          path: PayloadPath) -> tuple[bytes, list[memoryview | None]]:
    """(the serialized message without its payloads, each leaf message's payload in order as a
    view of ``data``; None when the leaf has none). A payload field given twice in a leaf
    takes its last value, as protobuf does. Raises ``DecodeError`` for bytes that are not a
    serialized message."""
    view = memoryview(data)
    payloads: list[memoryview | None] = []
    try:
        pieces, _ = _split(view, 0, len(view), path, 0, payloads)
    except VarintError as exc:
        raise DecodeError(str(exc)) from None
    return b"".join(pieces), payloads


def parse(data: bytes | memoryview, message_type: Any,
          path: PayloadPath) -> tuple[Any, list[memoryview | None]]:
    """:func:`split`, with the rest parsed as ``message_type``."""
    rest, payloads = split(data, path)
    return message_type.FromString(rest), payloads


def parse_message(data: bytes | memoryview, message_type: Any,
                  path: PayloadPath) -> tuple[Any, list[memoryview | None] | None]:
    """The message in ``data`` and its payloads: taken apart as :func:`parse` does when
    ``data`` is large enough for it to pay (see the module docstring), else parsed whole by
    protobuf, its payloads in it and None in their place."""
    if len(data) < SPLICE_MIN_BYTES or (
        len(data) < SPLIT_ALWAYS_BYTES
        and _first_payload_size(memoryview(data), path) < SPLICE_MIN_PAYLOAD_BYTES
    ):
        return message_type.FromString(data), None
    return parse(data, message_type, path)


def _first_payload_size(view: memoryview, path: PayloadPath) -> int:
    """The size of the first leaf's payload in the serialized message ``view`` (0 without
    one, or when the bytes do not read as a message: parsing then says why)."""
    start, end = 0, len(view)
    try:
        for field in path.numbers:
            position, found = start, False
            while position < end:
                key, position = decode_uvarint(view, position, end)
                if key >> 3 == field and key & 7 == _LENGTH_DELIMITED:
                    length, position = decode_uvarint(view, position, end)
                    start, end, found = position, position + length, True
                    break
                position = _skip(view, key, position, end)
            if not found:
                return 0
    except (VarintError, DecodeError):
        return 0
    return end - start


def leaves(message: Message, path: PayloadPath) -> Iterator[Message]:
    """The leaf messages of ``message`` (those holding a payload field), in order."""
    level: list[Message] = [message]
    for name in path.names[:-1]:
        following: list[Message] = []
        for parent in level:
            field = parent.DESCRIPTOR.fields_by_name[name]
            if field.is_repeated:
                following.extend(getattr(parent, name))
            elif parent.HasField(name):
                following.append(getattr(parent, name))
        level = following
    return iter(level)


def take(message: Message, path: PayloadPath) -> list[bytes | None]:
    """The payloads of a message built whole (by protobuf, e.g. from a unary call), in leaf
    order (None where unset), cleared from it: the shape :func:`split` gives, from a message
    that already paid for its copies."""
    name = path.names[-1]
    taken: list[bytes | None] = []
    for leaf in leaves(message, path):
        taken.append(getattr(leaf, name) if _present(leaf, name) else None)
        leaf.ClearField(name)
    return taken


def fill(message: Message, path: PayloadPath, payloads: Iterable[MaybePayload]) -> Message:
    """Set each leaf's payload field from ``payloads`` (in order; None left unset) and return
    ``message``: a whole message again (copying the payloads), for callers that need one (a
    unary gRPC answer)."""
    name = path.names[-1]
    for leaf, payload in zip(leaves(message, path), payloads, strict=True):
        if payload is not None:
            setattr(leaf, name, bytes(payload))
    return message


class Detached:
    """A message with its payloads beside it: ``message`` leaves its payload fields unset and
    ``payloads`` holds them in leaf order. What an API answers when its caller serializes the
    answer itself (:meth:`pieces`); :meth:`whole` is the ordinary message for any other."""

    __slots__ = ("files", "message", "path", "payloads")

    def __init__(self, message: Message, path: PayloadPath,
                 payloads: list[MaybePayload], files: Sequence[tuple[int, Any]] = ()) -> None:
        self.message = message
        self.path = path
        self.payloads = payloads
        # Payloads left empty for a reader on the log node's host to read from segment files
        # itself (services.common.file_records): (leaf index, a FileRecords message).
        self.files = files

    def pieces(self) -> tuple[Pieces, int]:
        """The serialized message as pieces (the payloads among them) and its size."""
        return splice(self.message.SerializeToString(), self.path, self.payloads)

    def serialized(self) -> bytes | tuple[Pieces, int]:
        """The serialized message: as :meth:`pieces` when its payloads are large enough for
        splicing to pay (see the module docstring), else as bytes serialized whole by
        protobuf (the payloads copied into the message first)."""
        size = payload_sizes(self.payloads)
        if size < SPLICE_MIN_BYTES or size < SPLICE_MIN_PAYLOAD_BYTES * len(self.payloads):
            return self.whole().SerializeToString()
        return self.pieces()

    def SerializeToString(self) -> bytes:
        serialized = self.serialized()
        return serialized if isinstance(serialized, bytes) else b"".join(serialized[0])

    def whole(self) -> Message:
        """The message with its payloads in it (copied there); those in ``files`` stay
        empty, for the caller to read from the files."""
        return fill(self.message, self.path, self.payloads)


def _present(message: Message, name: str) -> bool:
    """Whether the bytes field ``name`` is set (proto3 without presence: non-empty)."""
    if message.DESCRIPTOR.fields_by_name[name].has_presence:
        return message.HasField(name)
    return bool(getattr(message, name))


def _skip(view: memoryview, key: int, position: int, end: int) -> int:
    """The position after the value of a field with ``key`` at ``position``."""
    wire_type = key & 7
    if wire_type == 0:
        _, position = decode_uvarint(view, position, end)
    elif wire_type == 1:
        position += 8
    elif wire_type == _LENGTH_DELIMITED:
        length, position = decode_uvarint(view, position, end)
        position += length
    elif wire_type == 5:
        position += 4
    else:
        raise DecodeError(f"unsupported wire type {wire_type}")
    if position > end:
        raise DecodeError("truncated field")
    return position


def _splice(view: memoryview, start: int, end: int, path: PayloadPath, depth: int,
            feed: Iterator[Payload]) -> tuple[Pieces, int]:
    field = path.numbers[depth]
    leaf = depth == len(path.numbers) - 1
    pieces: Pieces = []
    size = 0
    kept = position = start
    while position < end:
        field_start = position
        key, position = decode_uvarint(view, position, end)
        if key >> 3 != field or key & 7 != _LENGTH_DELIMITED:
            position = _skip(view, key, position, end)
            continue
        length, position = decode_uvarint(view, position, end)
        value_start, position = position, position + length
        if position > end:
            raise DecodeError("truncated field")
        if kept < field_start:
            pieces.append(view[kept:field_start])
            size += field_start - kept
        kept = position
        if not leaf:  # a message on the path: its leaves get their payloads
            inner, inner_size = _splice(view, value_start, position, path, depth + 1, feed)
            prefix = path._keys[depth] + encode_uvarint(inner_size)
            pieces.append(prefix)
            pieces += inner
            size += len(prefix) + inner_size
        # In a leaf, the (empty) payload field is dropped and written once, below.
    if kept < end:
        pieces.append(view[kept:end])
        size += end - kept
    if leaf:
        payload = next(feed)
        if payload is not None:
            prefix = path._keys[depth] + encode_uvarint(len(payload))
            pieces += (prefix, payload)
            size += len(prefix) + len(payload)
    return pieces, size


def _split(view: memoryview, start: int, end: int, path: PayloadPath, depth: int,
           payloads: list[memoryview]) -> tuple[Pieces, int]:
    field = path.numbers[depth]
    leaf = depth == len(path.numbers) - 1
    pieces: Pieces = []
    size = 0
    payload: memoryview | None = None
    kept = position = start
    while position < end:
        field_start = position
        key, position = decode_uvarint(view, position, end)
        if key >> 3 != field or key & 7 != _LENGTH_DELIMITED:
            position = _skip(view, key, position, end)
            continue
        length, position = decode_uvarint(view, position, end)
        value_start, position = position, position + length
        if position > end:
            raise DecodeError("truncated field")
        if kept < field_start:
            pieces.append(view[kept:field_start])
            size += field_start - kept
        kept = position
        if leaf:
            payload = view[value_start:position]
        else:
            inner, inner_size = _split(view, value_start, position, path, depth + 1, payloads)
            prefix = path._keys[depth] + encode_uvarint(inner_size)
            pieces.append(prefix)
            pieces += inner
            size += len(prefix) + inner_size
    if kept < end:
        pieces.append(view[kept:end])
        size += end - kept
    if leaf:
        payloads.append(payload)
    return pieces, size


def payload_sizes(payloads: Sequence[MaybePayload]) -> int:
    """The bytes of ``payloads`` together."""
    return sum(len(p) for p in payloads if p is not None)


_END = object()
