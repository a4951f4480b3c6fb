"""The state of one ``__consumer_offsets`` partition, replayed from its records: every group it
holds and their committed offsets (what Kafka's ``GroupMetadataManager`` loads into memory when
it becomes a partition's coordinator), and the records that write changes of it. Pure: records
in, state out; records out of groups and offsets.

Later records win per key (the log is compacted by key, as Kafka's); a tombstone (no value)
deletes the group or the offset. A group "exists" while it has a group record or any committed
offset (a group that only ever committed offsets, outside group management, is Empty, as Kafka
loads it). A committed offset is its record's value (:class:`CommittedOffset`).
"""

from __future__ import annotations

from ..coordinator.schema import decode, decode_key, encode
from ..coordinator_records import (
    OFFSETS_KEYS,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
)
from .group import Group

TopicPartition = tuple[str, int]
CommittedOffset = OffsetCommitValue
Record = tuple[bytes, bytes | None]


class PartitionState:
    """Groups and committed offsets of one offsets partition."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}

    def group(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def group_offsets(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        return self.offsets.get(group_id, {})

    def exists(self, group_id: str) -> bool:
        return group_id in self.groups or bool(self.offsets.get(group_id))

    def group_ids(self) -> set[str]:
        return set(self.groups) | {g for g, offsets in self.offsets.items() if offsets}

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record; raises RecordFormatError for one it cannot read (records of
        other kinds are ignored)."""
        decoded = decode_key(OFFSETS_KEYS, key)
        if isinstance(decoded, OffsetCommitKey):
            offsets = self.offsets.setdefault(decoded.group, {})
            tp = (decoded.topic, decoded.partition)
            if value is None:
                offsets.pop(tp, None)
                if not offsets:
                    del self.offsets[decoded.group]
            else:
                offsets[tp] = decode(OffsetCommitValue, value)
        elif isinstance(decoded, GroupMetadataKey):
            if value is None:
                self.groups.pop(decoded.group, None)
            else:
                self.groups[decoded.group] = Group.from_record(
                    decoded.group, decode(GroupMetadataValue, value))


def group_record(group_id: str, group: Group | None) -> Record:
    """The record of a group (value v4 with its extension), or its tombstone."""
    key = encode(GroupMetadataKey(group=group_id))
    return key, None if group is None else encode(group.to_record(), 4)


def offset_record(group_id: str, tp: TopicPartition, offset: CommittedOffset | None) -> Record:
    """The record of a committed offset (value v3, or v1 to keep an expiry time), or its
    tombstone."""
    key = encode(OffsetCommitKey(group=group_id, topic=tp[0], partition=tp[1]), 1)
    if offset is None:
        return key, None
    return key, encode(offset, 1 if offset.expire_timestamp >= 0 else 3)
