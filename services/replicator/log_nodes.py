"""What the replicator asks of log nodes (the ``kbroker.log.v1`` LogService), on its generated
messages: health, creating and deleting partition replicas and updating their configs (the
controller), and replica states, replication settings, descriptions and the ISR change
stream (the replication control role; record bytes never pass through the replicator).

:class:`LogNodes` is implemented over gRPC by
:class:`~services.replicator.grpc_log_nodes.GrpcLogNodes`; tests may substitute fakes. A call
that fails as a whole raises :class:`LogNodeError`; per-partition failures come back in the
results as Kafka error codes (calls that change replicas return only the failed partitions).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Protocol

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, error_name

from .metadata import LogNode, NodeId, PartitionRegistration, TopicRegistration

NO_OFFSET = -1

TopicPartition = tuple[str, int]


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


class LogNodeError(Exception):
    """A call to a log node failed as a whole (unreachable, timed out, internal error);
    ``error`` is the Kafka error the affected topics report."""

    def __init__(self, node_id: int, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.error = error
        self.message = message


def kafka_error(code: int) -> ErrorCode:
    """A log node's error code (one this broker does not know: UNKNOWN_SERVER_ERROR)."""
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def failure_message(failure: log_pb2.PartitionError) -> str:
    return failure.error_message or error_name(failure.error_code)


def replica_state(topic: str, partition: PartitionRegistration, node: NodeId,
                  partition_epoch: int = 0) -> log_pb2.ReplicaState:
    """The state ``node``'s replica of ``partition`` should have (Kafka's LeaderAndIsr for one
    partition): leader or follower at the leader epoch, with the leader, replicas and ISR (at
    ``partition_epoch``: the metadata version where they last changed); a leader that is the
    only in-sync replica commits its own appends."""
    return log_pb2.ReplicaState(
        topic=topic, partition=partition.partition,
        role=log_pb2.REPLICA_ROLE_LEADER if node == partition.leader
        else log_pb2.REPLICA_ROLE_FOLLOWER,
        leader_epoch=partition.leader_epoch,
        in_sync_alone=node == partition.leader and tuple(partition.isr) == (node,),
        leader=partition.leader, replicas=partition.replicas, isr=partition.isr,
        partition_epoch=partition_epoch)


def partition_specs(
    topics: Iterable[TopicRegistration], nodes: Iterable[NodeId], *, with_state: bool
) -> dict[NodeId, list[log_pb2.PartitionSpec]]:
    """The replicas of ``topics`` on each of ``nodes`` holding some, with their topic's id
    and configs (and ``with_state``, the state each should have)."""
    wanted = set(nodes)
    specs: dict[NodeId, list[log_pb2.PartitionSpec]] = {}
    for topic in topics:
        for p in topic.partitions:
            for node in (n for n in p.replicas if n in wanted):
                specs.setdefault(node, []).append(log_pb2.PartitionSpec(
                    topic=topic.name, partition=p.partition, topic_id=topic.topic_id,
                    configs=topic.configs,
                    state=replica_state(topic.name, p, node) if with_state else None))
    return specs


class NodeHealth(enum.Enum):
    """What a log node's health check says: its LogService is SERVING; the node answers but
    its LogService is NOT_SERVING (its log directory failed: every replica on it is offline,
    see services.log.log_dir_failure); or no answer (down, unreachable, too slow)."""

    SERVING = "serving"
    LOG_DIR_FAILED = "log dir failed"
    UNREACHABLE = "not responding"


class LogNodes(Protocol):
    """The LogService calls the replicator makes, by node. The controller's: ``health`` (see
    :class:`NodeHealth`), ``wait_exit`` (a definite death, for fencing without waiting for the
    session timeout), creating replicas (with their
    state, if given; existing ones are confirmed), deleting them (unknown ones are no error),
    replacing their topic configs. Replication's: replica states, replication settings,
    descriptions, and the node's ISR change stream (``alter_partitions``: the node's
    requests, each answered through the returned stream's ``write``)."""

    async def health(self, node_id: NodeId) -> NodeHealth: ...

    async def wait_exit(self, node_id: NodeId) -> None:
        """Return once the node's process has certainly exited (its port refuses connections
        after a stream to it broke); a hung node never returns here."""
        ...

    async def create_partitions(self, node_id: NodeId, specs: Sequence[log_pb2.PartitionSpec]
                                ) -> list[log_pb2.PartitionError]: ...

    async def delete_partitions(self, node_id: NodeId, partitions: Sequence[TopicPartition]
                                ) -> list[log_pb2.PartitionError]: ...

    async def update_configs(self, node_id: NodeId, specs: Sequence[log_pb2.PartitionSpec]
                             ) -> list[log_pb2.PartitionError]: ...

    async def update_replica_states(self, node_id: NodeId,
                                    states: Sequence[log_pb2.ReplicaState]
                                    ) -> list[log_pb2.PartitionError]: ...

    async def update_replication_settings(self, node_id: NodeId,
                                          settings: log_pb2.ReplicationSettings) -> None: ...

    async def describe(self, node_id: NodeId, partitions: Sequence[TopicPartition]
                       ) -> Sequence[log_pb2.PartitionState]: ...

    def alter_partitions(self, node_id: NodeId) -> IsrChangeStream:
        """Open the node's ISR change stream."""
        ...

    async def close(self) -> None: ...


class IsrChangeStream(Protocol):
    """A log node's ISR change requests (``read``; None once the stream ended) and the
    answers to them (``write``); raises LogNodeError when the stream fails."""

    async def read(self) -> log_pb2.IsrChangeRequests | None: ...

    async def write(self, answers: log_pb2.IsrChangeAnswers) -> None: ...

    def cancel(self) -> None: ...
