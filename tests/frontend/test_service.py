"""The frontend as a service: a real frontend (server.start) in front of in-test handlers on
port-0 gRPC servers, driven over raw sockets with requests encoded by kio."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import socket
import struct
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.response import FetchResponse as FetchResponseV12
from kio.schema.metadata.v0.request import MetadataRequest as MetadataRequestV0
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12
from kio.schema.produce.v9.response import ProduceResponse as ProduceResponseV9
from kio.static.constants import EntityType
from prometheus_client import REGISTRY

from services.common.channels import insecure_channel
from services.frontend.api_versions import SUPPORTED_APIS, supported_versions
from services.frontend.config import FrontendConfig
from services.frontend.converter import from_proto, load_schema, proto_class
from services.frontend.server import FrontendService, start

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire, encode_request, frame
from .sample_requests import fetch_v12_request, metadata_v12, produce_v9_request


@contextlib.asynccontextmanager
async def frontend(*handlers: FakeHandler, before: tuple[str, ...] = ()
                   ) -> AsyncIterator[FrontendService]:
    """A frontend in front of ``handlers`` (started here, stopped on exit), with the handler
    addresses ``before`` listed first."""
    try:
        for handler in handlers:
            await handler.start()
        config = FrontendConfig(
            listen_port=0, grpc_address="127.0.0.1:0", instance="frontend-test",
            handlers=before + tuple(h.address for h in handlers))
        service = await start(config)
        try:
            yield service
        finally:
            await service.stop(0)
    finally:
        for handler in handlers:
            await handler.stop()


def test_api_versions_every_version_and_a_future_one() -> None:
    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            expected = supported_versions()
            for version in range(5):
                request = load_schema("api_versions", version, EntityType.request)
                response_cls = load_schema("api_versions", version, EntityType.response)
                fields = {"client_software_name": "kbroker-tests",
                          "client_software_version": "1.0"} if version >= 3 else {}
                await wire.send(encode_request(request(**fields), correlation_id=100 + version))
                correlation_id, response = await wire.read_response(response_cls, False)
                assert correlation_id == 100 + version
                assert response.error_code == ErrorCode.none
                got = [(a.api_key, a.min_version, a.max_version) for a in response.api_keys]
                assert got == expected
                if version >= 1:
                    assert response.throttle_time == datetime.timedelta(0)
                if version >= 3:
                    # transaction.version 2 (KIP-890 part 2), as a Kafka 4 broker with it.
                    assert [(f.name, f.min_version, f.max_version)
                            for f in response.supported_features] == [
                        ("transaction.version", 0, 2)]
                    assert [(f.name, f.min_version_level, f.max_version_level)
                            for f in response.finalized_features] == [
                        ("transaction.version", 2, 2)]
                    assert response.finalized_features_epoch >= 0
                    assert response.zk_migration_ready is False

            # KIP-511: a version beyond the range is answered in v0 with UNSUPPORTED_VERSION.
            await wire.send(encode_request(ApiVersionsRequestV0(), correlation_id=7,
                                           api_version=99))
            correlation_id, response = await wire.read_response(ApiVersionsResponseV0, False)
            assert correlation_id == 7
            assert response.error_code == ErrorCode.unsupported_version
            assert [(a.api_key, a.min_version, a.max_version)
                    for a in response.api_keys] == expected
            # The connection stays usable.
            assert (await wire.request(metadata_v12("a"), 8)).topics[0].name == "a"
            await wire.close()

    asyncio.run(main())


def test_api_versions_v3_with_invalid_software_name_is_invalid_request() -> None:
    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            request = load_schema("api_versions", 3, EntityType.request)
            response = await wire.request(request(client_software_name="-bad name-",
                                                  client_software_version="1"), 3)
            assert response.error_code == ErrorCode.invalid_request
            await wire.close()

    asyncio.run(main())


GARBAGE = {
    "absurd frame length": struct.pack(">i", 0x7FFFFFF0) + b"\x00" * 16,
    "negative frame length": struct.pack(">i", -5),
    "unknown API key": frame(struct.pack(">hhih", 999, 0, 1, -1)),
    "unsupported Metadata version": frame(struct.pack(">hhih", 3, 99, 1, -1)),
    "frame shorter than a header": frame(b"\x00\x03"),
    "truncated body": frame(encode_request(metadata_v12("a", "b"), 1)[4:-6]),
    "http": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "cut inside a frame": struct.pack(">i", 100) + b"\x00\x03\x00\x0c",
}


def test_garbage_closes_only_that_connection() -> None:
    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            good = await KafkaWire.connect(service.kafka_port)
            assert (await good.request(metadata_v12("x"), 1)).topics[0].name == "x"
            for number, (name, data) in enumerate(GARBAGE.items()):
                bad = await KafkaWire.connect(service.kafka_port)
                if name == "cut inside a frame":
                    await bad.send(data)
                    bad.writer.write_eof()
                else:
                    await bad.send(data)
                assert await bad.closed_by_peer(), name
                await bad.close()
                # The other connection, and new ones, keep working.
                response = await good.request(metadata_v12(f"t{number}"), 10 + number)
                assert response.topics[0].name == f"t{number}", name
            fresh = await KafkaWire.connect(service.kafka_port)
            assert (await fresh.request(metadata_v12("y"), 2)).topics[0].name == "y"
            await fresh.close()
            await good.close()

    asyncio.run(main())


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    async def main() -> None:
        handler = FakeHandler()
        # A slow Metadata must not let the quicker requests behind it overtake it.
        handler.delays["Metadata"] = 0.002
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            requests = []
            for i in range(50):
                if i % 3 == 0:
                    requests.append(metadata_v12(f"topic-{i}"))
                elif i % 3 == 1:
                    requests.append(produce_v9_request(partitions=1))
                else:
                    requests.append(load_schema("api_versions", 2, EntityType.request)())
            await wire.send(b"".join(encode_request(r, 1000 + i)
                                     for i, r in enumerate(requests)))
            for i, request in enumerate(requests):
                response_cls = load_schema(
                    request.__class__.__module__.split(".")[2], request.__version__,
                    EntityType.response)
                correlation_id, response = await wire.read_response(response_cls)
                assert correlation_id == 1000 + i
                if i % 3 == 0:
                    assert response.topics[0].name == f"topic-{i}"
            assert handler.max_in_flight == 1
            names = [rpc for rpc, _, _ in handler.calls]
            assert names == ["Metadata" if i % 3 == 0 else "Produce"
                             for i in range(50) if i % 3 != 2]
            await wire.close()

    asyncio.run(main())


def test_produce_with_acks_0_is_processed_but_not_answered() -> None:
    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(acks=0), 1)
                            + encode_request(metadata_v12("after"), 2))
            correlation_id, response = await wire.read_response(MetadataResponseV12)
            assert correlation_id == 2
            assert response.topics[0].name == "after"
            assert [rpc for rpc, _, _ in handler.calls] == ["Produce", "Metadata"]
            assert handler.called("Produce")[0].acks == 0
            await wire.close()

    asyncio.run(main())


def test_a_client_id_outside_printable_ascii_reaches_the_handler_percent_encoded() -> None:
    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(metadata_v12("m"), 1, client_id="caf\u00e9 100%"))
            await wire.read_response(MetadataResponseV12)
            await wire.close()
        assert handler.calls[0][2]["kafka-client-id"] == "caf%C3%A9 100%25"

    asyncio.run(main())


def test_failed_produce_with_acks_0_closes_the_connection() -> None:
    async def main() -> None:
        handler = FakeHandler()
        handler.produce_errors["orders"] = int(ErrorCode.not_leader_or_follower)
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(acks=0), 1))
            assert await wire.closed_by_peer()
            await wire.close()
            assert len(handler.called("Produce")) == 1

    asyncio.run(main())


def test_stop_lets_the_request_in_flight_finish() -> None:
    async def main() -> None:
        handler = FakeHandler()
        handler.delays["Metadata"] = 0.3
        async with frontend(handler) as service:
            busy = await KafkaWire.connect(service.kafka_port)
            idle = await KafkaWire.connect(service.kafka_port)
            await busy.send(encode_request(metadata_v12("late"), 4))
            await asyncio.wait_for(handler.received.wait(), 5)
            await service.stop(grace=5)
            correlation_id, response = await busy.read_response(MetadataResponseV12)
            assert (correlation_id, response.topics[0].name) == (4, "late")
            assert await busy.closed_by_peer()
            assert await idle.closed_by_peer()
            await busy.close()
            await idle.close()

    asyncio.run(main())


def test_requests_reach_the_handler_complete_and_with_context() -> None:
    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            response = await wire.request(MetadataRequestV0(topics=()), 1)
            assert [t.name for t in response.topics] == ["canned"]
            assert response.brokers[0].port == service.kafka_port
            produced = await wire.request(produce_v9_request(), 2)
            assert isinstance(produced, ProduceResponseV9)
            assert [p.base_offset for p in produced.responses[0].partition_responses] == [0, 0]
            fetched = await wire.request(fetch_v12_request(), 3)
            assert fetched.responses[0].partitions[0].error_code == ErrorCode.none
            await wire.close()

        metadata_request = handler.called("Metadata")[0]
        # Metadata v0's empty list means every topic; v0 has no auto-creation flag: default.
        assert metadata_request.topics_is_null is True
        assert metadata_request.allow_auto_topic_creation is True
        produce = handler.called("Produce")[0]
        assert produce.acks == 1 and produce.timeout_ms == 1500
        assert [p.records for p in produce.topic_data[0].partition_data] == [b"batch-0",
                                                                             b"batch-1"]
        _, _, context = handler.calls[0]
        assert context["kafka-client-id"] == "test-client"
        assert context["kafka-client-host"] == "127.0.0.1"
        assert context["kafka-advertised"] == f"127.0.0.1:{service.kafka_port}"
        assert context["kafka-frontend-id"] == "frontend-test"

    asyncio.run(main())


def test_handler_dying_mid_metadata_is_retried_on_another_handler() -> None:
    async def main() -> None:
        first = FakeHandler("first", block=("Metadata",))
        second = FakeHandler("second")
        async with frontend(first, second) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(metadata_v12("m"), 5))
            await asyncio.wait_for(first.entered.wait(), 5)
            await first.stop()
            correlation_id, response = await wire.read_response(MetadataResponseV12)
            assert correlation_id == 5
            assert response.cluster_id == "second"
            assert response.topics[0].name == "m"
            assert len(second.called("Metadata")) == 1
            await wire.close()

    asyncio.run(main())


def test_handler_dying_mid_produce_closes_the_connection() -> None:
    """The append may still arrive: an answer would let the next produce overtake it."""
    async def main() -> None:
        first = FakeHandler("first", block=("Produce",))
        second = FakeHandler("second")
        async with frontend(first, second) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(partitions=3), 9))
            # Pipelined behind it: dropped with the connection, never sent.
            await wire.send(encode_request(produce_v9_request(partitions=1), 10))
            await asyncio.wait_for(first.entered.wait(), 5)
            await first.stop()
            assert await wire.closed_by_peer()
            # The outcome is unknown, so the request must not have been sent again.
            assert second.called("Produce") == []
            await wire.close()
            # A new connection is served by the surviving handler.
            wire = await KafkaWire.connect(service.kafka_port)
            assert (await wire.request(metadata_v12("n"), 11)).cluster_id == "second"
            await wire.close()

    asyncio.run(main())


def test_an_idempotent_produce_whose_handler_died_is_resent_to_another_and_answered() -> None:
    """Every batch has a producer id: the leader recognises a copy it already stored, so the
    request is finished on another handler instead of leaving the client an unknown outcome."""
    async def main() -> None:
        first = FakeHandler("first", block=("Produce",))
        second = FakeHandler("second")
        async with frontend(first, second) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(partitions=3, producer_id=7), 9))
            await wire.send(encode_request(produce_v9_request(partitions=1, producer_id=7), 10))
            await asyncio.wait_for(first.entered.wait(), 5)
            sent = first.called("Produce")[0]
            await first.stop()
            for correlation_id in (9, 10):
                got, produced = await wire.read_response(ProduceResponseV9)
                assert got == correlation_id
                assert [p.error_code for p in produced.responses[0].partition_responses] == [
                    ErrorCode.none] * (3 if correlation_id == 9 else 1)
            resent = second.called("Produce")
            assert len(resent) == 2
            assert [p.records for p in resent[0].topic_data[0].partition_data] == [
                p.records for p in sent.topic_data[0].partition_data]
            assert resends("answered") == answered_before + 1
            await wire.close()

    answered_before = resends("answered")
    asyncio.run(main())


@pytest.mark.parametrize("resend_fails", ["refused", "error status"])
def test_an_idempotent_produce_whose_resend_failed_closes_the_connection(
        resend_fails: str) -> None:
    """The first copy may still land after the resend failed (refused on a partition, or the
    call failed with an error status, which alone is answered UNKNOWN_SERVER_ERROR): an answer
    would let the client's next produce for the partition overtake it."""
    async def main() -> None:
        first = FakeHandler("first", block=("Produce",))
        second = FakeHandler("second")
        if resend_fails == "refused":
            second.produce_errors["orders"] = int(ErrorCode.not_leader_or_follower)
        else:
            second.errors["Produce"] = grpc.StatusCode.INTERNAL
        async with frontend(first, second) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(partitions=2, producer_id=7), 9))
            await asyncio.wait_for(first.entered.wait(), 5)
            await first.stop()
            assert await wire.closed_by_peer()
            assert len(second.called("Produce")) == 1
            assert resends("closed") == closed_before + 1
            await wire.close()

    closed_before = resends("closed")
    asyncio.run(main())


def resends(outcome: str) -> float:
    return REGISTRY.get_sample_value("kbroker_frontend_produce_resends_total",
                                     {"outcome": outcome}) or 0.0


async def dead_address() -> str:
    """host:port that nothing listens on: bound once, then freed."""
    probe = FakeHandler()
    await probe.start()
    address = probe.address
    await probe.stop()
    return address


def test_produce_that_never_reached_a_handler_is_sent_to_another() -> None:
    async def main() -> None:
        alive = FakeHandler("alive")
        async with frontend(alive, before=(await dead_address(),)) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            for correlation_id in (1, 2):  # the round robin starts at the dead one, then not
                produced = await wire.request(produce_v9_request(partitions=1), correlation_id)
                assert produced.responses[0].partition_responses[0].error_code == \
                    ErrorCode.none
            assert len(alive.called("Produce")) == 2
            await wire.close()

    asyncio.run(main())


def test_handler_error_status_is_unknown_server_error_and_not_retried() -> None:
    async def main() -> None:
        first = FakeHandler("first")
        second = FakeHandler("second")
        first.errors["Produce"] = second.errors["Produce"] = grpc.StatusCode.INTERNAL
        async with frontend(first, second) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            produced = await wire.request(produce_v9_request(partitions=2), 1)
            assert {p.error_code for p in produced.responses[0].partition_responses} == {
                ErrorCode.unknown_server_error}
            assert len(first.called("Produce")) + len(second.called("Produce")) == 1
            await wire.close()

    asyncio.run(main())


def test_a_stream_reset_under_a_produce_closes_the_connection_and_a_fetch_goes_elsewhere(
) -> None:
    """A handler stream that ends mid-request, whatever status gRPC gives it (INTERNAL for a
    reset stream, here), leaves the request's outcome unknown: never UNKNOWN_SERVER_ERROR,
    which clients take as final (librdkafka fails the produce's records for good)."""
    async def main() -> None:
        breaking = FakeHandler("breaking")
        breaking.breaks_streams = True
        healthy = FakeHandler("healthy")
        async with frontend(breaking, healthy) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(partitions=2), 1))
            assert await wire.closed_by_peer()
            await wire.close()
            assert breaking.streams_broken == 1 and not healthy.called("Produce")
            wire = await KafkaWire.connect(service.kafka_port)
            for correlation_id in (2, 3):  # one of them starts at the breaking handler
                fetched = await wire.request(fetch_v12_request(), correlation_id)
                assert fetched.error_code == ErrorCode.none
                assert all(p.error_code == ErrorCode.none
                           for t in fetched.responses for p in t.partitions)
            assert breaking.streams_broken == 2 and len(healthy.called("Fetch")) == 2
            await wire.close()

    asyncio.run(main())


def test_a_produce_its_handler_could_not_answer_safely_closes_the_connection() -> None:
    """DEADLINE_EXCEEDED from the handler: an idempotent append whose outcome it does not
    know (the handler's own call to the log node failed midway)."""
    async def main() -> None:
        first = FakeHandler("first")
        second = FakeHandler("second")
        first.errors["Produce"] = second.errors["Produce"] = grpc.StatusCode.DEADLINE_EXCEEDED
        async with frontend(first, second) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(produce_v9_request(partitions=2), 1))
            assert await wire.closed_by_peer()
            assert len(first.called("Produce")) + len(second.called("Produce")) == 1
            await wire.close()

    asyncio.run(main())


def test_no_handler_reachable() -> None:
    async def main() -> None:
        async with frontend(before=(await dead_address(),)) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            produced = await wire.request(produce_v9_request(), 1)
            assert {p.error_code for p in produced.responses[0].partition_responses} == {
                ErrorCode.request_timed_out}
            fetched = await wire.request(fetch_v12_request(), 2)
            assert fetched.responses[0].partitions[0].error_code == \
                ErrorCode.not_leader_or_follower
            assert isinstance(fetched, FetchResponseV12)
            # Metadata has no honest error answer: the connection closes instead.
            await wire.send(encode_request(metadata_v12("m"), 3))
            assert await wire.closed_by_peer()
            await wire.close()

    asyncio.run(main())


def test_grpc_port_serves_health_and_metrics_count_requests() -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            before = sample("kbroker_frontend_requests_total", api="Metadata")
            wire = await KafkaWire.connect(service.kafka_port)
            for i in range(3):
                await wire.request(metadata_v12("m"), i)
            assert sample("kbroker_frontend_requests_total", api="Metadata") == before + 3
            assert sample("kbroker_frontend_open_connections") >= 1
            await wire.close()

            channel = insecure_channel(f"127.0.0.1:{service.port}")
            try:
                health = health_pb2_grpc.HealthStub(channel)
                reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            finally:
                await channel.close()

    asyncio.run(main())


def test_every_supported_api_and_version_is_routed_to_its_rpc() -> None:
    # Requests built from protobuf: every field the version has, at its default or zero.
    overrides = {"produce": {"acks": 1, "timeout_ms": 1000}}

    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            correlation_id = 0
            for api in SUPPORTED_APIS.values():
                if api.rpc is None:
                    continue
                for version in range(api.min_version, api.max_version + 1):
                    cls = load_schema(api.schema_name, version, EntityType.request)
                    message = proto_class(api.schema_name, EntityType.request)(
                        **overrides.get(api.schema_name, {}))
                    correlation_id += 1
                    calls = len(handler.calls)
                    await wire.request(from_proto(message, cls), correlation_id)
                    assert [rpc for rpc, _, _ in handler.calls[calls:]] == [api.rpc], (
                        api.name, version)
            await wire.close()

    asyncio.run(main())


def _kio_request(api_key: int, version: int, message: object) -> object:
    api = SUPPORTED_APIS[api_key]
    return from_proto(message, load_schema(api.schema_name, version, EntityType.request))


async def entered_first(*handlers: FakeHandler) -> tuple[FakeHandler, FakeHandler]:
    """(the handler a blocking request entered, the other one, which blocks no more): a group
    request goes first to the handler its group's partition ranks first, either of them."""
    async with asyncio.timeout(5):
        while True:
            for handler in handlers:
                if handler.entered.is_set():
                    [other] = [h for h in handlers if h is not handler]
                    other.block.clear()
                    return handler, other
            await asyncio.sleep(0.01)


def test_handler_dying_mid_offset_commit_answers_coordinator_not_available() -> None:
    async def main() -> None:
        handlers = (FakeHandler("first", block=("OffsetCommit",)),
                    FakeHandler("second", block=("OffsetCommit",)))
        async with frontend(*handlers) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            commit = _kio_request(8, 8, proto_class("offset_commit", EntityType.request)(
                group_id="g", generation_id_or_member_epoch=1, member_id="m",
                topics=[{"name": "t", "partitions": [
                    {"partition_index": 0, "committed_offset": 5},
                    {"partition_index": 1, "committed_offset": 7}]}]))
            await wire.send(encode_request(commit, 3))
            first, second = await entered_first(*handlers)
            await first.stop()
            response_cls = load_schema("offset_commit", 8, EntityType.response)
            correlation_id, response = await wire.read_response(response_cls)
            assert correlation_id == 3
            assert [(p.partition_index, p.error_code) for p in response.topics[0].partitions] \
                == [(0, ErrorCode.coordinator_not_available),
                    (1, ErrorCode.coordinator_not_available)]
            # A commit could undo a later one if it ran twice: not sent again.
            assert second.called("OffsetCommit") == []
            await wire.close()

    asyncio.run(main())


@pytest.mark.parametrize(("rpc", "api_key", "version", "fields"), [
    ("DescribeGroups", 15, 5, {"groups": ["g"]}),
    ("OffsetFetch", 9, 8, {"groups": [{"group_id": "g", "topics_is_null": True}]}),
    ("FindCoordinator", 10, 4, {"key_type": 0, "coordinator_keys": ["g"]}),
    ("ListGroups", 16, 5, {}),
    ("Heartbeat", 12, 4, {"group_id": "g", "generation_id": 1, "member_id": "m"}),
    ("SyncGroup", 14, 5, {"group_id": "g", "generation_id": 1, "member_id": "m"}),
])
def test_group_requests_safe_to_repeat_are_retried_on_another_handler(
        rpc: str, api_key: int, version: int, fields: dict) -> None:
    async def main() -> None:
        handlers = (FakeHandler("first", block=(rpc,)), FakeHandler("second", block=(rpc,)))
        async with frontend(*handlers) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            api = SUPPORTED_APIS[api_key]
            request = _kio_request(api_key, version,
                                   proto_class(api.schema_name, EntityType.request)(**fields))
            await wire.send(encode_request(request, 4))
            first, second = await entered_first(*handlers)
            await first.stop()
            response_cls = load_schema(api.schema_name, version, EntityType.response)
            correlation_id, response = await wire.read_response(response_cls)
            assert correlation_id == 4
            assert len(second.called(rpc)) == 1
            assert ErrorCode.coordinator_not_available not in {
                getattr(response, "error_code", ErrorCode.none)}
            await wire.close()

    asyncio.run(main())


def test_a_frontend_serves_inherited_sockets_and_a_restart_refuses_no_connection() -> None:
    """With the Kafka socket handed down (as the local launcher does), a frontend serves it
    without binding; once that frontend stopped, a connection still waits in the socket's
    queue (the launcher keeps it) and the next frontend on the same socket answers it."""
    async def main() -> None:
        held = socket.create_server(("127.0.0.1", 0), backlog=64)
        port = held.getsockname()[1]
        handler = FakeHandler()
        await handler.start()

        def config() -> FrontendConfig:  # each frontend gets its own copy of the socket
            return FrontendConfig(listen_port=port, grpc_address="127.0.0.1:0",
                                  handlers=(handler.address,),
                                  inherited_listeners=(f"{port}={os.dup(held.fileno())}",))
        try:
            first = await start(config())
            assert first.kafka_port == port
            wire = await KafkaWire.connect(port)
            await wire.send(encode_request(ApiVersionsRequestV0(), correlation_id=1))
            assert (await wire.read_response(ApiVersionsResponseV0, False))[0] == 1
            await first.stop(0)

            waiting = await KafkaWire.connect(port)  # no frontend: queued, not refused
            await waiting.send(encode_request(ApiVersionsRequestV0(), correlation_id=2))
            second = await start(config())
            try:
                correlation_id, response = await asyncio.wait_for(
                    waiting.read_response(ApiVersionsResponseV0, False), 10)
                assert correlation_id == 2 and response.error_code == ErrorCode.none
            finally:
                await second.stop(0)
        finally:
            held.close()
            await handler.stop()

    asyncio.run(main())
