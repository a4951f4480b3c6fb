"""Client quotas enforced by a real frontend (in front of an in-test handler) on the wire: a
client over its producer_byte_rate gets throttle_time_ms in its answer and its connection is
muted for that long (the next request on it waits), while another client id on another
connection is answered at once; a throttled Fetch is answered empty; the quota metrics count
it."""

from __future__ import annotations

import asyncio
import time

from kio.schema.fetch.v12.response import FetchResponse as FetchResponseV12
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12
from kio.schema.produce.v9.response import ProduceResponse as ProduceResponseV9
from prometheus_client import REGISTRY

from kbroker.replicator.v1.replicator_pb2 import ClientQuota, QuotaEntityPart
from services.frontend.config import FrontendConfig
from services.frontend.server import start

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire, encode_request
from .sample_requests import fetch_v12_request, metadata_v12, produce_v9_request


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def client_quota(client_id: str, **values: float) -> ClientQuota:
    return ClientQuota(entity=[QuotaEntityPart(entity_type="client-id", name=client_id)],
                       values=values)


def test_a_client_over_its_produce_quota_is_throttled_and_muted_alone() -> None:
    async def main() -> None:
        handler = await FakeHandler().start()
        # Two 1 s samples: a new client's rate is measured over one second.
        service = await start(FrontendConfig(
            listen_port=0, grpc_address="127.0.0.1:0", handlers=(handler.address,),
            quota_window_num=2, quota_window_size_seconds=1))
        try:
            produce = encode_request(produce_v9_request(), 1, client_id="slow")
            size = len(produce) - 4
            # The frame at twice the quota: (2 - 1) / 1 * 1 s = 1 s of throttle.
            service.quotas.update([client_quota("slow", producer_byte_rate=size / 2)])
            throttled_before = sample("kbroker_frontend_quota_throttle_seconds_count",
                                      quota_type="produce")
            bytes_before = sample("kbroker_frontend_quota_bytes_total", quota_type="produce")

            slow = await KafkaWire.connect(service.kafka_port)
            other = await KafkaWire.connect(service.kafka_port)
            await slow.send(produce + encode_request(metadata_v12(), 2, client_id="slow"))
            _, answer = await slow.read_response(ProduceResponseV9)
            answered = time.monotonic()
            throttle_ms = answer.throttle_time.total_seconds() * 1000
            assert 900 <= throttle_ms <= 1000, throttle_ms

            # Another client id is not slowed down by the throttled one.
            await other.send(encode_request(metadata_v12(), 3, client_id="fast"))
            await other.read_response(MetadataResponseV12)
            assert time.monotonic() - answered < 0.5

            # The throttled connection reads nothing more until its throttle time has passed.
            _, metadata = await slow.read_response(MetadataResponseV12)
            waited_ms = (time.monotonic() - answered) * 1000
            assert waited_ms >= throttle_ms - 50, (waited_ms, throttle_ms)
            assert metadata.throttle_time.total_seconds() == 0

            assert sample("kbroker_frontend_quota_throttle_seconds_count",
                          quota_type="produce") == throttled_before + 1
            assert sample("kbroker_frontend_quota_bytes_total",
                          quota_type="produce") == bytes_before + size
            await slow.close()
            await other.close()
        finally:
            await service.stop(0)
            await handler.stop()

    asyncio.run(main())


def test_a_throttled_fetch_is_answered_empty() -> None:
    async def main() -> None:
        handler = await FakeHandler().start()
        service = await start(FrontendConfig(listen_port=0, grpc_address="127.0.0.1:0",
                                             handlers=(handler.address,)))
        try:
            service.quotas.update([client_quota("reader", consumer_byte_rate=1)])
            before = sample("kbroker_frontend_quota_throttle_seconds_count", quota_type="fetch")
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(fetch_v12_request(), 1, client_id="reader"))
            _, answer = await wire.read_response(FetchResponseV12)
            assert answer.throttle_time.total_seconds() > 0
            assert answer.error_code == 0 and answer.responses == ()
            # max_bytes was capped to one quota window's worth (1 B/s over 10 windows).
            fetch = handler.called("Fetch")[0]
            assert (fetch.max_bytes, fetch.min_bytes) == (10, 1)
            assert sample("kbroker_frontend_quota_throttle_seconds_count",
                          quota_type="fetch") == before + 1
            await wire.close()
        finally:
            await service.stop(0)
            await handler.stop()

    asyncio.run(main())


def test_without_quotas_nothing_is_throttled() -> None:
    async def main() -> None:
        handler = await FakeHandler().start()
        service = await start(FrontendConfig(listen_port=0, grpc_address="127.0.0.1:0",
                                             handlers=(handler.address,)))
        try:
            service.quotas.update([client_quota("someone-else", producer_byte_rate=1)])
            wire = await KafkaWire.connect(service.kafka_port)
            for correlation_id in range(1, 4):
                await wire.send(encode_request(produce_v9_request(), correlation_id))
                _, answer = await wire.read_response(ProduceResponseV9)
                assert answer.throttle_time.total_seconds() == 0
            await wire.close()
        finally:
            await service.stop(0)
            await handler.stop()

    asyncio.run(main())


def test_time_spent_on_a_clients_requests_counts_against_its_request_percentage() -> None:
    async def main() -> None:
        handler = await FakeHandler().start()
        handler.delays["Metadata"] = 0.3
        service = await start(FrontendConfig(
            listen_port=0, grpc_address="127.0.0.1:0", handlers=(handler.address,),
            quota_window_num=2, quota_window_size_seconds=1))
        try:
            # 10% of a thread: 100 ms per second. 300 ms over a 1 s window is 30%.
            service.quotas.update([client_quota("busy", request_percentage=10)])
            before = sample("kbroker_frontend_quota_throttle_seconds_count",
                            quota_type="request")
            wire = await KafkaWire.connect(service.kafka_port)
            await wire.send(encode_request(metadata_v12(), 1, client_id="busy"))
            _, answer = await wire.read_response(MetadataResponseV12)
            # (30 - 10) / 10 * 1 s = 2 s, bounded by one quota window.
            assert answer.throttle_time.total_seconds() == 1.0
            assert sample("kbroker_frontend_quota_throttle_seconds_count",
                          quota_type="request") == before + 1
            await wire.close()
        finally:
            await service.stop(0)
            await handler.stop()

    asyncio.run(main())
