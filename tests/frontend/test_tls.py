"""TLS on the frontend's SSL and SASL_SSL listeners, over real sockets with certificates made
in the test: client certificates required, requested or absent, the mTLS principal and its
mapping rules, a certificate from another CA, certificates reloaded when their files change,
and the handshake timeout."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import time

import pytest
from prometheus_client import REGISTRY

from ..tls_material import CertificateAuthority, Leaf, client_certificate, localhost_server
from .kafka_wire import TIMEOUT, KafkaWire
from .sample_requests import metadata_v12
from .sasl_client import authenticate, handshake, plain_token
from .secure_frontend import secure_frontend


def client_context(ca: CertificateAuthority, client: Leaf | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


async def tls_connect(port: int, context: ssl.SSLContext) -> KafkaWire:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"), TIMEOUT)
    return KafkaWire(reader, writer)


async def rejected(port: int, context: ssl.SSLContext) -> bool:
    """True if the frontend refuses the TLS connection (at the handshake or, with TLS 1.3,
    at the first read, since the client's certificate is checked after its handshake)."""
    try:
        wire = await tls_connect(port, context)
        await wire.request(metadata_v12("t"))
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        return True
    return False


def failed_handshakes() -> float:
    return REGISTRY.get_sample_value("kbroker_frontend_failed_authentication_total",
                                     {"listener": "SSL", "mechanism": "SSL"}) or 0.0


async def counted(expected: float) -> None:
    """Wait until the frontend has counted ``expected`` failed handshakes (a client may
    give up before the frontend has read its alert)."""
    for _ in range(100):  # up to 5 s
        if failed_handshakes() >= expected:
            break
        await asyncio.sleep(0.05)
    assert failed_handshakes() == expected


@pytest.fixture()
def pki(tmp_path):
    ca = CertificateAuthority.create(tmp_path / "tls")
    server = localhost_server(ca)
    return ca, server


def tls_settings(ca: CertificateAuthority, server: Leaf, **more: object) -> dict[str, object]:
    return {"ssl_certfile": str(server.cert), "ssl_keyfile": str(server.key),
            "ssl_cafile": str(ca.cert), **more}


def test_mtls_principal_from_the_certificate_subject(pki, tmp_path) -> None:
    ca, server = pki
    alice = client_certificate(ca, "alice", unit="eng")
    other_ca = CertificateAuthority.create(tmp_path / "other", "kbroker other test ca")
    mallory = client_certificate(other_ca, "alice", unit="eng")

    async def main() -> None:
        async with secure_frontend(**tls_settings(
                ca, server, listeners="SSL://127.0.0.1:0", ssl_client_auth="required",
                ssl_principal_mapping_rules="RULE:^CN=(.*?),OU=eng,.*$/$1/L,DEFAULT")) as (
                service, handler):
            port = service.ports["SSL"]
            before = REGISTRY.get_sample_value("kbroker_frontend_successful_authentication_total",
                                               {"listener": "SSL", "mechanism": "SSL"}) or 0
            wire = await tls_connect(port, client_context(ca, alice))
            await wire.request(metadata_v12("t"))
            context = handler.calls[-1][2]
            assert context["kafka-principal"] == "User:alice"
            assert context["kafka-listener"] == "SSL"
            assert context["kafka-advertised"] == f"127.0.0.1:{port}"
            assert REGISTRY.get_sample_value("kbroker_frontend_successful_authentication_total",
                                             {"listener": "SSL", "mechanism": "SSL"}) == before + 1
            await wire.close()
            failed = failed_handshakes()
            assert await rejected(port, client_context(ca)), "no client certificate"
            assert await rejected(port, client_context(other_ca, mallory)), "another CA"
            # The other CA's client also does not trust our server.
            assert await rejected(port, client_context(other_ca, mallory))
            await counted(failed + 3)

    asyncio.run(main())


def test_default_mapping_and_requested_client_auth(pki) -> None:
    ca, server = pki
    bob = client_certificate(ca, "bob", unit="ops")

    async def main() -> None:
        async with secure_frontend(**tls_settings(
                ca, server, listeners="SSL://127.0.0.1:0", ssl_client_auth="requested")) as (
                service, handler):
            port = service.ports["SSL"]
            wire = await tls_connect(port, client_context(ca, bob))
            await wire.request(metadata_v12("t"))
            assert handler.calls[-1][2]["kafka-principal"] == \
                "User:CN=bob,OU=ops,O=kbroker tests,C=US"
            wire = await tls_connect(port, client_context(ca))
            await wire.request(metadata_v12("t"))
            assert handler.calls[-1][2]["kafka-principal"] == "User:ANONYMOUS"

    asyncio.run(main())


def test_a_dn_no_rule_maps_closes_the_connection(pki) -> None:
    ca, server = pki
    bob = client_certificate(ca, "bob", unit="ops")

    async def main() -> None:
        async with secure_frontend(**tls_settings(
                ca, server, listeners="SSL://127.0.0.1:0", ssl_client_auth="required",
                ssl_principal_mapping_rules="RULE:^CN=(.*?),OU=eng,.*$/$1/")) as (service, _):
            assert await rejected(service.ports["SSL"], client_context(ca, bob))

    asyncio.run(main())


def test_sasl_ssl_authenticates_inside_tls(pki, tmp_path) -> None:
    ca, server = pki
    users = tmp_path / "users.txt"
    users.write_text("alice:alice-secret\n")

    async def main() -> None:
        async with secure_frontend(**tls_settings(
                ca, server, listeners="SASL_SSL://127.0.0.1:0",
                sasl_users_file=str(users))) as (service, handler):
            wire = await tls_connect(service.ports["SASL_SSL"], client_context(ca))
            await wire.request(handshake("PLAIN"))
            response = await wire.request(authenticate(plain_token("alice", "alice-secret")))
            assert response.error_code == 0
            await wire.request(metadata_v12("t"))
            assert handler.calls[-1][2]["kafka-principal"] == "User:alice"
            assert handler.calls[-1][2]["kafka-listener"] == "SASL_SSL"

    asyncio.run(main())


def test_certificates_are_reloaded_when_their_files_change(pki, tmp_path) -> None:
    ca, server = pki
    renewed = localhost_server(ca, stem="renewed", unit="renewed")

    def server_unit(wire: KafkaWire) -> str:
        subject = wire.writer.get_extra_info("ssl_object").getpeercert()["subject"]
        return dict(item[0] for item in subject).get("organizationalUnitName", "")

    async def main() -> None:
        async with secure_frontend(**tls_settings(ca, server,
                                                  listeners="SSL://127.0.0.1:0")) as (service, _):
            port = service.ports["SSL"]
            old = await tls_connect(port, client_context(ca))
            assert server_unit(old) == ""
            # Replace the files (a renewed certificate, as cert-manager writes it).
            shutil.copy(renewed.key, tmp_path / "new.key")
            shutil.copy(renewed.cert, tmp_path / "new.pem")
            os.replace(tmp_path / "new.key", server.key)
            os.replace(tmp_path / "new.pem", server.cert)
            deadline = time.monotonic() + 10
            while True:
                wire = await tls_connect(port, client_context(ca))
                if server_unit(wire) == "renewed":
                    break
                assert time.monotonic() < deadline, "the new certificate was never served"
                await asyncio.sleep(0.3)
            await old.request(metadata_v12("t"))  # the open connection keeps working
            assert service.ssl is not None and service.ssl.reloads == 1

    asyncio.run(main())


def test_a_client_that_never_finishes_the_tls_handshake_is_closed(pki) -> None:
    ca, server = pki

    async def main() -> None:
        async with secure_frontend(**tls_settings(
                ca, server, listeners="SSL://127.0.0.1:0",
                authentication_timeout_ms=300)) as (service, _):
            failed = failed_handshakes()
            started = time.monotonic()
            wire = await KafkaWire.connect(service.ports["SSL"])  # TCP only, no ClientHello
            assert await wire.closed_by_peer()
            assert 0.25 < time.monotonic() - started < 5
            await counted(failed + 1)

    asyncio.run(main())
