"""The answers the frontend builds when no handler answered: one for every API and version it
advertises (Metadata excepted: it closes the connection), each encodable in the client's
version and carrying the error where that version has room for it; and the group APIs' shapes
and coordinator codes."""

from __future__ import annotations

import dataclasses
import io
import typing
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import Records

from kbroker.kafka.v1 import kafka_pb2 as k
from services.frontend import converter
from services.frontend.api_versions import SUPPORTED_APIS
from services.frontend.error_responses import (
    COORDINATOR_APIS,
    UNAVAILABLE_CODES,
    error_response,
    failure_code,
)

st.register_type_strategy(Records, st.binary(max_size=16))
st.register_type_strategy(uuid.UUID, st.uuids().filter(lambda u: u.int != 0))

FETCH_KEY = 1
METADATA_KEY = 3
CASES = [
    pytest.param(api.key, version, id=f"{api.name}-v{version}")
    for api in SUPPORTED_APIS.values() if api.rpc is not None
    for version in range(api.min_version, api.max_version + 1)
]


def encode_and_decode(api_key: int, version: int, response: object) -> object:
    """``response`` (protobuf) in the client's version, written and read back with kio."""
    api = SUPPORTED_APIS[api_key]
    cls = converter.load_schema(api.schema_name, version, EntityType.response)
    entity = converter.from_proto(response, cls)  # type: ignore[arg-type]
    out = io.BytesIO()
    entity_writer(cls)(out, entity)
    decoded, size = entity_reader(cls)(out.getvalue(), 0)
    assert size == len(out.getvalue())
    assert decoded == entity
    return decoded


def error_codes(entity: object) -> list[int]:
    """Every error_code field anywhere in a kio entity."""
    found: list[int] = []
    if dataclasses.is_dataclass(entity):
        for f in dataclasses.fields(entity):
            value = getattr(entity, f.name)
            if f.name == "error_code":
                found.append(int(value))
            else:
                found.extend(error_codes(value))
    elif isinstance(entity, tuple):
        for item in entity:
            found.extend(error_codes(item))
    return found


def has_top_level_error(api_key: int, version: int) -> bool:
    api = SUPPORTED_APIS[api_key]
    cls = converter.load_schema(api.schema_name, version, EntityType.response)
    return "error_code" in typing.get_type_hints(cls)


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_every_advertised_api_and_version_has_an_encodable_error_answer(
        api_key: int, version: int) -> None:
    api = SUPPORTED_APIS[api_key]
    request_cls = converter.load_schema(api.schema_name, version, EntityType.request)
    codes = {ErrorCode.request_timed_out, ErrorCode.unknown_server_error,
             UNAVAILABLE_CODES.get(api_key, ErrorCode.request_timed_out)}

    @settings(max_examples=5, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.from_type(request_cls))
    def answer(request: object) -> None:
        message = converter.to_proto(request)
        converter.normalise_request(api_key, version, message)
        for code in codes:
            response = error_response(api_key, message, code)
            if api_key == METADATA_KEY:
                assert response is None  # no honest answer: the connection closes
                continue
            assert response is not None, api.name
            decoded = encode_and_decode(api_key, version, response)
            found = error_codes(decoded)
            expected = int(failure_code(api_key, code))
            assert set(found) <= {0, expected}, (api.name, version, found)
            # A top-level error says it, except Fetch's (its fetch session is fine).
            if has_top_level_error(api_key, version) and api_key != FETCH_KEY:
                assert expected in found, (api.name, version, found)

    answer()


def test_coordinator_apis_answer_coordinator_not_available_for_an_unknown_outcome() -> None:
    for api_key in COORDINATOR_APIS - {9}:
        assert failure_code(api_key, ErrorCode.request_timed_out) == \
            ErrorCode.coordinator_not_available
    # OffsetFetch: the answer librdkafka retries in place (it never fetches the partitions of
    # an OffsetFetch answered COORDINATOR_NOT_AVAILABLE).
    assert failure_code(9, ErrorCode.request_timed_out) == ErrorCode.coordinator_load_in_progress
    for api_key in COORDINATOR_APIS:
        assert failure_code(api_key, ErrorCode.unknown_server_error) == \
            ErrorCode.unknown_server_error
    assert failure_code(0, ErrorCode.request_timed_out) == ErrorCode.request_timed_out
    # The transaction coordinator's APIs, as Kafka's answers a timed-out log write (librdkafka
    # aborts the transaction on REQUEST_TIMED_OUT to EndTxn and AddPartitionsToTxn).
    for api_key in (24, 25, 26, 28):
        assert failure_code(api_key, ErrorCode.request_timed_out) == \
            ErrorCode.coordinator_not_available


NOT_AVAILABLE = ErrorCode.coordinator_not_available
LOADING = ErrorCode.coordinator_load_in_progress


def test_group_answers_name_every_item_of_the_request() -> None:
    commit = k.OffsetCommitRequest(group_id="g", topics=[
        {"name": "t", "partitions": [{"partition_index": 0}, {"partition_index": 3}]}])
    answer = encode_and_decode(8, 8, error_response(8, commit, ErrorCode.request_timed_out))
    assert [(p.partition_index, p.error_code) for p in answer.topics[0].partitions] == [
        (0, NOT_AVAILABLE), (3, NOT_AVAILABLE)]

    fetch = k.OffsetFetchRequest(group_id="g", topics=[{"name": "t", "partition_indexes": [1]}])
    built = error_response(9, fetch, ErrorCode.request_timed_out)
    v1 = encode_and_decode(9, 1, built)  # no top-level error before v2: per partition
    [partition] = v1.topics[0].partitions
    assert (partition.partition_index, partition.committed_offset, partition.error_code) == (
        1, -1, LOADING)
    assert encode_and_decode(9, 7, built).error_code == LOADING
    batched = k.OffsetFetchRequest(groups=[{"group_id": "a", "topics_is_null": True},
                                           {"group_id": "b"}])
    v8 = encode_and_decode(9, 8, error_response(9, batched, ErrorCode.request_timed_out))
    assert [(g.group_id, g.error_code) for g in v8.groups] == [("a", LOADING), ("b", LOADING)]

    keys = k.FindCoordinatorRequest(key_type=0, coordinator_keys=["a", "b"])
    v4 = encode_and_decode(10, 4, error_response(10, keys, ErrorCode.request_timed_out))
    assert [(c.key, c.node_id, c.error_code) for c in v4.coordinators] == [
        ("a", -1, NOT_AVAILABLE), ("b", -1, NOT_AVAILABLE)]
    single = k.FindCoordinatorRequest(key="a", key_type=0)
    v3 = encode_and_decode(10, 3, error_response(10, single, ErrorCode.request_timed_out))
    assert (v3.error_code, v3.node_id, v3.port) == (NOT_AVAILABLE, -1, -1)

    join = k.JoinGroupRequest(group_id="g", member_id="m-1", protocol_type="consumer")
    joined = encode_and_decode(11, 9, error_response(11, join, ErrorCode.request_timed_out))
    assert (joined.error_code, joined.member_id, joined.generation_id) == (
        NOT_AVAILABLE, "m-1", -1)

    leave = k.LeaveGroupRequest(group_id="g", members=[{"member_id": "m-1"},
                                                       {"member_id": "", "group_instance_id": "i"}])
    left = encode_and_decode(13, 5, error_response(13, leave, ErrorCode.request_timed_out))
    assert left.error_code == NOT_AVAILABLE
    assert [(m.member_id, m.group_instance_id) for m in left.members] == [
        ("m-1", None), ("", "i")]

    describe = k.DescribeGroupsRequest(groups=["a", "b"])
    described = encode_and_decode(15, 5, error_response(15, describe,
                                                        ErrorCode.request_timed_out))
    assert [(g.group_id, g.error_code, g.group_state) for g in described.groups] == [
        ("a", NOT_AVAILABLE, ""), ("b", NOT_AVAILABLE, "")]

    delete = k.DeleteGroupsRequest(groups_names=["a"])
    deleted = encode_and_decode(42, 2, error_response(42, delete, ErrorCode.request_timed_out))
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("a", NOT_AVAILABLE)]

    pid = encode_and_decode(22, 4, error_response(22, k.InitProducerIdRequest(),
                                                  ErrorCode.request_timed_out))
    assert (pid.error_code, pid.producer_id, pid.producer_epoch) == (NOT_AVAILABLE, -1, -1)


@pytest.mark.parametrize("version", [4, 12, 15])
def test_fetch_error_answers_carry_empty_records_not_null(version: int) -> None:
    """librdkafka refuses a Fetch partition whose records are null ("invalid MessageSetSize
    -1"); Kafka answers an errored partition with empty records."""
    request = k.FetchRequest(topics=[k.FetchRequest.FetchTopic(
        topic="t", topic_id=str(uuid.uuid4()),
        partitions=[k.FetchRequest.FetchPartition(partition=p) for p in (0, 1)])])
    response = error_response(FETCH_KEY, request, ErrorCode.not_leader_or_follower)
    assert response is not None
    decoded = encode_and_decode(FETCH_KEY, version, response)
    partitions = decoded.responses[0].partitions  # type: ignore[attr-defined]
    assert [p.records for p in partitions] == [b"", b""]
