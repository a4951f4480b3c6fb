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

from collections.abc import Awaitable, Callable, Mapping, Sequence

from services.common.errors import ErrorCode

from ..coordinator.partition import TransactionalRecords
from ..coordinator.runtime import CoordinatorRuntime
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


class Offsets:
    """OffsetCommit, OffsetFetch and OffsetDelete of one coordinator."""

    def __init__(self, runtime: CoordinatorRuntime[PartitionState], timers: GroupTimers) -> None:
        self._runtime = runtime
        self._timers = timers

    async def commit(self, group_id: str, member_id: str, group_instance_id: str | None,
                     generation: int, offsets: Mapping[TopicPartition, CommittedOffset]) -> int:
        """Store offsets for a group's member (or, with no generation, for a group outside
        group management); returns the error for every partition of the commit."""
        if not group_id:
            return INVALID_GROUP_ID

        def change(state: PartitionState,
                   now: int) -> tuple[list[Record], tuple[int, Group | None]]:
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
                    ) -> tuple[dict[TopicPartition, CommittedOffset | None], set[TopicPartition]]:
        """Committed offsets of the named partitions (None: not committed), or of all; and
        the partitions with offsets pending in an open transaction."""
        state = await self._runtime.read(group_id)
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
            if group.state is not GroupState.EMPTY:
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
