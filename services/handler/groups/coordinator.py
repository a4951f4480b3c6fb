"""The group coordinator (Kafka's ``GroupCoordinator`` with its ``GroupMetadataManager``) run by
stateless handlers: the first user of the coordinator runtime (:mod:`..coordinator`), whose
internal topic is ``__consumer_offsets`` (created as Kafka creates it, from the offsets.topic.*
settings) and whose state per partition is its groups and committed offsets (:mod:`.state`).
Every handler can serve every group, because everything a group is, including a rebalance in
progress, lives in that topic. Here: the groups as a whole (DescribeGroups, ListGroups,
DeleteGroups) and the wiring of the package's other parts.
"""

from __future__ import annotations

from kbroker.replicator.v1 import replicator_pb2

from ..collaborators import Controller, LogNodes, Purgatory
from ..config import HandlerConfig
from ..coordinator.placement import Placement, partition_for
from ..coordinator.runtime import CoordinatorRuntime
from ..metadata_cache import MetadataCache
from ..metrics import GROUP_WRITES
from .group import (
    GROUP_ID_NOT_FOUND,
    INVALID_GROUP_ID,
    NON_EMPTY_GROUP,
    NONE,
    Group,
    GroupConfig,
    GroupState,
)
from .membership import Membership
from .offsets import Offsets
from .sessions import GroupTimers, timers_of
from .state import PartitionState, Record, group_record, offset_record

OFFSETS_TOPIC = "__consumer_offsets"


class GroupCoordinator:
    """Groups and committed offsets over ``__consumer_offsets``, the purgatory and metadata."""

    def __init__(self, cache: MetadataCache, log_nodes: LogNodes, controller: Controller,
                 purgatory: Purgatory, config: HandlerConfig) -> None:
        self.offset_metadata_max_bytes = config.offset_metadata_max_bytes
        self.placement = Placement(replicator_pb2.NewTopic(
            name=OFFSETS_TOPIC, num_partitions=config.offsets_topic_num_partitions,
            replication_factor=config.offsets_topic_replication_factor,
            configs={"segment.bytes": str(config.offsets_topic_segment_bytes),
                     "compression.type": "producer"}), cache, controller)
        self.runtime = CoordinatorRuntime(
            self.placement, log_nodes, purgatory, PartitionState, kind="group",
            timers_of=timers_of, writes=GROUP_WRITES)
        group_timers = GroupTimers(self.runtime)
        self.membership = Membership(self.runtime, group_timers, GroupConfig(
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            max_size=config.group_max_size))
        self.offsets = Offsets(self.runtime, group_timers)

    def now(self) -> int:
        """The coordinator's clock (wall-clock milliseconds)."""
        return self.runtime.now()

    async def describe(self, group_id: str) -> Group | None:
        """The group (an Empty one if it only has offsets), or None if it does not exist."""
        state = await self.runtime.read(group_id)
        group = state.group(group_id)
        if group is None and state.exists(group_id):
            group = Group(group_id=group_id)
        return group

    async def delete_group(self, group_id: str) -> int:
        """Kafka's DeleteGroups for one group: its record and offsets go (tombstones)."""
        if not group_id:
            return INVALID_GROUP_ID

        def change(state: PartitionState, now: int) -> tuple[list[Record], int]:
            group = state.group(group_id)
            if group is None and not state.exists(group_id):
                return [], GROUP_ID_NOT_FOUND
            if group is not None and group.state is not GroupState.EMPTY:
                return [], NON_EMPTY_GROUP
            records = [offset_record(group_id, tp, None) for tp in sorted(
                set(state.group_offsets(group_id)) | state.pending_partitions(group_id))]
            if group is not None:
                records.append(group_record(group_id, None))
            return records, NONE

        return (await self.runtime.update(group_id, change))[0]

    async def offsets_partition(self, group_id: str) -> tuple[str, int]:
        """The ``__consumer_offsets`` partition of a group: by the partitions the topic has,
        or will be created with (Kafka's ``partitionFor``)."""
        _, topic = await self.placement.topic(create=False)
        count = len(topic.partitions) if topic is not None and topic.partitions else (
            self.placement.spec.num_partitions)
        return OFFSETS_TOPIC, partition_for(group_id, count)

    async def list_groups(self, broker_id: int | None = None) -> list[Group]:
        """Every group of the offsets partitions ``broker_id`` leads (all when None); a group
        that only has offsets is an Empty one."""
        return [state.group(group_id) or Group(group_id=group_id)
                for state in await self.runtime.states_led_by(broker_id)
                for group_id in sorted(state.group_ids())]

    async def follow_expirations(self) -> None:
        """Act on the group timers that run out, for the handler's whole life."""
        await self.runtime.follow_expirations(self.membership.expire)

    async def close(self) -> None:
        await self.runtime.close()
