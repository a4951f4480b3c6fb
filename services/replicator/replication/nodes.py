"""What replication needs from the log nodes, as domain types: long-poll reads on leaders,
follower appends, high watermark updates, replica states and descriptions.

:class:`ReplicaNodes` is implemented over gRPC by
:class:`services.replicator.log_nodes.GrpcLogNodes`; tests may substitute fakes. A call that
fails as a whole raises :class:`~services.replicator.log_nodes.LogNodeError`; per-partition
failures come back in the results as Kafka error codes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from services.common.errors import ErrorCode

from ..metadata import NodeId, PartitionRegistration

if TYPE_CHECKING:
    from ..log_nodes import PartitionFailure, PartitionSpec

NO_OFFSET = -1

TopicPartition = tuple[str, int]


class Role(enum.Enum):
    """A replica's role as its log node reports it (UNKNOWN: not told since it restarted)."""

    UNKNOWN = "unknown"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaState:
    """The state the replicator gives one replica (Kafka's LeaderAndIsr for one partition)."""

    topic: str
    partition: int
    role: Role
    leader_epoch: int
    # A leader that is the only in-sync replica commits its own appends.
    in_sync_alone: bool = False


def replica_state(topic: str, partition: PartitionRegistration, node: NodeId) -> ReplicaState:
    """The state ``node``'s replica of ``partition`` should have."""
    if node == partition.leader:
        return ReplicaState(topic=topic, partition=partition.partition, role=Role.LEADER,
                            leader_epoch=partition.leader_epoch,
                            in_sync_alone=tuple(partition.isr) == (node,))
    return ReplicaState(topic=topic, partition=partition.partition, role=Role.FOLLOWER,
                        leader_epoch=partition.leader_epoch)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResult:
    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    records: bytes = b""
    log_start_offset: int = NO_OFFSET
    log_end_offset: int = NO_OFFSET
    high_watermark: int = NO_OFFSET


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicateRequest:
    topic: str
    partition: int
    leader_epoch: int
    records: bytes
    high_watermark: int = NO_OFFSET
    log_start_offset: int = NO_OFFSET


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicateResult:
    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    message: str = ""
    log_end_offset: int = NO_OFFSET
    high_watermark: int = NO_OFFSET


@dataclass(frozen=True, slots=True, kw_only=True)
class HighWatermarkUpdate:
    topic: str
    partition: int
    leader_epoch: int
    high_watermark: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaDescription:
    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    log_end_offset: int = NO_OFFSET
    high_watermark: int = NO_OFFSET
    leader_epoch: int = -1
    role: Role = Role.UNKNOWN
    # The newest epoch in the replica's leader epoch cache (-1: none).
    latest_log_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochEndOffset:
    """OffsetForLeaderEpoch for one partition: the largest epoch <= the one asked about that
    the log knows, and where the epoch after it starts (-1, -1: unknown)."""

    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    leader_epoch: int = -1
    end_offset: int = NO_OFFSET


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionError:
    topic: str
    partition: int
    error: ErrorCode
    message: str = ""


class ReplicaNodes(Protocol):
    async def fetch(
        self, node_id: NodeId, requests: Sequence[FetchRequest], *, max_wait_ms: int,
        max_bytes: int, partition_max_bytes: int,
    ) -> list[FetchResult]:
        """Read up to the log end from ``offset`` on (whole batches), waiting up to
        ``max_wait_ms`` for data when there is none."""
        ...

    async def replicate(
        self, node_id: NodeId, requests: Sequence[ReplicateRequest]
    ) -> list[ReplicateResult]:
        """Follower appends of the leader's batches."""
        ...

    async def update_high_watermarks(
        self, node_id: NodeId, updates: Sequence[HighWatermarkUpdate]
    ) -> list[PartitionError]:
        """Move replicas' high watermarks; returns the partitions that refused."""
        ...

    async def update_replica_states(
        self, node_id: NodeId, states: Sequence[ReplicaState]
    ) -> list[PartitionError]:
        """Give replicas their state; returns the partitions that refused."""
        ...

    async def describe(
        self, node_id: NodeId, partitions: Sequence[TopicPartition]
    ) -> list[ReplicaDescription]:
        """The offsets, epoch and role of replicas on the node."""
        ...

    async def end_offsets(
        self, node_id: NodeId, requests: Sequence[tuple[str, int, int]]
    ) -> list[EpochEndOffset]:
        """OffsetForLeaderEpoch for (topic, partition, leader epoch) each."""
        ...

    async def truncate(
        self, node_id: NodeId, requests: Sequence[tuple[str, int, int]],
        *, start_over: bool = False,
    ) -> list[ReplicateResult]:
        """Cut (topic, partition) replicas back to an offset each; with ``start_over``, drop
        their logs and continue empty at that offset."""
        ...

    async def create_partitions(
        self, node_id: NodeId, specs: Sequence[PartitionSpec]
    ) -> list[PartitionFailure]:
        """Create replicas (with their state) on the node; see
        :class:`~services.replicator.log_nodes.LogNodeClient`."""
        ...
