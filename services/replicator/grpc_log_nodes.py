""":class:`~services.replicator.log_nodes.LogNodes` over gRPC: one long-lived channel per
configured log node, and gRPC failures turned into :class:`LogNodeError` here and nowhere else
in the replicator."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import PLAINTEXT, internal_channel
from services.common.errors import ErrorCode
from services.common.tls import InternalTls

from .log_nodes import LogNodeError, NodeHealth, TopicPartition
from .metadata import LogNode, NodeId

LOG_SERVICE_NAME = log_pb2.DESCRIPTOR.services_by_name["LogService"].full_name

# Creating or deleting replicas touches a few files; anything slower is a sick node.
CALL_TIMEOUT = 10.0
# Between the probes of a node whose health stream broke (see GrpcLogNodes.wait_exit).
EXIT_PROBE_PAUSE = 0.02


class GrpcLogNodes:
    def __init__(self, nodes: Sequence[LogNode], health_timeout: float = 1.0, *,
                 tls: InternalTls = PLAINTEXT) -> None:
        self._health_timeout = health_timeout
        self._nodes = {n.node_id: n for n in nodes}
        self._channels = {n.node_id: internal_channel(n.address, tls, "log") for n in nodes}
        self._log = {i: log_pb2_grpc.LogServiceStub(c) for i, c in self._channels.items()}
        self._health = {i: health_pb2_grpc.HealthStub(c) for i, c in self._channels.items()}

    async def health(self, node_id: NodeId) -> NodeHealth:
        stub = self._health.get(node_id)
        if stub is None:
            return NodeHealth.UNREACHABLE
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=LOG_SERVICE_NAME),
                                     timeout=self._health_timeout)
        except grpc.aio.AioRpcError:
            return NodeHealth.UNREACHABLE
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return NodeHealth.SERVING
        return NodeHealth.LOG_DIR_FAILED

    async def wait_exit(self, node_id: NodeId) -> None:
        """Return once the process of ``node_id`` has certainly exited: the health stream held
        open to it broke (or could not be opened) and a new connection was refused.

        Refused is proof: nothing listens on the node's port any more. A node that hangs (a
        stopped or overloaded process) still accepts connections, so it never returns here;
        the session timeout of the periodic checks is for that case."""
        stub = self._health.get(node_id)
        if stub is None:
            await asyncio.Event().wait()  # an unknown node never exits
        request = health_pb2.HealthCheckRequest(service=LOG_SERVICE_NAME)
        loop = asyncio.get_running_loop()
        while True:
            opened = loop.time()
            call = stub.Watch(request)
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as e:
                if _refused(e):
                    return
            finally:
                call.cancel()
            if await self._refuses(stub, request):
                return
            if loop.time() - opened < self._health_timeout:
                await asyncio.sleep(self._health_timeout)  # never spin on a failing stream

    async def _refuses(self, stub: health_pb2_grpc.HealthStub,
                       request: health_pb2.HealthCheckRequest) -> bool:
        """Whether a node whose stream just broke refuses new connections: probed until it
        refuses, answers, or does not answer in time, for up to the health timeout (the first
        calls may still fail on the connection that is closing)."""
        deadline = asyncio.get_running_loop().time() + self._health_timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                await stub.Check(request, timeout=self._health_timeout)
                return False
            except grpc.aio.AioRpcError as e:
                if _refused(e):
                    return True
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    return False
            await asyncio.sleep(EXIT_PROBE_PAUSE)
        return False

    async def create_partitions(
        self, node_id: NodeId, specs: Sequence[log_pb2.PartitionSpec]
    ) -> list[log_pb2.PartitionError]:
        return _failed(await self._call(node_id, "create partitions", "CreatePartitions",
                                        log_pb2.CreatePartitionsRequest(partitions=specs)))

    async def delete_partitions(
        self, node_id: NodeId, partitions: Sequence[TopicPartition]
    ) -> list[log_pb2.PartitionError]:
        return _failed(await self._call(node_id, "delete partitions", "DeletePartitions",
                                        log_pb2.DeletePartitionsRequest(partitions=[
                                            log_pb2.TopicPartition(topic=t, partition=p)
                                            for t, p in partitions])))

    async def update_configs(
        self, node_id: NodeId, specs: Sequence[log_pb2.PartitionSpec]
    ) -> list[log_pb2.PartitionError]:
        return _failed(await self._call(node_id, "update configs", "UpdatePartitionConfigs",
                                        log_pb2.UpdatePartitionConfigsRequest(partitions=specs)))

    async def update_replica_states(
        self, node_id: NodeId, states: Sequence[log_pb2.ReplicaState]
    ) -> list[log_pb2.PartitionError]:
        return _failed(await self._call(node_id, "update replica states", "UpdateReplicaStates",
                                        log_pb2.UpdateReplicaStatesRequest(states=states)))

    async def describe(
        self, node_id: NodeId, partitions: Sequence[TopicPartition]
    ) -> Sequence[log_pb2.PartitionState]:
        request = log_pb2.DescribePartitionsRequest(partitions=[
            log_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])
        return (await self._call(node_id, "describe partitions", "DescribePartitions",
                                 request)).partitions

    async def update_replication_settings(self, node_id: NodeId,
                                          settings: log_pb2.ReplicationSettings) -> None:
        await self._call(node_id, "update replication settings", "UpdateReplicationSettings",
                         settings)

    def alter_partitions(self, node_id: NodeId) -> GrpcIsrChangeStream:
        stub = self._log.get(node_id)
        if stub is None:
            raise LogNodeError(node_id, ErrorCode.request_timed_out,
                               f"log node {node_id} is not configured")
        return GrpcIsrChangeStream(node_id, self._nodes[node_id].address,
                                   stub.AlterPartitions())

    async def _call(self, node_id: NodeId, what: str, method: str, request: object,
                    time_limit: float = CALL_TIMEOUT) -> Any:
        stub = self._log.get(node_id)
        if stub is None:
            raise LogNodeError(node_id, ErrorCode.request_timed_out,
                               f"log node {node_id} is not configured")
        try:
            return await getattr(stub, method)(request, timeout=time_limit)
        except grpc.aio.AioRpcError as e:
            # Retriable for clients: the next health check takes a dead node out of placement.
            raise LogNodeError(
                node_id, ErrorCode.request_timed_out,
                f"log node {node_id} ({self._nodes[node_id].address}) could not {what}: "
                f"{e.code().name} {e.details()}",
            ) from e

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))


def _refused(error: grpc.aio.AioRpcError) -> bool:
    """The call could not connect because the peer refused the connection."""
    return (error.code() == grpc.StatusCode.UNAVAILABLE
            and "connection refused" in (error.details() or "").lower())


def _failed(reply: Any) -> list[log_pb2.PartitionError]:
    return [r for r in reply.results if r.error_code]


class GrpcIsrChangeStream:
    """A log node's ``AlterPartitions`` stream as :class:`~.log_nodes.IsrChangeStream`."""

    def __init__(self, node_id: NodeId, address: str, call: Any) -> None:
        self._node_id = node_id
        self._address = address
        self._call = call

    def _error(self, e: Exception) -> LogNodeError:
        details = f"{e.code().name} {e.details()}" if isinstance(e, grpc.aio.AioRpcError) \
            else repr(e)
        return LogNodeError(self._node_id, ErrorCode.request_timed_out,
                            f"log node {self._node_id} ({self._address}): ISR change stream "
                            f"failed: {details}")

    async def read(self) -> log_pb2.IsrChangeRequests | None:
        try:
            message = await self._call.read()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
            raise self._error(e) from e
        return None if message is grpc.aio.EOF else message

    async def write(self, answers: log_pb2.IsrChangeAnswers) -> None:
        try:
            await self._call.write(answers)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            raise self._error(e) from e

    def cancel(self) -> None:
        self._call.cancel()
