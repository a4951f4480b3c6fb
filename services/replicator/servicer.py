"""gRPC glue of the Replicator service: each call goes to the control manager that owns it;
metadata images become ``ClusterMetadata`` messages here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import grpc

from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc

from .controller import Controller
from .metadata import MetadataImage, NodeId, TopicName, TopicRegistration


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
        return await self._controller.topics.create_topics(request)

    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicsResponse:
        return await self._controller.topics.delete_topics(request)

    async def AlterTopicConfigs(
        self, request: pb.AlterTopicConfigsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterTopicConfigsResponse:
        return await self._controller.configs.alter_configs(request)

    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreatePartitionsResponse:
        return await self._controller.topics.create_partitions(request)

    async def ElectLeaders(
        self, request: pb.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ElectLeadersResponse:
        wanted = None if request.all_partitions else [
            (p.topic, p.partition) for p in request.partitions]
        results = await self._controller.partitions.elect_leaders(
            int(request.election_type), wanted)
        return pb.ElectLeadersResponse(results=[
            pb.ElectionResult(topic=topic, partition=partition, error_code=code,
                              error_message=message)
            for (topic, partition), (code, message) in sorted(results.items())])

    async def AlterPartitionReassignments(
        self, request: pb.AlterPartitionReassignmentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterPartitionReassignmentsResponse:
        targets = {(r.topic, r.partition): None if r.cancel else tuple(
            NodeId(n) for n in r.replicas) for r in request.reassignments}
        results = await self._controller.reassignments.alter(
            targets, allow_rf_change=request.allow_replication_factor_change)
        return pb.AlterPartitionReassignmentsResponse(results=[
            pb.ElectionResult(topic=r.topic, partition=r.partition,
                              error_code=results[(r.topic, r.partition)][0],
                              error_message=results[(r.topic, r.partition)][1])
            for r in request.reassignments])

    async def ControlledShutdown(
        self, request: pb.ControlledShutdownRequest, context: grpc.aio.ServicerContext
    ) -> pb.ControlledShutdownResponse:
        code, message, staying = await self._controller.controlled_shutdown(request.node_id)
        return pb.ControlledShutdownResponse(
            error_code=code, error_message=message,
            remaining_leaderships=[pb.PartitionRef(topic=topic, partition=partition)
                                   for topic, partition in staying])

    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateProducerIdsResponse:
        return await self._controller.producer_ids.allocate(request)

    async def CreateAcls(
        self, request: pb.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateAclsResponse:
        return await self._controller.acls.create(request)

    async def DeleteAcls(
        self, request: pb.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteAclsResponse:
        return await self._controller.acls.delete(request)

    async def AlterScramCredentials(
        self, request: pb.AlterScramCredentialsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterScramCredentialsResponse:
        return await self._controller.scram.alter(request)

    async def AlterClientQuotas(
        self, request: pb.AlterClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterClientQuotasResponse:
        return await self._controller.client_quotas.alter(request)

    async def AlterConfigResources(
        self, request: pb.AlterConfigResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterConfigResourcesResponse:
        return await self._controller.config_resources.alter(request)


def to_cluster_metadata(
    image: MetadataImage, topics: Iterable[TopicRegistration]
) -> pb.ClusterMetadata:
    return pb.ClusterMetadata(
        version=image.version,
        cluster_id=image.cluster_id,
        controller_id=image.controller_id,
        log_nodes=[
            pb.LogNode(node_id=n.node_id, address=n.address, rack=n.rack, alive=n.alive,
                       fenced=n.fenced, in_controlled_shutdown=n.in_controlled_shutdown)
            for n in image.log_nodes
        ],
        topics=[
            pb.TopicMetadata(
                name=topic.name,
                topic_id=topic.topic_id,
                internal=topic.internal,
                configs=topic.configs,
                partitions=[
                    pb.PartitionMetadata(
                        partition=p.partition,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        replicas=p.replicas,
                        isr=p.isr,
                        offline_replicas=image.offline_replicas(p),
                        adding_replicas=p.adding,
                        removing_replicas=p.removing,
                    )
                    for p in topic.partitions
                ],
            )
            for topic in topics
        ],
        acls=[b.to_pb() for b in image.acls],
        scram_credentials=[
            pb.ScramCredential(user=user, mechanism=mechanism, salt=c.salt,
                               stored_key=c.stored_key, server_key=c.server_key,
                               iterations=c.iterations)
            for (user, mechanism), c in image.scram_credentials.items()
        ],
        client_quotas=[
            pb.ClientQuota(
                entity=[pb.QuotaEntityPart(entity_type=kind, name=name or "",
                                           is_default=name is None) for kind, name in entity],
                values=values)
            for entity, values in image.client_quotas.items()
        ],
        config_resources=[
            pb.ConfigResource(resource_type=kind, name=name, configs=configs)
            for (kind, name), configs in sorted(image.config_resources.items())
        ],
    )
