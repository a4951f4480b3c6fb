"""DescribeLogDirs: the log directory of the broker the client asked (Kafka's
``KafkaApis.handleDescribeLogDirs`` and ``ReplicaManager.describeLogDirs``).

    DescribeLogDirs Request => [topics]
      topics => topic [partitions]
    DescribeLogDirs Response => throttle_time_ms error_code [results]
      results => error_code log_dir [topics] total_bytes usable_bytes
        topics => name [partitions]
          partitions => partition_index partition_size offset_lag is_future_key

- A broker answers for its own log directories; here a broker is a log node, the one whose
  port the client used, and it has one directory: its data folder. A request through a port
  that names no broker is answered with no directory.
- The principal must be allowed to DESCRIBE the cluster: otherwise CLUSTER_AUTHORIZATION_FAILED
  (from v3; older versions get no directory, as Kafka answers them).
- Null topics: every replica in the directory; else those asked for that it holds.
- A failed directory (services.log.log_dir_failure) is KAFKA_STORAGE_ERROR, with no replicas
  and sizes -1. Sizes are the replicas' segment bytes; offset_lag how far a replica's log end
  is behind its high watermark (0 on a leader); nothing is a future replica.
- A log node that does not answer: UNKNOWN_SERVER_ERROR for the request.
"""

from __future__ import annotations

import logging

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, LogNodes
from ..metadata_cache import MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 10.0

Result = k.DescribeLogDirsResponse.DescribeLogDirsResult


class DescribeLogDirsApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes) -> None:
        self._cache = cache
        self._log_nodes = log_nodes

    async def handle(self, request: k.DescribeLogDirsRequest,
                     context: RequestContext) -> k.DescribeLogDirsResponse:
        denied = context.access.check(Operation.DESCRIBE, ResourceType.CLUSTER)
        if denied:
            return k.DescribeLogDirsResponse(error_code=denied)
        if context.broker_id is None:
            return k.DescribeLogDirsResponse(error_code=0)
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return k.DescribeLogDirsResponse(error_code=ErrorCode.unknown_server_error.value)
        node = metadata.log_nodes.get(context.broker_id)
        if node is None:
            return k.DescribeLogDirsResponse(error_code=0)
        asked = log_pb2.DescribeLogDirRequest(partitions=[] if request.topics_is_null else [
            log_pb2.TopicPartition(topic=t.topic, partition=p)
            for t in request.topics for p in t.partitions])
        if not request.topics_is_null and not asked.partitions:
            asked = None  # nothing asked for: the directory, no replicas
        try:
            description = await self._log_nodes.describe_log_dir(
                node, asked or log_pb2.DescribeLogDirRequest(), DESCRIBE_TIMEOUT_S)
        except CallError as exc:
            log.warning("log node %d did not describe its log dir: %s", node.node_id, exc)
            return k.DescribeLogDirsResponse(error_code=ErrorCode.unknown_server_error.value)
        result = Result(error_code=description.error_code, log_dir=description.path,
                        total_bytes=description.total_bytes,
                        usable_bytes=description.usable_bytes)
        if asked is not None:
            topics: dict[str, k.DescribeLogDirsResponse.DescribeLogDirsTopic] = {}
            for replica in description.replicas:
                topic = topics.get(replica.topic)
                if topic is None:
                    topic = topics[replica.topic] = result.topics.add(name=replica.topic)
                topic.partitions.add(partition_index=replica.partition,
                                     partition_size=replica.size_bytes,
                                     offset_lag=replica.offset_lag, is_future_key=False)
        return k.DescribeLogDirsResponse(error_code=0, results=[result])
