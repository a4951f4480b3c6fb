"""AlterPartitionReassignments and ListPartitionReassignments, carried out by the replicator in
its controller role (see :mod:`services.replicator.controller.reassignments` for what a
reassignment does).

    AlterPartitionReassignments Request => timeout_ms allow_replication_factor_change (v1)
      [topics => name [partitions => partition_index replicas (null: cancel)]]
    AlterPartitionReassignments Response => throttle_time_ms error_code error_message
      allow_replication_factor_change (v1) [responses => name [partitions => partition_index
      error_code error_message]]
    ListPartitionReassignments Request => timeout_ms [topics => name [partition_indexes]]
      (null topics: every partition)
    ListPartitionReassignments Response => throttle_time_ms error_code error_message
      [topics => name [partitions => partition_index replicas adding_replicas
      removing_replicas]]

- Alter needs ALTER on the cluster, List DESCRIBE on it: otherwise CLUSTER_AUTHORIZATION_FAILED
  (top-level, and for every partition named by Alter).
- Alter answers each partition as the controller decides (UNKNOWN_TOPIC_OR_PARTITION,
  INVALID_REPLICA_ASSIGNMENT, NO_REASSIGNMENT_IN_PROGRESS); a replicator that does not answer
  leaves them REQUEST_TIMED_OUT. The answer comes once the reassignment started, not when it
  is done: List shows it until it completes.
- List answers the partitions being reassigned, among those named (others, unknown ones
  included, are left out, as Kafka does), from metadata loaded for the request.
"""

from __future__ import annotations

import logging

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from .topics import controller_timeout

log = logging.getLogger(__name__)

AlterResponse = k.AlterPartitionReassignmentsResponse


def _alter_answer(named: list[tuple[str, int]], results: dict[tuple[str, int], tuple[int, str]],
                  allow_rf_change: bool, top_level: int = 0) -> AlterResponse:
    response = AlterResponse(error_code=top_level,
                             allow_replication_factor_change=allow_rf_change)
    by_topic: dict[str, AlterResponse.ReassignableTopicResponse] = {}
    for topic, partition in named:
        code, message = results[(topic, partition)]
        entry = by_topic.get(topic)
        if entry is None:
            entry = by_topic[topic] = response.responses.add(name=topic)
        entry.partitions.add(partition_index=partition, error_code=code,
                             error_message=message or None)
    return response


class AlterPartitionReassignmentsApi:
    def __init__(self, cache: MetadataCache, admin: Controller) -> None:
        self._cache = cache
        self._admin = admin

    async def handle(self, request: k.AlterPartitionReassignmentsRequest,
                     context: RequestContext) -> AlterResponse:
        allow = request.allow_replication_factor_change
        named = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
        denied = context.access.check(Operation.ALTER, ResourceType.CLUSTER)
        if denied:
            return _alter_answer(named, dict.fromkeys(named, (denied, "")), allow,
                                 top_level=denied)
        call = replicator_pb2.AlterPartitionReassignmentsRequest(
            allow_replication_factor_change=allow, reassignments=[
                replicator_pb2.Reassignment(topic=t.name, partition=p.partition_index,
                                            replicas=p.replicas, cancel=p.replicas_is_null)
                for t in request.topics for p in t.partitions])
        try:
            answer = await self._admin.alter_partition_reassignments(
                call, controller_timeout(request.timeout_ms))
        except CallError as exc:
            log.warning("the controller did not answer: %s", exc)
            failed = (ErrorCode.request_timed_out.value, f"the controller did not answer: {exc}")
            return _alter_answer(named, dict.fromkeys(named, failed), allow)
        results = {(r.topic, r.partition): (r.error_code, r.error_message)
                   for r in answer.results}
        if any(code == 0 for code, _ in results.values()):
            await self._cache.reload()
        return _alter_answer(named, results, allow)


class ListPartitionReassignmentsApi:
    def __init__(self, cache: MetadataCache) -> None:
        self._cache = cache

    async def handle(self, request: k.ListPartitionReassignmentsRequest,
                     context: RequestContext) -> k.ListPartitionReassignmentsResponse:
        denied = context.access.check(Operation.DESCRIBE, ResourceType.CLUSTER)
        if denied:
            return k.ListPartitionReassignmentsResponse(error_code=denied)
        try:
            snapshot = await self._cache.refresh()
        except MetadataUnavailableError as exc:
            return k.ListPartitionReassignmentsResponse(
                error_code=ErrorCode.request_timed_out.value, error_message=str(exc))
        wanted = None if request.topics_is_null else {
            (t.name, p) for t in request.topics for p in t.partition_indexes}
        response = k.ListPartitionReassignmentsResponse(error_code=0)
        for name in sorted(snapshot.topics):
            topic = snapshot.topics[name]
            entry = None
            for index in sorted(topic.partitions):
                p = topic.partitions[index]
                if not (p.adding_replicas or p.removing_replicas):
                    continue
                if wanted is not None and (name, index) not in wanted:
                    continue
                if entry is None:
                    entry = response.topics.add(name=name)
                entry.partitions.add(partition_index=index, replicas=p.replicas,
                                     adding_replicas=p.adding_replicas,
                                     removing_replicas=p.removing_replicas)
        return response
