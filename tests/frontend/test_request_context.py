"""What the frontend tells a handler about each request beyond the request itself: the API
version the client spoke and which broker's port it connected to (the group coordinator answers
by them: JoinGroup v4+ hands out member ids first, a broker that is not a group's coordinator
says NOT_COORDINATOR)."""

from __future__ import annotations

import asyncio

from kio.schema.metadata.v0.request import MetadataRequest as MetadataRequestV0

from services.frontend.config import FrontendConfig
from services.frontend.server import start
from services.local_cluster import free_port_range

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire
from .sample_requests import metadata_v12


def test_the_handler_learns_the_api_version_and_the_broker_port_used() -> None:
    async def main() -> None:
        handler = await FakeHandler().start()
        first = free_port_range("127.0.0.1", 3)
        service = await start(FrontendConfig(
            listen_port=first, grpc_address="127.0.0.1:0", instance="frontend-test",
            broker_ports=3, handlers=(handler.address,)))
        try:
            for broker, request, version in ((0, MetadataRequestV0(topics=()), 0),
                                             (2, metadata_v12("t"), 12)):
                wire = await KafkaWire.connect(first + broker)
                await wire.request(request, 1)
                await wire.close()
                _, _, context = handler.calls[-1]
                assert context["kafka-api-version"] == str(version)
                assert context["kafka-broker-id"] == str(broker)
        finally:
            await service.stop(0)
            await handler.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
