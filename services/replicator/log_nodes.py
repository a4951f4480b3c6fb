"""Talking to log nodes: parsing their configured addresses, health checks, creating and
deleting partition replicas and updating their topic configs, and the replication calls (the
kbroker.log.v1 LogService), with gRPC failures turned into Kafka error codes here and nowhere
else in the replicator.

:class:`LogNodeClient` is what the controller needs, :class:`~.replication.nodes.ReplicaNodes`
what replication needs; :class:`GrpcLogNodes` implements both with one long-lived channel per
node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode

from .metadata import LogNode, NodeId
from .replication import nodes as replica

LOG_SERVICE_NAME = log_pb2.DESCRIPTOR.services_by_name["LogService"].full_name

# Creating or deleting replicas touches a few files; anything slower is a sick node.
CALL_TIMEOUT = 10.0


def parse_log_nodes(entries: Iterable[str]) -> tuple[LogNode, ...]:
    """``["0=host:port", "1=host:port@rack", ...]`` -> log nodes (not yet known alive), by
    ascending id; a rack after ``@`` is the node's ``broker.rack``.

    Raises ValueError for a malformed entry or a repeated node id."""
    nodes: dict[int, LogNode] = {}
    for entry in entries:
        located, _, rack = entry.strip().partition("@")
        node_id, sep, address = located.partition("=")
        host, colon, port = address.strip().rpartition(":")
        if not sep or not colon or not host or not port.isdigit():
            raise ValueError(f"log node entry {entry!r} is not node_id=host:port")
        try:
            number = int(node_id)
        except ValueError:
            raise ValueError(f"log node entry {entry!r}: node id is not an integer") from None
        if number < 0:
            raise ValueError(f"log node entry {entry!r}: node id must not be negative")
        if number in nodes:
            raise ValueError(f"log node id {number} is configured twice")
        nodes[number] = LogNode(node_id=NodeId(number), address=address.strip(),
                                rack=rack.strip())
    return tuple(nodes[n] for n in sorted(nodes))


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionSpec:
    """A replica to create: the topic's name, id and configs, the partition index, and (for
    creation) the replica's state."""

    topic: str
    partition: int
    topic_id: str
    configs: Mapping[str, str] = field(default_factory=dict)
    state: replica.ReplicaState | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionFailure:
    topic: str
    partition: int
    error: ErrorCode
    message: str


class LogNodeError(Exception):
    """A call to a log node failed as a whole (unreachable, timed out, internal error);
    ``error`` is the Kafka error the affected topics report."""

    def __init__(self, node_id: int, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.error = error
        self.message = message


class LogNodeClient(Protocol):
    async def is_serving(self, node_id: NodeId) -> bool:
        """Whether the node's LogService health check answers SERVING (False on any failure)."""
        ...

    async def create_partitions(
        self, node_id: NodeId, specs: Sequence[PartitionSpec]
    ) -> list[PartitionFailure]:
        """Create (or confirm) replicas; per-partition failures are returned, a failure of the
        whole call raises :class:`LogNodeError`."""
        ...

    async def delete_partitions(
        self, node_id: NodeId, partitions: Sequence[tuple[str, int]]
    ) -> list[PartitionFailure]:
        """Delete replicas (unknown ones are not an error); as :meth:`create_partitions`."""
        ...

    async def update_configs(
        self, node_id: NodeId, specs: Sequence[PartitionSpec]
    ) -> list[PartitionFailure]:
        """Replace the topic configs of replicas; as :meth:`create_partitions`."""
        ...

    async def close(self) -> None: ...


class GrpcLogNodes:
    """:class:`LogNodeClient` over gRPC, one channel per configured node."""

    def __init__(self, nodes: Sequence[LogNode], health_timeout: float = 1.0) -> None:
        self._health_timeout = health_timeout
        self._nodes = {n.node_id: n for n in nodes}
        self._channels = {n.node_id: insecure_channel(n.address) for n in nodes}
        self._log = {i: log_pb2_grpc.LogServiceStub(c) for i, c in self._channels.items()}
        self._health = {i: health_pb2_grpc.HealthStub(c) for i, c in self._channels.items()}

    async def is_serving(self, node_id: NodeId) -> bool:
        stub = self._health.get(node_id)
        if stub is None:
            return False
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=LOG_SERVICE_NAME),
                                     timeout=self._health_timeout)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def create_partitions(
        self, node_id: NodeId, specs: Sequence[PartitionSpec]
    ) -> list[PartitionFailure]:
        request = log_pb2.CreatePartitionsRequest(partitions=[
            log_pb2.PartitionSpec(topic=s.topic, partition=s.partition, topic_id=s.topic_id,
                                  configs=dict(s.configs),
                                  state=_state_message(s.state) if s.state else None)
            for s in specs
        ])
        reply = await self._call(node_id, "create partitions", self._stub(node_id).CreatePartitions,
                                 request)
        return _failures(reply.results)

    async def delete_partitions(
        self, node_id: NodeId, partitions: Sequence[tuple[str, int]]
    ) -> list[PartitionFailure]:
        request = log_pb2.DeletePartitionsRequest(partitions=[
            log_pb2.TopicPartition(topic=topic, partition=partition)
            for topic, partition in partitions
        ])
        reply = await self._call(node_id, "delete partitions", self._stub(node_id).DeletePartitions,
                                 request)
        return _failures(reply.results)

    async def update_configs(
        self, node_id: NodeId, specs: Sequence[PartitionSpec]
    ) -> list[PartitionFailure]:
        request = log_pb2.UpdatePartitionConfigsRequest(partitions=[
            log_pb2.PartitionSpec(topic=s.topic, partition=s.partition, topic_id=s.topic_id,
                                  configs=dict(s.configs))
            for s in specs
        ])
        reply = await self._call(node_id, "update configs",
                                 self._stub(node_id).UpdatePartitionConfigs, request)
        return _failures(reply.results)

    # -- replication (see replication.nodes.ReplicaNodes) -----------------------------------

    async def fetch(
        self, node_id: NodeId, requests: Sequence[replica.FetchRequest], *, max_wait_ms: int,
        max_bytes: int, partition_max_bytes: int,
    ) -> list[replica.FetchResult]:
        request = log_pb2.ReadRequest(
            limit=log_pb2.READ_LIMIT_LOG_END, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
            partitions=[log_pb2.PartitionRead(topic=r.topic, partition=r.partition,
                                              offset=r.offset, max_bytes=partition_max_bytes)
                        for r in requests])
        reply = await self._call(node_id, "read", self._stub(node_id).Read, request,
                                 time_limit=max_wait_ms / 1000 + CALL_TIMEOUT)
        return [replica.FetchResult(
            topic=r.topic, partition=r.partition, error=_error(r.error_code), records=r.records,
            log_start_offset=r.log_start_offset, log_end_offset=r.log_end_offset,
            high_watermark=r.high_watermark) for r in reply.results]

    async def replicate(
        self, node_id: NodeId, requests: Sequence[replica.ReplicateRequest]
    ) -> list[replica.ReplicateResult]:
        request = log_pb2.ReplicateAppendRequest(partitions=[
            log_pb2.PartitionReplicate(topic=r.topic, partition=r.partition,
                                       leader_epoch=r.leader_epoch, records=r.records,
                                       high_watermark=r.high_watermark,
                                       log_start_offset=r.log_start_offset)
            for r in requests])
        reply = await self._call(node_id, "replicate", self._stub(node_id).ReplicateAppend,
                                 request)
        return [replica.ReplicateResult(
            topic=r.topic, partition=r.partition, error=_error(r.error_code),
            message=r.error_message, log_end_offset=r.log_end_offset,
            high_watermark=r.high_watermark) for r in reply.results]

    async def update_high_watermarks(
        self, node_id: NodeId, updates: Sequence[replica.HighWatermarkUpdate]
    ) -> list[replica.PartitionError]:
        request = log_pb2.UpdateHighWatermarksRequest(partitions=[
            log_pb2.PartitionHighWatermark(topic=u.topic, partition=u.partition,
                                           leader_epoch=u.leader_epoch,
                                           high_watermark=u.high_watermark)
            for u in updates])
        reply = await self._call(node_id, "update high watermarks",
                                 self._stub(node_id).UpdateHighWatermarks, request)
        return _partition_errors(reply.results)

    async def update_replica_states(
        self, node_id: NodeId, states: Sequence[replica.ReplicaState]
    ) -> list[replica.PartitionError]:
        request = log_pb2.UpdateReplicaStatesRequest(states=[_state_message(s) for s in states])
        reply = await self._call(node_id, "update replica states",
                                 self._stub(node_id).UpdateReplicaStates, request)
        return _partition_errors(reply.results)

    async def describe(
        self, node_id: NodeId, partitions: Sequence[replica.TopicPartition]
    ) -> list[replica.ReplicaDescription]:
        request = log_pb2.DescribePartitionsRequest(partitions=[
            log_pb2.TopicPartition(topic=topic, partition=partition)
            for topic, partition in partitions])
        reply = await self._call(node_id, "describe partitions",
                                 self._stub(node_id).DescribePartitions, request)
        return [replica.ReplicaDescription(
            topic=p.topic, partition=p.partition, error=_error(p.error_code),
            log_end_offset=p.log_end_offset, high_watermark=p.high_watermark,
            leader_epoch=p.leader_epoch, role=_ROLES.get(p.role, replica.Role.UNKNOWN),
            latest_log_epoch=p.latest_log_epoch)
            for p in reply.partitions]

    async def end_offsets(
        self, node_id: NodeId, requests: Sequence[tuple[str, int, int]]
    ) -> list[replica.EpochEndOffset]:
        request = log_pb2.OffsetForLeaderEpochRequest(partitions=[
            log_pb2.PartitionLeaderEpoch(topic=topic, partition=partition, leader_epoch=epoch)
            for topic, partition, epoch in requests])
        reply = await self._call(node_id, "find epoch end offsets",
                                 self._stub(node_id).OffsetForLeaderEpoch, request)
        return [replica.EpochEndOffset(
            topic=r.topic, partition=r.partition, error=_error(r.error_code),
            leader_epoch=r.leader_epoch, end_offset=r.end_offset) for r in reply.results]

    async def truncate(
        self, node_id: NodeId, requests: Sequence[tuple[str, int, int]],
        *, start_over: bool = False,
    ) -> list[replica.ReplicateResult]:
        request = log_pb2.TruncateRequest(partitions=[
            log_pb2.PartitionTruncation(topic=topic, partition=partition, offset=offset,
                                        start_over=start_over)
            for topic, partition, offset in requests])
        reply = await self._call(node_id, "truncate", self._stub(node_id).Truncate, request)
        return [replica.ReplicateResult(
            topic=r.topic, partition=r.partition, error=_error(r.error_code),
            message=r.error_message, log_end_offset=r.log_end_offset,
            high_watermark=r.high_watermark) for r in reply.results]

    def _stub(self, node_id: NodeId) -> log_pb2_grpc.LogServiceStub:
        stub = self._log.get(node_id)
        if stub is None:
            raise LogNodeError(node_id, ErrorCode.request_timed_out,
                                     f"log node {node_id} is not configured")
        return stub

    async def _call(self, node_id: NodeId, what: str, method, request,  # type: ignore[no-untyped-def]
                    time_limit: float = CALL_TIMEOUT):
        address = self._nodes[node_id].address
        try:
            return await method(request, timeout=time_limit)
        except grpc.aio.AioRpcError as e:
            # Retriable for clients: the next health check takes a dead node out of placement.
            raise LogNodeError(
                node_id, ErrorCode.request_timed_out,
                f"log node {node_id} ({address}) could not {what}: {e.code().name} {e.details()}",
            ) from e

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))


def _failures(results: Iterable[log_pb2.PartitionError]) -> list[PartitionFailure]:
    failures = []
    for r in results:
        if r.error_code == 0:
            continue
        try:
            error = ErrorCode(r.error_code)
        except ValueError:
            error = ErrorCode.unknown_server_error
        failures.append(PartitionFailure(topic=r.topic, partition=r.partition, error=error,
                                         message=r.error_message or error.name.upper()))
    return failures


_ROLES = {
    log_pb2.REPLICA_ROLE_LEADER: replica.Role.LEADER,
    log_pb2.REPLICA_ROLE_FOLLOWER: replica.Role.FOLLOWER,
}
_ROLE_VALUES = {role: value for value, role in _ROLES.items()}


def _state_message(state: replica.ReplicaState) -> log_pb2.ReplicaState:
    return log_pb2.ReplicaState(topic=state.topic, partition=state.partition,
                                role=_ROLE_VALUES[state.role], leader_epoch=state.leader_epoch,
                                in_sync_alone=state.in_sync_alone)


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def _partition_errors(results: Iterable[log_pb2.PartitionError]) -> list[replica.PartitionError]:
    return [replica.PartitionError(topic=r.topic, partition=r.partition,
                                   error=_error(r.error_code), message=r.error_message)
            for r in results if r.error_code]
