"""ElectLeaders, carried out by the replicator in its controller role (Kafka's
``KafkaApis.handleElectLeaders`` in front of the controller's ``electLeaders``).

    ElectLeaders Request => election_type [topic_partitions] timeout_ms
      topic_partitions => topic [partitions]
    ElectLeaders Response => throttle_time_ms error_code [replica_election_results]
      replica_election_results => topic [partition_result]
        partition_result => partition_id error_code error_message

- The principal must be allowed to ALTER the cluster: otherwise CLUSTER_AUTHORIZATION_FAILED,
  top-level and for every partition named.
- election_type 0 (preferred) or 1 (unclean); anything else is INVALID_REQUEST.
- Null topic_partitions: every partition, and only those where an election happened or was
  refused are answered; named partitions are each answered (ELECTION_NOT_NEEDED,
  PREFERRED_LEADER_NOT_AVAILABLE, ELIGIBLE_LEADERS_NOT_AVAILABLE,
  UNKNOWN_TOPIC_OR_PARTITION, as the controller decides; see
  services.replicator.controller.partitions.requested).
- A replicator that does not answer leaves the partitions named REQUEST_TIMED_OUT. After an
  election the metadata cache is reloaded, so a Metadata request that follows on this handler
  sees the new leaders.
"""

from __future__ import annotations

import logging

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import MetadataCache
from ..request_context import RequestContext
from .topics import controller_timeout

log = logging.getLogger(__name__)

PartitionResult = k.ElectLeadersResponse.PartitionResult
ElectionTypes = (replicator_pb2.ElectLeadersRequest.PREFERRED,
                 replicator_pb2.ElectLeadersRequest.UNCLEAN)


def _answer(named: list[tuple[str, int]], code: int, message: str | None = None,
            top_level: int = 0) -> k.ElectLeadersResponse:
    """Every named partition answered ``code``."""
    return _response({key: (code, message or "") for key in named}, top_level)


def _response(results: dict[tuple[str, int], tuple[int, str]],
              top_level: int = 0) -> k.ElectLeadersResponse:
    response = k.ElectLeadersResponse(error_code=top_level)
    by_topic: dict[str, k.ElectLeadersResponse.ReplicaElectionResult] = {}
    for (topic, partition), (code, message) in results.items():
        result = by_topic.get(topic)
        if result is None:
            result = by_topic[topic] = response.replica_election_results.add(topic=topic)
        result.partition_result.append(PartitionResult(
            partition_id=partition, error_code=code, error_message=message or None))
    return response


class ElectLeadersApi:
    def __init__(self, cache: MetadataCache, admin: Controller) -> None:
        self._cache = cache
        self._admin = admin

    async def handle(self, request: k.ElectLeadersRequest,
                     context: RequestContext) -> k.ElectLeadersResponse:
        every = request.topic_partitions_is_null
        named = [] if every else list(dict.fromkeys(
            (t.topic, p) for t in request.topic_partitions for p in t.partitions))
        denied = context.access.check(Operation.ALTER, ResourceType.CLUSTER)
        if denied:
            return _answer(named, denied, top_level=denied)
        if request.election_type not in ElectionTypes:
            return _answer(named, ErrorCode.invalid_request.value,
                           f"unknown election type {request.election_type}",
                           top_level=ErrorCode.invalid_request.value)
        call = replicator_pb2.ElectLeadersRequest(
            election_type=request.election_type, all_partitions=every,
            partitions=[replicator_pb2.PartitionRef(topic=t, partition=p) for t, p in named])
        try:
            answer = await self._admin.elect_leaders(call, controller_timeout(request.timeout_ms))
        except CallError as exc:
            log.warning("the controller did not answer: %s", exc)
            return _answer(named, ErrorCode.request_timed_out.value,
                           f"the controller did not answer: {exc}")
        results = {(r.topic, r.partition): (r.error_code, r.error_message)
                   for r in answer.results}
        if any(code == 0 for code, _ in results.values()):
            await self._cache.reload()
        return _response(results)
