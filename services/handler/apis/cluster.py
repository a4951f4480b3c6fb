"""DescribeCluster, and the broker list every cluster-describing answer shares.

    DescribeCluster Request => include_cluster_authorized_operations endpoint_type
    DescribeCluster Response => error_code error_message endpoint_type cluster_id
                                controller_id [brokers] cluster_authorized_operations

Brokers are the log nodes, dead ones too (the frontend serves their ports), advertised at the
frontend the client used (any frontend reaches every log node), each at a port of its own (see
``request_context.broker_port``). A client that asks for the cluster's authorized operations
gets those its principal may do (0 when it may not DESCRIBE the cluster; every operation
without an authorizer, as Kafka answers without one); otherwise the "not requested" sentinel.
"""

from __future__ import annotations

import enum
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import CLUSTER_NAME, Operation, ResourceType
from services.common.errors import ErrorCode

from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext, broker_port
from ..security.access import Access
from ..security.authorizer import SUPPORTED_OPERATIONS, operations_bitfield

# Kafka's "authorized operations not requested" marker (Integer.MIN_VALUE).
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


# Every operation each resource type supports (what a client is told without an authorizer).
TOPIC_OPERATIONS = operations_bitfield(SUPPORTED_OPERATIONS[ResourceType.TOPIC])
GROUP_OPERATIONS = operations_bitfield(SUPPORTED_OPERATIONS[ResourceType.GROUP])
CLUSTER_OPERATIONS = operations_bitfield(SUPPORTED_OPERATIONS[ResourceType.CLUSTER])


class EndpointType(enum.IntEnum):
    BROKER = 1
    CONTROLLER = 2


def authorized(requested: bool, access: Access, resource_type: ResourceType,
               name: str = CLUSTER_NAME) -> int:
    """An authorized-operations field: the operations of the resource the principal may do
    when the client asks, else the "not requested" marker."""
    return access.operations(resource_type, name) if requested else AUTHORIZED_OPERATIONS_OMITTED


def cluster_operations(requested: bool, access: Access) -> int:
    """The cluster's authorized-operations field: as :func:`authorized`, but 0 for a
    principal that may not DESCRIBE the cluster (Kafka's Metadata and DescribeCluster)."""
    if not requested:
        return AUTHORIZED_OPERATIONS_OMITTED
    if not access.allows(Operation.DESCRIBE, ResourceType.CLUSTER):
        return 0
    return access.operations(ResourceType.CLUSTER)


def describe_cluster(response: Any, id_field: str, metadata: ClusterMetadata,
                     include_operations: bool, context: RequestContext) -> None:
    """Fill in what Metadata and DescribeCluster both answer: the brokers (every log node,
    see :meth:`~..metadata_cache.ClusterMetadata.brokers`) at the request's advertised address
    (``id_field``: the response's broker id field), the cluster id, the controller and the
    cluster's authorized operations."""
    for node in metadata.brokers():
        response.brokers.add(host=context.advertised_host, rack=node.rack,
                             port=broker_port(context, node.node_id), **{id_field: node.node_id})
    response.cluster_id = metadata.cluster_id
    response.controller_id = metadata.client_controller_id()
    response.cluster_authorized_operations = cluster_operations(include_operations,
                                                                context.access)


class DescribeClusterApi:
    def __init__(self, cache: MetadataCache) -> None:
        self._cache = cache

    async def handle(
        self, request: k.DescribeClusterRequest, context: RequestContext
    ) -> k.DescribeClusterResponse:
        # Kafka answers an endpoint type it does not know with UNSUPPORTED_ENDPOINT_TYPE and a
        # known one that is not its own (a broker asked for controllers) with
        # MISMATCHED_ENDPOINT_TYPE.
        if request.endpoint_type == EndpointType.CONTROLLER:
            return k.DescribeClusterResponse(
                error_code=ErrorCode.mismatched_endpoint_type.value,
                endpoint_type=request.endpoint_type,
                error_message="The request was sent to an endpoint of type BROKER, but we wanted"
                              " an endpoint of type CONTROLLER")
        if request.endpoint_type != EndpointType.BROKER:
            return k.DescribeClusterResponse(
                error_code=ErrorCode.unsupported_endpoint_type.value,
                error_message=f"Unsupported endpoint type {request.endpoint_type}",
                endpoint_type=request.endpoint_type)
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError as exc:
            # DescribeCluster has only top-level errors; a retriable one lets the admin client
            # try again once the replicator answers.
            return k.DescribeClusterResponse(
                error_code=ErrorCode.request_timed_out.value, error_message=exc.message)
        response = k.DescribeClusterResponse()
        describe_cluster(response, "broker_id", metadata,
                         request.include_cluster_authorized_operations, context)
        return response
