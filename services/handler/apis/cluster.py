"""DescribeCluster, and the broker list every cluster-describing answer shares.

    DescribeCluster Request => include_cluster_authorized_operations endpoint_type
    DescribeCluster Response => error_code error_message endpoint_type cluster_id
                                controller_id [brokers] cluster_authorized_operations

Brokers are the live log nodes, advertised at the frontend the client used (any frontend reaches
every log node), each at a port of its own (see ``request_context.broker_port``). Without an
authorizer every operation is allowed, so a client that asks for its authorized operations gets
every operation the resource supports, as Kafka answers without an authorizer; otherwise the
"not requested" sentinel.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode

from ..metadata_cache import LogNode, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext, broker_port

# Kafka's "authorized operations not requested" marker (Integer.MIN_VALUE).
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


class AclOperation(enum.IntEnum):
    """Kafka's ACL operation codes (bit positions in authorized-operations fields)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


def operations_bitfield(*operations: AclOperation) -> int:
    bits = 0
    for operation in operations:
        bits |= 1 << int(operation)
    return bits


TOPIC_OPERATIONS = operations_bitfield(
    AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
    AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
)
CLUSTER_OPERATIONS = operations_bitfield(
    AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
    AclOperation.DESCRIBE,
)


class EndpointType(enum.IntEnum):
    BROKER = 1
    CONTROLLER = 2


def add_brokers(brokers: Any, id_field: str, nodes: Iterable[LogNode],
                context: RequestContext) -> None:
    """Add the live log nodes to ``brokers`` (a response's repeated broker field, whose broker
    id is ``id_field``) as brokers at the request's advertised address."""
    host = context.advertised_host
    for node in nodes:
        if node.alive:
            brokers.add(host=host, port=broker_port(context, node.node_id), rack=node.rack,
                        **{id_field: node.node_id})


class DescribeClusterApi:
    def __init__(self, cache: MetadataCache) -> None:
        self._cache = cache

    async def handle(
        self, request: k.DescribeClusterRequest, context: RequestContext
    ) -> k.DescribeClusterResponse:
        # Kafka answers an endpoint type it does not know with UNSUPPORTED_ENDPOINT_TYPE and a
        # known one that is not its own (a broker asked for controllers) with
        # MISMATCHED_ENDPOINT_TYPE.
        if request.endpoint_type != EndpointType.BROKER:
            if request.endpoint_type == EndpointType.CONTROLLER:
                return k.DescribeClusterResponse(
                    error_code=ErrorCode.mismatched_endpoint_type.value,
                    error_message=(
                        "The request was sent to an endpoint of type BROKER, but we wanted an"
                        " endpoint of type CONTROLLER"
                    ),
                    endpoint_type=request.endpoint_type,
                )
            return k.DescribeClusterResponse(
                error_code=ErrorCode.unsupported_endpoint_type.value,
                error_message=f"Unsupported endpoint type {request.endpoint_type}",
                endpoint_type=request.endpoint_type,
            )
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError as exc:
            # DescribeCluster has only top-level errors; a retriable one lets the admin client
            # try again once the replicator answers.
            return k.DescribeClusterResponse(
                error_code=ErrorCode.request_timed_out.value, error_message=exc.message
            )
        response = k.DescribeClusterResponse(
            cluster_id=metadata.cluster_id,
            controller_id=metadata.client_controller_id(),
            cluster_authorized_operations=(
                CLUSTER_OPERATIONS
                if request.include_cluster_authorized_operations
                else AUTHORIZED_OPERATIONS_OMITTED
            ),
        )
        add_brokers(response.brokers, "broker_id", metadata.live_nodes(), context)
        return response
