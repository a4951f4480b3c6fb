"""The state of one ``__consumer_offsets`` partition, materialised from its records: every group
it holds and their committed offsets (what Kafka's ``GroupMetadataManager`` loads into memory
when it becomes a partition's coordinator). Pure: records in, state out.

Later records win per key (the log is compacted by key, as Kafka's); a tombstone (no value)
deletes the group or the offset. ``end`` is the offset after the last record applied, the
log end offset the state corresponds to, which is what a conditional append expects.

A group "exists" while it has a group record or any committed offset (a group that only ever
committed offsets, outside group management, is Empty, as Kafka loads it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .group import Group
from .records import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class LoggedRecord(NamedTuple):
    """A record read back from the partition: its offset, key and value (None: a tombstone)."""

    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1

    @classmethod
    def from_value(cls, value: OffsetCommitValue) -> CommittedOffset:
        return cls(offset=value.offset, leader_epoch=value.leader_epoch,
                   metadata=value.metadata, commit_timestamp=value.commit_timestamp,
                   expire_timestamp=value.expire_timestamp)

    def to_value(self) -> OffsetCommitValue:
        return OffsetCommitValue(offset=self.offset, leader_epoch=self.leader_epoch,
                                 metadata=self.metadata, commit_timestamp=self.commit_timestamp,
                                 expire_timestamp=self.expire_timestamp)


class PartitionState:
    """Groups and committed offsets of one offsets partition, up to ``end``."""

    def __init__(self, start: int = 0) -> None:
        self.end = start
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

    def apply(self, records: Iterable[LoggedRecord], end: int) -> None:
        """Apply records read from the log (in offset order), then stand at ``end``."""
        for record in records:
            if record.offset < self.end:
                continue  # already applied (a read may start inside a batch)
            self.apply_record(record.key, record.value)
        self.end = max(self.end, end)

    def apply_record(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetCommitKey):
                offsets = self.offsets.setdefault(decoded.group, {})
                tp = (decoded.topic, decoded.partition)
                if value is None:
                    offsets.pop(tp, None)
                    if not offsets:
                        del self.offsets[decoded.group]
                else:
                    offsets[tp] = CommittedOffset.from_value(decode_offset_commit_value(value))
            elif isinstance(decoded, GroupMetadataKey):
                if value is None:
                    self.groups.pop(decoded.group, None)
                else:
                    self.groups[decoded.group] = Group.from_record(
                        decoded.group, decode_group_metadata_value(value))
        except (RecordFormatError, ValueError) as exc:
            # One unreadable record must not make a whole partition's groups unavailable.
            log.warning("skipping an unreadable record of the offsets topic: %s", exc)
