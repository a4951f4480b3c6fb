"""gRPC glue of the Replicator service: protobuf <-> :class:`Controller` calls and metadata
images, with Kafka error codes in the topic results."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable

import grpc

from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc
from services.common.errors import ErrorCode, KafkaError

from .controller import ConfigChanges, Controller, NewTopic, PartitionIncrease, TopicResult
from .metadata import MetadataImage, TopicName, TopicRegistration
from .topic_rules import ConfigOperation

log = logging.getLogger(__name__)


class ReplicatorServicer(replicator_pb2_grpc.ReplicatorServicer):
    def __init__(self, controller: Controller) -> None:
        self._controller = controller
        # Many watchers share one conversion per version.
        self._converted: tuple[int, pb.ClusterMetadata] | None = None

    def _cluster_metadata(self, image: MetadataImage) -> pb.ClusterMetadata:
        cached = self._converted
        if cached is not None and cached[0] == image.version:
            return cached[1]
        message = to_cluster_metadata(image, image.topics.values())
        self._converted = (image.version, message)
        return message

    async def GetMetadata(
        self, request: pb.GetMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClusterMetadata:
        image = self._controller.image
        if not request.topics:
            return self._cluster_metadata(image)
        # Unknown names are left out; the caller decides what a missing topic means.
        found = (image.topics.get(TopicName(n)) for n in dict.fromkeys(request.topics))
        return to_cluster_metadata(image, (t for t in found if t is not None))

    async def WatchMetadata(
        self, request: pb.WatchMetadataRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ClusterMetadata]:
        async for image in self._controller.publisher.watch():
            yield self._cluster_metadata(image)

    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicsResponse:
        topics = [
            NewTopic(
                name=t.name,
                num_partitions=t.num_partitions,
                replication_factor=t.replication_factor,
                configs=dict(t.configs),
                assignments={index: tuple(r.node_ids) for index, r in t.assignments.items()},
            )
            for t in request.topics
        ]
        results = await self._controller.create_topics(topics, validate_only=request.validate_only)
        return pb.CreateTopicsResponse(topics=[to_topic_result(r) for r in results])

    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicsResponse:
        results = await self._controller.delete_topics(list(request.names),
                                                       list(request.topic_ids))
        return pb.DeleteTopicsResponse(topics=[to_topic_result(r) for r in results])

    async def AlterTopicConfigs(
        self, request: pb.AlterTopicConfigsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterTopicConfigsResponse:
        changes = [
            ConfigChanges(
                topic=t.topic,
                replace=t.replace,
                changes=[(c.name, ConfigOperation(c.operation), c.value) for c in t.changes],
            )
            for t in request.topics
        ]
        results = await self._controller.alter_configs(changes,
                                                       validate_only=request.validate_only)
        return pb.AlterTopicConfigsResponse(topics=[to_topic_result(r) for r in results])

    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreatePartitionsResponse:
        increases = [
            PartitionIncrease(topic=t.topic, count=t.count,
                              assignments=[tuple(a.node_ids) for a in t.assignments])
            for t in request.topics
        ]
        results = await self._controller.create_partitions(
            increases, validate_only=request.validate_only)
        return pb.CreatePartitionsResponse(topics=[to_topic_result(r) for r in results])

    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateProducerIdsResponse:
        try:
            block = await self._controller.allocate_producer_ids()
        except KafkaError as exc:
            return pb.AllocateProducerIdsResponse(error_code=exc.errno,
                                                  error_message=exc.message or "")
        except OSError as exc:
            log.error("cannot save a producer id block: %s", exc)
            return pb.AllocateProducerIdsResponse(
                error_code=ErrorCode.unknown_server_error.value, error_message=str(exc))
        log.info("producer ids %d-%d handed to %s", block.first_id, block.last_id,
                 request.requester or "an unnamed requester")
        return pb.AllocateProducerIdsResponse(producer_id_start=block.first_id,
                                              producer_id_len=block.size)


def to_cluster_metadata(
    image: MetadataImage, topics: Iterable[TopicRegistration]
) -> pb.ClusterMetadata:
    return pb.ClusterMetadata(
        version=image.version,
        cluster_id=image.cluster_id,
        controller_id=image.controller_id,
        log_nodes=[
            pb.LogNode(node_id=n.node_id, address=n.address, rack=n.rack, alive=n.alive)
            for n in image.log_nodes
        ],
        topics=[to_topic_metadata(image, t) for t in topics],
    )


def to_topic_metadata(image: MetadataImage, topic: TopicRegistration) -> pb.TopicMetadata:
    return pb.TopicMetadata(
        name=topic.name,
        topic_id=topic.topic_id,
        internal=topic.internal,
        configs=dict(topic.configs),
        partitions=[
            pb.PartitionMetadata(
                partition=p.partition,
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                replicas=p.replicas,
                isr=p.isr,
                offline_replicas=image.offline_replicas(p),
            )
            for p in topic.partitions
        ],
    )


def to_topic_result(result: TopicResult) -> pb.TopicResult:
    return pb.TopicResult(
        name=result.name,
        topic_id=result.topic_id,
        error_code=int(result.error.value),
        error_message=result.message,
        num_partitions=result.num_partitions,
        replication_factor=result.replication_factor,
        configs=dict(result.configs),
    )
