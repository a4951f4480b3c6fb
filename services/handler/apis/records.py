"""DeleteRecords: move partitions' log start offsets forward, on their leaders (Kafka's
``KafkaApis.handleDeleteRecordsRequest``, v0-v2).

    DeleteRecords Request => [topics] timeout_ms
      topics => name [partitions]
        partitions => partition_index offset
    DeleteRecords Response => throttle_time_ms [topics]
      topics => name [partitions]
        partitions => partition_index low_watermark error_code

An offset of -1 means the high watermark. Each leader moves its log start offset and deletes the
segments wholly below it, answering with the new log start offset (the low watermark); an
offset beyond the high watermark is OFFSET_OUT_OF_RANGE, a topic the principal may not DELETE
TOPIC_AUTHORIZATION_FAILED (whether it exists or not), an unknown partition
UNKNOWN_TOPIC_OR_PARTITION, a leader that does not know its partition NOT_LEADER_OR_FOLLOWER.
Followers are not waited for (Kafka's DelayedDeleteRecords waits for every replica's log start
offset): the answer reflects the leader. A partition named twice keeps the last offset, as
Kafka's request map does.
"""

from __future__ import annotations

from collections.abc import Sequence
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

DELETE_RECORDS_TIMEOUT_S = 30.0

PartitionLowWatermark = k.DeleteRecordsResponse.DeleteRecordsPartitionResult


def _failed(partition: int, code: int) -> PartitionLowWatermark:
    """A partition's answer when its records were not deleted: no low watermark (-1)."""
    return PartitionLowWatermark(partition_index=partition, low_watermark=-1, error_code=code)


class DeleteRecordsApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes) -> None:
        self._cache = cache
        self._log_nodes = log_nodes

    async def handle(
        self, request: k.DeleteRecordsRequest, context: RequestContext
    ) -> k.DeleteRecordsResponse:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return error_response(request, ErrorCode.not_leader_or_follower.value)
        # The last offset asked for each partition wins; answers keep the request's order.
        # An unset offset (a hand-made request) is -1, the high watermark.
        wanted: dict[tuple[str, int], int] = {}
        for topic in request.topics:
            for p in topic.partitions:
                wanted[(topic.name, p.partition_index)] = p.offset if p.HasField("offset") else -1
        answers: dict[tuple[str, int], PartitionLowWatermark] = {}
        routed: list[tuple[Route, log_pb2.PartitionDeleteRecords]] = []
        denied = {name: context.access.check(Operation.DELETE, ResourceType.TOPIC, name)
                  for name, _ in wanted}
        for (name, index), offset in wanted.items():
            if denied[name]:
                answers[(name, index)] = _failed(index, denied[name])
                continue
            try:
                route = locate(metadata, metadata.topic(name), index)
            except KafkaError as exc:
                answers[(name, index)] = _failed(index, exc.errno)
                continue
            routed.append((route, log_pb2.PartitionDeleteRecords(topic=name, partition=index,
                                                                  offset=offset)))
        time_limit = max(request.timeout_ms, 1) / 1000 if request.timeout_ms > 0 else (
            DELETE_RECORDS_TIMEOUT_S)

        async def delete_on(node: LogNode,
                            deletions: list[log_pb2.PartitionDeleteRecords]) -> Sequence[Any]:
            message = log_pb2.DeleteRecordsRequest(partitions=deletions)
            return (await self._log_nodes.delete_records(node, message, time_limit)).results

        # A call that never arrived did nothing: clients find the leader again; one whose
        # outcome is unknown is REQUEST_TIMED_OUT, as Kafka reports it.
        for d, code, result in await call_leaders(routed, delete_on, effect=True):
            answers[(d.topic, d.partition)] = _failed(d.partition, code) if code else (
                PartitionLowWatermark(partition_index=d.partition,
                                      low_watermark=result.low_watermark))

        response = k.DeleteRecordsResponse()
        for topic in request.topics:
            seen: set[int] = set()
            row = []
            for p in topic.partitions:
                if p.partition_index in seen:
                    continue
                seen.add(p.partition_index)
                row.append(answers.get((topic.name, p.partition_index)) or _failed(
                    p.partition_index, ErrorCode.unknown_server_error.value))
            response.topics.add(name=topic.name, partitions=row)
        return response
