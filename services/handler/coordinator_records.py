"""The records coordinators keep their state in (Kafka's coordinator records), as one schema
table read and written by :mod:`.coordinator.schema`: the formats of ``__consumer_offsets``
(Kafka's group-coordinator message definitions) and ``__transaction_state`` (its
transaction-coordinator ones), field for field, in Kafka's order, with Kafka's versions.

Every record has a key and, except for tombstones (a deleted group, offset or transactional
id), a value, each starting with its int16 version. In ``__consumer_offsets`` the key's
version also says the kind of record (:data:`OFFSETS_KEYS`): 0-1 an offset commit, 2 a classic
group, 3-8 and 16 the records of a consumer group (KIP-848: its epoch, the partition counts of
its subscribed topics, each member's subscription, the target assignment's epoch and each
member's part of it, each member's current assignment, and the topics each subscribed regular
expression resolved to); other kinds (share and streams groups) are not kept here.

Written to ``__consumer_offsets``: offset commit key v1 with value v3 (v1 when the commit
carries an expiry time), group metadata key v2 with value v4, and the consumer group records
at the versions Kafka 4.0 writes (values v0; topics named by their topic ids), current
assignments with the epoch at which each partition was assigned (KIP-1251's tagged field).
Value v4 carries, in tagged field :data:`EXTENSION_TAG`, what a stateless coordinator must
also persist: the group state, rebalance deadlines, pending members and each member's
protocols (:class:`GroupExtension`, its own small versioned record). Kafka's readers skip
unknown tagged fields, so Kafka tools read these records as ordinary group metadata.

``__transaction_state`` holds a :class:`TransactionLogKey` v0 (the transactional id) per
transaction with a :class:`TransactionLogValue` (v0, or v1 with tagged fields). Written: v1,
with the producer ids of Kafka's tagged fields and, in tagged field :data:`EXTENSION_TAG`, the
producer's previous epoch (:class:`TransactionExtension`), which Kafka keeps in memory only and
a stateless coordinator must persist to recognise a retried InitProducerId.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .coordinator.schema import kafka

# The tagged field of GroupMetadataValue v4 holding a GroupExtension: "kb".
EXTENSION_TAG = 0x6B62


# --- __consumer_offsets ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitKey:
    __versions__: ClassVar[str] = "0-1"
    group: str = kafka("string")
    topic: str = kafka("string")
    partition: int = kafka("int32")


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataKey:
    __versions__: ClassVar[str] = "2"
    group: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMetadataKey:
    __versions__: ClassVar[str] = "3"
    group: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupPartitionMetadataKey:
    __versions__: ClassVar[str] = "4"
    group: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMemberMetadataKey:
    __versions__: ClassVar[str] = "5"
    group: str = kafka("string")
    member_id: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMetadataKey:
    __versions__: ClassVar[str] = "6"
    group: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMemberKey:
    __versions__: ClassVar[str] = "7"
    group: str = kafka("string")
    member_id: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupCurrentMemberAssignmentKey:
    __versions__: ClassVar[str] = "8"
    group: str = kafka("string")
    member_id: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupRegularExpressionKey:
    __versions__: ClassVar[str] = "16"
    group: str = kafka("string")
    regular_expression: str = kafka("string")


OFFSETS_KEYS: dict[int, type] = {
    0: OffsetCommitKey, 1: OffsetCommitKey, 2: GroupMetadataKey,
    3: ConsumerGroupMetadataKey, 4: ConsumerGroupPartitionMetadataKey,
    5: ConsumerGroupMemberMetadataKey, 6: ConsumerGroupTargetAssignmentMetadataKey,
    7: ConsumerGroupTargetAssignmentMemberKey, 8: ConsumerGroupCurrentMemberAssignmentKey,
    16: ConsumerGroupRegularExpressionKey,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitValue:
    __versions__: ClassVar[str] = "0-4"
    __flexible__: ClassVar[str] = "4+"
    offset: int = kafka("int64")
    leader_epoch: int = kafka("int32", "3+", default=-1)
    metadata: str = kafka("string", default="")
    commit_timestamp: int = kafka("int64", default=-1)
    # Only in v1 (commits that asked for a retention time); -1: none.
    expire_timestamp: int = kafka("int64", "1", default=-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberMetadata:
    member_id: str = kafka("string")
    group_instance_id: str | None = kafka("string", "3+", nullable="3+", default=None)
    client_id: str = kafka("string", default="")
    client_host: str = kafka("string", default="")
    rebalance_timeout: int = kafka("int32", "1+", default=-1)
    session_timeout: int = kafka("int32", default=0)
    subscription: bytes = kafka("bytes", default=b"")
    assignment: bytes = kafka("bytes", default=b"")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolMetadata:
    name: str = kafka("string")
    metadata: bytes = kafka("bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberExtension:
    """What a member has beyond Kafka's record: whether it has joined the rebalance in
    progress, its protocol type, and its protocols in preference order."""

    member_id: str = kafka("string")
    joined: bool = kafka("bool", default=False)
    protocol_type: str = kafka("string", default="")
    protocols: tuple[ProtocolMetadata, ...] = kafka([ProtocolMetadata], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingMember:
    """A member id handed out with MEMBER_ID_REQUIRED, and when it lapses (ms)."""

    member_id: str = kafka("string")
    expires: int = kafka("int64")


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupExtension:
    """The coordinator state Kafka keeps in memory and a stateless coordinator persists.

    ``state`` is a :class:`~.groups.group.GroupState` value; times are wall-clock
    milliseconds, -1 for none: ``join_deadline`` ends the join phase in progress,
    ``initial_delay_remaining`` is what is left of the rebalance timeout while that phase is an
    initial delay (-1 when it is not), ``sync_deadline`` is when members of the new generation
    that have not sent SyncGroup (``pending_sync``) are removed (Kafka's DelayedSync). v1 adds
    the pending SyncGroups and is written only when there are some (the lowest version that
    holds a value is written), so records of groups without any stay readable by readers that
    know v0 alone."""

    __versions__: ClassVar[str] = "0-1"
    state: int = kafka("int8", default=0)
    join_deadline: int = kafka("int64", default=-1)
    initial_delay_remaining: int = kafka("int64", default=-1)
    new_member_added: bool = kafka("bool", default=False)
    pending: tuple[PendingMember, ...] = kafka([PendingMember], default=())
    members: tuple[MemberExtension, ...] = kafka([MemberExtension], default=())
    sync_deadline: int = kafka("int64", "1+", default=-1)
    pending_sync: tuple[str, ...] = kafka(["string"], "1+", default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataValue:
    __versions__: ClassVar[str] = "0-4"
    __flexible__: ClassVar[str] = "4+"
    protocol_type: str = kafka("string", default="")
    generation: int = kafka("int32", default=0)
    protocol: str | None = kafka("string", nullable="0+", default=None)
    leader: str | None = kafka("string", nullable="0+", default=None)
    current_state_timestamp: int = kafka("int64", "2+", default=-1)
    members: tuple[MemberMetadata, ...] = kafka([MemberMetadata], default=())
    # None in records written by Kafka itself (or before v4).
    extension: GroupExtension | None = kafka(GroupExtension, "4+", tag=EXTENSION_TAG,
                                              default=None)


# --- consumer groups (KIP-848) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMetadataValue:
    """The group epoch."""

    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    epoch: int = kafka("int32")


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRacks:
    partition: int = kafka("int32")
    racks: tuple[str, ...] = kafka(["string"], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicMetadata:
    topic_id: str = kafka("uuid")
    topic_name: str = kafka("string")
    num_partitions: int = kafka("int32")
    partition_metadata: tuple[PartitionRacks, ...] = kafka([PartitionRacks], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupPartitionMetadataValue:
    """The subscribed topics as the group's last assignment saw them."""

    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    topics: tuple[TopicMetadata, ...] = kafka([TopicMetadata], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicProtocol:
    name: str = kafka("string")
    metadata: bytes = kafka("bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicMemberMetadata:
    """What a member of a consumer group that speaks the classic protocol joined with."""

    session_timeout_ms: int = kafka("int32")
    supported_protocols: tuple[ClassicProtocol, ...] = kafka([ClassicProtocol], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMemberMetadataValue:
    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    instance_id: str | None = kafka("string", nullable="0+", default=None)
    rack_id: str | None = kafka("string", nullable="0+", default=None)
    client_id: str = kafka("string", default="")
    client_host: str = kafka("string", default="")
    subscribed_topic_names: tuple[str, ...] = kafka(["string"], default=())
    subscribed_topic_regex: str | None = kafka("string", nullable="0+", default=None)
    rebalance_timeout_ms: int = kafka("int32", default=-1)
    server_assignor: str | None = kafka("string", nullable="0+", default=None)
    classic_member_metadata: ClassicMemberMetadata | None = kafka(
        ClassicMemberMetadata, nullable="0+", tag=0, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMetadataValue:
    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    assignment_epoch: int = kafka("int32")


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicPartitions:
    """A topic's partitions; in a current assignment also the member epoch at which each was
    assigned to the member (KIP-1251, aligned with ``partitions``; None in other records)."""

    topic_id: str = kafka("uuid")
    partitions: tuple[int, ...] = kafka(["int32"], default=())
    assignment_epochs: tuple[int, ...] | None = kafka(["int32"], nullable="0+", tag=0,
                                                      default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMemberValue:
    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    topic_partitions: tuple[TopicPartitions, ...] = kafka([TopicPartitions], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupCurrentMemberAssignmentValue:
    """``state`` is Kafka's ``MemberState`` value (0 unrevoked partitions, 1 unreleased
    partitions, 2 stable)."""

    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    member_epoch: int = kafka("int32")
    previous_member_epoch: int = kafka("int32")
    state: int = kafka("int8", default=0)
    assigned_partitions: tuple[TopicPartitions, ...] = kafka([TopicPartitions], default=())
    partitions_pending_revocation: tuple[TopicPartitions, ...] = kafka(
        [TopicPartitions], default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupRegularExpressionValue:
    """The topics a subscribed regular expression matched, as of the metadata ``version``
    (here: the handler's metadata epoch), resolved at ``timestamp``."""

    __versions__: ClassVar[str] = "0"
    __flexible__: ClassVar[str] = "0+"
    topics: tuple[str, ...] = kafka(["string"], default=())
    version: int = kafka("int64", default=0)
    timestamp: int = kafka("int64", default=0)


# --- __transaction_state ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionLogKey:
    __versions__: ClassVar[str] = "0"
    transactional_id: str = kafka("string")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionPartitions:
    """The partitions of one topic in a transaction (Kafka's ``PartitionsSchema``)."""

    topic: str = kafka("string")
    partition_ids: tuple[int, ...] = kafka(["int32"])


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionExtension:
    """What a transaction has beyond Kafka's record: the producer's epoch before the last bump
    (Kafka's ``lastProducerEpoch``; -1: none)."""

    __versions__: ClassVar[str] = "0"
    last_producer_epoch: int = kafka("int16", default=-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionLogValue:
    """A transactional id's producer, epoch, state (Kafka's ``TransactionState`` id), timeout
    and partitions. The producer ids of the last committed transaction and of the next one,
    and the client's transaction version, are tagged fields of v1."""

    __versions__: ClassVar[str] = "0-1"
    __flexible__: ClassVar[str] = "1+"
    producer_id: int = kafka("int64")
    previous_producer_id: int = kafka("int64", "1+", tag=0, default=-1)
    next_producer_id: int = kafka("int64", "1+", tag=1, default=-1)
    producer_epoch: int = kafka("int16")
    transaction_timeout_ms: int = kafka("int32")
    transaction_status: int = kafka("int8")
    transaction_partitions: tuple[TransactionPartitions, ...] | None = kafka(
        [TransactionPartitions], nullable="0+")
    transaction_last_update_timestamp_ms: int = kafka("int64")
    transaction_start_timestamp_ms: int = kafka("int64")
    client_transaction_version: int = kafka("int16", "1+", tag=2, default=0)
    # None in records written by Kafka itself (or in v0).
    extension: TransactionExtension | None = kafka(TransactionExtension, "1+",
                                                   tag=EXTENSION_TAG, default=None)


TRANSACTION_KEYS: dict[int, type] = {0: TransactionLogKey}
