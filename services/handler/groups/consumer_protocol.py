"""The embedded consumer protocol of classic groups (Kafka's ``ConsumerProtocol``): what a
classic consumer sends in JoinGroup and receives in SyncGroup, read and written where a
consumer group serves classic members and where groups convert between the protocols.

    ConsumerProtocolSubscription => version:int16 [topics:string] user_data:nullable bytes
                                    [owned_partitions => topic:string [partitions:int32]] (v1+)
                                    generation_id:int32 (v2+, default -1)
                                    rack_id:nullable string (v3+)
    ConsumerProtocolAssignment => version:int16 [assigned_partitions => topic:string
                                  [partitions:int32]] user_data:nullable bytes

Never flexible. Versions above 3 are read as 3 (Kafka reads a newer version by its known
prefix, as each version only appends fields).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..coordinator.schema import Reader, RecordFormatError

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
MAX_VERSION = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    version: int = 0
    topics: tuple[str, ...] = ()
    owned: dict[str, frozenset[int]] | None = None
    generation: int = -1
    rack_id: str | None = None


def _string(r: Reader, nullable: bool = False) -> str | None:
    size = int(r.fixed(_INT16))
    if size < 0:
        if not nullable:
            raise RecordFormatError("null string")
        return None
    try:
        return bytes(r._take(size)).decode()
    except UnicodeDecodeError as exc:
        raise RecordFormatError(str(exc)) from None


def _partitions(r: Reader) -> dict[str, frozenset[int]]:
    result: dict[str, frozenset[int]] = {}
    for _ in range(max(int(r.fixed(_INT32)), 0)):
        topic = _string(r) or ""
        count = max(int(r.fixed(_INT32)), 0)
        result[topic] = result.get(topic, frozenset()) | frozenset(
            int(r.fixed(_INT32)) for _ in range(count))
    return result


def read_subscription(data: bytes) -> Subscription:
    """Raises RecordFormatError for bytes that are not a subscription."""
    r = Reader(data)
    version = int(r.fixed(_INT16))
    if version < 0:
        raise RecordFormatError(f"subscription version {version}")
    topics = tuple(_string(r) or "" for _ in range(max(int(r.fixed(_INT32)), 0)))
    size = int(r.fixed(_INT32))  # user data
    if size > 0:
        r._take(size)
    owned = _partitions(r) if version >= 1 else None
    generation = int(r.fixed(_INT32)) if version >= 2 else -1
    rack = _string(r, nullable=True) if version >= 3 else None
    return Subscription(version=version, topics=topics, owned=owned, generation=generation,
                        rack_id=rack)


def subscription_version(data: bytes) -> int:
    """The version a subscription was written in (0 when unreadable)."""
    return max(_INT16.unpack_from(data)[0], 0) if len(data) >= 2 else 0


def read_assignment(data: bytes) -> dict[str, frozenset[int]]:
    """The partitions of a ConsumerProtocolAssignment (empty bytes: none). Raises
    RecordFormatError."""
    if not data:
        return {}
    r = Reader(data)
    if int(r.fixed(_INT16)) < 0:
        raise RecordFormatError("negative assignment version")
    return _partitions(r)


def write_assignment(partitions: dict[str, frozenset[int]], version: int) -> bytes:
    """A ConsumerProtocolAssignment of ``partitions`` (topic name -> partitions), in the
    version of the member's subscription (at most :data:`MAX_VERSION`), without user data."""
    out = bytearray(_INT16.pack(min(max(version, 0), MAX_VERSION)))
    out += _INT32.pack(len(partitions))
    for topic in sorted(partitions):
        name = topic.encode()
        out += _INT16.pack(len(name)) + name + _INT32.pack(len(partitions[topic]))
        for p in sorted(partitions[topic]):
            out += _INT32.pack(p)
    out += _INT32.pack(-1)
    return bytes(out)


def write_subscription(subscription: Subscription) -> bytes:
    """A ConsumerProtocolSubscription (tests, and members converted to the classic protocol
    keep their own bytes)."""
    version = min(subscription.version, MAX_VERSION)
    out = bytearray(_INT16.pack(version))
    out += _INT32.pack(len(subscription.topics))
    for topic in subscription.topics:
        name = topic.encode()
        out += _INT16.pack(len(name)) + name
    out += _INT32.pack(-1)
    if version >= 1:
        owned = subscription.owned or {}
        out += _INT32.pack(len(owned))
        for topic in sorted(owned):
            name = topic.encode()
            out += _INT16.pack(len(name)) + name + _INT32.pack(len(owned[topic]))
            for p in sorted(owned[topic]):
                out += _INT32.pack(p)
    if version >= 2:
        out += _INT32.pack(subscription.generation)
    if version >= 3:
        if subscription.rack_id is None:
            out += _INT16.pack(-1)
        else:
            rack = subscription.rack_id.encode()
            out += _INT16.pack(len(rack)) + rack
    return bytes(out)
