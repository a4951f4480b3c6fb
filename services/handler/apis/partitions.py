"""CreatePartitions, carried out by the replicator in its controller role (Kafka's
``ControllerApis.createPartitions`` in front of the quorum controller).

    CreatePartitions Request => [topics] timeout_ms validate_only
      topics => name count [assignments => [broker_ids]]
    CreatePartitions Response => throttle_time_ms [results]
      results => name error_code error_message

Partition counts only grow; new partitions are placed like a new topic's unless the request
assigns them. The handler answers names given twice (INVALID_REQUEST) and illegal names; the
controller judges the rest (unknown topics, counts, assignments). A replicator that cannot be
reached leaves the topics REQUEST_TIMED_OUT. After a change the metadata cache is reloaded, so
a Metadata request that follows on this handler sees the new partitions.
"""

from __future__ import annotations

import logging
from collections import Counter

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import MetadataCache
from ..request_context import RequestContext
from ..topic_identity import invalid_name_reason
from .topics import controller_timeout

log = logging.getLogger(__name__)

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
        try:
            results = (await self._admin.create_partitions(
                increases, controller_timeout(request.timeout_ms))).topics
        except CallError as exc:
            log.warning("creating partitions failed: %s", exc)
            return {t.name: CreatePartitionsResult(
                name=t.name, error_code=ErrorCode.request_timed_out.value,
                error_message=f"the controller did not answer: {exc}") for t in topics}
        by_name = {r.name: r for r in results}
        answers = {}
        for topic in topics:
            result = by_name.get(topic.name)
            if result is None:
                answers[topic.name] = CreatePartitionsResult(
                    name=topic.name, error_code=ErrorCode.unknown_server_error.value,
                    error_message="the controller returned no result for this topic")
            else:
                answers[topic.name] = CreatePartitionsResult(
                    name=topic.name, error_code=result.error_code,
                    error_message=result.error_message or None if result.error_code else None)
        if not request.validate_only and any(not r.error_code for r in results):
            await self._cache.reload()
        return answers
