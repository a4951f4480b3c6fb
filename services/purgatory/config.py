"""Settings of the purgatory service."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option


@dataclass(frozen=True, slots=True)
class PurgatoryConfig:
    """The purgatory: delayed operations (produce acks=all, fetch min bytes, join, heartbeat)."""

    grpc_address: str = option("127.0.0.1:19300", "host:port of the Purgatory gRPC service")
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
