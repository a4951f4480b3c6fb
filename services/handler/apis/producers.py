"""DescribeProducers: the active producers of partitions, from their leaders' producer state
(Kafka's ``KafkaApis.handleDescribeProducersRequest`` with ``ReplicaManager.activeProducerState``;
admin clients use it to find hanging transactions).

    DescribeProducers Request => [topics => name [partition_indexes]]
    DescribeProducers Response => throttle_time_ms [topics => name [partitions =>
                                  partition_index error_code error_message
                                  [active_producers => producer_id producer_epoch
                                   last_sequence last_timestamp coordinator_epoch
                                   current_txn_start_offset]]]

Each partition is asked of its leader log node (``LogService.DescribeProducers``), one call per
node, the nodes concurrently. A topic name that is not a legal one is INVALID_TOPIC_EXCEPTION
(with Kafka's reason), one the principal may not READ TOPIC_AUTHORIZATION_FAILED, an unknown
topic or partition UNKNOWN_TOPIC_OR_PARTITION, a partition
without a live leader (or one whose leader no longer leads it) NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode, KafkaError

from ..collaborators import LogNodes
from ..metadata_cache import LogNode, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from ..routing import Route, call_leaders, locate
from ..topic_identity import invalid_name_reason

DESCRIBE_TIMEOUT_S = 10.0

PartitionResponse = k.DescribeProducersResponse.PartitionResponse


def _failed(partition: int, code: int, message: str | None = None) -> PartitionResponse:
    return PartitionResponse(partition_index=partition, error_code=code, error_message=message)


class DescribeProducersApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes) -> None:
        self._cache = cache
        self._log_nodes = log_nodes

    async def handle(self, request: k.DescribeProducersRequest,
                     context: RequestContext) -> k.DescribeProducersResponse:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            metadata = None
        answers: dict[tuple[str, int], PartitionResponse] = {}
        routed: list[tuple[Route, tuple[str, int]]] = []
        for topic in request.topics:
            reason = invalid_name_reason(topic.name)
            denied = context.access.check(Operation.READ, ResourceType.TOPIC, topic.name)
            for index in topic.partition_indexes:
                tp = (topic.name, index)
                if reason is not None:
                    answers[tp] = _failed(index, ErrorCode.invalid_topic_exception.value, reason)
                    continue
                if denied:
                    answers[tp] = _failed(index, denied)
                    continue
                if metadata is None:
                    answers[tp] = _failed(index, ErrorCode.not_leader_or_follower.value)
                    continue
                try:
                    routed.append((locate(metadata, metadata.topic(topic.name), index), tp))
                except KafkaError as exc:
                    answers[tp] = _failed(index, exc.errno, exc.message)

        async def describe_on(node: LogNode, items: list[tuple[str, int]]) -> Sequence[Any]:
            question = log_pb2.DescribeProducersRequest(partitions=[
                log_pb2.TopicPartition(topic=t, partition=p) for t, p in items])
            return (await self._log_nodes.describe_producers(node, question,
                                                             DESCRIBE_TIMEOUT_S)).results

        for tp, code, result in await call_leaders(routed, describe_on, effect=False):
            if code:
                message = result.error_message if isinstance(
                    result, log_pb2.PartitionProducers) else None
                answers[tp] = _failed(tp[1], code, message or None)
                continue
            answers[tp] = PartitionResponse(partition_index=tp[1], error_code=0, active_producers=[
                k.DescribeProducersResponse.ProducerState(
                    producer_id=p.producer_id, producer_epoch=p.producer_epoch,
                    last_sequence=p.last_sequence, last_timestamp=p.last_timestamp,
                    coordinator_epoch=p.coordinator_epoch,
                    current_txn_start_offset=p.current_txn_start_offset)
                for p in result.active_producers])
        response = k.DescribeProducersResponse()
        for topic in request.topics:
            response.topics.add(name=topic.name, partitions=[
                answers[(topic.name, index)] for index in topic.partition_indexes])
        return response
