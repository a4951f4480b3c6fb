"""A whole local cluster with mutual TLS between its services (certificates made in the test,
one per service kind): confluent-kafka produces with acks=all to replicated partitions and
consumes back in a group that commits; every internal port refuses plaintext and certificates
of another CA, and answers the probe; services configured for plaintext off loopback do not
start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import probe
from services.common.channels import internal_sync_channel
from services.local_cluster import ClusterSpec, LocalCluster, internal_tls_of

from ..tls_material import internal_tls_dir
from .records import Message, assert_same, make_messages
from .test_confluent_kafka import consume_all
from .test_grpcurl import GRPCURL

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("internal-tls")
    internal_tls_dir(directory)
    return directory


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, material: Path
                ) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        data_dir=tmp_path_factory.mktemp("tls-cluster"), kafka_port=0, base_port=0,
        handlers=1, log_nodes=2, num_partitions=PARTITIONS, default_replication_factor=2,
        group_initial_rebalance_delay_ms=0, internal_tls=material,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
    )
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_produce_and_consume_through_a_cluster_with_internal_mtls(tls_cluster, topic_name):
    bootstrap = tls_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=PARTITIONS, replication_factor=2)],
                        request_timeout=15)[topic_name].result(timeout=20)
    sent = make_messages("mtls", 200, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failures: list[str] = []
    for m in sent:
        producer.produce(topic_name, value=m.value, key=m.key, partition=m.partition,
                         headers=list(m.headers), timestamp=m.timestamp_ms,
                         on_delivery=lambda err, _m: err and failures.append(str(err)))
    assert producer.flush(30) == 0
    assert failures == []
    assert_same(sent, consume_all(bootstrap, topic_name, len(sent), PARTITIONS))

    # A group member: joins (a delayed join in the purgatory), reads everything, commits.
    group = f"g-{topic_name}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    got: list[Message] = []
    try:
        consumer.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got.append(Message(msg.partition(), msg.key(), msg.value(),
                               tuple(msg.headers() or ()), msg.timestamp()[1]))
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic_name, p)
                                        for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert_same(sent, got)
    assert sum(tp.offset for tp in committed) == len(sent)


def health(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=5)
    except grpc.RpcError as e:
        return e.code()  # type: ignore[attr-defined]
    finally:
        channel.close()
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


def test_every_internal_port_requires_a_certificate_of_the_cluster_ca(
        tls_cluster, tmp_path: Path):
    stranger = tmp_path / "stranger"
    internal_tls_dir(stranger)
    for name, svc in tls_cluster.services.items():
        assert health(tls_cluster.health_channel(name)) == grpc.StatusCode.OK, name
        assert health(grpc.insecure_channel(svc.grpc_address)) == \
            grpc.StatusCode.UNAVAILABLE, name
        assert health(internal_sync_channel(
            svc.grpc_address, internal_tls_of(stranger, svc.kind), svc.kind)) == \
            grpc.StatusCode.UNAVAILABLE, name
        own = internal_tls_of(tls_cluster.spec.internal_tls, svc.kind)
        assert probe.main([svc.grpc_address, "--internal-tls-ca", own.ca, "--internal-tls-cert",
                           own.cert, "--internal-tls-key", own.key]) == 0, name
    lines = list(tls_cluster.status_lines())
    assert len(lines) == len(tls_cluster.services)
    assert all(" mtls " in line for line in lines), lines
    security = list(tls_cluster.security_lines())
    assert security[0].startswith(f"Kafka listeners: PLAINTEXT://{tls_cluster.bootstrap} ")
    assert "mutual TLS" in security[1], security


def test_grpcurl_reaches_a_port_with_a_certificate_of_the_cluster(tls_cluster):
    """What an engineer types to debug a TLS port: the CA, a certificate, and the server name
    of the port's kind (the address is an IP, which no certificate names)."""
    own = internal_tls_of(tls_cluster.spec.internal_tls, "handler")
    address = tls_cluster.services["log-0"].grpc_address
    done = subprocess.run([GRPCURL, "-cacert", own.ca, "-cert", own.cert, "-key", own.key,
                           "-servername", "kbroker-log", "-d", '{"service": ""}', address,
                           "grpc.health.v1.Health/Check"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert '"SERVING"' in done.stdout
    done = subprocess.run([GRPCURL, "-cacert", own.ca, "-servername", "kbroker-log", address,
                           "list"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode != 0


def start_refused(module: str, *flags: str) -> str:
    """Run a service that must refuse to start; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBROKER_")}
    done = subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    return done.stderr


def test_services_refuse_plaintext_off_loopback():
    out = start_refused("services.purgatory", "--grpc-address", "0.0.0.0:0")
    assert "purgatory: cannot start: purgatory gRPC server on 0.0.0.0:0: plaintext gRPC is " \
        "allowed only on loopback addresses" in out
    assert "Traceback" not in out
    out = start_refused("services.handler", "--grpc-address", "127.0.0.1:0",
                        "--replicator-address", "10.0.0.1:19400")
    assert "channel to the replicator 10.0.0.1:19400: plaintext gRPC is allowed only" in out
    out = start_refused("services.frontend", "--grpc-address", "127.0.0.1:0",
                        "--handlers", "dns:///kbroker-handler:19100")
    assert "handlers at dns:///kbroker-handler:19100: plaintext gRPC" in out
    out = start_refused("services.log", "--grpc-address", "127.0.0.1:0",
                        "--internal-tls-ca", "ca.crt")
    assert "needs all of internal_tls_ca, internal_tls_cert and internal_tls_key" in out
