"""Unmodified Kafka clients against the frontend (in front of an in-test handler): librdkafka
through confluent-kafka, negotiating versions with ApiVersions and speaking flexible versions.
Also the frontend as a process (``python -m services.frontend``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from services.frontend.config import FrontendConfig
from services.frontend.server import start

from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire
from .sample_requests import metadata_v12

ROOT = Path(__file__).resolve().parents[2]


def test_confluent_kafka_admin_and_producer() -> None:
    async def main() -> None:
        handler = await FakeHandler("fake-cluster").start()
        service = await start(FrontendConfig(listen_port=0, grpc_address="127.0.0.1:0",
                                             handlers=(handler.address,)))
        try:
            bootstrap = f"127.0.0.1:{service.kafka_port}"
            await asyncio.to_thread(drive_clients, bootstrap)
        finally:
            await service.stop(0)
            await handler.stop()
        assert handler.called("Produce"), "the producer's batch reached the handler"
        assert handler.called("CreateTopics")[0].topics[0].name == "created"

    asyncio.run(main())


def drive_clients(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert metadata.cluster_id == "fake-cluster"
    assert "canned" in metadata.topics
    assert [b.port for b in metadata.brokers.values()] == [int(bootstrap.rsplit(":", 1)[1])]
    futures = admin.create_topics([NewTopic("created", num_partitions=3,
                                            replication_factor=1)], request_timeout=10)
    futures["created"].result(timeout=10)

    delivered: list[tuple[KafkaError | None, int]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})
    for value in (b"one", b"two"):
        producer.produce("orders", value, partition=0,
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
        producer.flush(10)
    assert delivered == [(None, 0), (None, 1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.processes
def test_runs_as_a_process_and_stops_on_sigterm() -> None:
    async def main() -> None:
        handler = await FakeHandler().start()
        port = free_port()
        env = dict(os.environ, KBROKER_HANDLERS=handler.address, KBROKER_LOG_LEVEL="WARNING")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.frontend", "--listen-port", str(port),
            "--grpc-address", "127.0.0.1:0", cwd=ROOT, env=env)
        try:
            wire = None
            for _ in range(200):
                try:
                    wire = await KafkaWire.connect(port)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            assert wire is not None, "the frontend process never listened"
            response = await wire.request(metadata_v12("p"), 1)
            assert response.topics[0].name == "p"
            assert response.brokers[0].port == port
            await wire.close()
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 10) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await asyncio.wait_for(process.wait(), 10)
            await handler.stop()

    asyncio.run(main())
