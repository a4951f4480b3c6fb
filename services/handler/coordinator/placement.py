"""Where a coordinator's keys live and who coordinates them (Kafka's ``partitionFor`` and
FindCoordinator): key ``k`` (a group id, a transactional id) lives in partition
``abs(java_string_hash(k)) % partitions`` of the coordinator's internal compacted topic, and
its coordinator, as clients see it, is that partition's leader.

The topic is created on first need (a FindCoordinator) with its configured partition count,
replication factor min(configured, live log nodes) and ``cleanup.policy=compact``; concurrent
requests share one creation. Requests that reach a live broker that does not lead the key's
partition are NOT_COORDINATOR, as Kafka's; a request that reached the port of a broker that
is not alive is served (see :meth:`Placement.not_coordinator`).
"""

from __future__ import annotations

import asyncio
import logging

from kbroker.replicator.v1 import replicator_pb2
from services.common.coordinator_keys import partition_for
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import (
    ClusterMetadata,
    LogNode,
    MetadataCache,
    MetadataUnavailableError,
    PartitionInfo,
    TopicInfo,
)

log = logging.getLogger(__name__)

NONE = 0
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
NOT_COORDINATOR = ErrorCode.not_coordinator.value
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower.value
KAFKA_STORAGE_ERROR = ErrorCode.kafka_storage_error.value
TOPIC_ALREADY_EXISTS = ErrorCode.topic_already_exists.value
CREATE_TOPIC_TIMEOUT_S = 30.0


class CoordinatorError(Exception):
    """A key's partition cannot be served now; ``code`` is the Kafka error to answer."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or ErrorCode(code).name.upper())
        self.code = code


def leader_error(code: int, message: str) -> CoordinatorError:
    """A partition's leader failed (``code``: the Kafka error it gave, 0 for none): clients are
    told NOT_COORDINATOR when it leads no more or its log directory failed (leadership is
    about to move), so they look the coordinator up again, else COORDINATOR_NOT_AVAILABLE."""
    moving = code in (NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR)
    return CoordinatorError(NOT_COORDINATOR if moving else COORDINATOR_NOT_AVAILABLE, message)


class Placement:
    """The internal topic of one coordinator in the cluster metadata. ``topic`` is as it is
    created: ``cleanup.policy=compact`` is added, and the replication factor bounded by the
    live log nodes."""

    def __init__(self, topic: replicator_pb2.NewTopic, cache: MetadataCache,
                 controller: Controller) -> None:
        self.spec = topic
        self._cache = cache
        self._controller = controller
        self._creation: asyncio.Task[None] | None = None

    async def metadata(self) -> ClusterMetadata:
        try:
            return await self._cache.current()
        except MetadataUnavailableError as exc:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE, str(exc)) from exc

    async def topic(self, create: bool) -> tuple[ClusterMetadata, TopicInfo | None]:
        """The topic as metadata shows it (looked up afresh when missing), created first when
        ``create`` and it does not exist. Raises CoordinatorError without metadata."""
        name = self.spec.name
        metadata = await self.metadata()
        topic = metadata.topic(name)
        if topic is None:
            metadata = await self._cache.refresh()
            topic = metadata.topic(name)
        if topic is None and create:
            if self._creation is None or self._creation.done():
                self._creation = asyncio.ensure_future(self._create())
            await asyncio.shield(self._creation)
            metadata = await self.metadata()
            topic = metadata.topic(name)
        return metadata, topic

    async def _create(self) -> None:
        live = len((await self.metadata()).live_nodes())
        if live == 0:
            return
        spec = self.spec
        topic = replicator_pb2.NewTopic(
            name=spec.name, num_partitions=spec.num_partitions,
            replication_factor=min(spec.replication_factor, live),
            configs={"cleanup.policy": "compact", **spec.configs})
        try:
            results = (await self._controller.create_topics(
                replicator_pb2.CreateTopicsRequest(topics=[topic]), CREATE_TOPIC_TIMEOUT_S)).topics
        except CallError as exc:
            log.warning("creating %s failed: %s", spec.name, exc)
            return
        for result in results:
            if result.error_code and result.error_code != TOPIC_ALREADY_EXISTS:
                log.warning("creating %s failed: error %d %s", spec.name, result.error_code,
                            result.error_message)
            else:
                log.info("created %s with %d partitions", spec.name, spec.num_partitions)
        await self._cache.refresh()

    async def find(self, key: str) -> tuple[int, int]:
        """(error, node id) of the coordinator of ``key``: the leader of its partition, the
        topic created on first need (COORDINATOR_NOT_AVAILABLE while it cannot be had).

        As Kafka's FindCoordinator, a leader that stopped answering is still named until it is
        fenced (its partitions then move at once): clients send it their requests, which are
        answered COORDINATOR_NOT_AVAILABLE meanwhile, and look it up again. Answering
        COORDINATOR_NOT_AVAILABLE to the lookup itself in that window instead would leave
        clients that give up looking after a few tries (librdkafka's group coordinator
        lookup for TxnOffsetCommit) waiting for a broker state change that never comes, the
        frontend keeping every broker's port open."""
        try:
            metadata, topic = await self.topic(create=True)
            if topic is None:
                return COORDINATOR_NOT_AVAILABLE, -1
        except CoordinatorError as exc:
            return exc.code, -1
        info = topic.partitions.get(self.partition_of(topic, key))
        node = metadata.unfenced_node(info.leader) if info is not None else None
        if node is None:
            return COORDINATOR_NOT_AVAILABLE, -1
        return NONE, node.node_id

    async def not_coordinator(self, key: str, broker_id: int | None,
                              strict: bool = False) -> int:
        """NOT_COORDINATOR when the client sent a request about ``key`` to a live broker (log
        node) that does not lead the key's partition (Kafka's check); the reason when the
        coordinator is unknown; 0 when it does, or when the broker is not known (a direct
        call). An empty key is left to the API's own check (e.g. INVALID_GROUP_ID). Any
        handler could serve the request, but clients must keep talking to the coordinator they
        found, as Kafka's do.

        A request that reached the port of a broker that is not alive is served: the frontend
        keeps serving every broker's port, so a client's connection to a dead broker stays up,
        and clients that cache a coordinator for as long as its connection is up
        (librdkafka's admin API: a NOT_COORDINATOR inside a response does not evict its cache)
        would otherwise be told NOT_COORDINATOR until they restart. Serving is safe: the state
        lives in its partition, whose leader every handler writes to. Clients that look the
        coordinator up again are sent to the new one.

        ``strict``: Kafka's check at every port, for requests whose clients look the
        coordinator up again on NOT_COORDINATOR (TxnOffsetCommit): so they drop a dead broker
        from their coordinator cache (the broker stays in the metadata and its port stays
        served, see :meth:`~..metadata_cache.ClusterMetadata.brokers`, so the request gets
        there to be answered)."""
        if broker_id is None or not key:
            return NONE
        try:
            metadata, topic = await self.topic(create=False)
        except CoordinatorError as exc:
            return exc.code
        if not strict and metadata.live_node(broker_id) is None:
            return NONE
        if topic is None or not self.leads(topic, self.partition_of(topic, key), broker_id):
            return NOT_COORDINATOR
        return NONE

    @staticmethod
    def partition_of(topic: TopicInfo, key: str) -> int:
        return partition_for(key, len(topic.partitions)) if topic.partitions else -1

    @staticmethod
    def leads(topic: TopicInfo, partition: int, broker_id: int | None) -> bool:
        """Whether ``broker_id`` leads a partition of the topic (any broker when unknown)."""
        info = topic.partitions.get(partition)
        return info is not None and (broker_id is None or info.leader == broker_id)

    @staticmethod
    def leader(metadata: ClusterMetadata, topic: TopicInfo,
               partition: int) -> tuple[PartitionInfo, LogNode]:
        """A partition and its live leader. Raises CoordinatorError (COORDINATOR_NOT_AVAILABLE)."""
        info = topic.partitions.get(partition)
        node = metadata.live_node(info.leader) if info is not None else None
        if info is None or node is None:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE,
                                   f"{topic.name}-{partition} has no live leader")
        return info, node
