"""Settings of the purgatory service."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option
from services.common.tls import CA_HELP, CERT_HELP, KEY_HELP


@dataclass(frozen=True, slots=True)
class PurgatoryConfig:
    """The purgatory: delayed operations (produce acks=all, fetch min bytes, join, heartbeat)."""

    grpc_address: str = option("127.0.0.1:19300", "host:port of the Purgatory gRPC service")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
    instance: str = option("purgatory-0", "this instance's name (metrics snapshots, logs)")
    tick_ms: int = option(1, "Tick of the finest timing wheel, in milliseconds")
    wheel_size: int = option(20, "Buckets per timing wheel")
    purge_interval: int = option(
        1000, "Purge completed operations from watcher lists once this many entries pile up")
    watch_linger_ms: int = option(
        60000, "Keep publishing a key to progress reporters this long after its last parked "
        "fetch or produce operation (WatchKeys)")
