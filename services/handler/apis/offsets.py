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
log up to the high watermark (isolation_level 0, read_uncommitted) or the last stable offset
(1, read_committed: latest is then the last stable offset); anyone else sees it to its end.
The latest offset comes with the partition's current leader epoch.
A partition named twice in one request is INVALID_REQUEST. A topic the principal may not
DESCRIBE is TOPIC_AUTHORIZATION_FAILED, whether it exists or not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.acls import Operation, ResourceType
from services.common.error_answers import error_response
from services.common.errors import ErrorCode, KafkaError

from ..collaborators import LogNodes
from ..metadata_cache import LogNode, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from ..routing import Route, call_leaders, locate

CONSUMER_REPLICA_ID = -1
READ_COMMITTED = 1
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
EARLIEST_LOCAL_TIMESTAMP = -4
LIST_OFFSETS_TIMEOUT_S = 10.0

PartitionOffset = k.ListOffsetsResponse.ListOffsetsPartitionResponse


@dataclass(slots=True)
class _Slot:
    request: k.ListOffsetsRequest.ListOffsetsPartition
    topic: str
    answer: PartitionOffset | None = None
    # The partition's leader epoch in this handler's metadata.
    leader_epoch: int = -1


class ListOffsetsApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes) -> None:
        self._cache = cache
        self._log_nodes = log_nodes

    async def handle(
        self, request: k.ListOffsetsRequest, context: RequestContext
    ) -> k.ListOffsetsResponse:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return error_response(request, ErrorCode.not_leader_or_follower.value)
        seen = Counter((t.name, p.partition_index) for t in request.topics for p in t.partitions)
        rows: list[list[_Slot]] = []
        routed: list[tuple[Route, _Slot]] = []
        for topic in request.topics:
            info = metadata.topic(topic.name)
            denied = context.access.check(Operation.DESCRIBE, ResourceType.TOPIC, topic.name)
            row = []
            for p in topic.partitions:
                slot = _Slot(p, topic.name)
                row.append(slot)
                if denied:
                    slot.answer = _failed(p, denied)
                    continue
                if seen[(topic.name, p.partition_index)] > 1:
                    slot.answer = _failed(p, ErrorCode.invalid_request.value)
                    continue
                try:
                    route = locate(metadata, info, p.partition_index, p.current_leader_epoch)
                except KafkaError as exc:
                    slot.answer = _failed(p, exc.errno)
                    continue
                slot.leader_epoch = route.partition.leader_epoch
                routed.append((route, slot))
            rows.append(row)

        # An unset replica id (a hand-made request) is a consumer's.
        consumer = request.replica_id == CONSUMER_REPLICA_ID or not request.HasField("replica_id")
        limit = log_pb2.READ_LIMIT_LOG_END
        if consumer:
            limit = log_pb2.READ_LIMIT_LAST_STABLE if request.isolation_level == READ_COMMITTED \
                else log_pb2.READ_LIMIT_HIGH_WATERMARK

        async def list_on(node: LogNode, slots: list[_Slot]) -> Sequence[Any]:
            queries = log_pb2.ListOffsetsRequest(limit=limit, partitions=[
                log_pb2.PartitionTimestamp(topic=s.topic, partition=s.request.partition_index,
                                           timestamp=_log_timestamp(s.request.timestamp))
                for s in slots])
            answer = await self._log_nodes.list_offsets(node, queries, LIST_OFFSETS_TIMEOUT_S)
            return answer.results

        for s, code, result in await call_leaders(routed, list_on, effect=False):
            if code:
                s.answer = _failed(s.request, code)
                continue
            epoch = result.leader_epoch
            if s.request.timestamp == LATEST_TIMESTAMP and consumer:
                epoch = s.leader_epoch
            s.answer = PartitionOffset(partition_index=s.request.partition_index,
                                       timestamp=result.timestamp, offset=result.offset,
                                       leader_epoch=epoch)

        response = k.ListOffsetsResponse()
        for t, row in zip(request.topics, rows, strict=True):
            response.topics.add(name=t.name, partitions=[
                s.answer or _failed(s.request, ErrorCode.unknown_server_error.value)
                for s in row])
        return response


def _log_timestamp(timestamp: int) -> int:
    """The log node's timestamp for a Kafka one: every segment is local, so the earliest local
    offset is the earliest offset."""
    return EARLIEST_TIMESTAMP if timestamp == EARLIEST_LOCAL_TIMESTAMP else timestamp


def _failed(request: k.ListOffsetsRequest.ListOffsetsPartition, code: int) -> PartitionOffset:
    """Unknown timestamp, offset and leader epoch: unset, -1."""
    return PartitionOffset(partition_index=request.partition_index, error_code=code)
