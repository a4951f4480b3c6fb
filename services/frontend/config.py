"""Settings of the frontend: where it listens for Kafka clients, the address it advertises to
them, where its own gRPC port (health, reflection, metrics) and the handlers are."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option
from services.common.tls import CA_HELP, CERT_HELP, KEY_HELP


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """The Kafka wire-protocol frontend."""

    listen_host: str = option("127.0.0.1", "interface the Kafka listener binds")
    listen_port: int = option(9092, "Kafka listener port (0 picks a free one)")
    advertised_host: str = option("", "host clients are told to reach this frontend at "
                                      "(default: listen_host)")
    advertised_port: int = option(0, "port clients are told to reach this frontend at "
                                     "(default: the bound listen port)")
    broker_ports: int = option(
        1, "Kafka listener ports, one per broker id: broker N is served on listen_port + N and "
           "advertised at advertised_port + N (clients identify brokers by address)")
    grpc_address: str = option("127.0.0.1:19090", "host:port of the frontend's own gRPC port "
                                                  "(health, reflection, metrics)")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)
    metrics_port: int = option(0, "Prometheus HTTP port (0 = disabled)")
    handlers: tuple[str, ...] = option(("127.0.0.1:19100",),
                                       "comma-separated host:port of every handler")
    socket_request_max_bytes: int = option(104857600, "largest request frame accepted; a "
                                                      "larger one closes the connection")
    instance: str = option("frontend-0", "name of this frontend instance (kafka-frontend-id)")
    quota_window_num: int = option(11, "samples a client quota rate is measured over "
                                       "(quota.window.num)")
    quota_window_size_seconds: int = option(1, "length of each client quota sample "
                                               "(quota.window.size.seconds)")
