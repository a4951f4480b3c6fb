"""Who a request runs as: the principal a frontend names in the call metadata, trusted only
from a caller whose TLS certificate names a frontend identity or from a plaintext loopback
peer; anyone else (another service's certificate, TLS without one, plaintext from elsewhere)
runs as User:ANONYMOUS from its own address. Checked on the rule itself and on a real handler
serving gRPC over TLS with certificates made here."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, ResourceType
from services.common.envelopes import decode_handler_reply, encode_handler_call
from services.common.errors import ErrorCode
from services.common.tls import is_loopback
from services.handler.exchange import STREAM_SERVICE_NAME, CallContext
from services.handler.security.principal import caller_of, peer_host

from ...tls_material import CertificateAuthority
from ..batches import record_batch
from .handler import allow, running_handler

FRONTENDS = frozenset({"kbroker-frontend"})
INSECURE = {"transport_security_type": [b"insecure"]}


def tls(common_name: str | None) -> dict[str, Any]:
    auth: dict[str, Any] = {"transport_security_type": [b"ssl"]}
    if common_name is not None:
        auth["x509_common_name"] = [common_name.encode()]
    return auth


def who(peer: str, auth: dict[str, Any], metadata: dict[str, str]) -> tuple[str, str]:
    return caller_of(CallContext((), peer, auth), FRONTENDS).principal_and_host(metadata)


NAMED = {"kafka-principal": "User:alice", "kafka-client-host": "192.0.2.7"}


def test_a_frontend_names_the_principal_and_client_host():
    assert who("ipv4:10.0.0.5:40000", tls("kbroker-frontend"), NAMED) == (
        "User:alice", "192.0.2.7")
    assert who("ipv4:127.0.0.1:40000", INSECURE, NAMED) == ("User:alice", "192.0.2.7")
    assert who("ipv6:[::1]:40000", INSECURE, NAMED) == ("User:alice", "192.0.2.7")
    # A trusted caller that names nobody: anonymous, from the address it gives or its own.
    assert who("ipv4:127.0.0.1:40000", INSECURE, {}) == ("User:ANONYMOUS", "127.0.0.1")


def test_no_other_caller_can_claim_a_principal():
    # Another service's certificate, TLS without a certificate, plaintext from elsewhere:
    # anonymous, and the client host is the caller's own address.
    assert who("ipv4:10.0.0.5:40000", tls("kbroker-log"), NAMED) == (
        "User:ANONYMOUS", "10.0.0.5")
    assert who("ipv4:127.0.0.1:40000", tls(None), NAMED) == ("User:ANONYMOUS", "127.0.0.1")
    assert who("ipv4:127.0.0.1:40000", tls("kbroker-handler"), NAMED) == (
        "User:ANONYMOUS", "127.0.0.1")
    assert who("ipv4:10.0.0.5:40000", INSECURE, NAMED) == ("User:ANONYMOUS", "10.0.0.5")
    assert who("ipv6:[2001:db8::1]:40000", INSECURE, NAMED) == (
        "User:ANONYMOUS", "2001:db8::1")
    # A Unix socket is as local as loopback (and plaintext is allowed on it).
    assert who("unix:/tmp/socket", INSECURE, NAMED)[0] == "User:alice"


def test_peer_addresses():
    assert peer_host("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert peer_host("ipv6:[::ffff:127.0.0.1]:5000") == "::ffff:127.0.0.1"
    assert is_loopback("ipv4:127.0.0.2:5000") and is_loopback("ipv6:%5B::1%5D:5000")
    assert is_loopback("ipv6:[::ffff:127.0.0.1]:5000")
    assert not is_loopback("ipv4:10.0.0.1:5000") and not is_loopback("0.0.0.0:5000")


# --- over TLS -----------------------------------------------------------------------------

def _pki(directory: Path) -> tuple[bytes, dict[str, tuple[bytes, bytes]]]:
    """A CA (PEM) and, by common name, certificates (key, chain) it signed."""
    ca = CertificateAuthority.create(directory)
    issued = {}
    for name in ("kbroker-handler", "kbroker-frontend", "kbroker-log"):
        leaf = ca.issue(directory, name, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        issued[name] = (leaf.key.read_bytes(), leaf.cert.read_bytes())
    return ca.cert.read_bytes(), issued


def test_over_tls_only_a_frontend_certificate_may_name_the_principal(tmp_path: Path) -> None:
    ca, issued = _pki(tmp_path)

    def server_credentials(client_auth: bool) -> grpc.ServerCredentials:
        # Client certificates are requested (and verified) only when required.
        return grpc.ssl_server_credentials([issued["kbroker-handler"]], root_certificates=ca,
                                           require_client_auth=client_auth)

    request = k.ProduceRequest(acks=1, timeout_ms=1000, topic_data=[
        {"name": "orders", "partition_data": [{"index": 0, "records": record_batch([b"v"])}]}])
    metadata = (("kafka-principal", "User:alice"), ("kafka-client-host", "192.0.2.7"))

    async def produce(port: int, client: str | None) -> int:
        key, chain = issued[client] if client else (None, None)
        credentials = grpc.ssl_channel_credentials(ca, key, chain)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            stub = kafka_handler_pb2_grpc.KafkaHandlerStub(channel)
            answer = await stub.Produce(request, metadata=metadata, timeout=10)
        return answer.responses[0].partition_responses[0].error_code

    async def produce_on_stream(port: int, client: str) -> int:
        """The same request as a frontend sends it: one call on a KafkaHandlerStream."""
        key, chain = issued[client]
        credentials = grpc.ssl_channel_credentials(ca, key, chain)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            exchange = channel.stream_stream(f"/{STREAM_SERVICE_NAME}/Exchange")
            stream = exchange(iter([encode_handler_call(
                1, "Produce", request.SerializeToString(), metadata)]), timeout=10)
            async for data in stream:
                reply, response = decode_handler_reply(data)
                assert reply.call_id == 1 and not reply.status_code, reply
                answer = k.ProduceResponse.FromString(bytes(response))
                return answer.responses[0].partition_responses[0].error_code
        raise AssertionError("no reply on the stream")

    async def main() -> None:
        denied = ErrorCode.topic_authorization_failed.value
        async with running_handler(server_credentials(False)) as handler:
            handler.use([allow(ResourceType.TOPIC, "orders", Operation.WRITE)])
            assert await produce(handler.port, None) == denied
        async with running_handler(server_credentials(True)) as handler:
            handler.use([allow(ResourceType.TOPIC, "orders", Operation.WRITE)])
            assert await produce(handler.port, "kbroker-frontend") == 0
            assert await produce(handler.port, "kbroker-log") == denied
            assert await produce_on_stream(handler.port, "kbroker-frontend") == 0
            assert await produce_on_stream(handler.port, "kbroker-log") == denied
            # What anonymous may do, a non-frontend caller may do.
            handler.use([allow(ResourceType.TOPIC, "orders", Operation.WRITE,
                               principal="User:ANONYMOUS")])
            assert await produce(handler.port, "kbroker-log") == 0
            assert await produce(handler.port, "kbroker-frontend") == denied

    asyncio.run(asyncio.wait_for(main(), 60))
