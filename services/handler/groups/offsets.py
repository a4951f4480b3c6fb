"""Committed offsets of groups (Kafka's offset commit, fetch and delete of the group
coordinator, and its transactional offset commit), over the coordinator runtime. A commit takes
the same conditional path as a group change: the group's checks (generation, member) are made
on fresh state and the offsets are appended only if nothing was appended since, so a commit of
a stale generation is refused and two racing handlers never interleave.

A transactional commit is appended as a transactional batch of the producer (see
:mod:`.state`: pending until the producer's COMMIT marker). As Kafka's coordinator does, it
first checks with the transaction coordinator that the offsets partition is part of the
producer's transaction when the producer has none open here yet (KIP-890 verification, which
the log node does not do for coordinator writes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from services.common.errors import ErrorCode

from ..coordinator.partition import TransactionalRecords
from ..coordinator.runtime import CoordinatorRuntime
from .consumer_config import GroupError
from .consumer_group import ConsumerGroup
from .group import (
    GROUP_ID_NOT_FOUND,
    ILLEGAL_GENERATION,
    INVALID_GROUP_ID,
    NON_EMPTY_GROUP,
    NONE,
    REBALANCE_IN_PROGRESS,
    Group,
    GroupState,
)
from .sessions import GroupTimers
from .state import CommittedOffset, PartitionState, Record, TopicPartition, offset_record

GROUP_SUBSCRIBED_TO_TOPIC = ErrorCode.group_subscribed_to_topic.value
UNKNOWN_MEMBER_ID = ErrorCode.unknown_member_id.value
STALE_MEMBER_EPOCH = ErrorCode.stale_member_epoch.value
UNSUPPORTED_VERSION = ErrorCode.unsupported_version.value
# The first OffsetCommit version that members of the consumer protocol may use.
CONSUMER_PROTOCOL_OFFSET_COMMIT = 9


def _member_epoch_error(received: int, expected: int, classic: bool) -> int:
    if received != expected:
        return ILLEGAL_GENERATION if classic else STALE_MEMBER_EPOCH
    return NONE


def validate_consumer_commit(group: ConsumerGroup, member_id: str, instance_id: str | None,
                             member_epoch: int, transactional: bool, api_version: int | None,
                             partitions: Iterable[TopicPartition]) -> int:
    """Kafka's ``ConsumerGroup.validateOffsetCommit`` (with KIP-1251's assignment epochs):
    a negative epoch commits to a group without members (admin clients, consumers outside
    group management), as does a TxnOffsetCommit naming no member; a classic member must send
    its member epoch as the generation (ILLEGAL_GENERATION); a consumer protocol member its
    epoch, or an older one not older than the epoch at which it got each partition it commits
    and still holds (assigned or pending revocation): its heartbeat may have moved it on while
    the commit was under way. Anything else is STALE_MEMBER_EPOCH, for the whole commit."""
    if member_epoch < 0 and not group.members:
        return NONE
    if transactional and member_epoch == -1 and not member_id and instance_id is None:
        return NONE
    member = group.members.get(member_id)
    if member is None:
        return UNKNOWN_MEMBER_ID
    if not transactional and not member.uses_classic_protocol and api_version is not None \
            and api_version < CONSUMER_PROTOCOL_OFFSET_COMMIT:
        return UNSUPPORTED_VERSION
    if member.uses_classic_protocol or member_epoch >= member.member_epoch:
        return _member_epoch_error(member_epoch, member.member_epoch,
                                   member.uses_classic_protocol)
    ids = {name: t.topic_id for name, t in group.subscription_metadata.items()}
    for topic, partition in partitions:
        topic_id = ids.get(topic)
        assigned_at = None if topic_id is None else member.assignment_epoch(topic_id, partition)
        if assigned_at is None or member_epoch < assigned_at:
            return STALE_MEMBER_EPOCH
    return NONE


def validate_consumer_fetch(group: ConsumerGroup, member_id: str | None,
                            member_epoch: int) -> int:
    """Kafka's ``ConsumerGroup.validateOffsetFetch``."""
    if not member_id and member_epoch < 0:
        return NONE
    member = group.members.get(member_id or "")
    if member is None:
        return UNKNOWN_MEMBER_ID
    return _member_epoch_error(member_epoch, member.member_epoch, member.uses_classic_protocol)


class Offsets:
    """OffsetCommit, OffsetFetch and OffsetDelete of one coordinator."""

    def __init__(self, runtime: CoordinatorRuntime[PartitionState], timers: GroupTimers) -> None:
        self._runtime = runtime
        self._timers = timers

    async def commit(self, group_id: str, member_id: str, group_instance_id: str | None,
                     generation: int, offsets: Mapping[TopicPartition, CommittedOffset],
                     api_version: int | None = None) -> int:
        """Store offsets for a group's member (or, with no generation, for a group outside
        group management); returns the error for every partition of the commit."""
        if not group_id:
            return INVALID_GROUP_ID

        def change(state: PartitionState,
                   now: int) -> tuple[list[Record], tuple[int, Group | None]]:
            consumer_group = state.consumer_group(group_id)
            if consumer_group is not None:
                error = validate_consumer_commit(consumer_group, member_id, group_instance_id,
                                                 generation, False, api_version, offsets)
                if error or not offsets:
                    return [], (error, None)
                return [offset_record(group_id, tp, o) for tp, o in offsets.items()], (
                    NONE, None)
            group = state.group(group_id)
            if group is None:
                if generation >= 0 and not state.exists(group_id):
                    return [], (ILLEGAL_GENERATION, None)
                group = Group(group_id=group_id)
            error = group.validate_offset_commit(member_id, group_instance_id, generation)
            if error or not offsets:
                return [], (error, group)
            return [offset_record(group_id, tp, o) for tp, o in offsets.items()], (NONE, group)

        (error, group), _ = await self._runtime.update(group_id, change)
        if group is not None and member_id and error in (NONE, REBALANCE_IN_PROGRESS):
            await self._timers.arm_member(group, member_id)
        return error

    async def commit_transactional(self, group_id: str, producer_id: int, producer_epoch: int,
                                   member_id: str, group_instance_id: str | None,
                                   generation: int,
                                   offsets: Mapping[TopicPartition, CommittedOffset],
                                   verify: Callable[[], Awaitable[int]]) -> int:
        """Kafka's TxnOffsetCommit (``commitTransactionalOffset``): store offsets in the
        producer's transaction; returns the error for every partition of the commit.
        ``verify()`` asks the transaction coordinator whether this partition is in the
        transaction (0, or the error to answer)."""
        if not group_id:
            return INVALID_GROUP_ID
        if not (await self._runtime.read(group_id)).in_transaction(producer_id):
            error = await verify()
            if error:
                return error

        def change(state: PartitionState,
                   now: int) -> tuple[TransactionalRecords | list[Record], int]:
            consumer_group = state.consumer_group(group_id)
            if consumer_group is not None:
                error = validate_consumer_commit(consumer_group, member_id, group_instance_id,
                                                 generation, True, None, offsets)
                if error or not offsets:
                    return [], error
                return TransactionalRecords(
                    producer_id=producer_id, producer_epoch=producer_epoch,
                    records=[offset_record(group_id, tp, o) for tp, o in offsets.items()]), NONE
            group = state.group(group_id)
            if group is None:
                if generation >= 0:
                    return [], ILLEGAL_GENERATION
                group = Group(group_id=group_id)
            error = group.validate_offset_commit(member_id, group_instance_id, generation,
                                                 transactional=True)
            if error or not offsets:
                return [], error
            return TransactionalRecords(
                producer_id=producer_id, producer_epoch=producer_epoch,
                records=[offset_record(group_id, tp, o) for tp, o in offsets.items()]), NONE

        return (await self._runtime.update(group_id, change))[0]

    async def fetch(self, group_id: str, partitions: Sequence[TopicPartition] | None,
                    member_id: str | None = None, member_epoch: int = -1,
                    ) -> tuple[dict[TopicPartition, CommittedOffset | None], set[TopicPartition]]:
        """Committed offsets of the named partitions (None: not committed), or of all; and
        the partitions with offsets pending in an open transaction. Raises GroupError when
        the member of a consumer group may not fetch."""
        state = await self._runtime.read(group_id)
        consumer_group = state.consumer_group(group_id)
        if consumer_group is not None:
            error = validate_consumer_fetch(consumer_group, member_id, member_epoch)
            if error:
                raise GroupError(error, f"member {member_id} of group {group_id}")
        committed = state.group_offsets(group_id)
        pending = state.pending_partitions(group_id)
        if partitions is None:
            return dict(committed), pending
        return {tp: committed.get(tp) for tp in partitions}, pending

    async def delete(self, group_id: str, partitions: Sequence[TopicPartition],
                     ) -> tuple[int, dict[TopicPartition, int]]:
        """Kafka's OffsetDelete: (group error, error per partition)."""

        def change(state: PartitionState,
                   now: int) -> tuple[list[Record], tuple[int, dict[TopicPartition, int]]]:
            group = state.group(group_id)
            if group is None and not state.exists(group_id):
                return [], (GROUP_ID_NOT_FOUND, {})
            group = group or Group(group_id=group_id)
            errors: dict[TopicPartition, int] = {}
            consumer_group = state.consumer_group(group_id)
            if consumer_group is not None and consumer_group.members:
                subscribed = consumer_group.subscribed_topic_names()
                errors = {tp: GROUP_SUBSCRIBED_TO_TOPIC for tp in partitions
                          if tp[0] in subscribed}
            elif group.state is not GroupState.EMPTY:
                if group.protocol_type != "consumer":
                    return [], (NON_EMPTY_GROUP, {})
                subscribed = group.subscribed_topics() or set()
                errors = {tp: GROUP_SUBSCRIBED_TO_TOPIC for tp in partitions
                          if tp[0] in subscribed}
            committed = state.group_offsets(group_id)
            pending = state.pending_partitions(group_id)
            records = []
            for tp in partitions:
                if tp not in errors:
                    errors[tp] = NONE
                    if tp in committed or tp in pending:
                        records.append(offset_record(group_id, tp, None))
            return records, (NONE, errors)

        return (await self._runtime.update(group_id, change))[0]
