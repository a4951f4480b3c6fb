"""ListOffsets: offsets by timestamp, from the partitions' leaders (Kafka's
``KafkaApis.handleListOffsetRequest``, v1 and later).

    ListOffsets Request => replica_id isolation_level [topics] timeout_ms
      topics => name [partitions]
        partitions => partition_index current_leader_epoch timestamp
    ListOffsets Response => throttle_time_ms [topics]
      topics => name [partitions]
        partitions => partition_index error_code timestamp offset leader_epoch

Timestamps: -1 latest, -2 earliest, -3 the record with the largest timestamp, -4 earliest
local (the same as earliest: every segment is local), else the first offset whose timestamp is
at or after the given time (offset -1 when there is none). Consumers (replica id -1) see the
log up to the high watermark, which is also the last stable offset (no transactions); anyone
else sees it to its end. The latest offset comes with the partition's current leader epoch.
A partition named twice in one request is INVALID_REQUEST.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.errors import ErrorCode, KafkaError

from ..collaborators import CallError, LogNodes, OffsetQuery, OffsetResult, ReadLimit
from ..metadata_cache import LogNode, MetadataCache, MetadataUnavailableError
from ..routing import (
    Route,
    by_partition,
    call_per_node,
    group_by_leader,
    leader_epoch_error,
    leader_error,
    locate,
)

log = logging.getLogger(__name__)

CONSUMER_REPLICA_ID = -1
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
EARLIEST_LOCAL_TIMESTAMP = -4
LIST_OFFSETS_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartition:
    partition_index: int
    timestamp: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopic:
    name: str
    partitions: Sequence[ListOffsetsPartition] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsRequest:
    replica_id: int = CONSUMER_REPLICA_ID
    isolation_level: int = 0
    topics: Sequence[ListOffsetsTopic] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionOffset:
    partition_index: int
    error_code: int = 0
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicOffsets:
    name: str
    partitions: list[PartitionOffset] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsResponse:
    topics: list[TopicOffsets] = field(default_factory=list)


def error_response(request: ListOffsetsRequest, code: int) -> ListOffsetsResponse:
    """Every partition of ``request`` failed with ``code``."""
    return ListOffsetsResponse(topics=[
        TopicOffsets(name=t.name, partitions=[
            PartitionOffset(partition_index=p.partition_index, error_code=code)
            for p in t.partitions])
        for t in request.topics
    ])


@dataclass(slots=True)
class _Slot:
    request: ListOffsetsPartition
    topic: str
    answer: PartitionOffset | None = None


class ListOffsetsApi:
    def __init__(
        self, cache: MetadataCache, log_nodes: LogNodes, *,
        timeout: float = LIST_OFFSETS_TIMEOUT_S,
    ) -> None:
        self._cache = cache
        self._log_nodes = log_nodes
        self._timeout = timeout

    async def handle(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return error_response(request, ErrorCode.not_leader_or_follower.value)
        seen = Counter((t.name, p.partition_index) for t in request.topics for p in t.partitions)
        rows: list[list[_Slot]] = []
        routed: list[tuple[Route, _Slot]] = []
        for topic in request.topics:
            info = metadata.topic(topic.name)
            row = []
            for p in topic.partitions:
                slot = _Slot(p, topic.name)
                row.append(slot)
                if seen[(topic.name, p.partition_index)] > 1:
                    slot.answer = _failed(p, ErrorCode.invalid_request.value)
                    continue
                try:
                    route = locate(metadata, info, p.partition_index)
                except KafkaError as exc:
                    slot.answer = _failed(p, exc.errno)
                    continue
                epoch_error = leader_epoch_error(p.current_leader_epoch,
                                                 route.partition.leader_epoch)
                if epoch_error is not None:
                    slot.answer = _failed(p, epoch_error.value)
                    continue
                routed.append((route, slot))
            rows.append(row)

        consumer = request.replica_id == CONSUMER_REPLICA_ID
        limit = ReadLimit.HIGH_WATERMARK if consumer else ReadLimit.LOG_END
        groups = group_by_leader(routed)
        epochs = {(r.topic.name, s.request.partition_index): r.partition.leader_epoch
                  for r, s in routed}

        async def list_on(node: LogNode, slots: list[_Slot]) -> list[OffsetResult]:
            queries = [OffsetQuery(topic=s.topic, partition=s.request.partition_index,
                                   timestamp=_log_timestamp(s.request.timestamp))
                       for s in slots]
            return await self._log_nodes.list_offsets(node, queries, limit, self._timeout)

        outcomes = await call_per_node(groups, list_on)
        for node_id, (_node, slots) in groups.items():
            outcome = outcomes[node_id]
            if isinstance(outcome, Exception):
                if isinstance(outcome, CallError):
                    log.info("listing offsets failed: %s", outcome)
                else:
                    log.error("listing offsets failed unexpectedly", exc_info=outcome)
                for s in slots:
                    s.answer = _failed(s.request, ErrorCode.not_leader_or_follower.value)
                continue
            results = by_partition(outcome, lambda r: (r.topic, r.partition))
            for s in slots:
                key = (s.topic, s.request.partition_index)
                result = results.get(key)
                if result is None:
                    s.answer = _failed(s.request, ErrorCode.unknown_server_error.value)
                elif result.error_code:
                    s.answer = _failed(s.request, leader_error(result.error_code))
                else:
                    epoch = result.leader_epoch
                    if s.request.timestamp == LATEST_TIMESTAMP and consumer:
                        epoch = epochs[key]
                    s.answer = PartitionOffset(
                        partition_index=s.request.partition_index,
                        timestamp=result.timestamp, offset=result.offset, leader_epoch=epoch)

        return ListOffsetsResponse(topics=[
            TopicOffsets(name=t.name, partitions=[
                s.answer or _failed(s.request, ErrorCode.unknown_server_error.value)
                for s in row])
            for t, row in zip(request.topics, rows, strict=True)
        ])


def _log_timestamp(timestamp: int) -> int:
    """The log node's timestamp for a Kafka one: every segment is local, so the earliest local
    offset is the earliest offset."""
    return EARLIEST_TIMESTAMP if timestamp == EARLIEST_LOCAL_TIMESTAMP else timestamp


def _failed(request: ListOffsetsPartition, code: int) -> PartitionOffset:
    return PartitionOffset(partition_index=request.partition_index, error_code=code)
