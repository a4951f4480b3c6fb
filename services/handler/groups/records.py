"""The records of ``__consumer_offsets`` in Kafka's own formats (Kafka's
``GroupCoordinatorRecordSerde`` and the ``*Key``/``*Value`` message definitions of the
group-coordinator module). The batches that carry them are built and read by :mod:`.store`.

Every record has a key and, except for tombstones (a deleted group or offset), a value; each
starts with an int16 version that also says which kind of record it is. Strings are int16
length + UTF-8 (-1: null), bytes int32 length + data; flexible versions (value v4) use compact
forms (unsigned varint length + 1, 0: null) and end each structure with tagged fields.

    OffsetCommitKey        => version:int16 (0|1) group:string topic:string partition:int32
    GroupMetadataKey       => version:int16 (2) group:string

    OffsetCommitValue v0   => offset:int64 metadata:string commit_timestamp:int64
                      v1   => offset metadata commit_timestamp expire_timestamp:int64
                      v2   => offset metadata commit_timestamp
                      v3   => offset leader_epoch:int32 metadata commit_timestamp
                      v4   => v3, flexible
    GroupMetadataValue v0  => protocol_type:string generation:int32 protocol:nullable_string
                              leader:nullable_string [members]
                      v1   => members gain rebalance_timeout:int32 (before session_timeout)
                      v2   => current_state_timestamp:int64 (after leader)
                      v3   => members gain group_instance_id:nullable_string (after member_id)
                      v4   => v3, flexible
      members => member_id client_id client_host rebalance_timeout session_timeout
                 subscription:bytes assignment:bytes

Written: offset commit key v1 with value v3 (v1 when the commit carries an expiry time), group
metadata key v2 with value v4. Value v4 carries, in tagged field :data:`EXTENSION_TAG`, what a
stateless coordinator must also persist: the group state, rebalance deadlines, pending members
and each member's protocols (see :class:`GroupExtension`). Kafka's readers skip unknown tagged
fields, so Kafka tools read these records as ordinary group metadata.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from services.common.varints import VarintError, decode_uvarint, encode_uvarint

OFFSET_COMMIT_KEY_VERSIONS = (0, 1)
GROUP_METADATA_KEY_VERSION = 2
# The tagged field of GroupMetadataValue v4 holding a GroupExtension.
EXTENSION_TAG = 0x6B62  # "kb"
# v1 adds the pending SyncGroups; it is written only when there are some, so records of
# groups without any stay readable by readers that know v0 alone.
EXTENSION_VERSIONS = (0, 1)


class RecordFormatError(ValueError):
    """A key or value that is not one of the formats above."""


# --- primitive writers and readers -------------------------------------------------------------


uvarint = encode_uvarint


class Writer:
    """Appends Kafka primitives to a buffer."""

    def __init__(self) -> None:
        self.out = bytearray()

    def int8(self, value: int) -> None:
        self.out += struct.pack(">b", value)

    def int16(self, value: int) -> None:
        self.out += struct.pack(">h", value)

    def int32(self, value: int) -> None:
        self.out += struct.pack(">i", value)

    def int64(self, value: int) -> None:
        self.out += struct.pack(">q", value)

    def string(self, value: str | None, compact: bool = False) -> None:
        if value is None:
            self.out += uvarint(0) if compact else struct.pack(">h", -1)
            return
        data = value.encode()
        self.out += uvarint(len(data) + 1) if compact else struct.pack(">h", len(data))
        self.out += data

    def bytes_(self, value: bytes | None, compact: bool = False) -> None:
        if value is None:
            self.out += uvarint(0) if compact else struct.pack(">i", -1)
            return
        self.out += uvarint(len(value) + 1) if compact else struct.pack(">i", len(value))
        self.out += value

    def array_length(self, count: int, compact: bool = False) -> None:
        self.out += uvarint(count + 1) if compact else struct.pack(">i", count)

    def tagged_fields(self, fields: dict[int, bytes]) -> None:
        self.out += uvarint(len(fields))
        for tag in sorted(fields):
            self.out += uvarint(tag) + uvarint(len(fields[tag])) + fields[tag]


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

    def _unpack(self, fmt: str, size: int) -> int:
        value: int = struct.unpack(fmt, self._take(size))[0]
        return value

    def int8(self) -> int:
        return self._unpack(">b", 1)

    def int16(self) -> int:
        return self._unpack(">h", 2)

    def int32(self) -> int:
        return self._unpack(">i", 4)

    def int64(self) -> int:
        return self._unpack(">q", 8)

    def uvarint(self) -> int:
        try:
            value, self.pos = decode_uvarint(self.data, self.pos)
        except VarintError as exc:
            raise RecordFormatError(str(exc)) from None
        return value

    def varint(self) -> int:
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def string(self, compact: bool = False) -> str | None:
        size = self.uvarint() - 1 if compact else self.int16()
        if size < 0:
            return None
        try:
            return bytes(self._take(size)).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"bad string: {exc}") from exc

    def bytes_(self, compact: bool = False) -> bytes | None:
        size = self.uvarint() - 1 if compact else self.int32()
        return None if size < 0 else bytes(self._take(size))

    def array_length(self, compact: bool = False) -> int:
        count = self.uvarint() - 1 if compact else self.int32()
        if count > len(self.data) - self.pos:
            raise RecordFormatError("array longer than the record")
        return count

    def tagged_fields(self) -> dict[int, bytes]:
        fields = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            fields[tag] = bytes(self._take(self.uvarint()))
        return fields

    def at_end(self) -> bool:
        return self.pos == len(self.data)


# --- keys --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int

    def encode(self) -> bytes:
        w = Writer()
        w.int16(1)
        w.string(self.group)
        w.string(self.topic)
        w.int32(self.partition)
        return bytes(w.out)


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str

    def encode(self) -> bytes:
        w = Writer()
        w.int16(GROUP_METADATA_KEY_VERSION)
        w.string(self.group)
        return bytes(w.out)


RecordKey = OffsetCommitKey | GroupMetadataKey


def decode_key(data: bytes) -> RecordKey | None:
    """The key's meaning, or None for kinds of records this coordinator does not keep (Kafka
    writes others for its newer group types). Raises RecordFormatError when malformed."""
    r = Reader(data)
    version = r.int16()
    if version in OFFSET_COMMIT_KEY_VERSIONS:
        group, topic = r.string(), r.string()
        partition = r.int32()
        if group is None or topic is None:
            raise RecordFormatError("null group or topic in an offset commit key")
        return OffsetCommitKey(group, topic, partition)
    if version == GROUP_METADATA_KEY_VERSION:
        group = r.string()
        if group is None:
            raise RecordFormatError("null group in a group metadata key")
        return GroupMetadataKey(group)
    return None


# --- offset commit values ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    # Only in value v1 (commits that asked for a retention time); -1: none.
    expire_timestamp: int = -1

    def encode(self) -> bytes:
        w = Writer()
        if self.expire_timestamp >= 0:
            w.int16(1)
            w.int64(self.offset)
            w.string(self.metadata)
            w.int64(self.commit_timestamp)
            w.int64(self.expire_timestamp)
        else:
            w.int16(3)
            w.int64(self.offset)
            w.int32(self.leader_epoch)
            w.string(self.metadata)
            w.int64(self.commit_timestamp)
        return bytes(w.out)


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    r = Reader(data)
    version = r.int16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown offset commit value version {version}")
    flexible = version >= 4
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string(flexible) or ""
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else -1
    if flexible:
        r.tagged_fields()
    return OffsetCommitValue(offset=offset, leader_epoch=leader_epoch, metadata=metadata,
                             commit_timestamp=commit_timestamp,
                             expire_timestamp=expire_timestamp)


# --- group metadata values ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout: int = -1
    session_timeout: int = 0
    subscription: bytes = b""
    assignment: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberExtension:
    """What a member has beyond Kafka's record: its protocols (name, metadata) in preference
    order, whether it has joined the rebalance in progress, and its protocol type."""

    member_id: str
    protocols: tuple[tuple[str, bytes], ...] = ()
    joined: bool = False
    protocol_type: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupExtension:
    """The coordinator state Kafka keeps in memory and a stateless coordinator persists.

    ``state`` is a :class:`~.group.GroupState` value; times are wall-clock milliseconds, -1 for
    none: ``join_deadline`` ends the join phase in progress, ``initial_delay_remaining`` is
    what is left of the rebalance timeout while that phase is an initial delay (-1 when it is
    not), ``pending`` holds member ids handed out with MEMBER_ID_REQUIRED and when they lapse,
    ``sync_deadline`` is when members of the new generation that have not sent SyncGroup
    (``pending_sync``) are removed (Kafka's DelayedSync).

        GroupExtension v0 => version:int16 state:int8 join_deadline:int64
                             initial_delay_remaining:int64 new_member_added:int8
                             [pending => member_id:string expires:int64]
                             [members => member_id:string joined:int8 protocol_type:string
                                         [protocols => name:string metadata:bytes]]
        GroupExtension v1 => v0 sync_deadline:int64 [pending_sync => member_id:string]
    """

    state: int = 0
    join_deadline: int = -1
    initial_delay_remaining: int = -1
    new_member_added: bool = False
    pending: tuple[tuple[str, int], ...] = ()
    members: tuple[MemberExtension, ...] = ()
    sync_deadline: int = -1
    pending_sync: tuple[str, ...] = ()

    @property
    def version(self) -> int:
        """The lowest version that holds everything set."""
        return 1 if self.sync_deadline != -1 or self.pending_sync else 0

    def encode(self) -> bytes:
        w = Writer()
        version = self.version
        w.int16(version)
        w.int8(self.state)
        w.int64(self.join_deadline)
        w.int64(self.initial_delay_remaining)
        w.int8(1 if self.new_member_added else 0)
        w.array_length(len(self.pending))
        for member_id, expires in self.pending:
            w.string(member_id)
            w.int64(expires)
        w.array_length(len(self.members))
        for member in self.members:
            w.string(member.member_id)
            w.int8(1 if member.joined else 0)
            w.string(member.protocol_type)
            w.array_length(len(member.protocols))
            for name, metadata in member.protocols:
                w.string(name)
                w.bytes_(metadata)
        if version >= 1:
            w.int64(self.sync_deadline)
            w.array_length(len(self.pending_sync))
            for member_id in self.pending_sync:
                w.string(member_id)
        return bytes(w.out)


def decode_group_extension(data: bytes) -> GroupExtension:
    r = Reader(data)
    version = r.int16()
    if version not in EXTENSION_VERSIONS:
        raise RecordFormatError(f"unknown group extension version {version}")
    state = r.int8()
    join_deadline = r.int64()
    initial_delay_remaining = r.int64()
    new_member_added = bool(r.int8())
    pending = []
    for _ in range(r.array_length()):
        member_id = r.string() or ""
        pending.append((member_id, r.int64()))
    members = []
    for _ in range(r.array_length()):
        member_id = r.string() or ""
        joined = bool(r.int8())
        protocol_type = r.string() or ""
        protocols = []
        for _ in range(r.array_length()):
            name = r.string() or ""
            protocols.append((name, r.bytes_() or b""))
        members.append(MemberExtension(member_id=member_id, protocols=tuple(protocols),
                                       joined=joined, protocol_type=protocol_type))
    sync_deadline = -1
    pending_sync: list[str] = []
    if version >= 1:
        sync_deadline = r.int64()
        pending_sync = [r.string() or "" for _ in range(r.array_length())]
    return GroupExtension(state=state, join_deadline=join_deadline,
                          initial_delay_remaining=initial_delay_remaining,
                          new_member_added=new_member_added, pending=tuple(pending),
                          members=tuple(members), sync_deadline=sync_deadline,
                          pending_sync=tuple(pending_sync))


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataValue:
    protocol_type: str = ""
    generation: int = 0
    protocol: str | None = None
    leader: str | None = None
    current_state_timestamp: int = -1
    members: tuple[MemberMetadata, ...] = ()
    # None in records written by Kafka itself (or by versions before v4).
    extension: GroupExtension | None = None

    def encode(self) -> bytes:
        w = Writer()
        w.int16(4)
        w.string(self.protocol_type, True)
        w.int32(self.generation)
        w.string(self.protocol, True)
        w.string(self.leader, True)
        w.int64(self.current_state_timestamp)
        w.array_length(len(self.members), True)
        for m in self.members:
            w.string(m.member_id, True)
            w.string(m.group_instance_id, True)
            w.string(m.client_id, True)
            w.string(m.client_host, True)
            w.int32(m.rebalance_timeout)
            w.int32(m.session_timeout)
            w.bytes_(m.subscription, True)
            w.bytes_(m.assignment, True)
            w.tagged_fields({})
        tags = {} if self.extension is None else {EXTENSION_TAG: self.extension.encode()}
        w.tagged_fields(tags)
        return bytes(w.out)


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    r = Reader(data)
    version = r.int16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown group metadata value version {version}")
    flexible = version >= 4
    protocol_type = r.string(flexible) or ""
    generation = r.int32()
    protocol = r.string(flexible)
    leader = r.string(flexible)
    current_state_timestamp = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.array_length(flexible)):
        member_id = r.string(flexible) or ""
        group_instance_id = r.string(flexible) if version >= 3 else None
        client_id = r.string(flexible) or ""
        client_host = r.string(flexible) or ""
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        subscription = r.bytes_(flexible) or b""
        assignment = r.bytes_(flexible) or b""
        if flexible:
            r.tagged_fields()
        members.append(MemberMetadata(
            member_id=member_id, group_instance_id=group_instance_id, client_id=client_id,
            client_host=client_host, rebalance_timeout=rebalance_timeout,
            session_timeout=session_timeout, subscription=subscription, assignment=assignment))
    extension = None
    if flexible:
        raw = r.tagged_fields().get(EXTENSION_TAG)
        if raw is not None:
            extension = decode_group_extension(raw)
    return GroupMetadataValue(protocol_type=protocol_type, generation=generation,
                              protocol=protocol, leader=leader,
                              current_state_timestamp=current_state_timestamp,
                              members=tuple(members), extension=extension)
