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

Authorization (Kafka's): only topics the principal may DESCRIBE are shown; all topics lists just
those, a topic asked for by name or id that the principal may not describe is
TOPIC_AUTHORIZATION_FAILED (without its id when asked by name, without its name when asked by
id), whether it exists or not; a missing topic is created only with CREATE on the cluster or
on the topic, else TOPIC_AUTHORIZATION_FAILED. Authorized operations, when asked for, are the
principal's.

A topic described without its authorized operations depends on the metadata snapshot alone:
each is built once per snapshot and copied into the answers from then on (a Metadata of every
topic of a large cluster, which clients ask for periodically, copies its topics rather than
building thousands of partitions each time).
"""

from __future__ import annotations

import logging
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError, TopicInfo
from ..request_context import RequestContext
from ..security.access import Access
from ..topic_identity import canonical_topic_id, invalid_name_reason
from .cluster import authorized, describe_cluster

log = logging.getLogger(__name__)

TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed.value

# How long topic creation on behalf of a Metadata request may take.
AUTO_CREATE_TIMEOUT_S = 30.0


def describe_topic(
    topics: Any, metadata: ClusterMetadata, topic: TopicInfo, include_authorized_operations: bool,
    access: Access,
) -> None:
    """Add ``topic`` to ``topics`` (a response's) as Kafka describes it; a partition whose
    leader is not live has no leader and LEADER_NOT_AVAILABLE (clients wait for the next
    leader rather than send their records to a node that cannot take them)."""
    partitions = topics.add(
        name=topic.name, topic_id=topic.topic_id, is_internal=topic.internal,
        topic_authorized_operations=authorized(include_authorized_operations, access,
                                               ResourceType.TOPIC, topic.name),
    ).partitions
    live_node = metadata.live_node
    for index in sorted(topic.partitions):
        info = topic.partitions[index]
        leader_live = live_node(info.leader) is not None
        partitions.add(
            partition_index=index,
            error_code=0 if leader_live else ErrorCode.leader_not_available.value,
            leader_id=info.leader if leader_live else -1,
            leader_epoch=info.leader_epoch,
            replica_nodes=info.replicas,
            isr_nodes=info.isr,
            offline_replicas=metadata.offline_replicas(info),
        )


class MetadataApi:
    def __init__(
        self, cache: MetadataCache, controller: Controller, auto_create_topics_enable: bool
    ) -> None:
        self._cache = cache
        self._controller = controller
        self._auto_create = auto_create_topics_enable
        # The snapshot the described topics are of, and those topics by name.
        self._described_in: ClusterMetadata | None = None
        self._described: dict[str, Any] = {}

    def _describe(self, topics: Any, metadata: ClusterMetadata, topic: TopicInfo,
                  include_ops: bool, access: Access) -> None:
        """:func:`describe_topic`, copied from the snapshot's description when the
        authorized operations are not asked for."""
        if include_ops:
            describe_topic(topics, metadata, topic, include_ops, access)
            return
        if self._described_in is not metadata:
            self._described_in, self._described = metadata, {}
        described = self._described.get(topic.name)
        if described is None:
            holder = k.MetadataResponse().topics
            describe_topic(holder, metadata, topic, False, access)
            described = self._described[topic.name] = holder[0]
        topics.add().CopyFrom(described)

    async def handle(
        self, request: k.MetadataRequest, context: RequestContext
    ) -> k.MetadataResponse:
        # Unset topics_is_null (a hand-made request): an empty list asks for every topic too.
        all_topics = (request.topics_is_null if request.HasField("topics_is_null")
                      else not request.topics)
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return self._unavailable(request, all_topics)
        response = k.MetadataResponse()
        topics = response.topics
        include_ops = request.include_topic_authorized_operations
        access = context.access
        if all_topics:
            for name in sorted(metadata.topics):
                if access.allows(Operation.DESCRIBE, ResourceType.TOPIC, name):
                    self._describe(topics, metadata, metadata.topics[name], include_ops, access)
        else:
            ids = list(dict.fromkeys(
                i for i in (canonical_topic_id(t.topic_id) for t in request.topics) if i))
            if ids:
                self._by_id(topics, metadata, ids, include_ops, access)
            else:
                names = list(dict.fromkeys(t.name for t in request.topics))
                metadata = await self._by_name(topics, metadata, names, request, access)
        describe_cluster(response, "node_id", metadata,
                         request.include_cluster_authorized_operations, context)
        return response

    def _by_id(self, topics: Any, metadata: ClusterMetadata, ids: list[str],
               include_ops: bool, access: Access) -> None:
        for topic_id in ids:
            topic = metadata.topic_by_id(topic_id)
            if topic is None:
                topics.add(error_code=ErrorCode.unknown_topic_id.value, topic_id=topic_id)
            elif not access.allows(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                topics.add(error_code=TOPIC_AUTHORIZATION_FAILED, topic_id=topic_id)
            else:
                self._describe(topics, metadata, topic, include_ops, access)

    async def _by_name(
        self, topics: Any, metadata: ClusterMetadata, names: list[str],
        request: k.MetadataRequest, access: Access,
    ) -> ClusterMetadata:
        """Describe ``names`` into ``topics``, creating the missing ones if allowed; returns
        the metadata the answer is from (fresh after a creation)."""
        include_ops = request.include_topic_authorized_operations
        refused = {n for n in names if not access.allows(Operation.DESCRIBE, ResourceType.TOPIC, n)}
        missing = [n for n in names if n not in refused and metadata.topic(n) is None]
        may_create = request.allow_auto_topic_creation and self._auto_create
        if may_create and missing and not access.allows(Operation.CREATE, ResourceType.CLUSTER):
            refused.update(n for n in missing
                           if not access.allows(Operation.CREATE, ResourceType.TOPIC, n))
        creatable = [n for n in missing if n not in refused and invalid_name_reason(n) is None]
        created: dict[str, replicator_pb2.TopicResult] = {}
        if creatable and may_create:
            metadata, created = await self._create(creatable)
        for name in names:
            if name in refused:
                topics.add(error_code=TOPIC_AUTHORIZATION_FAILED, name=name)
                continue
            topic = metadata.topic(name)
            if topic is not None:
                self._describe(topics, metadata, topic, include_ops, access)
                continue
            if invalid_name_reason(name) is not None:
                code = ErrorCode.invalid_topic_exception.value
            elif not may_create:
                code = ErrorCode.unknown_topic_or_partition.value
            else:
                code = self._creation_error(created.get(name))
            topics.add(error_code=code, name=name)
        return metadata

    async def _create(
        self, names: list[str]
    ) -> tuple[ClusterMetadata, dict[str, replicator_pb2.TopicResult]]:
        """Create ``names`` with the broker defaults; returns fresh metadata and the results."""
        results: dict[str, replicator_pb2.TopicResult] = {}
        try:
            answer = await self._controller.create_topics(
                replicator_pb2.CreateTopicsRequest(topics=[
                    replicator_pb2.NewTopic(name=n, num_partitions=-1, replication_factor=-1)
                    for n in names]), AUTO_CREATE_TIMEOUT_S)
            results = {r.name: r for r in answer.topics}
        except CallError as exc:
            log.warning("auto-creating topics %s failed: %s", names, exc)
        return await self._cache.refresh(), results

    @staticmethod
    def _creation_error(result: replicator_pb2.TopicResult | None) -> int:
        """The error for a topic this request tried to create but metadata does not show yet.

        Kafka answers auto-created topics with LEADER_NOT_AVAILABLE until their partitions are
        ready, and keeps answering so while creation fails in the background; clients retry.
        Only an illegal name is final.
        """
        if result is not None and result.error_code == ErrorCode.invalid_topic_exception.value:
            return result.error_code
        return ErrorCode.leader_not_available.value

    @staticmethod
    def _unavailable(request: k.MetadataRequest, all_topics: bool) -> k.MetadataResponse:
        """No metadata at all yet: named topics get a retriable error, there are no brokers."""
        response = k.MetadataResponse()
        for t in () if all_topics else request.topics:
            response.topics.add(error_code=ErrorCode.leader_not_available.value,
                                name=t.name if t.HasField("name") else None,
                                topic_id=canonical_topic_id(t.topic_id))
        return response
