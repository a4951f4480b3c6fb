"""WriteTxnMarkers: end transactions on partitions, as a partition leader does for a transaction
coordinator (Kafka's ``KafkaApis.handleWriteTxnMarkersRequest``). Kafka clients send it to abort
a hanging transaction (the admin client's ``abortTransaction``, with the producer and
coordinator epochs DescribeProducers reported); this cluster's own transaction coordinator
writes its markers on the log nodes directly (:mod:`..transactions.markers`).

    WriteTxnMarkers Request => [markers => producer_id producer_epoch transaction_result
                                [topics => name [partition_indexes]] coordinator_epoch
                                transaction_version (v2)]
    WriteTxnMarkers Response => [markers => producer_id [topics => name
                                 [partitions => partition_index error_code]]]

Each partition's marker is written by its leader log node and answered once replicated (as an
acks=all append: REQUEST_TIMED_OUT after :data:`REPLICATION_TIMEOUT_MS`, Kafka's
request.timeout.ms). A partition the cluster does not have is UNKNOWN_TOPIC_OR_PARTITION;
the leader's refusals come back as it gives them (INVALID_PRODUCER_EPOCH for an epoch older
than the producer's there, TRANSACTION_COORDINATOR_FENCED for an older coordinator epoch,
NOT_LEADER_OR_FOLLOWER). A principal without ALTER or CLUSTER_ACTION on the cluster gets
CLUSTER_AUTHORIZATION_FAILED for every partition. As Kafka's response is keyed by producer id,
markers of one producer are answered together.
"""

from __future__ import annotations

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, ResourceType
from services.common.error_answers import error_response

from ..collaborators import LogNodes, Purgatory
from ..metadata_cache import MetadataCache
from ..request_context import RequestContext
from ..transactions.markers import Marker, write_markers

REPLICATION_TIMEOUT_MS = 30_000

MarkerResult = k.WriteTxnMarkersResponse.WritableTxnMarkerResult


class WriteTxnMarkersApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes, purgatory: Purgatory, *,
                 leader_wait_ms: int = 0) -> None:
        self._cache = cache
        self._log_nodes = log_nodes
        self._purgatory = purgatory
        self._leader_wait_ms = leader_wait_ms

    async def handle(self, request: k.WriteTxnMarkersRequest,
                     context: RequestContext) -> k.WriteTxnMarkersResponse:
        markers = [Marker(producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                          committed=m.transaction_result, coordinator_epoch=m.coordinator_epoch,
                          partitions=frozenset((t.name, p) for t in m.topics
                                               for p in t.partition_indexes))
                   for m in request.markers]
        denied = context.access.check_any((Operation.ALTER, Operation.CLUSTER_ACTION),
                                          ResourceType.CLUSTER)
        if denied:
            return error_response(request, denied)  # type: ignore[no-any-return]
        errors = await write_markers(self._cache, self._log_nodes, self._purgatory, markers,
                                     REPLICATION_TIMEOUT_MS,
                                     self._leader_wait_ms) if markers else []
        by_producer: dict[int, dict[str, dict[int, int]]] = {}
        for marker, answered in zip(request.markers, errors, strict=True):
            topics = by_producer.setdefault(marker.producer_id, {})
            for topic in marker.topics:
                for partition in topic.partition_indexes:
                    topics.setdefault(topic.name, {})[partition] = answered[
                        (topic.name, partition)]
        return k.WriteTxnMarkersResponse(markers=[
            MarkerResult(producer_id=producer_id, topics=[
                {"name": name, "partitions": [{"partition_index": p, "error_code": error}
                                              for p, error in partitions.items()]}
                for name, partitions in topics.items()])
            for producer_id, topics in by_producer.items()])
