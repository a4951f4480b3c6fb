"""CreatePartitions, carried out by the replicator in its controller role (Kafka's
``ControllerApis.createPartitions`` in front of the quorum controller).

    CreatePartitions Request => [topics] timeout_ms validate_only
      topics => name count [assignments => [broker_ids]]
    CreatePartitions Response => throttle_time_ms [results]
      results => name error_code error_message

Partition counts only grow; new partitions are placed like a new topic's unless the request
assigns them. The handler answers names given twice (INVALID_REQUEST) and illegal names; the
controller judges the rest (unknown topics, counts, assignments). A replicator that cannot be
reached leaves the topics REQUEST_TIMED_OUT. A topic the principal may not ALTER is
TOPIC_AUTHORIZATION_FAILED, whether it exists or not. After a change the metadata cache is
reloaded, so a Metadata request that follows on this handler sees the new partitions.
"""

from __future__ import annotations

from collections import Counter

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import Controller
from ..metadata_cache import MetadataCache
from ..request_context import RequestContext
from ..topic_identity import invalid_name_reason
from .topics import controller_results, controller_timeout

CreatePartitionsTopic = k.CreatePartitionsRequest.CreatePartitionsTopic
CreatePartitionsResult = k.CreatePartitionsResponse.CreatePartitionsTopicResult


class CreatePartitionsApi:
    def __init__(self, cache: MetadataCache, admin: Controller) -> None:
        self._cache = cache
        self._admin = admin

    async def handle(self, request: k.CreatePartitionsRequest,
                     context: RequestContext) -> k.CreatePartitionsResponse:
        counts = Counter(t.name for t in request.topics)
        answers: dict[str, CreatePartitionsResult] = {}
        to_grow: list[CreatePartitionsTopic] = []
        for topic in request.topics:
            if topic.name in answers:
                continue
            if counts[topic.name] > 1:
                answers[topic.name] = CreatePartitionsResult(
                    name=topic.name, error_code=ErrorCode.invalid_request.value,
                    error_message="Duplicate topic in request.")
                continue
            denied = context.access.check(Operation.ALTER, ResourceType.TOPIC, topic.name)
            if denied:
                answers[topic.name] = CreatePartitionsResult(name=topic.name, error_code=denied)
                continue
            reason = invalid_name_reason(topic.name)
            if reason is not None:
                answers[topic.name] = CreatePartitionsResult(
                    name=topic.name, error_code=ErrorCode.invalid_topic_exception.value,
                    error_message=reason)
                continue
            answers[topic.name] = CreatePartitionsResult(name=topic.name, error_code=0)
            to_grow.append(topic)
        if to_grow:
            answers.update(await self._grow(to_grow, request))
        names = dict.fromkeys(t.name for t in request.topics)
        return k.CreatePartitionsResponse(results=[answers[n] for n in names])

    async def _grow(self, topics: list[CreatePartitionsTopic],
                    request: k.CreatePartitionsRequest) -> dict[str, CreatePartitionsResult]:
        # Null assignments (or none given): the controller places the new partitions.
        increases = replicator_pb2.CreatePartitionsRequest(
            validate_only=request.validate_only, topics=[replicator_pb2.PartitionIncrease(
                topic=t.name, count=t.count,
                assignments=[replicator_pb2.Replicas(node_ids=a.broker_ids)
                             for a in t.assignments])
                for t in topics])
        results = await controller_results(
            self._cache, self._admin.create_partitions(
                increases, controller_timeout(request.timeout_ms)),
            [t.name for t in topics], request.validate_only)
        return {name: CreatePartitionsResult(name=name, error_code=r.error_code,
                                             error_message=r.error_message or None)
                for name, r in results.items()}
