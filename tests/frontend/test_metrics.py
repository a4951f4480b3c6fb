"""The frontend's request metrics: the arrival clock, error codes and bytes per topic as pure
logic, then the request phases, per-topic bytes and error counts through a real frontend in
front of an in-test handler on a port-0 gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kio.schema.fetch.v12.response import FetchResponse as FetchResponseV12
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12
from kio.schema.produce.v9.response import ProduceResponse as ProduceResponseV9
from prometheus_client import REGISTRY

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.error_answers import error_codes
from services.common.metrics import REMOTE_TIME_METADATA_KEY
from services.frontend.config import FrontendConfig
from services.frontend.server import FrontendService, start

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire, encode_request
from .sample_requests import fetch_v12_request, metadata_v12, produce_v9_request


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def phase(api: str, name: str) -> tuple[float, float]:
    """(count, sum) of one request phase's histogram."""
    labels = {"api": api, "phase": name}
    return (sample("kbroker_frontend_request_phase_seconds_count", **labels),
            sample("kbroker_frontend_request_phase_seconds_sum", **labels))


def total(api: str) -> tuple[float, float]:
    return (sample("kbroker_frontend_request_total_seconds_count", api=api),
            sample("kbroker_frontend_request_total_seconds_sum", api=api))


PHASES = ("request_queue", "local", "remote", "response_queue", "response_send")


def phases(api: str) -> dict[str, tuple[float, float]]:
    return {name: phase(api, name) for name in PHASES}


def delta(after: tuple[float, float], before: tuple[float, float]) -> tuple[float, float]:
    return after[0] - before[0], after[1] - before[1]


# --- pure logic --------------------------------------------------------------------------------


def test_error_codes_anywhere_in_a_response_count_once_per_code() -> None:
    fetch = k.FetchResponse(error_code=0, responses=[
        {"topic": "a", "partitions": [{"partition_index": 0, "error_code": 6},
                                      {"partition_index": 1, "error_code": 6},
                                      {"partition_index": 2, "error_code": 0}]},
        {"topic": "b", "partitions": [{"partition_index": 0, "error_code": 3}]}])
    assert sorted(error_codes(fetch)) == [3, 6]
    assert error_codes(k.FetchResponse(error_code=70, responses=[
        {"topic": "a", "partitions": [{"error_code": 6}]}])) == [70, 6]
    assert error_codes(k.MetadataResponse(topics=[{"name": "x", "error_code": 0}])) == []
    assert error_codes(k.CreateTopicsResponse(topics=[{"name": "x", "error_code": 36}])) == [36]


# --- through a real frontend -------------------------------------------------------------------


class TimedHandler(FakeHandler):
    """Fetch answers with records and, like the real handler after a purgatory wait, reports
    remote time in the trailing metadata."""

    def __init__(self, remote_ms: float, records: bytes) -> None:
        super().__init__()
        self.remote_ms = remote_ms
        self.records = records

    async def Fetch(self, request, context):
        await self._enter("Fetch", request, context)
        await asyncio.sleep(self.remote_ms / 1000)
        context.set_trailing_metadata(((REMOTE_TIME_METADATA_KEY, f"{self.remote_ms:.3f}"),))
        return k.FetchResponse(responses=[
            {"topic": t.topic, "partitions": [
                {"partition_index": p.partition, "high_watermark": 1, "last_stable_offset": 1,
                 "log_start_offset": 0, "records": self.records} for p in t.partitions]}
            for t in request.topics])


@contextlib.asynccontextmanager
async def frontend(handler: FakeHandler, **settings: object) -> AsyncIterator[FrontendService]:
    await handler.start()
    try:
        service = await start(FrontendConfig(
            listen_port=0, grpc_address="127.0.0.1:0", instance="frontend-metrics-test",
            handlers=(handler.address,), **settings))
        try:
            yield service
        finally:
            await service.stop(0)
    finally:
        await handler.stop()


def test_pipelined_requests_wait_in_the_request_queue() -> None:
    """Four Metadata requests sent in one write: served one after another (each takes the
    handler 80 ms), so the second waits ~80 ms, the third ~160 ms, the fourth ~240 ms."""
    delay = 0.08

    async def main() -> None:
        handler = FakeHandler()
        handler.delays["Metadata"] = delay
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.request(metadata_v12("warm-up"), 1)  # connection and channel set up
            before, before_total = phases("Metadata"), total("Metadata")
            await wire.send(b"".join(encode_request(metadata_v12("t"), i) for i in range(2, 6)))
            for i in range(2, 6):
                got, _ = await wire.read_response(MetadataResponseV12)
                assert got == i
            await wire.close()
            after, after_total = phases("Metadata"), total("Metadata")
            moved = {name: delta(after[name], before[name]) for name in PHASES}
            assert all(count == 4 for count, _ in moved.values()), moved
            queue = moved["request_queue"][1]
            assert 6 * delay * 0.9 <= queue <= 6 * delay + 0.5, queue
            assert 4 * delay * 0.9 <= moved["local"][1] <= 4 * delay + 0.5, moved
            assert moved["remote"][1] == 0.0
            total_count, total_sum = delta(after_total, before_total)
            assert total_count == 4
            # The phases add up to the total (each observation is clamped at 0: equal here).
            assert abs(sum(s for _, s in moved.values()) - total_sum) < 1e-3

    asyncio.run(asyncio.wait_for(main(), 30))


def test_remote_time_is_what_the_handler_reports_and_fetch_bytes_count_per_topic() -> None:
    records = b"r" * 1234

    async def main() -> None:
        async with frontend(TimedHandler(remote_ms=150, records=records)) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            # A first Fetch v12 compiles that version's codec (frontend work, not measured).
            await wire.request(fetch_v12_request(), 6)
            before = phases("Fetch")
            out_before = sample("kbroker_frontend_topic_fetched_bytes_total", topic="orders")
            response = await wire.request(fetch_v12_request(), 7)
            assert isinstance(response, FetchResponseV12)
            await wire.close()
            after = phases("Fetch")
            remote = delta(after["remote"], before["remote"])
            local = delta(after["local"], before["local"])
            assert remote[0] == 1 and abs(remote[1] - 0.15) < 1e-9, remote
            # The handler's sleep is the remote part; what is left is frontend work.
            assert local[0] == 1 and local[1] < 0.1, local
            out = sample("kbroker_frontend_topic_fetched_bytes_total", topic="orders") - out_before
            assert out == len(records)  # one partition in the request

    asyncio.run(asyncio.wait_for(main(), 30))


def test_produce_bytes_in_per_topic_and_error_codes_per_response() -> None:
    async def main() -> None:
        handler = FakeHandler()
        async with frontend(handler) as service:
            wire = await KafkaWire.connect(service.kafka_port)
            request = produce_v9_request(acks=1, partitions=3)
            sizes = [len(p.records) for p in request.topic_data[0].partition_data]
            in_before = sample("kbroker_frontend_topic_produced_bytes_total", topic="orders")
            errors_before = sample("kbroker_frontend_error_responses_total",
                                   api="Produce", error_code="3")
            response = await wire.request(request, 1)
            assert isinstance(response, ProduceResponseV9)
            assert sample("kbroker_frontend_topic_produced_bytes_total", topic="orders") \
                - in_before == sum(sizes)

            # Every partition fails: nothing appended, no bytes in; one error response for
            # code 3 however many partitions carry it.
            handler.produce_errors["orders"] = 3
            await wire.request(request, 2)
            await wire.close()
            assert sample("kbroker_frontend_topic_produced_bytes_total", topic="orders") \
                - in_before == sum(sizes)
            assert sample("kbroker_frontend_error_responses_total",
                          api="Produce", error_code="3") - errors_before == 1

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_request_memory_pool_shows_what_it_holds_and_who_waits() -> None:
    """With queued.max.request.bytes smaller than one request, a second connection's Produce
    waits (not read) while the first is being processed; the gauges show the bytes held and the
    connection waiting, then both are answered and the pool is empty again."""
    async def main() -> None:
        handler = FakeHandler()
        handler.delays["Produce"] = 0.5
        request = produce_v9_request(acks=1, partitions=3)
        frame_bytes = len(encode_request(request, 1)) - 4
        async with frontend(handler, queued_max_request_bytes=frame_bytes // 2) as service:
            depleted_before = sample("kbroker_frontend_memory_pool_depleted_seconds_total")
            wires = [await KafkaWire.connect(service.kafka_port) for _ in range(2)]
            first = asyncio.create_task(wires[0].request(request, 1))
            await asyncio.sleep(0.1)
            second = asyncio.create_task(wires[1].request(request, 1))
            await asyncio.sleep(0.2)
            assert sample("kbroker_frontend_memory_pool_used_bytes") == frame_bytes
            assert sample("kbroker_frontend_memory_pool_available_bytes") == 0
            assert sample("kbroker_frontend_memory_pool_waiting_connections") == 1
            for answer in await asyncio.wait_for(asyncio.gather(first, second), 10):
                assert isinstance(answer, ProduceResponseV9)
            for wire in wires:
                await wire.close()
            assert sample("kbroker_frontend_memory_pool_used_bytes") == 0
            assert sample("kbroker_frontend_memory_pool_waiting_connections") == 0
            # The second request waited for the first's 0.5 s.
            assert sample("kbroker_frontend_memory_pool_depleted_seconds_total") \
                - depleted_before > 0.6

    asyncio.run(asyncio.wait_for(main(), 30))
