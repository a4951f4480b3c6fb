"""Metadata: brokers, cluster id, controller, and topics with their partitions (Kafka's
``KafkaApis.handleTopicMetadataRequest``).

    Metadata Request => [topics] allow_auto_topic_creation
                        include_cluster_authorized_operations include_topic_authorized_operations
      topics => topic_id name
    Metadata Response => throttle_time_ms [brokers] cluster_id controller_id [topics]
                         cluster_authorized_operations
      topics => error_code name topic_id is_internal [partitions] topic_authorized_operations
        partitions => error_code partition_index leader_id leader_epoch [replica_nodes]
                      [isr_nodes] [offline_replicas]

Topics null means every topic and an empty list none. Asked by topic id (any non-zero id in the
request), topics are looked up by id only and never created. Asked by name, a missing topic
with a legal name is created with the broker defaults when both the request and
``auto.create.topics.enable`` allow it, and answered in full once the replicator reports it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller, NewTopic, TopicResult
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError, TopicInfo
from ..request_context import RequestContext
from ..topic_identity import canonical_topic_id, invalid_name_reason
from .cluster import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    TOPIC_OPERATIONS,
    Broker,
    advertised_brokers,
)

log = logging.getLogger(__name__)

# How long topic creation on behalf of a Metadata request may take.
AUTO_CREATE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicRef:
    name: str | None = None
    topic_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataRequest:
    # None: every topic.
    topics: Sequence[TopicRef] | None = None
    allow_auto_topic_creation: bool = True
    include_cluster_authorized_operations: bool = False
    include_topic_authorized_operations: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionMetadata:
    partition_index: int
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = -1
    replica_nodes: list[int] = field(default_factory=list)
    isr_nodes: list[int] = field(default_factory=list)
    offline_replicas: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicMetadata:
    error_code: int = 0
    name: str | None = None
    topic_id: str | None = None
    is_internal: bool = False
    partitions: list[PartitionMetadata] = field(default_factory=list)
    topic_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataResponse:
    brokers: list[Broker] = field(default_factory=list)
    cluster_id: str | None = None
    controller_id: int = -1
    topics: list[TopicMetadata] = field(default_factory=list)
    cluster_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


def describe_topic(
    metadata: ClusterMetadata, topic: TopicInfo, include_authorized_operations: bool
) -> TopicMetadata:
    """A topic as Kafka describes it; a partition whose leader is not live has no leader and
    LEADER_NOT_AVAILABLE."""
    partitions = []
    for index in sorted(topic.partitions):
        info = topic.partitions[index]
        leader_live = metadata.live_node(info.leader) is not None
        partitions.append(
            PartitionMetadata(
                partition_index=index,
                error_code=0 if leader_live else ErrorCode.leader_not_available.value,
                leader_id=info.leader if leader_live else -1,
                leader_epoch=info.leader_epoch,
                replica_nodes=list(info.replicas),
                isr_nodes=list(info.isr),
                offline_replicas=metadata.offline_replicas(info),
            )
        )
    return TopicMetadata(
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=partitions,
        topic_authorized_operations=(
            TOPIC_OPERATIONS if include_authorized_operations else AUTHORIZED_OPERATIONS_OMITTED
        ),
    )


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


class MetadataApi:
    def __init__(
        self, cache: MetadataCache, controller: Controller, auto_create_topics_enable: bool
    ) -> None:
        self._cache = cache
        self._controller = controller
        self._auto_create = auto_create_topics_enable

    async def handle(self, request: MetadataRequest, context: RequestContext) -> MetadataResponse:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return self._unavailable(request)
        include_ops = request.include_topic_authorized_operations
        if request.topics is None:
            topics = [
                describe_topic(metadata, metadata.topics[name], include_ops)
                for name in sorted(metadata.topics)
            ]
        else:
            ids = _unique(
                [i for i in (canonical_topic_id(t.topic_id) for t in request.topics) if i])
            if ids:
                topics = self._by_id(metadata, ids, include_ops)
            else:
                names = _unique([t.name or "" for t in request.topics])
                metadata, topics = await self._by_name(metadata, names, request)
        return MetadataResponse(
            brokers=advertised_brokers(metadata.live_nodes(), context),
            cluster_id=metadata.cluster_id,
            controller_id=metadata.client_controller_id(),
            topics=topics,
            cluster_authorized_operations=(
                CLUSTER_OPERATIONS
                if request.include_cluster_authorized_operations
                else AUTHORIZED_OPERATIONS_OMITTED
            ),
        )

    @staticmethod
    def _by_id(
        metadata: ClusterMetadata, ids: list[str], include_ops: bool
    ) -> list[TopicMetadata]:
        out = []
        for topic_id in ids:
            topic = metadata.topic_by_id(topic_id)
            if topic is None:
                out.append(
                    TopicMetadata(error_code=ErrorCode.unknown_topic_id.value, topic_id=topic_id)
                )
            else:
                out.append(describe_topic(metadata, topic, include_ops))
        return out

    async def _by_name(
        self, metadata: ClusterMetadata, names: list[str], request: MetadataRequest
    ) -> tuple[ClusterMetadata, list[TopicMetadata]]:
        include_ops = request.include_topic_authorized_operations
        missing = [n for n in names if metadata.topic(n) is None]
        creatable = [n for n in missing if invalid_name_reason(n) is None]
        created: dict[str, TopicResult] = {}
        may_create = request.allow_auto_topic_creation and self._auto_create
        if creatable and may_create:
            metadata, created = await self._create(creatable)
        out = []
        for name in names:
            topic = metadata.topic(name)
            if topic is not None:
                out.append(describe_topic(metadata, topic, include_ops))
            elif invalid_name_reason(name) is not None:
                out.append(TopicMetadata(error_code=ErrorCode.invalid_topic_exception.value,
                                         name=name))
            elif not may_create:
                out.append(TopicMetadata(error_code=ErrorCode.unknown_topic_or_partition.value,
                                         name=name))
            else:
                out.append(TopicMetadata(error_code=self._creation_error(created.get(name)),
                                         name=name))
        return metadata, out

    async def _create(
        self, names: list[str]
    ) -> tuple[ClusterMetadata, dict[str, TopicResult]]:
        """Create ``names`` with the broker defaults; returns fresh metadata and the results."""
        results: dict[str, TopicResult] = {}
        try:
            answers = await self._controller.create_topics(
                [NewTopic(name=n) for n in names], validate_only=False,
                time_limit=AUTO_CREATE_TIMEOUT_S,
            )
            results = {r.name: r for r in answers}
        except CallError as exc:
            log.warning("auto-creating topics %s failed: %s", names, exc)
        return await self._cache.refresh(), results

    @staticmethod
    def _creation_error(result: TopicResult | None) -> int:
        """The error for a topic this request tried to create but metadata does not show yet.

        Kafka answers auto-created topics with LEADER_NOT_AVAILABLE until their partitions are
        ready, and keeps answering so while creation fails in the background; clients retry.
        Only an illegal name is final.
        """
        if result is not None and result.error_code == ErrorCode.invalid_topic_exception.value:
            return result.error_code
        return ErrorCode.leader_not_available.value

    @staticmethod
    def _unavailable(request: MetadataRequest) -> MetadataResponse:
        """No metadata at all yet: named topics get a retriable error, there are no brokers."""
        topics = [
            TopicMetadata(error_code=ErrorCode.leader_not_available.value,
                          name=t.name, topic_id=canonical_topic_id(t.topic_id))
            for t in request.topics or ()
        ]
        return MetadataResponse(topics=topics)
