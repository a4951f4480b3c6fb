"""Responses the frontend builds itself when no handler answered a request: the request's own
topics and partitions, each carrying one error code, the way Kafka's broker answers a request
it failed to complete (``AbstractRequest.getErrorResponse``).

Two kinds of failure reach here:

- the outcome is unknown (a handler took the request and then died or missed the deadline):
  the request may or may not have taken effect, so mutating APIs answer REQUEST_TIMED_OUT, the
  code the Java broker gives for an operation whose result it cannot tell;
- no handler could be reached at all: read-only APIs answer the retriable code that makes a
  client refresh its metadata and try again (:data:`UNAVAILABLE_CODES`).

Metadata has no such answer: a response without brokers leaves a client with nowhere to send
anything, and one naming brokers or leaders the frontend does not know would be a lie. The
frontend therefore closes the connection, which every client handles as a broker that went
away (reconnect, with back-off, to its bootstrap servers). :func:`error_response` returns None
for it.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import Message
from kio.schema.errors import ErrorCode

from kbroker.kafka.v1 import kafka_pb2 as k

# The retriable code a read-only API answers when no handler is reachable.
UNAVAILABLE_CODES: dict[int, ErrorCode] = {
    1: ErrorCode.not_leader_or_follower,     # Fetch: refresh metadata, fetch again
    2: ErrorCode.not_leader_or_follower,     # ListOffsets: likewise
    32: ErrorCode.request_timed_out,         # DescribeConfigs: likewise
    60: ErrorCode.request_timed_out,         # DescribeCluster: retried by the admin client
}


def _set(message: Message, *names: str) -> dict[str, object]:
    """The fields of ``message`` among ``names`` that are set, to copy into an answer."""
    return {n: getattr(message, n) for n in names if message.HasField(n)}


def _produce(request: k.ProduceRequest, code: int) -> k.ProduceResponse:
    return k.ProduceResponse(responses=[
        dict(_set(topic, "name", "topic_id"), partition_responses=[
            {"index": p.index, "error_code": code, "base_offset": -1, "log_start_offset": -1}
            for p in topic.partition_data
        ])
        for topic in request.topic_data
    ])


def _fetch(request: k.FetchRequest, code: int) -> k.FetchResponse:
    # Session id 0: whatever fetch session the client had is over; its next fetch is full.
    return k.FetchResponse(error_code=0, session_id=0, responses=[
        dict(_set(topic, "topic", "topic_id"), partitions=[
            {"partition_index": p.partition, "error_code": code, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1}
            for p in topic.partitions
        ])
        for topic in request.topics
    ])


def _list_offsets(request: k.ListOffsetsRequest, code: int) -> k.ListOffsetsResponse:
    return k.ListOffsetsResponse(topics=[
        {"name": topic.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": code, "timestamp": -1,
             "offset": -1, "leader_epoch": -1}
            for p in topic.partitions
        ]}
        for topic in request.topics
    ])


def _create_topics(request: k.CreateTopicsRequest, code: int) -> k.CreateTopicsResponse:
    return k.CreateTopicsResponse(topics=[
        {"name": topic.name, "error_code": code, "num_partitions": -1, "replication_factor": -1}
        for topic in request.topics
    ])


def _delete_topics(request: k.DeleteTopicsRequest, code: int) -> k.DeleteTopicsResponse:
    # Versions before 6 name topics in topic_names, later ones in topics (name or id).
    results = [{"name": name, "error_code": code} for name in request.topic_names]
    results += [dict(_set(topic, "name", "topic_id"), error_code=code)
                for topic in request.topics]
    return k.DeleteTopicsResponse(responses=results)


def _delete_records(request: k.DeleteRecordsRequest, code: int) -> k.DeleteRecordsResponse:
    return k.DeleteRecordsResponse(topics=[
        {"name": topic.name, "partitions": [
            {"partition_index": p.partition_index, "low_watermark": -1, "error_code": code}
            for p in topic.partitions
        ]}
        for topic in request.topics
    ])


def _offset_for_leader_epoch(
    request: k.OffsetForLeaderEpochRequest, code: int
) -> k.OffsetForLeaderEpochResponse:
    return k.OffsetForLeaderEpochResponse(topics=[
        {"topic": topic.topic, "partitions": [
            {"partition": p.partition, "error_code": code, "leader_epoch": -1,
             "end_offset": -1}
            for p in topic.partitions
        ]}
        for topic in request.topics
    ])


def _describe_cluster(request: k.DescribeClusterRequest, code: int) -> k.DescribeClusterResponse:
    return k.DescribeClusterResponse(error_code=code, cluster_id="", controller_id=-1)


def _describe_configs(
    request: k.DescribeConfigsRequest, code: int
) -> k.DescribeConfigsResponse:
    return k.DescribeConfigsResponse(results=[
        {"error_code": code, "resource_type": r.resource_type, "resource_name": r.resource_name}
        for r in request.resources
    ])


def _alter_configs(request: k.AlterConfigsRequest, code: int) -> k.AlterConfigsResponse:
    return k.AlterConfigsResponse(responses=[
        {"error_code": code, "resource_type": r.resource_type, "resource_name": r.resource_name}
        for r in request.resources
    ])


def _incremental_alter_configs(
    request: k.IncrementalAlterConfigsRequest, code: int
) -> k.IncrementalAlterConfigsResponse:
    return k.IncrementalAlterConfigsResponse(responses=[
        {"error_code": code, "resource_type": r.resource_type, "resource_name": r.resource_name}
        for r in request.resources
    ])


def _create_partitions(
    request: k.CreatePartitionsRequest, code: int
) -> k.CreatePartitionsResponse:
    return k.CreatePartitionsResponse(results=[
        {"name": t.name, "error_code": code} for t in request.topics
    ])


_BUILDERS: dict[int, Callable[[Message, int], Message]] = {
    0: _produce,  # type: ignore[dict-item]
    1: _fetch,  # type: ignore[dict-item]
    2: _list_offsets,  # type: ignore[dict-item]
    19: _create_topics,  # type: ignore[dict-item]
    20: _delete_topics,  # type: ignore[dict-item]
    21: _delete_records,  # type: ignore[dict-item]
    23: _offset_for_leader_epoch,  # type: ignore[dict-item]
    32: _describe_configs,  # type: ignore[dict-item]
    33: _alter_configs,  # type: ignore[dict-item]
    37: _create_partitions,  # type: ignore[dict-item]
    44: _incremental_alter_configs,  # type: ignore[dict-item]
    60: _describe_cluster,  # type: ignore[dict-item]
}


def error_response(api_key: int, request: Message, code: ErrorCode) -> Message | None:
    """The answer to ``request`` (its protobuf form) giving every topic/partition ``code``,
    or None when the API has no safe error answer and the connection should close instead."""
    build = _BUILDERS.get(api_key)
    return None if build is None else build(request, int(code))
