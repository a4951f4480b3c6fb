"""gRPC glue for kbroker.handler.v1.KafkaHandler: Kafka protobuf messages to and from the API
modules' domain objects, request context from gRPC metadata, per-request metrics (the time a
Produce or Fetch parked in the purgatory goes back to the frontend as the trailing metadata
``kbroker-remote-ms``, see :mod:`.metrics`), and the guarantee that no request kills the
handler (an unexpected failure is logged and answered with UNKNOWN_SERVER_ERROR for every item
of the request).

Unset optional request fields take Kafka's defaults (callers such as grpcurl may leave them
out), except where a hand-made request means something else: an unset replica id is a
consumer's (-1), unset partition counts and replication factors of CreateTopics mean the broker
default (-1), and a Metadata request that neither lists topics nor says its topic list is null
asks for every topic. Unset response fields are left for the frontend to fill with the
client version's defaults.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import unquote

import grpc

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode

from .apis import (
    cluster,
    configs,
    fetch,
    group_offsets,
    groups,
    leader_epochs,
    metadata,
    offsets,
    partitions,
    produce,
    producer_ids,
    records,
    topics,
)
from .config import HandlerConfig
from .groups.group import JoinResult
from .metrics import record_request, remote_time
from .request_context import RequestContext, split_host_port

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")

UNKNOWN_SERVER_ERROR = ErrorCode.unknown_server_error.value


def _opt(message: Any, name: str, default: Any) -> Any:
    """An optional field's value, or ``default`` when unset."""
    return getattr(message, name) if message.HasField(name) else default


def _set_opt(message: Any, name: str, value: Any) -> None:
    """Set an optional field unless ``value`` is None (null: left to the frontend)."""
    if value is not None:
        setattr(message, name, value)


def _or_unsupported(
    api: Any, error_response: Callable[[Req, int], Resp]
) -> Callable[[Req], Awaitable[Resp]]:
    """``api.handle``, or UNSUPPORTED_VERSION for every item when this handler was built
    without the API."""

    async def handle(request: Req) -> Resp:
        if api is None:
            return error_response(request, ErrorCode.unsupported_version.value)
        return await api.handle(request)

    return handle


def _first_error(codes: Iterable[int]) -> int:
    return next((c for c in codes if c), 0)


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


# --- Metadata ----------------------------------------------------------------------------------


def metadata_request(m: k.MetadataRequest) -> metadata.MetadataRequest:
    refs = [metadata.TopicRef(name=_opt(t, "name", None), topic_id=_opt(t, "topic_id", None))
            for t in m.topics]
    if m.HasField("topics_is_null"):
        requested = None if m.topics_is_null else refs
    else:
        requested = refs or None
    return metadata.MetadataRequest(
        topics=requested,
        allow_auto_topic_creation=_opt(m, "allow_auto_topic_creation", True),
        include_cluster_authorized_operations=_opt(
            m, "include_cluster_authorized_operations", False),
        include_topic_authorized_operations=_opt(m, "include_topic_authorized_operations", False),
    )


def metadata_response(r: metadata.MetadataResponse) -> k.MetadataResponse:
    out = k.MetadataResponse(
        throttle_time_ms=0,
        controller_id=r.controller_id,
        cluster_authorized_operations=r.cluster_authorized_operations,
    )
    _set_opt(out, "cluster_id", r.cluster_id)
    for b in r.brokers:
        broker = out.brokers.add(node_id=b.node_id, host=b.host, port=b.port)
        _set_opt(broker, "rack", b.rack)
    for t in r.topics:
        topic = out.topics.add(
            error_code=t.error_code,
            is_internal=t.is_internal,
            topic_authorized_operations=t.topic_authorized_operations,
        )
        _set_opt(topic, "name", t.name)
        _set_opt(topic, "topic_id", t.topic_id)
        for p in t.partitions:
            topic.partitions.add(
                error_code=p.error_code,
                partition_index=p.partition_index,
                leader_id=p.leader_id,
                leader_epoch=p.leader_epoch,
                replica_nodes=p.replica_nodes,
                isr_nodes=p.isr_nodes,
                offline_replicas=p.offline_replicas,
            )
    return out


def metadata_failed(request: metadata.MetadataRequest, code: int) -> metadata.MetadataResponse:
    return metadata.MetadataResponse(topics=[
        metadata.TopicMetadata(error_code=code, name=t.name, topic_id=t.topic_id)
        for t in request.topics or ()
    ])


def metadata_error(r: metadata.MetadataResponse) -> int:
    return _first_error(t.error_code for t in r.topics)


# --- Produce -----------------------------------------------------------------------------------


def produce_request(m: k.ProduceRequest) -> produce.ProduceRequest:
    return produce.ProduceRequest(
        acks=_opt(m, "acks", 0),
        timeout_ms=_opt(m, "timeout_ms", 0),
        # A null transactional id may arrive as an empty string; neither names a transaction.
        transactional_id=_opt(m, "transactional_id", None) or None,
        topics=[
            produce.TopicData(
                name=_opt(t, "name", None),
                topic_id=_opt(t, "topic_id", None),
                partitions=[produce.PartitionData(index=p.index, records=p.records)
                            for p in t.partition_data],
            )
            for t in m.topic_data
        ],
    )


def produce_response(r: produce.ProduceResponse) -> k.ProduceResponse:
    out = k.ProduceResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.responses.add()
        _set_opt(topic, "name", t.name)
        _set_opt(topic, "topic_id", t.topic_id)
        for p in t.partitions:
            partition = topic.partition_responses.add(
                index=p.index,
                error_code=p.error_code,
                base_offset=p.base_offset,
                log_append_time_ms=p.log_append_time_ms,
                log_start_offset=p.log_start_offset,
            )
            _set_opt(partition, "error_message", p.error_message)
    return out


def produce_error(r: produce.ProduceResponse) -> int:
    return _first_error(p.error_code for t in r.topics for p in t.partitions)


# --- Fetch -------------------------------------------------------------------------------------


def fetch_request(m: k.FetchRequest) -> fetch.FetchRequest:
    replica_id = _opt(m, "replica_id", -1)
    if m.HasField("replica_state") and _opt(m.replica_state, "replica_id", -1) != -1:
        replica_id = m.replica_state.replica_id
    return fetch.FetchRequest(
        replica_id=replica_id,
        max_wait_ms=_opt(m, "max_wait_ms", 0),
        min_bytes=_opt(m, "min_bytes", 0),
        max_bytes=_opt(m, "max_bytes", fetch.MAX_INT32),
        isolation_level=_opt(m, "isolation_level", 0),
        session_id=_opt(m, "session_id", fetch.NO_SESSION_ID),
        session_epoch=_opt(m, "session_epoch", fetch.FINAL_EPOCH),
        topics=[
            fetch.FetchTopic(
                topic=_opt(t, "topic", None),
                topic_id=_opt(t, "topic_id", None),
                partitions=[
                    fetch.FetchPartition(
                        partition=p.partition,
                        fetch_offset=p.fetch_offset,
                        partition_max_bytes=_opt(p, "partition_max_bytes",
                                                 fetch.DEFAULT_PARTITION_MAX_BYTES),
                        current_leader_epoch=_opt(p, "current_leader_epoch", -1),
                    )
                    for p in t.partitions
                ],
            )
            for t in m.topics
        ],
    )


def fetch_response(r: fetch.FetchResponse) -> k.FetchResponse:
    out = k.FetchResponse(throttle_time_ms=0, error_code=r.error_code, session_id=r.session_id)
    for t in r.topics:
        topic = out.responses.add()
        _set_opt(topic, "topic", t.topic)
        _set_opt(topic, "topic_id", t.topic_id)
        for p in t.partitions:
            partition = topic.partitions.add(
                partition_index=p.partition_index,
                error_code=p.error_code,
                high_watermark=p.high_watermark,
                last_stable_offset=p.last_stable_offset,
                log_start_offset=p.log_start_offset,
                preferred_read_replica=p.preferred_read_replica,
                records=p.records,
            )
            if p.aborted_transactions is None:
                partition.aborted_transactions_is_null = True
            else:
                partition.aborted_transactions_is_null = False
                for producer_id, first_offset in p.aborted_transactions:
                    partition.aborted_transactions.add(producer_id=producer_id,
                                                       first_offset=first_offset)
    return out


def fetch_error(r: fetch.FetchResponse) -> int:
    return r.error_code or _first_error(p.error_code for t in r.topics for p in t.partitions)


# --- ListOffsets -------------------------------------------------------------------------------


def list_offsets_request(m: k.ListOffsetsRequest) -> offsets.ListOffsetsRequest:
    return offsets.ListOffsetsRequest(
        replica_id=_opt(m, "replica_id", offsets.CONSUMER_REPLICA_ID),
        isolation_level=_opt(m, "isolation_level", 0),
        topics=[
            offsets.ListOffsetsTopic(
                name=t.name,
                partitions=[
                    offsets.ListOffsetsPartition(
                        partition_index=p.partition_index,
                        timestamp=_opt(p, "timestamp", 0),
                        current_leader_epoch=_opt(p, "current_leader_epoch", -1),
                    )
                    for p in t.partitions
                ],
            )
            for t in m.topics
        ],
    )


def list_offsets_response(r: offsets.ListOffsetsResponse) -> k.ListOffsetsResponse:
    out = k.ListOffsetsResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.topics.add(name=t.name)
        for p in t.partitions:
            topic.partitions.add(
                partition_index=p.partition_index,
                error_code=p.error_code,
                timestamp=p.timestamp,
                offset=p.offset,
                leader_epoch=p.leader_epoch,
            )
    return out


def list_offsets_error(r: offsets.ListOffsetsResponse) -> int:
    return _first_error(p.error_code for t in r.topics for p in t.partitions)


# --- OffsetForLeaderEpoch ----------------------------------------------------------------------


def offset_for_leader_epoch_request(
    m: k.OffsetForLeaderEpochRequest,
) -> leader_epochs.OffsetForLeaderEpochRequest:
    return leader_epochs.OffsetForLeaderEpochRequest(
        replica_id=_opt(m, "replica_id", -1),
        topics=[
            leader_epochs.EpochTopic(
                topic=t.topic,
                partitions=[
                    leader_epochs.EpochPartition(
                        partition=p.partition,
                        leader_epoch=_opt(p, "leader_epoch", -1),
                        current_leader_epoch=_opt(p, "current_leader_epoch", -1),
                    )
                    for p in t.partitions
                ],
            )
            for t in m.topics
        ],
    )


def offset_for_leader_epoch_response(
    r: leader_epochs.OffsetForLeaderEpochResponse,
) -> k.OffsetForLeaderEpochResponse:
    out = k.OffsetForLeaderEpochResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.topics.add(topic=t.topic)
        for p in t.partitions:
            topic.partitions.add(error_code=p.error_code, partition=p.partition,
                                 leader_epoch=p.leader_epoch, end_offset=p.end_offset)
    return out


def offset_for_leader_epoch_error(r: leader_epochs.OffsetForLeaderEpochResponse) -> int:
    return _first_error(p.error_code for t in r.topics for p in t.partitions)


# --- CreateTopics / DeleteTopics ---------------------------------------------------------------


def create_topics_request(m: k.CreateTopicsRequest) -> topics.CreateTopicsRequest:
    return topics.CreateTopicsRequest(
        timeout_ms=_opt(m, "timeout_ms", 60_000),
        validate_only=_opt(m, "validate_only", False),
        topics=[
            topics.CreatableTopic(
                name=t.name,
                num_partitions=_opt(t, "num_partitions", -1),
                replication_factor=_opt(t, "replication_factor", -1),
                assignments=[(a.partition_index, tuple(a.broker_ids)) for a in t.assignments],
                configs=[(c.name, _opt(c, "value", None)) for c in t.configs],
            )
            for t in m.topics
        ],
    )


def create_topics_response(r: topics.CreateTopicsResponse) -> k.CreateTopicsResponse:
    out = k.CreateTopicsResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.topics.add(
            name=t.name,
            error_code=t.error_code,
            topic_config_error_code=0,
            num_partitions=t.num_partitions,
            replication_factor=t.replication_factor,
            configs_is_null=False,
        )
        _set_opt(topic, "error_message", t.error_message)
        _set_opt(topic, "topic_id", t.topic_id)
        for c in t.configs:
            config = topic.configs.add(
                name=c.name,
                read_only=c.read_only,
                config_source=c.config_source,
                is_sensitive=c.is_sensitive,
            )
            _set_opt(config, "value", c.value)
    return out


def create_topics_error(r: topics.CreateTopicsResponse) -> int:
    return _first_error(t.error_code for t in r.topics)


def delete_topics_request(m: k.DeleteTopicsRequest) -> topics.DeleteTopicsRequest:
    refs = [topics.TopicToDelete(name=name) for name in m.topic_names]
    refs += [
        topics.TopicToDelete(name=_opt(t, "name", None), topic_id=_opt(t, "topic_id", None))
        for t in m.topics
    ]
    return topics.DeleteTopicsRequest(topics=refs, timeout_ms=_opt(m, "timeout_ms", 30_000))


def delete_topics_response(r: topics.DeleteTopicsResponse) -> k.DeleteTopicsResponse:
    out = k.DeleteTopicsResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.responses.add(error_code=t.error_code)
        _set_opt(topic, "name", t.name)
        _set_opt(topic, "topic_id", t.topic_id)
        _set_opt(topic, "error_message", t.error_message)
    return out


def delete_topics_error(r: topics.DeleteTopicsResponse) -> int:
    return _first_error(t.error_code for t in r.topics)


# --- DescribeCluster ---------------------------------------------------------------------------


def describe_cluster_request(m: k.DescribeClusterRequest) -> cluster.DescribeClusterRequest:
    return cluster.DescribeClusterRequest(
        include_cluster_authorized_operations=_opt(
            m, "include_cluster_authorized_operations", False),
        endpoint_type=_opt(m, "endpoint_type", cluster.EndpointType.BROKER),
    )


def describe_cluster_response(r: cluster.DescribeClusterResponse) -> k.DescribeClusterResponse:
    out = k.DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=r.error_code,
        cluster_id=r.cluster_id,
        controller_id=r.controller_id,
        cluster_authorized_operations=r.cluster_authorized_operations,
        endpoint_type=r.endpoint_type,
    )
    _set_opt(out, "error_message", r.error_message)
    for b in r.brokers:
        broker = out.brokers.add(broker_id=b.node_id, host=b.host, port=b.port, is_fenced=False)
        _set_opt(broker, "rack", b.rack)
    return out


# --- DeleteRecords -----------------------------------------------------------------------------


def delete_records_request(m: k.DeleteRecordsRequest) -> records.DeleteRecordsRequest:
    return records.DeleteRecordsRequest(
        topics=[
            records.DeleteRecordsTopic(
                name=t.name,
                partitions=[records.DeleteRecordsPartition(
                    partition_index=p.partition_index, offset=_opt(p, "offset", -1))
                    for p in t.partitions],
            )
            for t in m.topics
        ],
        timeout_ms=_opt(m, "timeout_ms", 30_000),
    )


def delete_records_response(r: records.DeleteRecordsResponse) -> k.DeleteRecordsResponse:
    out = k.DeleteRecordsResponse(throttle_time_ms=0)
    for t in r.topics:
        topic = out.topics.add(name=t.name)
        for p in t.partitions:
            topic.partitions.add(partition_index=p.partition_index,
                                 low_watermark=p.low_watermark, error_code=p.error_code)
    return out


def delete_records_error(r: records.DeleteRecordsResponse) -> int:
    return _first_error(p.error_code for t in r.topics for p in t.partitions)


# --- DescribeConfigs / AlterConfigs / IncrementalAlterConfigs ---------------------------------


def describe_configs_request(m: k.DescribeConfigsRequest) -> configs.DescribeConfigsRequest:
    resources = []
    for r in m.resources:
        keys = None if _opt(r, "configuration_keys_is_null", False) else list(
            r.configuration_keys)
        resources.append(configs.DescribeResource(
            resource_type=r.resource_type, resource_name=r.resource_name,
            configuration_keys=keys))
    return configs.DescribeConfigsRequest(
        resources=resources,
        include_synonyms=_opt(m, "include_synonyms", False),
        include_documentation=_opt(m, "include_documentation", False),
    )


def describe_configs_response(r: configs.DescribeConfigsResponse) -> k.DescribeConfigsResponse:
    out = k.DescribeConfigsResponse(throttle_time_ms=0)
    for result in r.results:
        item = out.results.add(error_code=result.error_code, resource_type=result.resource_type,
                               resource_name=result.resource_name)
        _set_opt(item, "error_message", result.error_message)
        for c in result.configs:
            entry = item.configs.add(name=c.name, read_only=c.read_only,
                                     config_source=c.config_source,
                                     is_sensitive=c.is_sensitive, config_type=c.config_type)
            _set_opt(entry, "value", c.value)
            _set_opt(entry, "documentation", c.documentation)
            for synonym in c.synonyms:
                added = entry.synonyms.add(name=synonym.name, source=synonym.source)
                _set_opt(added, "value", synonym.value)
    return out


def describe_configs_error(r: configs.DescribeConfigsResponse) -> int:
    return _first_error(result.error_code for result in r.results)


def alter_configs_request(m: k.AlterConfigsRequest) -> configs.AlterConfigsRequest:
    return configs.AlterConfigsRequest(
        validate_only=_opt(m, "validate_only", False),
        resources=[
            configs.AlterResource(
                resource_type=r.resource_type, resource_name=r.resource_name,
                configs=[configs.AlterableConfig(name=c.name, value=_opt(c, "value", None))
                         for c in r.configs])
            for r in m.resources
        ],
    )


def incremental_alter_configs_request(
    m: k.IncrementalAlterConfigsRequest,
) -> configs.AlterConfigsRequest:
    return configs.AlterConfigsRequest(
        validate_only=_opt(m, "validate_only", False),
        incremental=True,
        resources=[
            configs.AlterResource(
                resource_type=r.resource_type, resource_name=r.resource_name,
                configs=[configs.AlterableConfig(name=c.name, value=_opt(c, "value", None),
                                                 operation=c.config_operation)
                         for c in r.configs])
            for r in m.resources
        ],
    )


def _alter_results(r: configs.AlterConfigsResponse, out: Any) -> Any:
    for result in r.results:
        item = out.responses.add(error_code=result.error_code,
                                 resource_type=result.resource_type,
                                 resource_name=result.resource_name)
        _set_opt(item, "error_message", result.error_message)
    return out


def alter_configs_response(r: configs.AlterConfigsResponse) -> k.AlterConfigsResponse:
    return _alter_results(r, k.AlterConfigsResponse(throttle_time_ms=0))


def incremental_alter_configs_response(
    r: configs.AlterConfigsResponse,
) -> k.IncrementalAlterConfigsResponse:
    return _alter_results(r, k.IncrementalAlterConfigsResponse(throttle_time_ms=0))


def alter_configs_error(r: configs.AlterConfigsResponse) -> int:
    return _first_error(result.error_code for result in r.results)


# --- CreatePartitions --------------------------------------------------------------------------


def create_partitions_request(m: k.CreatePartitionsRequest) -> partitions.CreatePartitionsRequest:
    return partitions.CreatePartitionsRequest(
        timeout_ms=_opt(m, "timeout_ms", 30_000),
        validate_only=_opt(m, "validate_only", False),
        topics=[
            partitions.CreatePartitionsTopic(
                name=t.name, count=t.count,
                assignments=None if _opt(t, "assignments_is_null", not t.assignments)
                else [tuple(a.broker_ids) for a in t.assignments],
            )
            for t in m.topics
        ],
    )


def create_partitions_response(
    r: partitions.CreatePartitionsResponse,
) -> k.CreatePartitionsResponse:
    out = k.CreatePartitionsResponse(throttle_time_ms=0)
    for result in r.results:
        item = out.results.add(name=result.name, error_code=result.error_code)
        _set_opt(item, "error_message", result.error_message)
    return out


def create_partitions_error(r: partitions.CreatePartitionsResponse) -> int:
    return _first_error(result.error_code for result in r.results)


# --- InitProducerId ----------------------------------------------------------------------------


def init_producer_id_request(m: k.InitProducerIdRequest) -> producer_ids.InitProducerIdRequest:
    return producer_ids.InitProducerIdRequest(
        transactional_id=_opt(m, "transactional_id", None),
        transaction_timeout_ms=_opt(m, "transaction_timeout_ms", 0),
        producer_id=_opt(m, "producer_id", producer_ids.NO_PRODUCER_ID),
        producer_epoch=_opt(m, "producer_epoch", producer_ids.NO_PRODUCER_EPOCH),
    )


def init_producer_id_response(
    r: producer_ids.InitProducerIdResponse,
) -> k.InitProducerIdResponse:
    return k.InitProducerIdResponse(throttle_time_ms=0, error_code=r.error_code,
                                    producer_id=r.producer_id, producer_epoch=r.producer_epoch)


# --- Groups: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups,
# DescribeGroups, DeleteGroups, OffsetCommit, OffsetFetch, OffsetDelete ------------------------


def find_coordinator_request(
    m: k.FindCoordinatorRequest, version: int | None,
) -> groups.FindCoordinatorRequest:
    batched = bool(m.coordinator_keys) if version is None else version >= 4
    keys = list(m.coordinator_keys) if batched else [_opt(m, "key", "")]
    return groups.FindCoordinatorRequest(key_type=_opt(m, "key_type", 0), keys=keys)


def find_coordinator_response(r: groups.FindCoordinatorResponse) -> k.FindCoordinatorResponse:
    # v0-3 answer their one key at the top level, v4+ every key in coordinators.
    first = r.coordinators[0] if r.coordinators else groups.Coordinator(key="")
    out = k.FindCoordinatorResponse(throttle_time_ms=0, error_code=first.error_code,
                                    node_id=first.node_id, host=first.host, port=first.port)
    _set_opt(out, "error_message", first.error_message)
    for c in r.coordinators:
        added = out.coordinators.add(key=c.key, node_id=c.node_id, host=c.host, port=c.port,
                                     error_code=c.error_code)
        _set_opt(added, "error_message", c.error_message)
    return out


def join_group_request(m: k.JoinGroupRequest) -> groups.JoinGroupRequest:
    return groups.JoinGroupRequest(
        group_id=_opt(m, "group_id", ""),
        session_timeout_ms=_opt(m, "session_timeout_ms", 0),
        rebalance_timeout_ms=_opt(m, "rebalance_timeout_ms", -1),
        member_id=_opt(m, "member_id", ""),
        group_instance_id=_opt(m, "group_instance_id", None),
        protocol_type=_opt(m, "protocol_type", ""),
        protocols=[(p.name, p.metadata) for p in m.protocols],
        reason=_opt(m, "reason", None),
    )


def join_group_response(r: JoinResult) -> k.JoinGroupResponse:
    out = k.JoinGroupResponse(throttle_time_ms=0, error_code=r.error, generation_id=r.generation,
                              leader=r.leader, member_id=r.member_id,
                              skip_assignment=r.skip_assignment)
    _set_opt(out, "protocol_type", r.protocol_type)
    _set_opt(out, "protocol_name", r.protocol_name)
    for member_id, group_instance_id, member_metadata in r.members:
        added = out.members.add(member_id=member_id, metadata=member_metadata)
        _set_opt(added, "group_instance_id", group_instance_id)
    return out


def sync_group_request(m: k.SyncGroupRequest) -> groups.SyncGroupRequest:
    return groups.SyncGroupRequest(
        group_id=_opt(m, "group_id", ""),
        generation_id=_opt(m, "generation_id", -1),
        member_id=_opt(m, "member_id", ""),
        group_instance_id=_opt(m, "group_instance_id", None),
        protocol_type=_opt(m, "protocol_type", None),
        protocol_name=_opt(m, "protocol_name", None),
        assignments=[(a.member_id, a.assignment) for a in m.assignments],
    )


def sync_group_response(r: groups.SyncGroupResponse) -> k.SyncGroupResponse:
    out = k.SyncGroupResponse(throttle_time_ms=0, error_code=r.error_code,
                              assignment=r.assignment)
    _set_opt(out, "protocol_type", r.protocol_type)
    _set_opt(out, "protocol_name", r.protocol_name)
    return out


def heartbeat_request(m: k.HeartbeatRequest) -> groups.HeartbeatRequest:
    return groups.HeartbeatRequest(
        group_id=_opt(m, "group_id", ""), generation_id=_opt(m, "generation_id", -1),
        member_id=_opt(m, "member_id", ""),
        group_instance_id=_opt(m, "group_instance_id", None))


def leave_group_request(m: k.LeaveGroupRequest, version: int | None) -> groups.LeaveGroupRequest:
    single = not m.members if version is None else version < 3
    if single:
        members = [groups.LeavingMember(member_id=_opt(m, "member_id", ""))]
    else:
        members = [groups.LeavingMember(member_id=_opt(x, "member_id", ""),
                                        group_instance_id=_opt(x, "group_instance_id", None),
                                        reason=_opt(x, "reason", None))
                   for x in m.members]
    return groups.LeaveGroupRequest(group_id=_opt(m, "group_id", ""), members=members,
                                    single=single)


def leave_group_response(r: groups.LeaveGroupResponse) -> k.LeaveGroupResponse:
    out = k.LeaveGroupResponse(throttle_time_ms=0, error_code=r.error_code)
    for member in r.members:
        added = out.members.add(member_id=member.member_id, error_code=member.error_code)
        _set_opt(added, "group_instance_id", member.group_instance_id)
    return out


def list_groups_request(m: k.ListGroupsRequest) -> groups.ListGroupsRequest:
    return groups.ListGroupsRequest(states_filter=list(m.states_filter),
                                    types_filter=list(m.types_filter))


def list_groups_response(r: groups.ListGroupsResponse) -> k.ListGroupsResponse:
    out = k.ListGroupsResponse(throttle_time_ms=0, error_code=r.error_code)
    for g in r.groups:
        out.groups.add(group_id=g.group_id, protocol_type=g.protocol_type,
                       group_state=g.group_state, group_type=g.group_type)
    return out


def describe_groups_request(m: k.DescribeGroupsRequest) -> groups.DescribeGroupsRequest:
    return groups.DescribeGroupsRequest(
        groups=list(m.groups),
        include_authorized_operations=_opt(m, "include_authorized_operations", False))


def describe_groups_response(r: groups.DescribeGroupsResponse) -> k.DescribeGroupsResponse:
    out = k.DescribeGroupsResponse(throttle_time_ms=0)
    for g in r.groups:
        group = out.groups.add(error_code=g.error_code, group_id=g.group_id,
                               group_state=g.group_state, protocol_type=g.protocol_type,
                               protocol_data=g.protocol_data,
                               authorized_operations=g.authorized_operations)
        _set_opt(group, "error_message", g.error_message)
        for m in g.members:
            added = group.members.add(member_id=m.member_id, client_id=m.client_id,
                                      client_host=m.client_host,
                                      member_metadata=m.member_metadata,
                                      member_assignment=m.member_assignment)
            _set_opt(added, "group_instance_id", m.group_instance_id)
    return out


def delete_groups_request(m: k.DeleteGroupsRequest) -> groups.DeleteGroupsRequest:
    return groups.DeleteGroupsRequest(groups=list(m.groups_names))


def delete_groups_response(r: groups.DeleteGroupsResponse) -> k.DeleteGroupsResponse:
    out = k.DeleteGroupsResponse(throttle_time_ms=0)
    for group_id, code in r.results:
        out.results.add(group_id=group_id, error_code=code)
    return out


def offset_commit_request(m: k.OffsetCommitRequest) -> group_offsets.OffsetCommitRequest:
    return group_offsets.OffsetCommitRequest(
        group_id=_opt(m, "group_id", ""),
        generation_id=_opt(m, "generation_id_or_member_epoch", -1),
        member_id=_opt(m, "member_id", ""),
        group_instance_id=_opt(m, "group_instance_id", None),
        retention_time_ms=_opt(m, "retention_time_ms", -1),
        topics=[
            group_offsets.CommitTopic(name=_opt(t, "name", ""), partitions=[
                group_offsets.CommitPartition(
                    partition_index=p.partition_index,
                    committed_offset=_opt(p, "committed_offset", -1),
                    committed_leader_epoch=_opt(p, "committed_leader_epoch", -1),
                    committed_metadata=_opt(p, "committed_metadata", None))
                for p in t.partitions])
            for t in m.topics
        ],
    )


def _partition_errors_response(message: Any, topics: Any) -> Any:
    for name, answers in topics:
        topic = message.topics.add(name=name)
        for index, code in answers:
            topic.partitions.add(partition_index=index, error_code=code)
    return message


def offset_commit_response(r: group_offsets.OffsetCommitResponse) -> k.OffsetCommitResponse:
    return _partition_errors_response(k.OffsetCommitResponse(throttle_time_ms=0), r.topics)


def offset_fetch_request(
    m: k.OffsetFetchRequest, version: int | None,
) -> group_offsets.OffsetFetchRequest:
    batched = bool(m.groups) if version is None else version >= 8

    def topics_of(message: Any) -> list[tuple[str, list[int]]] | None:
        if _opt(message, "topics_is_null", False):
            return None
        return [(t.name, list(t.partition_indexes)) for t in message.topics]

    if batched:
        fetches = [group_offsets.FetchGroup(group_id=g.group_id, topics=topics_of(g))
                   for g in m.groups]
    else:
        fetches = [group_offsets.FetchGroup(group_id=_opt(m, "group_id", ""),
                                            topics=topics_of(m))]
    return group_offsets.OffsetFetchRequest(groups=fetches, batched=batched,
                                            require_stable=_opt(m, "require_stable", False))


def offset_fetch_response(r: group_offsets.OffsetFetchResponse) -> k.OffsetFetchResponse:
    out = k.OffsetFetchResponse(throttle_time_ms=0)
    if r.batched:
        for g in r.groups:
            group = out.groups.add(group_id=g.group_id, error_code=g.error_code)
            for name, answers in g.topics:
                topic = group.topics.add(name=name)
                for p in answers:
                    topic.partitions.add(
                        partition_index=p.partition_index, committed_offset=p.committed_offset,
                        committed_leader_epoch=p.committed_leader_epoch, metadata=p.metadata,
                        error_code=p.error_code)
        return out
    single = r.groups[0] if r.groups else group_offsets.FetchedGroup(group_id="")
    out.error_code = single.error_code
    for name, answers in single.topics:
        topic = out.topics.add(name=name)
        for p in answers:
            topic.partitions.add(
                partition_index=p.partition_index, committed_offset=p.committed_offset,
                committed_leader_epoch=p.committed_leader_epoch, metadata=p.metadata,
                error_code=p.error_code)
    return out


def offset_fetch_error(r: group_offsets.OffsetFetchResponse) -> int:
    return _first_error(g.error_code for g in r.groups)


def offset_delete_request(m: k.OffsetDeleteRequest) -> group_offsets.OffsetDeleteRequest:
    return group_offsets.OffsetDeleteRequest(
        group_id=_opt(m, "group_id", ""),
        topics=[(t.name, [p.partition_index for p in t.partitions]) for t in m.topics])


def offset_delete_response(r: group_offsets.OffsetDeleteResponse) -> k.OffsetDeleteResponse:
    return _partition_errors_response(
        k.OffsetDeleteResponse(throttle_time_ms=0, error_code=r.error_code), r.topics)


# --- the service -------------------------------------------------------------------------------


class KafkaHandlerServicer(kafka_handler_pb2_grpc.KafkaHandlerServicer):
    """One RPC per Kafka API; each converts, delegates to its API module and records metrics."""

    def __init__(
        self,
        config: HandlerConfig,
        *,
        metadata_api: metadata.MetadataApi,
        produce_api: produce.ProduceApi,
        fetch_api: fetch.FetchApi,
        list_offsets_api: offsets.ListOffsetsApi,
        create_topics_api: topics.CreateTopicsApi,
        delete_topics_api: topics.DeleteTopicsApi,
        describe_cluster_api: cluster.DescribeClusterApi,
        delete_records_api: records.DeleteRecordsApi | None = None,
        describe_configs_api: configs.DescribeConfigsApi | None = None,
        alter_configs_api: configs.AlterConfigsApi | None = None,
        create_partitions_api: partitions.CreatePartitionsApi | None = None,
        init_producer_id_api: producer_ids.InitProducerIdApi | None = None,
        group_apis: groups.GroupApis | None = None,
        offset_for_leader_epoch_api: leader_epochs.OffsetForLeaderEpochApi | None = None,
    ) -> None:
        self._default_advertised = split_host_port(config.advertised)
        self._default_broker_ports = config.broker_ports
        self._metadata = metadata_api
        self._produce = produce_api
        self._fetch = fetch_api
        self._list_offsets = list_offsets_api
        self._create_topics = create_topics_api
        self._delete_topics = delete_topics_api
        self._describe_cluster = describe_cluster_api
        self._delete_records = delete_records_api
        self._describe_configs = describe_configs_api
        self._alter_configs = alter_configs_api
        self._create_partitions = create_partitions_api
        self._init_producer_id = init_producer_id_api
        self._group_apis = group_apis
        self._offset_for_leader_epoch = offset_for_leader_epoch_api

    def request_context(self, context: grpc.aio.ServicerContext) -> RequestContext:
        values = {key: value for key, value in (context.invocation_metadata() or ())}
        host, port = self._default_advertised
        advertised = values.get("kafka-advertised")
        if advertised:
            try:
                host, port = split_host_port(str(advertised))
            except ValueError:
                log.warning("ignoring malformed kafka-advertised %r", advertised)
        try:
            broker_ports = int(values.get("kafka-broker-ports", self._default_broker_ports))
        except ValueError:
            broker_ports = self._default_broker_ports
        return RequestContext(
            advertised_host=host,
            advertised_port=port,
            broker_ports=broker_ports,
            # The frontend percent-encodes client ids (gRPC metadata is printable ASCII).
            client_id=unquote(str(values.get("kafka-client-id", ""))),
            client_host=str(values.get("kafka-client-host", "")),
            frontend_id=str(values.get("kafka-frontend-id", "")),
            api_version=_int_or_none(values.get("kafka-api-version")),
            broker_id=_int_or_none(values.get("kafka-broker-id")),
        )

    async def _serve(
        self,
        api: str,
        message: Any,
        to_domain: Callable[[Any], Req],
        handle: Callable[[Req], Awaitable[Resp]],
        failed: Callable[[Req, int], Resp],
        error_of: Callable[[Resp], int],
        to_proto: Callable[[Resp], Any],
    ) -> Any:
        started = time.perf_counter()
        request = to_domain(message)
        try:
            response = await handle(request)
            answer = to_proto(response)
        except Exception:
            log.exception("%s failed", api)
            response = failed(request, UNKNOWN_SERVER_ERROR)
            answer = to_proto(response)
        record_request(api, error_of(response), time.perf_counter() - started)
        return answer

    async def Metadata(
        self, request: k.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> k.MetadataResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "Metadata", request, metadata_request, lambda r: self._metadata.handle(r, ctx),
            metadata_failed, metadata_error, metadata_response)

    async def Produce(
        self, request: k.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> k.ProduceResponse:
        with remote_time(context):
            return await self._serve(
                "Produce", request, produce_request, self._produce.handle,
                produce.error_response, produce_error, produce_response)

    async def Fetch(
        self, request: k.FetchRequest, context: grpc.aio.ServicerContext
    ) -> k.FetchResponse:
        with remote_time(context):
            return await self._serve(
                "Fetch", request, fetch_request, self._fetch.handle,
                fetch.error_response, fetch_error, fetch_response)

    async def ListOffsets(
        self, request: k.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> k.ListOffsetsResponse:
        return await self._serve(
            "ListOffsets", request, list_offsets_request, self._list_offsets.handle,
            offsets.error_response, list_offsets_error, list_offsets_response)

    async def DeleteRecords(
        self, request: k.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> k.DeleteRecordsResponse:
        handle = _or_unsupported(self._delete_records, records.error_response)
        return await self._serve(
            "DeleteRecords", request, delete_records_request, handle,
            records.error_response, delete_records_error, delete_records_response)

    async def CreateTopics(
        self, request: k.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> k.CreateTopicsResponse:
        return await self._serve(
            "CreateTopics", request, create_topics_request, self._create_topics.handle,
            topics.create_error_response, create_topics_error, create_topics_response)

    async def DeleteTopics(
        self, request: k.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> k.DeleteTopicsResponse:
        return await self._serve(
            "DeleteTopics", request, delete_topics_request, self._delete_topics.handle,
            topics.delete_error_response, delete_topics_error, delete_topics_response)

    async def DescribeCluster(
        self, request: k.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> k.DescribeClusterResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "DescribeCluster", request, describe_cluster_request,
            lambda r: self._describe_cluster.handle(r, ctx),
            lambda _r, code: cluster.DescribeClusterResponse(error_code=code),
            lambda r: r.error_code, describe_cluster_response)

    async def DescribeConfigs(
        self, request: k.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> k.DescribeConfigsResponse:
        handle = _or_unsupported(self._describe_configs, configs.describe_error_response)
        return await self._serve(
            "DescribeConfigs", request, describe_configs_request, handle,
            configs.describe_error_response, describe_configs_error, describe_configs_response)

    async def _alter(self, r: configs.AlterConfigsRequest) -> configs.AlterConfigsResponse:
        return await _or_unsupported(self._alter_configs, configs.alter_error_response)(r)

    async def AlterConfigs(
        self, request: k.AlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> k.AlterConfigsResponse:
        return await self._serve(
            "AlterConfigs", request, alter_configs_request, self._alter,
            configs.alter_error_response, alter_configs_error, alter_configs_response)

    async def IncrementalAlterConfigs(
        self, request: k.IncrementalAlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> k.IncrementalAlterConfigsResponse:
        return await self._serve(
            "IncrementalAlterConfigs", request, incremental_alter_configs_request, self._alter,
            configs.alter_error_response, alter_configs_error,
            incremental_alter_configs_response)

    async def CreatePartitions(
        self, request: k.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> k.CreatePartitionsResponse:
        handle = _or_unsupported(self._create_partitions, partitions.error_response)
        return await self._serve(
            "CreatePartitions", request, create_partitions_request, handle,
            partitions.error_response, create_partitions_error, create_partitions_response)

    async def OffsetForLeaderEpoch(
        self, request: k.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> k.OffsetForLeaderEpochResponse:
        handle = _or_unsupported(self._offset_for_leader_epoch, leader_epochs.error_response)
        return await self._serve(
            "OffsetForLeaderEpoch", request, offset_for_leader_epoch_request, handle,
            leader_epochs.error_response, offset_for_leader_epoch_error,
            offset_for_leader_epoch_response)

    async def InitProducerId(
        self, request: k.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> k.InitProducerIdResponse:
        handle = _or_unsupported(self._init_producer_id, producer_ids.error_response)
        return await self._serve(
            "InitProducerId", request, init_producer_id_request, handle,
            producer_ids.error_response, lambda r: r.error_code, init_producer_id_response)

    # -- groups ---------------------------------------------------------------------------

    def _groups(self) -> groups.GroupApis:
        if self._group_apis is None:
            raise RuntimeError("this handler serves no group APIs")
        return self._group_apis

    async def FindCoordinator(
        self, request: k.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> k.FindCoordinatorResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "FindCoordinator", request, lambda m: find_coordinator_request(m, ctx.api_version),
            lambda r: self._groups().find_coordinator.handle(r, ctx),
            groups.find_coordinator_error,
            lambda r: _first_error(c.error_code for c in r.coordinators),
            find_coordinator_response)

    async def JoinGroup(
        self, request: k.JoinGroupRequest, context: grpc.aio.ServicerContext
    ) -> k.JoinGroupResponse:
        ctx = self.request_context(context)
        with remote_time(context):
            return await self._serve(
                "JoinGroup", request, join_group_request,
                lambda r: self._groups().join_group.handle(r, ctx),
                groups.join_group_error, lambda r: r.error, join_group_response)

    async def SyncGroup(
        self, request: k.SyncGroupRequest, context: grpc.aio.ServicerContext
    ) -> k.SyncGroupResponse:
        ctx = self.request_context(context)
        with remote_time(context):
            return await self._serve(
                "SyncGroup", request, sync_group_request,
                lambda r: self._groups().sync_group.handle(r, ctx),
                groups.sync_group_error, lambda r: r.error_code, sync_group_response)

    async def Heartbeat(
        self, request: k.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> k.HeartbeatResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "Heartbeat", request, heartbeat_request,
            lambda r: self._groups().heartbeat.handle(r, ctx),
            lambda _r, code: groups.HeartbeatResponse(error_code=code),
            lambda r: r.error_code,
            lambda r: k.HeartbeatResponse(throttle_time_ms=0, error_code=r.error_code))

    async def LeaveGroup(
        self, request: k.LeaveGroupRequest, context: grpc.aio.ServicerContext
    ) -> k.LeaveGroupResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "LeaveGroup", request, lambda m: leave_group_request(m, ctx.api_version),
            lambda r: self._groups().leave_group.handle(r, ctx),
            groups.leave_group_error,
            lambda r: r.error_code or _first_error(m.error_code for m in r.members),
            leave_group_response)

    async def ListGroups(
        self, request: k.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> k.ListGroupsResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "ListGroups", request, list_groups_request,
            lambda r: self._groups().list_groups.handle(r, ctx),
            groups.list_groups_error, lambda r: r.error_code, list_groups_response)

    async def DescribeGroups(
        self, request: k.DescribeGroupsRequest, context: grpc.aio.ServicerContext
    ) -> k.DescribeGroupsResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "DescribeGroups", request, describe_groups_request,
            lambda r: self._groups().describe_groups.handle(r, ctx),
            groups.describe_groups_error,
            lambda r: _first_error(g.error_code for g in r.groups), describe_groups_response)

    async def DeleteGroups(
        self, request: k.DeleteGroupsRequest, context: grpc.aio.ServicerContext
    ) -> k.DeleteGroupsResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "DeleteGroups", request, delete_groups_request,
            lambda r: self._groups().delete_groups.handle(r, ctx),
            groups.delete_groups_error,
            lambda r: _first_error(code for _, code in r.results), delete_groups_response)

    async def OffsetCommit(
        self, request: k.OffsetCommitRequest, context: grpc.aio.ServicerContext
    ) -> k.OffsetCommitResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "OffsetCommit", request, offset_commit_request,
            lambda r: self._groups().offset_commit.handle(r, ctx),
            group_offsets.offset_commit_error,
            lambda r: _first_error(code for _, ps in r.topics for _, code in ps),
            offset_commit_response)

    async def OffsetFetch(
        self, request: k.OffsetFetchRequest, context: grpc.aio.ServicerContext
    ) -> k.OffsetFetchResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "OffsetFetch", request, lambda m: offset_fetch_request(m, ctx.api_version),
            lambda r: self._groups().offset_fetch.handle(r, ctx),
            group_offsets.offset_fetch_error, offset_fetch_error, offset_fetch_response)

    async def OffsetDelete(
        self, request: k.OffsetDeleteRequest, context: grpc.aio.ServicerContext
    ) -> k.OffsetDeleteResponse:
        ctx = self.request_context(context)
        return await self._serve(
            "OffsetDelete", request, offset_delete_request,
            lambda r: self._groups().offset_delete.handle(r, ctx),
            group_offsets.offset_delete_error,
            lambda r: r.error_code or _first_error(
                code for _, ps in r.topics for _, code in ps),
            offset_delete_response)
