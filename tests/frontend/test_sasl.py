"""SASL on the frontend's SASL_PLAINTEXT listener, over real sockets, with Kafka's answers:
SaslHandshake v0 and v1, SaslAuthenticate, PLAIN and SCRAM exchanges, what is answered and
what is closed out of turn, failure delays, the authentication timeout, session lifetimes,
re-authentication and expiry (KIP-368), and the principal and listener handed to handlers."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import grpc
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from prometheus_client import REGISTRY

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.frontend.sasl.scram import ScramMechanism, credential_from_password

from .kafka_wire import KafkaWire, encode_request, frame
from .sample_requests import metadata_v12, produce_v9_request
from .sasl_client import ScramClient, authenticate, handshake, plain_token
from .secure_frontend import secure_frontend

LISTENERS = "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"


def users_file(tmp_path: Path) -> str:
    path = tmp_path / "users.txt"
    path.write_text("# test users\nalice:alice-secret\nbob:b:o:b\n\n")
    return str(path)


def settings(tmp_path: Path, **more: object) -> dict[str, object]:
    return {"listeners": LISTENERS, "sasl_users_file": users_file(tmp_path),
            "connection_failed_authentication_delay_ms": 0, **more}


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def scram_login(wire: KafkaWire, mechanism: str, user: str, password: str) -> int:
    """Handshake v1 and a SCRAM exchange; the session lifetime the frontend answered."""
    response = await wire.request(handshake(mechanism))
    assert response.error_code == ErrorCode.none
    client = ScramClient(mechanism, user, password)
    first = await wire.request(authenticate(client.first()), correlation_id=2)
    assert first.error_code == ErrorCode.none, first.error_message
    final = await wire.request(authenticate(client.final(first.auth_bytes)), correlation_id=3)
    assert final.error_code == ErrorCode.none, final.error_message
    assert client.verify(final.auth_bytes), "the server proved it holds the credential"
    return int(final.session_lifetime.total_seconds() * 1000)


def test_scram_authenticates_and_requests_carry_principal_and_listener(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, handler):
            port = service.ports["SASL_PLAINTEXT"]
            for mechanism, user, password in (("SCRAM-SHA-256", "alice", "alice-secret"),
                                              ("SCRAM-SHA-512", "bob", "b:o:b")):
                wire = await KafkaWire.connect(port)
                versions = await wire.request(ApiVersionsRequest(
                    client_software_name="t", client_software_version="1"))
                assert versions.error_code == ErrorCode.none
                assert await scram_login(wire, mechanism, user, password) == 0
                await wire.request(metadata_v12("t"), correlation_id=4)
                *_, context = handler.calls[-1]
                assert context["kafka-principal"] == f"User:{user}"
                assert context["kafka-listener"] == "SASL_PLAINTEXT"
                assert context["kafka-advertised"] == f"127.0.0.1:{port}"
                await wire.close()
            plain = await KafkaWire.connect(service.ports["PLAINTEXT"])
            await plain.request(metadata_v12("t"))
            *_, context = handler.calls[-1]
            assert context["kafka-principal"] == "User:ANONYMOUS"
            assert context["kafka-listener"] == "PLAINTEXT"
            assert context["kafka-advertised"] == f"127.0.0.1:{service.ports['PLAINTEXT']}"
            await plain.close()

    asyncio.run(main())


def test_plain_with_handshake_v0_exchanges_raw_tokens(tmp_path) -> None:
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0

    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, handler):
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            response = await wire.request(HandshakeV0(mechanism="PLAIN"))
            assert response.error_code == ErrorCode.none
            assert list(response.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
            await wire.send(frame(plain_token("alice", "alice-secret")))
            assert await wire.read_frame() == b""  # PLAIN's empty challenge, size-prefixed
            await wire.request(metadata_v12("t"))
            assert handler.calls[-1][2]["kafka-principal"] == "User:alice"
            await wire.close()
            # A wrong password after a v0 handshake: the connection closes, unanswered.
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            await wire.request(HandshakeV0(mechanism="PLAIN"))
            await wire.send(frame(plain_token("alice", "nope")))
            assert await wire.closed_by_peer()

    asyncio.run(main())


def test_unsupported_mechanism_is_answered_with_the_enabled_ones_then_closed(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, _):
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            response = await wire.request(handshake("GSSAPI"))
            assert response.error_code == ErrorCode.unsupported_sasl_mechanism
            assert list(response.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
            assert await wire.closed_by_peer()

    asyncio.run(main())


def test_requests_before_the_handshake_close_the_connection_unanswered(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, handler):
            port = service.ports["SASL_PLAINTEXT"]
            before = metric("kbroker_frontend_failed_authentication_total",
                            listener="SASL_PLAINTEXT", mechanism="none")
            for request in (produce_v9_request(), authenticate(plain_token("alice", "x")),
                            metadata_v12("t")):
                wire = await KafkaWire.connect(port)
                await wire.send(encode_request(request, correlation_id=7))
                assert await wire.closed_by_peer(), type(request).__name__
            # A second ApiVersions before the handshake too.
            wire = await KafkaWire.connect(port)
            await wire.request(ApiVersionsRequest(client_software_name="t",
                                                  client_software_version="1"))
            await wire.send(encode_request(ApiVersionsRequest(
                client_software_name="t", client_software_version="1"), correlation_id=2))
            assert await wire.closed_by_peer()
            assert not handler.calls, "nothing reached a handler"
            assert metric("kbroker_frontend_failed_authentication_total",
                          listener="SASL_PLAINTEXT", mechanism="none") == before + 4

    asyncio.run(main())


def test_a_request_other_than_sasl_authenticate_after_the_handshake_is_illegal(
        tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, handler):
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            await wire.request(handshake("PLAIN"))
            response = await wire.request(produce_v9_request(), correlation_id=5)
            assert {p.error_code for t in response.responses for p in t.partition_responses
                    } == {ErrorCode.illegal_sasl_state}
            assert await wire.closed_by_peer()
            assert not handler.calls

    asyncio.run(main())


def test_wrong_password_fails_after_a_growing_delay_and_closes(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(
                tmp_path, connection_failed_authentication_delay_ms=200)) as (service, _):
            port = service.ports["SASL_PLAINTEXT"]
            before = metric("kbroker_frontend_failed_authentication_total",
                            listener="SASL_PLAINTEXT", mechanism="PLAIN")
            took = []
            for _ in range(2):
                wire = await KafkaWire.connect(port)
                await wire.request(handshake("PLAIN"))
                started = time.monotonic()
                response = await wire.request(authenticate(plain_token("alice", "wrong")))
                took.append(time.monotonic() - started)
                assert response.error_code == ErrorCode.sasl_authentication_failed
                assert response.error_message == ("Authentication failed: Invalid username "
                                                  "or password")
                assert await wire.closed_by_peer()
            assert 0.2 <= took[0] < 0.39 and took[1] >= 0.39, took  # 200 ms, then 400 ms
            assert metric("kbroker_frontend_failed_authentication_total",
                          listener="SASL_PLAINTEXT", mechanism="PLAIN") == before + 2
            # SCRAM with a wrong password: Kafka's generic message (no user enumeration).
            wire = await KafkaWire.connect(port)
            await wire.request(handshake("SCRAM-SHA-512"))
            client = ScramClient("SCRAM-SHA-512", "alice", "wrong")
            first = await wire.request(authenticate(client.first()))
            final = await wire.request(authenticate(client.final(first.auth_bytes)))
            assert final.error_code == ErrorCode.sasl_authentication_failed
            assert final.error_message == ("Authentication failed during authentication due "
                                           "to invalid credentials with SASL mechanism "
                                           "SCRAM-SHA-512")
            assert await wire.closed_by_peer()

    asyncio.run(main())


def test_a_client_that_never_authenticates_is_closed_after_the_timeout(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path, authentication_timeout_ms=300)) as (
                service, _):
            started = time.monotonic()
            silent = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            halfway = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            await halfway.request(handshake("PLAIN"))
            assert await silent.closed_by_peer()
            assert await halfway.closed_by_peer()
            assert 0.25 < time.monotonic() - started < 5
            # The PLAINTEXT listener has no such timeout.
            idle = await KafkaWire.connect(service.ports["PLAINTEXT"])
            await asyncio.sleep(0.5)
            await idle.request(metadata_v12("t"))

    asyncio.run(main())


def test_sasl_requests_after_authentication_or_on_plaintext_are_illegal(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, _):
            wire = await KafkaWire.connect(service.ports["PLAINTEXT"])
            response = await wire.request(handshake("PLAIN"))
            assert response.error_code == ErrorCode.illegal_sasl_state
            response = await wire.request(authenticate(b"x"))
            assert response.error_code == ErrorCode.illegal_sasl_state
            await wire.request(metadata_v12("t"))  # still open
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            await scram_login(wire, "SCRAM-SHA-256", "alice", "alice-secret")
            # No session expiry: a second handshake is no re-authentication.
            response = await wire.request(handshake("PLAIN"))
            assert response.error_code == ErrorCode.illegal_sasl_state

    asyncio.run(main())


def test_session_lifetime_reauthentication_and_expiry(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path, connections_max_reauth_ms=1500)) as (
                service, handler):
            port = service.ports["SASL_PLAINTEXT"]
            labels = {"listener": "SASL_PLAINTEXT", "mechanism": "SCRAM-SHA-256"}
            before = metric("kbroker_frontend_successful_reauthentication_total", **labels)
            wire = await KafkaWire.connect(port)
            assert await scram_login(wire, "SCRAM-SHA-256", "alice", "alice-secret") == 1500
            await asyncio.sleep(1.1)  # re-authentication waits a second after the last
            assert await scram_login(wire, "SCRAM-SHA-256", "alice", "alice-secret") == 1500
            assert metric("kbroker_frontend_successful_reauthentication_total",
                          **labels) == before + 1
            await wire.request(metadata_v12("t"))
            assert handler.calls[-1][2]["kafka-principal"] == "User:alice"
            # Re-authenticating as someone else fails.
            await asyncio.sleep(1.1)
            await wire.request(handshake("SCRAM-SHA-256"))
            client = ScramClient("SCRAM-SHA-256", "bob", "b:o:b")
            first = await wire.request(authenticate(client.first()))
            final = await wire.request(authenticate(client.final(first.auth_bytes)))
            assert final.error_code == ErrorCode.sasl_authentication_failed
            assert final.error_message == ("Cannot change principals during re-authentication "
                                           "from User.alice: User.bob")
            assert await wire.closed_by_peer()
            # A request after the session expired closes the connection.
            killed = metric("kbroker_frontend_expired_connections_killed_total",
                            listener="SASL_PLAINTEXT")
            wire = await KafkaWire.connect(port)
            await scram_login(wire, "SCRAM-SHA-256", "alice", "alice-secret")
            await asyncio.sleep(1.6)
            await wire.send(encode_request(metadata_v12("t"), correlation_id=9))
            assert await wire.closed_by_peer()
            assert metric("kbroker_frontend_expired_connections_killed_total",
                          listener="SASL_PLAINTEXT") == killed + 1

    asyncio.run(main())


class FakeReplicator(replicator_pb2_grpc.ReplicatorServicer):
    """Streams one ClusterMetadata snapshot, then holds the stream open."""

    def __init__(self, snapshot: replicator_pb2.ClusterMetadata) -> None:
        self.snapshot = snapshot

    async def WatchMetadata(self, request, context):
        yield self.snapshot
        await asyncio.Event().wait()


def test_scram_and_plain_use_credentials_from_the_cluster_metadata(tmp_path) -> None:
    async def main() -> None:
        snapshot = replicator_pb2.ClusterMetadata(version=3)
        for mechanism in ScramMechanism:
            c = credential_from_password(mechanism, "carol-secret", iterations=4096)
            snapshot.scram_credentials.add(user="carol", mechanism=mechanism.code, salt=c.salt,
                                           stored_key=c.stored_key, server_key=c.server_key,
                                           iterations=c.iterations)
        server = grpc.aio.server()
        replicator_pb2_grpc.add_ReplicatorServicer_to_server(FakeReplicator(snapshot), server)
        replicator_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with secure_frontend(**settings(
                    tmp_path, replicator_address=f"127.0.0.1:{replicator_port}")) as (
                    service, handler):
                await asyncio.wait_for(service.cluster_view.updated.wait(), 10)
                port = service.ports["SASL_PLAINTEXT"]
                wire = await KafkaWire.connect(port)
                await scram_login(wire, "SCRAM-SHA-512", "carol", "carol-secret")
                await wire.request(metadata_v12("t"))
                assert handler.calls[-1][2]["kafka-principal"] == "User:carol"
                wire = await KafkaWire.connect(port)
                await wire.request(handshake("PLAIN"))
                response = await wire.request(authenticate(plain_token("carol",
                                                                       "carol-secret")))
                assert response.error_code == ErrorCode.none
                wire = await KafkaWire.connect(port)
                await wire.request(handshake("PLAIN"))
                response = await wire.request(authenticate(plain_token("carol", "wrong")))
                assert response.error_code == ErrorCode.sasl_authentication_failed
        finally:
            await server.stop(0)

    asyncio.run(main())


def test_the_frontend_serves_without_a_reachable_replicator(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(
                tmp_path, replicator_address="127.0.0.1:1")) as (service, _):
            wire = await KafkaWire.connect(service.ports["PLAINTEXT"])
            await wire.request(metadata_v12("t"))
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            await scram_login(wire, "SCRAM-SHA-256", "alice", "alice-secret")
            assert service.cluster_view.latest is None

    asyncio.run(main())


def test_a_truncated_frame_during_authentication_closes(tmp_path) -> None:
    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, _):
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            await wire.send(struct.pack(">i", 3) + b"abc")
            assert await wire.closed_by_peer()

    asyncio.run(main())


def test_api_versions_too_new_may_be_asked_again_before_the_handshake(tmp_path) -> None:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsV0

    async def main() -> None:
        async with secure_frontend(**settings(tmp_path)) as (service, _):
            wire = await KafkaWire.connect(service.ports["SASL_PLAINTEXT"])
            request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
            await wire.send(encode_request(request, correlation_id=1, api_version=99))
            _, response = await wire.read_response(ApiVersionsV0, False)
            assert response.error_code == ErrorCode.unsupported_version
            assert (await wire.request(request, correlation_id=2)).error_code == ErrorCode.none
            await scram_login(wire, "SCRAM-SHA-256", "alice", "alice-secret")

    asyncio.run(main())


def test_every_broker_port_of_a_listener_authenticates_and_names_its_broker(tmp_path) -> None:
    from services.local_cluster import free_port_range

    sasl_port, plain_port = free_port_range("127.0.0.1", 3), free_port_range("127.0.0.1", 3)

    async def main() -> None:
        async with secure_frontend(**settings(
                tmp_path, broker_ports=3,
                listeners=f"SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                          f"PLAINTEXT://127.0.0.1:{plain_port}",
                advertised_listeners=f"SASL_PLAINTEXT://kafka.example:{sasl_port + 1000}")) as (
                service, handler):
            wire = await KafkaWire.connect(sasl_port + 2)
            await scram_login(wire, "SCRAM-SHA-512", "alice", "alice-secret")
            await wire.request(metadata_v12("t"))
            context = handler.calls[-1][2]
            assert context["kafka-broker-id"] == "2"
            assert context["kafka-advertised"] == f"kafka.example:{sasl_port + 1000}"
            assert context["kafka-broker-ports"] == "3"
            wire = await KafkaWire.connect(plain_port + 1)
            await wire.request(metadata_v12("t"))
            context = handler.calls[-1][2]
            assert context["kafka-broker-id"] == "1"
            assert context["kafka-advertised"] == f"127.0.0.1:{plain_port}"

    asyncio.run(main())
