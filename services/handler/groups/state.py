"""The state of one ``__consumer_offsets`` partition, replayed from its records: every group it
holds (classic groups, and consumer groups of the KIP-848 protocol, :mod:`.consumer_group`)
and their committed offsets (what Kafka's ``GroupMetadataManager`` loads into memory when
it becomes a partition's coordinator), and the records that write changes of it. Pure: records
in, state out; records out of groups and offsets.

Later records win per key (the log is compacted by key, as Kafka's); a tombstone (no value)
deletes the group or the offset. A group "exists" while it has a group record or any committed
or pending offset (a group that only ever committed offsets, outside group management, is
Empty, as Kafka loads it). A committed offset is its record's value (:class:`CommittedOffset`).

Transactional offset commits (TxnOffsetCommit, Kafka's ``OffsetMetadataManager`` pending
transactional offsets): offset records in a producer's transactional batch are pending for that
producer until its COMMIT marker reaches the partition, which makes them the group's committed
offsets (unless a commit written later in the log already replaced one: the newer record
wins, as compaction would have it), or its ABORT marker, which drops them. A tombstone of an
offset drops the pending ones of that partition too.
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
from . import consumer_group
from .consumer_group import CONSUMER_GROUP_KEYS, ConsumerGroup
from .group import Group

TopicPartition = tuple[str, int]
CommittedOffset = OffsetCommitValue
Record = tuple[bytes, bytes | None]


NO_PRODUCER_ID = -1


class PartitionState:
    """Groups, committed and pending transactional offsets of one offsets partition."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        # Where each committed offset's record is in the log (-1: unknown).
        self.record_offsets: dict[tuple[str, TopicPartition], int] = {}
        # Per producer with a transaction open here: group -> partition -> (record offset,
        # the offset it commits).
        self.pending: dict[int, dict[str, dict[TopicPartition, tuple[int, CommittedOffset]]]] = {}

    def group(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer_groups.get(group_id)

    def group_offsets(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        return self.offsets.get(group_id, {})

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The partitions of a group with offsets pending in an open transaction (Kafka's
        ``hasPendingTransactionalOffsets``)."""
        return {tp for groups in self.pending.values() for tp in groups.get(group_id, {})}

    def in_transaction(self, producer_id: int) -> bool:
        """Whether ``producer_id`` has a transaction open on this partition."""
        return producer_id in self.pending

    def exists(self, group_id: str) -> bool:
        return (group_id in self.groups or group_id in self.consumer_groups
                or bool(self.offsets.get(group_id))
                or any(groups.get(group_id) for groups in self.pending.values()))

    def group_ids(self) -> set[str]:
        return (set(self.groups) | set(self.consumer_groups)
                | {g for g, offsets in self.offsets.items() if offsets}
                | {g for groups in self.pending.values() for g, tps in groups.items() if tps})

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record outside transactions, its place in the log unknown."""
        self.replay_record(-1, NO_PRODUCER_ID, key, value)

    def replay_record(self, offset: int, producer_id: int, key: bytes,
                      value: bytes | None) -> None:
        """Apply the record at ``offset`` (of ``producer_id``'s transaction, -1: none); raises
        RecordFormatError for one it cannot read (records of other kinds are ignored)."""
        decoded = decode_key(OFFSETS_KEYS, key)
        if isinstance(decoded, OffsetCommitKey):
            group = decoded.group
            tp = (decoded.topic, decoded.partition)
            if value is None:
                self._drop(group, tp)
                for groups in self.pending.values():
                    groups.get(group, {}).pop(tp, None)
            elif producer_id != NO_PRODUCER_ID:
                self.pending.setdefault(producer_id, {}).setdefault(group, {})[tp] = (
                    offset, decode(OffsetCommitValue, value))
            else:
                self._commit(group, tp, offset, decode(OffsetCommitValue, value))
        elif isinstance(decoded, CONSUMER_GROUP_KEYS):
            consumer_group.replay(self.consumer_groups, decoded, value)
        elif isinstance(decoded, GroupMetadataKey):
            if value is None:
                self.groups.pop(decoded.group, None)
            else:
                self.groups[decoded.group] = Group.from_record(
                    decoded.group, decode(GroupMetadataValue, value))

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        """Kafka's ``replayEndTransactionMarker``: the producer's pending offsets become
        committed ones (each unless a newer record already committed its partition), or are
        dropped."""
        pending = self.pending.pop(producer_id, None)
        if not pending or not committed:
            return
        for group, offsets in pending.items():
            for tp, (offset, value) in offsets.items():
                current = self.record_offsets.get((group, tp))
                if current is None or tp not in self.group_offsets(group) or offset > current:
                    self._commit(group, tp, offset, value)

    def _commit(self, group: str, tp: TopicPartition, offset: int,
                value: CommittedOffset) -> None:
        self.offsets.setdefault(group, {})[tp] = value
        self.record_offsets[(group, tp)] = offset

    def _drop(self, group: str, tp: TopicPartition) -> None:
        offsets = self.offsets.get(group)
        if offsets is not None:
            offsets.pop(tp, None)
            if not offsets:
                del self.offsets[group]
        self.record_offsets.pop((group, tp), None)


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
