"""OffsetForLeaderEpoch: where a leader epoch ends in the partition leader's log (Kafka's
``KafkaApis.handleOffsetForLeaderEpochRequest``), which consumers use to find out whether the
log they read was cut back after a leader change (KIP-320), and followers to find where to
cut their own (KIP-101).

    OffsetForLeaderEpoch Request => replica_id [topics]
      topics => topic [partitions]
        partitions => partition current_leader_epoch leader_epoch
    OffsetForLeaderEpoch Response => throttle_time_ms [topics]
      topics => topic [partitions]
        partitions => error_code partition leader_epoch end_offset

Each partition goes to its leader log node, which answers from its leader epoch cache: the
largest epoch it knows at or below the one asked about, and the offset where the next epoch
starts (its log end offset for the current epoch); -1, -1 when the epoch is newer than any it
knows. A partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION, one without a live
leader NOT_LEADER_OR_FOLLOWER, and a current_leader_epoch other than the leader's
FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer). Without CLUSTER_ACTION on the
cluster (a follower's right) a topic the principal may not DESCRIBE is
TOPIC_AUTHORIZATION_FAILED (KIP-320 lets consumers ask with DESCRIBE).
"""

from __future__ import annotations

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

TIMEOUT_S = 10.0

PartitionEnd = k.OffsetForLeaderEpochResponse.EpochEndOffset


@dataclass(slots=True)
class _Slot:
    topic: str
    request: k.OffsetForLeaderEpochRequest.OffsetForLeaderPartition
    answer: PartitionEnd | None = None


class OffsetForLeaderEpochApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes) -> None:
        self._cache = cache
        self._log_nodes = log_nodes

    async def handle(
        self, request: k.OffsetForLeaderEpochRequest, context: RequestContext
    ) -> k.OffsetForLeaderEpochResponse:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return error_response(request, ErrorCode.not_leader_or_follower.value)
        rows: list[list[_Slot]] = []
        routed: list[tuple[Route, _Slot]] = []
        replica = context.access.allows(Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
        for topic in request.topics:
            info = metadata.topic(topic.topic)
            denied = 0 if replica else context.access.check(
                Operation.DESCRIBE, ResourceType.TOPIC, topic.topic)
            row = []
            for p in topic.partitions:
                slot = _Slot(topic.topic, p)
                row.append(slot)
                if denied:
                    slot.answer = _failed(p, denied)
                    continue
                try:
                    routed.append((locate(metadata, info, p.partition, p.current_leader_epoch),
                                   slot))
                except KafkaError as exc:
                    slot.answer = _failed(p, exc.errno)
            rows.append(row)


        async def ask(node: LogNode, slots: list[_Slot]) -> Sequence[Any]:
            queries = log_pb2.OffsetForLeaderEpochRequest(partitions=[
                log_pb2.PartitionLeaderEpoch(topic=s.topic, partition=s.request.partition,
                                             leader_epoch=_leader_epoch(s.request))
                for s in slots])
            return (await self._log_nodes.offset_for_leader_epoch(node, queries,
                                                                  TIMEOUT_S)).results

        for s, code, result in await call_leaders(routed, ask, effect=False):
            s.answer = _failed(s.request, code) if code else PartitionEnd(
                partition=s.request.partition, leader_epoch=result.leader_epoch,
                end_offset=result.end_offset)
        response = k.OffsetForLeaderEpochResponse()
        for t, row in zip(request.topics, rows, strict=True):
            response.topics.add(topic=t.topic, partitions=[
                s.answer or _failed(s.request, ErrorCode.unknown_server_error.value)
                for s in row])
        return response


def _leader_epoch(request: k.OffsetForLeaderEpochRequest.OffsetForLeaderPartition) -> int:
    """The epoch asked about; unset (a hand-made request) is no epoch, -1."""
    return request.leader_epoch if request.HasField("leader_epoch") else -1


def _failed(request: k.OffsetForLeaderEpochRequest.OffsetForLeaderPartition,
            code: int) -> PartitionEnd:
    """Unknown leader epoch and end offset: unset, -1."""
    return PartitionEnd(partition=request.partition, error_code=code)
