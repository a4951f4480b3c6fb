"""The group coordinator (Kafka's ``GroupCoordinator`` with its ``GroupMetadataManager``) run by
stateless handlers: the first user of the coordinator runtime (:mod:`..coordinator`), whose
internal topic is ``__consumer_offsets`` (created as Kafka creates it, from the offsets.topic.*
settings) and whose state per partition is its groups and committed offsets (:mod:`.state`).
Every handler can serve every group, because everything a group is, including a rebalance in
progress, lives in that topic. Here: the groups as a whole (DescribeGroups, ListGroups,
DeleteGroups, ConsumerGroupDescribe, for classic and consumer groups alike), the
``group.consumer.*`` settings (checked as Kafka checks them at start-up) and the wiring of the
package's other parts.
"""

from __future__ import annotations

import functools

from kbroker.replicator.v1 import replicator_pb2
from services.common.coordinator_keys import OFFSETS_TOPIC, partition_for

from ..collaborators import Controller, LogNodes, Purgatory
from ..config import HandlerConfig
from ..coordinator.placement import Placement
from ..coordinator.runtime import CoordinatorRuntime
from ..metadata_cache import MetadataCache
from ..metrics import GROUP_WRITES
from .assignors import ASSIGNORS
from .consumer_config import MIGRATION_POLICIES, ConsumerGroupConfig
from .consumer_group import ConsumerGroup, records_between
from .consumer_groups import ConsumerGroups
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


def consumer_group_config(config: HandlerConfig) -> ConsumerGroupConfig:
    """The group.consumer.* settings, checked as Kafka's ``GroupCoordinatorConfig`` does.
    Raises ValueError."""
    if not config.group_consumer_min_session_timeout_ms <= \
            config.group_consumer_session_timeout_ms <= \
            config.group_consumer_max_session_timeout_ms:
        raise ValueError("group.consumer.session.timeout.ms must be between "
                         "group.consumer.min.session.timeout.ms and "
                         "group.consumer.max.session.timeout.ms")
    if not config.group_consumer_min_heartbeat_interval_ms <= \
            config.group_consumer_heartbeat_interval_ms <= \
            config.group_consumer_max_heartbeat_interval_ms:
        raise ValueError("group.consumer.heartbeat.interval.ms must be between "
                         "group.consumer.min.heartbeat.interval.ms and "
                         "group.consumer.max.heartbeat.interval.ms")
    if config.group_consumer_heartbeat_interval_ms >= config.group_consumer_session_timeout_ms:
        raise ValueError("group.consumer.heartbeat.interval.ms must be less than "
                         "group.consumer.session.timeout.ms")
    unknown = [a for a in config.group_consumer_assignors if a not in ASSIGNORS]
    if unknown or not config.group_consumer_assignors:
        raise ValueError(f"group.consumer.assignors: unknown assignors {unknown} "
                         f"(known: {', '.join(ASSIGNORS)})")
    if config.group_consumer_migration_policy.lower() not in MIGRATION_POLICIES:
        raise ValueError("group.consumer.migration.policy must be one of "
                         f"{', '.join(MIGRATION_POLICIES)}")
    return ConsumerGroupConfig(
        session_timeout_ms=config.group_consumer_session_timeout_ms,
        heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
        max_size=config.group_consumer_max_size,
        assignors=tuple(config.group_consumer_assignors),
        migration_policy=config.group_consumer_migration_policy.lower(),
        classic_max_size=config.group_max_size)



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
        self.consumer_config = consumer_group_config(config)
        self.runtime = CoordinatorRuntime(
            self.placement, log_nodes, purgatory, PartitionState, kind="group",
            timers_of=functools.partial(
                timers_of,
                consumer_session_timeout_ms=self.consumer_config.session_timeout_ms),
            writes=GROUP_WRITES, leader_wait_ms=config.acks_all_leader_wait_ms)
        group_timers = GroupTimers(self.runtime)
        classic_config = GroupConfig(
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            max_size=config.group_max_size)
        self.membership = Membership(self.runtime, group_timers, classic_config)
        self.consumer = ConsumerGroups(self.runtime, group_timers, cache, self.consumer_config,
                                       classic_config)
        self.membership.consumer = self.consumer
        self.offsets = Offsets(self.runtime, group_timers)

    def now(self) -> int:
        """The coordinator's clock (wall-clock milliseconds)."""
        return self.runtime.now()

    async def describe(self, group_id: str) -> Group | ConsumerGroup | None:
        """The group (an Empty classic one if it only has offsets; a consumer group as
        such), or None if it does not exist."""
        state = await self.runtime.read(group_id)
        consumer_group = state.consumer_group(group_id)
        if consumer_group is not None:
            return consumer_group
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
            consumer_group = state.consumer_group(group_id)
            if group is None and not state.exists(group_id):
                return [], GROUP_ID_NOT_FOUND
            if group is not None and group.state is not GroupState.EMPTY or (
                    consumer_group is not None and consumer_group.members):
                return [], NON_EMPTY_GROUP
            records = [offset_record(group_id, tp, None) for tp in sorted(
                set(state.group_offsets(group_id)) | state.pending_partitions(group_id))]
            if group is not None:
                records.append(group_record(group_id, None))
            if consumer_group is not None:
                records += records_between(consumer_group, None)
            return records, NONE

        return (await self.runtime.update(group_id, change))[0]

    async def offsets_partition(self, group_id: str) -> tuple[str, int]:
        """The ``__consumer_offsets`` partition of a group: by the partitions the topic has,
        or will be created with (Kafka's ``partitionFor``)."""
        _, topic = await self.placement.topic(create=False)
        count = len(topic.partitions) if topic is not None and topic.partitions else (
            self.placement.spec.num_partitions)
        return OFFSETS_TOPIC, partition_for(group_id, count)

    async def list_groups(self, broker_id: int | None = None) -> list[Group | ConsumerGroup]:
        """Every group of the offsets partitions ``broker_id`` leads (all when None); a group
        that only has offsets is an Empty classic one."""
        return [state.consumer_group(group_id) or state.group(group_id)
                or Group(group_id=group_id)
                for state in await self.runtime.states_led_by(broker_id)
                for group_id in sorted(state.group_ids())]

    async def follow_expirations(self) -> None:
        """Act on the group timers that run out, for the handler's whole life."""
        await self.runtime.follow_expirations(self.membership.expire)

    async def close(self) -> None:
        await self.runtime.close()
