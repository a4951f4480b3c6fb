"""Internal mutual TLS (services.common.tls, channels, create_server): which addresses may go
plaintext, the settings object, the certificate CN reader, and real gRPC servers on port 0 with
certificates made in the test: a caller without a certificate, with one from another CA, or
reaching a server of another kind is refused; the server's certificate is reloaded when its
files change; the caller's identity reaches the servicer."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import (
    PLAINTEXT,
    insecure_channel,
    internal_channel,
    internal_sync_channel,
)
from services.common.server import ServiceBinding, create_server
from services.common.tls import (
    InternalTls,
    InternalTlsError,
    PlaintextNotAllowedError,
    certificate_common_name,
    is_loopback,
    peer_identity,
)

from ..tls_material import CertificateAuthority, internal_tls_dir

TIMEOUT = 30.0
SERVICE = "kbroker.purgatory.v1.Purgatory"


def tls_of(directory: Path, kind: str) -> InternalTls:
    return InternalTls(str(directory / "ca.crt"), str(directory / f"{kind}.crt"),
                       str(directory / f"{kind}.key"))


@pytest.mark.parametrize(("target", "loopback"), [
    ("127.0.0.1:19200", True),
    ("127.0.0.1:0", True),
    ("127.3.4.5:1", True),
    ("localhost:9", True),
    ("[::1]:19200", True),
    ("dns:///localhost:19100", True),
    ("ipv4:127.0.0.1:1,127.0.0.2:2", True),
    ("unix:/tmp/kbroker.sock", True),
    # A caller's context.peer().
    ("ipv4:127.0.0.1:40730", True),
    ("ipv6:%5B::1%5D:38946", True),
    ("ipv4:10.0.0.7:40730", False),
    ("ipv6:%5B2001:db8::1%5D:38946", False),
    ("0.0.0.0:19200", False),
    ("[::]:19200", False),
    (":19200", False),
    ("10.1.2.3:19200", False),
    ("kbroker-log-0.kbroker-log:19200", False),
    ("dns:///kbroker-handler:19100", False),
    ("k8s:///kbroker-handler.default:19100", False),
    ("ipv4:127.0.0.1:1,10.0.0.1:2", False),
    ("", False),
])
def test_only_loopback_targets_are_loopback(target: str, loopback: bool):
    assert is_loopback(target) is loopback


def test_settings_are_all_or_nothing():
    assert not InternalTls().enabled
    assert InternalTls("ca", "cert", "key").enabled
    for partial in (("ca", "", ""), ("", "cert", "key"), ("ca", "cert", "")):
        with pytest.raises(InternalTlsError, match="needs all of"):
            InternalTls(*partial)


def test_unreadable_files_are_a_settings_error(tmp_path: Path):
    tls = InternalTls(str(tmp_path / "ca.crt"), str(tmp_path / "x.crt"), str(tmp_path / "x.key"))
    with pytest.raises(InternalTlsError, match=r"CA .*ca\.crt"):
        tls.channel_credentials()


def test_common_name_is_read_from_the_certificate(tmp_path: Path):
    ca = CertificateAuthority.create(tmp_path, "a-test-ca")
    plain = ca.issue(tmp_path, "kbroker-log")
    with_sans = ca.issue(tmp_path, "kbroker-handler", dns_names=["kbroker-handler", "x.y"],
                         ip_addresses=["127.0.0.1"])
    for path, expected in ((ca.cert, "a-test-ca"), (plain.cert, "kbroker-log"),
                           (with_sans.cert, "kbroker-handler")):
        pem = path.read_bytes()
        subject = x509.load_pem_x509_certificate(pem).subject
        assert subject.rfc4514_string() == f"CN={expected}"
        assert certificate_common_name(pem) == expected
    with pytest.raises(ValueError, match="no PEM certificate"):
        certificate_common_name(b"not a certificate")


def test_plaintext_on_a_non_loopback_address_is_refused_before_binding():
    async def main() -> None:
        with pytest.raises(PlaintextNotAllowedError, match="allowed only on loopback"):
            await create_server("test", [], "0.0.0.0:0")
        with pytest.raises(PlaintextNotAllowedError, match="channel to the log 10.0.0.1:1"):
            internal_channel("10.0.0.1:1", PLAINTEXT, "log")
        with pytest.raises(PlaintextNotAllowedError):
            internal_sync_channel("kbroker-log:19200", PLAINTEXT, "log")
        with pytest.raises(PlaintextNotAllowedError):
            insecure_channel("0.0.0.0:19200")

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


class Identities(purgatory_pb2_grpc.PurgatoryServicer):
    """Records the caller identity of every CheckAndComplete, and whether it called from
    loopback."""

    def __init__(self) -> None:
        self.callers: list[str | None] = []
        self.loopback: list[bool] = []

    async def CheckAndComplete(self, request, context):
        self.callers.append(peer_identity(context))
        self.loopback.append(is_loopback(context.peer()))
        return purgatory_pb2.CheckAndCompleteResponse(completed=0)


async def check(channel: grpc.aio.Channel) -> grpc.StatusCode:
    """The status of a health check over ``channel`` (OK when it answered SERVING)."""
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.aio.AioRpcError as e:
        return e.code()
    finally:
        await channel.close()
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


def test_a_tls_server_requires_a_certificate_of_its_ca_and_channels_check_the_kind(
        tmp_path: Path):
    material = tmp_path / "tls"
    internal_tls_dir(material)
    stranger = tmp_path / "stranger"
    internal_tls_dir(stranger)

    async def main() -> None:
        servicer = Identities()
        server, port, _ = await create_server("purgatory", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, servicer)],
            "127.0.0.1:0", tls=tls_of(material, "purgatory"))
        address = f"127.0.0.1:{port}"
        try:
            handler = tls_of(material, "handler")
            assert await check(internal_channel(address, handler, "purgatory")) == \
                grpc.StatusCode.OK
            # The caller's identity is its certificate's CN.
            channel = internal_channel(address, handler, "purgatory")
            await purgatory_pb2_grpc.PurgatoryStub(channel).CheckAndComplete(
                purgatory_pb2.CheckAndCompleteRequest(), timeout=5)
            await channel.close()
            assert servicer.callers == ["kbroker-handler"]

            # No client certificate: the handshake fails.
            ca_only = grpc.ssl_channel_credentials((material / "ca.crt").read_bytes())
            assert await check(grpc.aio.secure_channel(
                address, ca_only, options=[("grpc.ssl_target_name_override",
                                            "kbroker-purgatory")])) == \
                grpc.StatusCode.UNAVAILABLE
            # A certificate of the right name from another CA (which also does not trust the
            # server's).
            assert await check(internal_channel(
                address, tls_of(stranger, "handler"), "purgatory")) == \
                grpc.StatusCode.UNAVAILABLE
            # Another CA's client certificate, but trusting the server's CA: still refused.
            mixed = InternalTls(str(material / "ca.crt"), str(stranger / "handler.crt"),
                                str(stranger / "handler.key"))
            assert await check(internal_channel(address, mixed, "purgatory")) == \
                grpc.StatusCode.UNAVAILABLE
            # Plaintext to a TLS port.
            assert await check(insecure_channel(address)) == grpc.StatusCode.UNAVAILABLE
            # A channel meant for a log node does not accept a purgatory's certificate.
            assert await check(internal_channel(address, handler, "log")) == \
                grpc.StatusCode.UNAVAILABLE
            assert servicer.callers == ["kbroker-handler"]
        finally:
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_plaintext_server_has_no_caller_identity():
    async def main() -> None:
        servicer = Identities()
        server, port, _ = await create_server("purgatory", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, servicer)])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            await purgatory_pb2_grpc.PurgatoryStub(channel).CheckAndComplete(
                purgatory_pb2.CheckAndCompleteRequest(), timeout=5)
            assert servicer.callers == [None]
            assert servicer.loopback == [True]
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_the_server_certificate_is_reloaded_when_its_files_change(tmp_path: Path):
    old, new = tmp_path / "old", tmp_path / "new"
    internal_tls_dir(old)
    internal_tls_dir(new)
    serving = tmp_path / "serving"
    shutil.copytree(old, serving)

    async def main() -> None:
        server, port, _ = await create_server("log", [], "127.0.0.1:0",
                                              tls=tls_of(serving, "log"))
        address = f"127.0.0.1:{port}"
        try:
            assert await check(internal_channel(address, tls_of(old, "handler"), "log")) == \
                grpc.StatusCode.OK
            assert await check(internal_channel(address, tls_of(new, "handler"), "log")) == \
                grpc.StatusCode.UNAVAILABLE
            # Rotate: the new CA, certificate and key replace the old ones in place.
            for name in ("ca.crt", "log.crt", "log.key"):
                (serving / name).write_bytes((new / name).read_bytes())
            assert await check(internal_channel(address, tls_of(new, "handler"), "log")) == \
                grpc.StatusCode.OK
            assert await check(internal_channel(address, tls_of(old, "handler"), "log")) == \
                grpc.StatusCode.UNAVAILABLE
            # A broken rotation (a key that is not PEM) keeps the last good material.
            (serving / "log.key").write_bytes(b"half written")
            assert await check(internal_channel(address, tls_of(new, "handler"), "log")) == \
                grpc.StatusCode.OK
        finally:
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))
