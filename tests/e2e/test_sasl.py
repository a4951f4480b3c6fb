"""Real clients authenticating to a real local cluster whose frontend has PLAINTEXT, SASL_SSL
and SASL_PLAINTEXT listeners (certificates made in the test, users from a users file):
confluent-kafka and kcat over SASL_SSL with SCRAM-SHA-512 and with PLAIN, kafkajs over
SASL_SSL, aiokafka over SASL_PLAINTEXT, OAUTHBEARER with tokens made in the test, a wrong
password, an expired token, a SASL frame before the handshake and a client that never
authenticates."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from services.local_cluster import ClusterSpec, LocalCluster, free_port_range
from tests.frontend.oauth_tokens import TokenIssuer
from tests.frontend.sasl_client import authenticate, plain_token
from tests.tls_material import CertificateAuthority, localhost_server

from .wire import encode_request

HOST = "127.0.0.1"
JS_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"
USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@dataclass
class SecureCluster:
    cluster: LocalCluster
    ca: Path
    sasl_ssl: str
    sasl_plaintext: str
    issuer: TokenIssuer


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[SecureCluster]:
    folder = tmp_path_factory.mktemp("sasl")
    ca = CertificateAuthority.create(folder / "tls")
    server = localhost_server(ca)
    users = folder / "users.txt"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    issuer = TokenIssuer(folder)
    kafka_port = free_port_range(HOST, 1)
    sasl_ssl = free_port_range(HOST, 1)
    sasl_plaintext = free_port_range(HOST, 1)
    spec = ClusterSpec(
        data_dir=folder / "cluster", kafka_port=kafka_port, base_port=0, handlers=1,
        log_nodes=1, log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
        group_initial_rebalance_delay_ms=0,
        service_flags={"frontend": {
            "listeners": f"PLAINTEXT://{HOST}:{kafka_port},SASL_SSL://{HOST}:{sasl_ssl},"
                         f"SASL_PLAINTEXT://{HOST}:{sasl_plaintext}",
            "ssl_certfile": server.cert, "ssl_keyfile": server.key,
            "sasl_enabled_mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
            "sasl_users_file": users, "sasl_oauthbearer_jwks": issuer.jwks,
            "sasl_oauthbearer_expected_issuer": issuer.issuer,
            "sasl_oauthbearer_expected_audience": "kafka",
            "authentication_timeout_ms": 1000,
        }})
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield SecureCluster(cluster, ca.cert, f"{HOST}:{sasl_ssl}", f"{HOST}:{sasl_plaintext}",
                            issuer)
    finally:
        cluster.stop()


def sasl_ssl_config(secure: SecureCluster, mechanism: str, user: str = "alice",
                    password: str | None = None) -> dict[str, object]:
    return {"bootstrap.servers": secure.sasl_ssl, "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.ca), "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": USERS[user] if password is None
            else password}


def roundtrip(config: dict[str, object], topic: str, count: int = 20) -> list[bytes]:
    """Create ``topic``, produce ``count`` values, read them back, all with ``config``."""
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=15)[topic].result(15)
    producer = Producer({**config, "acks": "all", "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    return consume(config, topic, count)


def consume(config: dict[str, object], topic: str, count: int) -> list[bytes]:
    consumer = Consumer({**config, "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            got.append(msg.value())
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_confluent_kafka_over_sasl_ssl(secure, topic_name, mechanism):
    config = sasl_ssl_config(secure, mechanism)
    assert roundtrip(config, topic_name) == [b"v%d" % i for i in range(20)]


def kcat(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    path = shutil.which("kcat")
    assert path, "kcat is installed by `make test-deps`"
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_kcat_over_sasl_ssl(secure, topic_name, mechanism):
    security = ["-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={secure.ca}",
                "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=bob",
                "-X", f"sasl.password={USERS['bob']}"]
    lines = [f"line-{i}" for i in range(10)]
    done = kcat("-b", secure.sasl_ssl, *security, "-t", topic_name, "-P", "-p", "0",
                stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    done = kcat("-b", secure.sasl_ssl, *security, "-t", topic_name, "-C", "-o", "beginning",
                "-e", "-q")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == lines


def test_kafkajs_over_sasl_ssl(secure, topic_name):
    node = shutil.which("node")
    assert node, "node is required for the kafkajs tests"
    done = subprocess.run(
        [node, "sasl_produce.js", secure.sasl_ssl, topic_name, "25", "scram-sha-512", "alice",
         USERS["alice"], str(secure.ca)],
        cwd=JS_DIR, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["sent"] == 25
    config = sasl_ssl_config(secure, "SCRAM-SHA-256")
    assert consume(config, topic_name, 25) == [str(i).encode() for i in range(25)]


def test_aiokafka_over_sasl_plaintext(secure, topic_name):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioPartition

    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "bob", "sasl_plain_password": USERS["bob"]}

    async def main() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=secure.sasl_plaintext, acks="all",
                                    **auth)
        await producer.start()
        try:
            for i in range(15):
                await producer.send_and_wait(topic_name, b"a%d" % i, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=secure.sasl_plaintext,
                                    auto_offset_reset="earliest", **auth)
        await consumer.start()
        got: list[bytes] = []
        try:
            consumer.assign([AioPartition(topic_name, 0)])
            deadline = asyncio.get_running_loop().time() + 30
            while len(got) < 15 and asyncio.get_running_loop().time() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(r.value for r in records)
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(main()) == [b"a%d" % i for i in range(15)]


def oauth_config(secure: SecureCluster, token: str, errors: list[KafkaError]
                 ) -> dict[str, object]:
    return {"bootstrap.servers": secure.sasl_ssl, "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.ca), "sasl.mechanism": "OAUTHBEARER",
            "error_cb": errors.append,
            # librdkafka checks the lifetime given here, never the token's own exp claim.
            "oauth_cb": lambda _config: (token, time.time() + 3600, "ignored", {})}


def test_oauthbearer_with_a_token_made_here(secure, topic_name):
    errors: list[KafkaError] = []
    config = oauth_config(secure, secure.issuer.token("svc-orders"), errors)
    assert roundtrip(config, topic_name, 5) == [b"v%d" % i for i in range(5)]
    assert errors == []


def authentication_error(config: dict[str, object], errors: list[KafkaError]) -> KafkaError:
    """Connect with ``config``; the authentication error librdkafka reported."""
    producer = Producer({**config, "error_cb": errors.append})
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            producer.poll(0.2)
            for error in errors:
                if error.code() == KafkaError._AUTHENTICATION:
                    return error
        raise AssertionError(f"no authentication error, only {errors}")
    finally:
        producer.flush(0)


def test_wrong_password_is_refused(secure):
    errors: list[KafkaError] = []
    error = authentication_error(sasl_ssl_config(secure, "SCRAM-SHA-512", "alice", "nope"),
                                 errors)
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in error.str()
    errors.clear()
    error = authentication_error(sasl_ssl_config(secure, "PLAIN", "alice", "nope"), errors)
    assert "Invalid username or password" in error.str()


def test_an_expired_token_is_refused(secure):
    errors: list[KafkaError] = []
    error = authentication_error(
        oauth_config(secure, secure.issuer.token(lifetime=-300), errors), errors)
    assert "invalid_token" in error.str()


def closed_without_answer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_sasl_frame_before_the_handshake_closes_the_connection(secure):
    host, port = secure.sasl_plaintext.rsplit(":", 1)
    frame = encode_request(authenticate(plain_token("alice", USERS["alice"])), 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame)
        assert closed_without_answer(sock)


def test_a_client_that_never_finishes_the_handshake_is_closed(secure):
    started = time.monotonic()
    for address in (secure.sasl_ssl, secure.sasl_plaintext):  # TLS, then SASL
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            assert closed_without_answer(sock)
    assert time.monotonic() - started < 8
