"""The generic kio <-> protobuf converter: round trips for every supported API version, the
defaults filled into requests of old versions, response fallbacks and the wire quirks."""

from __future__ import annotations

import datetime
import typing
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import Records

from kbroker.kafka.v1 import kafka_pb2
from services.frontend import converter
from services.frontend.api_versions import SUPPORTED_APIS

# kio leaves record batches to the caller; any bytes will do for a codec round trip.
st.register_type_strategy(Records, st.binary(max_size=64))
# kio reads the nil UUID as None, so None is the only spelling of "no id" that round-trips.
st.register_type_strategy(uuid.UUID, st.uuids().filter(lambda u: u.int != 0))

CASES = [
    pytest.param(api.schema_name, version, kind, id=f"{api.name}-v{version}-{kind.name}")
    for api in SUPPORTED_APIS.values()
    for version in range(api.min_version, api.max_version + 1)
    for kind in (EntityType.request, EntityType.response)
]


@pytest.mark.parametrize(("api", "version", "kind"), CASES)
def test_round_trip_every_supported_version(api: str, version: int, kind: EntityType) -> None:
    cls = converter.load_schema(api, version, kind)

    @settings(max_examples=10, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.from_type(cls))
    def round_trip(entity: object) -> None:
        message = converter.to_proto(entity)
        again = type(message).FromString(message.SerializeToString())
        assert converter.from_proto(again, cls) == entity

    round_trip()


def test_absent_request_fields_take_the_newest_declared_default() -> None:
    from kio.schema.fetch.v4 import request as fetch_v4

    entity = fetch_v4.FetchRequest(
        replica_id=-1, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1,
        max_bytes=1024, isolation_level=0, topics=(fetch_v4.FetchTopic(
            topic="t", partitions=(fetch_v4.FetchPartition(
                partition=3, fetch_offset=42, partition_max_bytes=100),)),))
    message = converter.to_proto(entity)
    assert isinstance(message, kafka_pb2.FetchRequest)
    assert message.max_wait_ms == 500
    # Fetch sessions (v7+): none, and the epoch of a full fetch without a session.
    assert message.session_id == 0 and message.session_epoch == -1
    assert message.rack_id == ""
    assert (message.replica_state.replica_id, message.replica_state.replica_epoch) == (-1, -1)
    [partition] = message.topics[0].partitions
    assert (partition.partition, partition.fetch_offset) == (3, 42)
    assert partition.current_leader_epoch == -1
    assert partition.last_fetched_epoch == -1
    assert partition.log_start_offset == -1
    # No version declares a default topic id, so it stays unset.
    assert not message.topics[0].HasField("topic_id")
    assert not message.HasField("cluster_id")


def test_metadata_quirks_and_auto_creation_default() -> None:
    v0 = converter.load_schema("metadata", 0, EntityType.request)
    v1 = converter.load_schema("metadata", 1, EntityType.request)
    v4 = converter.load_schema("metadata", 4, EntityType.request)

    def converted(entity: object, version: int) -> kafka_pb2.MetadataRequest:
        message = converter.to_proto(entity)
        converter.normalise_request(3, version, message)
        return message  # type: ignore[return-value]

    everything = converted(v0(topics=()), 0)
    assert everything.topics_is_null is True
    assert everything.allow_auto_topic_creation is True
    topic = _nested(v0, "topics")
    named = converted(v0(topics=(topic(name="a"),)), 0)
    assert named.topics_is_null is False and [t.name for t in named.topics] == ["a"]
    # From v1 on, null means every topic and an empty list means none.
    assert converted(v1(topics=None), 1).topics_is_null is True
    none = converted(v1(topics=()), 1)
    assert none.topics_is_null is False and list(none.topics) == []
    assert converted(v4(topics=(), allow_auto_topic_creation=False), 4) \
        .allow_auto_topic_creation is False


def _nested(cls: type, field: str) -> type:
    """The element class of an array field."""
    hint = typing.get_type_hints(cls)[field]
    for arg in typing.get_args(hint):
        if typing.get_origin(arg) is tuple:
            hint = arg
    return typing.get_args(hint)[0]


def test_response_fields_left_unset_take_the_version_default_or_zero() -> None:
    metadata = converter.load_schema("metadata", 12, EntityType.response)
    response = converter.from_proto(kafka_pb2.MetadataResponse(
        topics=[{"name": "t", "topic_id": converter.NIL_UUID},
                {"name": "u", "topic_id": "6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f1"},
                {"name": "v"}]), metadata)
    assert response.brokers == ()
    assert response.cluster_id is None
    assert response.throttle_time == datetime.timedelta(0)
    assert [t.topic_id for t in response.topics] == [
        None, uuid.UUID("6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f1"), None]
    assert response.topics[0].error_code is ErrorCode.none
    assert response.topics[0].partitions == ()
    assert response.topics[0].topic_authorized_operations == -2147483648

    produce = converter.load_schema("produce", 8, EntityType.response)
    partitions = converter.from_proto(kafka_pb2.ProduceResponse(responses=[{
        "name": "t", "partition_responses": [
            {"index": 0},
            {"index": 1, "log_append_time_ms": -1, "error_code": 12345},
            {"index": 2, "log_append_time_ms": 1500, "log_start_offset": 7},
        ]}]), produce).responses[0].partition_responses
    assert [p.log_append_time for p in partitions] == [
        None, None, datetime.datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=datetime.UTC)]
    assert [p.log_start_offset for p in partitions] == [-1, -1, 7]
    assert partitions[1].error_code is ErrorCode.unknown_server_error
    assert partitions[0].record_errors == () and partitions[0].error_message is None

    fetch = converter.load_schema("fetch", 11, EntityType.response)
    data = converter.from_proto(kafka_pb2.FetchResponse(responses=[{"topic": "t", "partitions": [
        {"partition_index": 0},
        {"partition_index": 1, "aborted_transactions_is_null": False, "records": b"batch"},
    ]}]), fetch).responses[0].partitions
    assert [p.aborted_transactions for p in data] == [None, ()]
    assert [p.records for p in data] == [None, b"batch"]
    assert [p.preferred_read_replica for p in data] == [-1, -1]


def test_none_values_are_left_unset() -> None:
    produce = converter.load_schema("produce", 9, EntityType.request)
    entity = converter.from_proto(kafka_pb2.ProduceRequest(
        acks=-1, timeout_ms=30000, topic_data=[{"name": "t", "partition_data": [
            {"index": 0}]}]), produce)
    assert entity.transactional_id is None
    assert entity.topic_data[0].partition_data[0].records is None
    message = converter.to_proto(entity)
    assert not message.HasField("transactional_id")
    assert not message.topic_data[0].partition_data[0].HasField("records")
    assert message.acks == -1 and message.timeout_ms == 30000


def test_fetch_v5_and_older_get_not_leader_where_v6_and_newer_get_kafka_storage_error():
    """Kafka's maybeDownConvertStorageError: KAFKA_STORAGE_ERROR is a Fetch answer from v6."""
    storage, not_leader = (ErrorCode.kafka_storage_error.value,
                           ErrorCode.not_leader_or_follower.value)

    def answered(version: int) -> list[int]:
        response = kafka_pb2.FetchResponse()
        partitions = response.responses.add(topic="t").partitions
        partitions.add(partition_index=0, error_code=storage)
        partitions.add(partition_index=1, error_code=0)
        converter.normalise_response(1, version, response)
        return [p.error_code for p in partitions]

    assert answered(4) == answered(5) == [not_leader, 0]
    assert answered(6) == answered(16) == [storage, 0]
