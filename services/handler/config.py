"""The handler's settings, read once at start-up from flags and ``KBROKER_*`` variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option


@dataclass(frozen=True, slots=True)
class HandlerConfig:
    """Settings of one handler instance."""

    grpc_address: str = option("127.0.0.1:19100", "host:port the KafkaHandler gRPC service binds")
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
    replicator_address: str = option("127.0.0.1:19400", "host:port of the replicator")
    purgatory_address: str = option("127.0.0.1:19300", "host:port of the purgatory")
    auto_create_topics_enable: bool = option(
        True, "create unknown topics asked for in Metadata requests (auto.create.topics.enable)"
    )
    advertised: str = option(
        "127.0.0.1:9092",
        "host:port brokers are advertised at when a request carries no kafka-advertised metadata",
    )
    broker_ports: int = option(
        1,
        "with no kafka-broker-ports metadata: broker N is advertised at the advertised port + N "
        "for N below this (a frontend port per broker id), else at the advertised port",
    )
    instance: str = option("handler-0", "this instance's name (metrics, logs)")
