"""Responses the frontend builds itself when no handler answered a request: the request's own
topics and partitions, each carrying one error code, the way Kafka's broker answers a request
it failed to complete (``AbstractRequest.getErrorResponse``).

Two kinds of failure reach here:

- the outcome is unknown (a handler took the request and then died or missed the deadline):
  the request may or may not have taken effect, so mutating APIs answer REQUEST_TIMED_OUT, the
  code the Java broker gives for an operation whose result it cannot tell;
- no handler could be reached at all: read-only APIs answer the retriable code that makes a
  client refresh its metadata and try again (:data:`UNAVAILABLE_CODES`).

The group APIs (and InitProducerId) answer as Kafka's coordinators do when they cannot
complete an operation: a timed-out write or an unavailable coordinator is
COORDINATOR_NOT_AVAILABLE (Kafka's coordinator turns REQUEST_TIMED_OUT into it), which makes
clients look the coordinator up again and retry (:func:`failure_code`). Each answer has the
API's own shape: an error per partition (OffsetCommit, and OffsetFetch before v2), per group
(DescribeGroups, DeleteGroups, OffsetFetch v8+), per coordinator key (FindCoordinator v4+), per
member (LeaveGroup v3+) and at the top level wherever the response has one; fields a version
lacks are dropped when the answer is encoded in the client's version.

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

# APIs served by a coordinator (groups, producer ids): their failures are the coordinator's.
COORDINATOR_APIS = frozenset({8, 9, 10, 11, 12, 13, 14, 15, 16, 22, 42, 47})
# DescribeGroups' "authorized operations not asked for" (Kafka's Integer.MIN_VALUE).
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)

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


def _error_message(code: int) -> str:
    return ErrorCode(code).name.upper()


def _offset_commit(request: k.OffsetCommitRequest, code: int) -> k.OffsetCommitResponse:
    return k.OffsetCommitResponse(topics=[
        dict(_set(topic, "name", "topic_id"), partitions=[
            {"partition_index": p.partition_index, "error_code": code} for p in topic.partitions
        ])
        for topic in request.topics
    ])


def _offset_fetch(request: k.OffsetFetchRequest, code: int) -> k.OffsetFetchResponse:
    # v0-1 carry the error per partition only, v2-7 at the top level too, v8+ per group.
    def unknown(index: int) -> dict[str, object]:
        return {"partition_index": index, "committed_offset": -1,
                "committed_leader_epoch": -1, "metadata": "", "error_code": code}

    return k.OffsetFetchResponse(
        error_code=code,
        topics=[{"name": t.name, "partitions": [unknown(i) for i in t.partition_indexes]}
                for t in request.topics],
        groups=[{"group_id": g.group_id, "error_code": code, "topics": [
            dict(_set(t, "name", "topic_id"),
                 partitions=[unknown(i) for i in t.partition_indexes])
            for t in g.topics]} for g in request.groups])


def _find_coordinator(request: k.FindCoordinatorRequest,
                      code: int) -> k.FindCoordinatorResponse:
    message = _error_message(code)
    return k.FindCoordinatorResponse(
        error_code=code, error_message=message, node_id=-1, host="", port=-1,
        coordinators=[{"key": key, "node_id": -1, "host": "", "port": -1, "error_code": code,
                       "error_message": message} for key in request.coordinator_keys])


def _join_group(request: k.JoinGroupRequest, code: int) -> k.JoinGroupResponse:
    # The member keeps its id (a client rejoins with it); no generation, no protocol.
    return k.JoinGroupResponse(error_code=code, generation_id=-1, protocol_name="",
                               leader="", member_id=request.member_id, members=[],
                               skip_assignment=False)


def _sync_group(request: k.SyncGroupRequest, code: int) -> k.SyncGroupResponse:
    return k.SyncGroupResponse(error_code=code, assignment=b"")


def _heartbeat(request: k.HeartbeatRequest, code: int) -> k.HeartbeatResponse:
    return k.HeartbeatResponse(error_code=code)


def _leave_group(request: k.LeaveGroupRequest, code: int) -> k.LeaveGroupResponse:
    return k.LeaveGroupResponse(error_code=code, members=[
        dict(_set(m, "member_id", "group_instance_id"), error_code=code)
        for m in request.members
    ])


def _describe_groups(request: k.DescribeGroupsRequest,
                     code: int) -> k.DescribeGroupsResponse:
    message = _error_message(code)
    return k.DescribeGroupsResponse(groups=[
        {"group_id": group_id, "error_code": code, "error_message": message,
         "group_state": "", "protocol_type": "", "protocol_data": "", "members": [],
         "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        for group_id in request.groups
    ])


def _list_groups(request: k.ListGroupsRequest, code: int) -> k.ListGroupsResponse:
    return k.ListGroupsResponse(error_code=code, groups=[])


def _delete_groups(request: k.DeleteGroupsRequest, code: int) -> k.DeleteGroupsResponse:
    return k.DeleteGroupsResponse(results=[
        {"group_id": group_id, "error_code": code} for group_id in request.groups_names
    ])


def _offset_delete(request: k.OffsetDeleteRequest, code: int) -> k.OffsetDeleteResponse:
    # As Kafka's getErrorResponse: the group-level error alone.
    return k.OffsetDeleteResponse(error_code=code, topics=[])


def _init_producer_id(request: k.InitProducerIdRequest,
                      code: int) -> k.InitProducerIdResponse:
    return k.InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)


_BUILDERS: dict[int, Callable[[Message, int], Message]] = {
    0: _produce,  # type: ignore[dict-item]
    1: _fetch,  # type: ignore[dict-item]
    2: _list_offsets,  # type: ignore[dict-item]
    8: _offset_commit,  # type: ignore[dict-item]
    9: _offset_fetch,  # type: ignore[dict-item]
    10: _find_coordinator,  # type: ignore[dict-item]
    11: _join_group,  # type: ignore[dict-item]
    12: _heartbeat,  # type: ignore[dict-item]
    13: _leave_group,  # type: ignore[dict-item]
    14: _sync_group,  # type: ignore[dict-item]
    15: _describe_groups,  # type: ignore[dict-item]
    16: _list_groups,  # type: ignore[dict-item]
    19: _create_topics,  # type: ignore[dict-item]
    20: _delete_topics,  # type: ignore[dict-item]
    21: _delete_records,  # type: ignore[dict-item]
    22: _init_producer_id,  # type: ignore[dict-item]
    23: _offset_for_leader_epoch,  # type: ignore[dict-item]
    32: _describe_configs,  # type: ignore[dict-item]
    33: _alter_configs,  # type: ignore[dict-item]
    37: _create_partitions,  # type: ignore[dict-item]
    42: _delete_groups,  # type: ignore[dict-item]
    44: _incremental_alter_configs,  # type: ignore[dict-item]
    47: _offset_delete,  # type: ignore[dict-item]
    60: _describe_cluster,  # type: ignore[dict-item]
}


def failure_code(api_key: int, code: ErrorCode) -> ErrorCode:
    """The code an API answers for a failure the frontend would call ``code``: coordinator
    APIs say COORDINATOR_NOT_AVAILABLE where others say REQUEST_TIMED_OUT."""
    if api_key in COORDINATOR_APIS and code == ErrorCode.request_timed_out:
        return ErrorCode.coordinator_not_available
    return code


def error_response(api_key: int, request: Message, code: ErrorCode) -> Message | None:
    """The answer to ``request`` (its protobuf form) giving every item it names the code
    ``code`` stands for (:func:`failure_code`), or None when the API has no safe error answer
    and the connection should close instead."""
    build = _BUILDERS.get(api_key)
    return None if build is None else build(request, int(failure_code(api_key, code)))
