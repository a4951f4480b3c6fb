"""An mTLS-only client: confluent-kafka on the frontend's SSL listener with client
certificates required, against a real local cluster (certificates made in the test); no
client certificate, or one from another CA, is refused."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer

from services.local_cluster import ClusterSpec, LocalCluster, free_port_range
from tests.tls_material import CertificateAuthority, Leaf, client_certificate, localhost_server

from .test_sasl import roundtrip

HOST = "127.0.0.1"


@dataclass
class MtlsCluster:
    cluster: LocalCluster
    bootstrap: str
    ca: CertificateAuthority
    client: Leaf
    folder: Path


@pytest.fixture(scope="module")
def mtls(tmp_path_factory) -> Iterator[MtlsCluster]:
    folder = tmp_path_factory.mktemp("mtls")
    ca = CertificateAuthority.create(folder / "tls")
    server = localhost_server(ca)
    client = client_certificate(ca, "orders-service", unit="apps")
    kafka_port = free_port_range(HOST, 1)
    ssl_port = free_port_range(HOST, 1)
    spec = ClusterSpec(
        data_dir=folder / "cluster", kafka_port=kafka_port, base_port=0, handlers=1,
        log_nodes=1, log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
        service_flags={"frontend": {
            "listeners": f"PLAINTEXT://{HOST}:{kafka_port},SSL://{HOST}:{ssl_port}",
            "ssl_certfile": server.cert, "ssl_keyfile": server.key, "ssl_cafile": ca.cert,
            "ssl_client_auth": "required",
            "ssl_principal_mapping_rules": "RULE:^CN=(.*?),.*$/$1/,DEFAULT"}})
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield MtlsCluster(cluster, f"{HOST}:{ssl_port}", ca, client, folder)
    finally:
        cluster.stop()


def ssl_config(mtls: MtlsCluster, ca: Path, client: Leaf | None) -> dict[str, object]:
    config: dict[str, object] = {"bootstrap.servers": mtls.bootstrap,
                                 "security.protocol": "SSL", "ssl.ca.location": str(ca)}
    if client is not None:
        config.update({"ssl.certificate.location": str(client.cert),
                       "ssl.key.location": str(client.key)})
    return config


def test_mtls_client_produces_and_consumes(mtls, topic_name):
    config = ssl_config(mtls, mtls.ca.cert, mtls.client)
    assert roundtrip(config, topic_name, 10) == [b"v%d" % i for i in range(10)]


def refused(config: dict[str, object]) -> list[KafkaError]:
    """Connect; the transport errors librdkafka reported (none if it got metadata)."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})
    try:
        producer.list_topics(timeout=3)
    except Exception:  # noqa: BLE001 - the failure is what the test wants
        producer.poll(0.5)
        return errors or [KafkaError(KafkaError._TRANSPORT)]
    finally:
        producer.flush(0)
    return []


def test_clients_without_a_trusted_certificate_are_refused(mtls):
    other = CertificateAuthority.create(mtls.folder / "other", "kbroker other test ca")
    impostor = client_certificate(other, "orders-service", unit="apps")
    started = time.monotonic()
    assert refused(ssl_config(mtls, mtls.ca.cert, None)), "no client certificate"
    assert refused(ssl_config(mtls, mtls.ca.cert, impostor)), "a certificate of another CA"
    assert time.monotonic() - started < 30
