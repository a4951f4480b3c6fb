"""librdkafka (confluent-kafka) authenticating to the frontend (in front of an in-test
handler): SCRAM-SHA-512 over SASL_SSL with sessions short enough that the producer
re-authenticates (KIP-368) while it keeps producing, and OAUTHBEARER with tokens made in the
test (valid, expired)."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from ..tls_material import CertificateAuthority, localhost_server
from .oauth_tokens import TokenIssuer
from .secure_frontend import secure_frontend


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_producer_keeps_producing_across_reauthentications(tmp_path) -> None:
    ca = CertificateAuthority.create(tmp_path / "tls")
    server = localhost_server(ca)
    users = tmp_path / "users.txt"
    users.write_text("alice:alice-secret\n")
    labels = {"listener": "SASL_SSL", "mechanism": "SCRAM-SHA-512"}

    def produce_for(bootstrap: str, seconds: float) -> list[object]:
        errors: list[object] = []
        producer = Producer({
            "bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(ca.cert), "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice", "sasl.password": "alice-secret", "acks": 1,
            "linger.ms": 0})
        deadline = time.monotonic() + seconds
        sent = 0
        while time.monotonic() < deadline:
            producer.produce("orders", b"x%d" % sent, partition=0,
                             on_delivery=lambda err, msg: errors.append(err) if err else None)
            sent += 1
            producer.flush(10)
            time.sleep(0.05)
        assert producer.flush(10) == 0
        assert sent > 20
        return errors

    async def main() -> None:
        async with secure_frontend(
                listeners="SASL_SSL://127.0.0.1:0", ssl_certfile=str(server.cert),
                ssl_keyfile=str(server.key), sasl_users_file=str(users),
                sasl_enabled_mechanisms=("SCRAM-SHA-512",),
                connections_max_reauth_ms=1500) as (service, handler):
            before = metric("kbroker_frontend_successful_reauthentication_total", **labels)
            killed = metric("kbroker_frontend_expired_connections_killed_total",
                            listener="SASL_SSL")
            bootstrap = f"localhost:{service.ports['SASL_SSL']}"
            errors = await asyncio.to_thread(produce_for, bootstrap, 5.0)
            assert errors == []
            assert metric("kbroker_frontend_successful_reauthentication_total",
                          **labels) >= before + 2
            assert metric("kbroker_frontend_expired_connections_killed_total",
                          listener="SASL_SSL") == killed
            assert {c["kafka-principal"] for name, _, c in handler.calls
                    if name == "Produce"} == {"User:alice"}

    asyncio.run(main())


def test_oauthbearer_tokens_from_oauth_cb(tmp_path) -> None:
    issuer = TokenIssuer(tmp_path)

    errors: list[KafkaError] = []

    def list_topics(bootstrap: str, token: str) -> None:
        admin = AdminClient({
            "bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "error_cb": errors.append,
            # librdkafka checks only the lifetime it is given, never the token's own exp.
            "oauth_cb": lambda _config: (token, time.time() + 3600, "ignored", {})})
        try:
            admin.list_topics(timeout=3)
        finally:
            admin.poll(0.5)  # serves error_cb

    async def main() -> None:
        async with secure_frontend(
                listeners="SASL_PLAINTEXT://127.0.0.1:0",
                sasl_enabled_mechanisms=("OAUTHBEARER",),
                sasl_oauthbearer_jwks=str(issuer.jwks),
                sasl_oauthbearer_expected_issuer=issuer.issuer,
                sasl_oauthbearer_expected_audience="kafka",
                connection_failed_authentication_delay_ms=0) as (service, handler):
            bootstrap = f"127.0.0.1:{service.ports['SASL_PLAINTEXT']}"
            await asyncio.to_thread(list_topics, bootstrap, issuer.token("svc-orders"))
            assert handler.calls[-1][2]["kafka-principal"] == "User:svc-orders"
            calls = len(handler.calls)
            failed = metric("kbroker_frontend_failed_authentication_total",
                            listener="SASL_PLAINTEXT", mechanism="OAUTHBEARER")
            try:
                await asyncio.to_thread(list_topics, bootstrap, issuer.token(lifetime=-120))
            except KafkaException:
                pass
            else:
                raise AssertionError("an expired token authenticated")
            assert any(e.code() == KafkaError._AUTHENTICATION and "invalid_token" in e.str()
                       for e in errors), errors
            assert len(handler.calls) == calls
            assert metric("kbroker_frontend_failed_authentication_total",
                          listener="SASL_PLAINTEXT", mechanism="OAUTHBEARER") > failed

    asyncio.run(main())
