"""A log node with internal mutual TLS (a real LogService on 127.0.0.1 port 0): a handler's
certificate from the cluster's CA appends and reads; a call without a client certificate, or with
one from another CA, never reaches the service; plaintext settings on a wildcard address do not
start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import internal_channel
from services.common.tls import InternalTls, PlaintextNotAllowedError
from services.log.config import LogConfig
from services.log.server import start

from ..record_batches import build_batch
from ..tls_material import internal_tls_dir

TIMEOUT = 60.0


def tls_of(directory: Path, kind: str) -> InternalTls:
    return InternalTls(str(directory / "ca.crt"), str(directory / f"{kind}.crt"),
                       str(directory / f"{kind}.key"))


def test_log_node_serves_only_callers_with_a_certificate_of_its_ca(tmp_path: Path):
    material, stranger = tmp_path / "tls", tmp_path / "stranger"
    internal_tls_dir(material)
    internal_tls_dir(stranger)

    async def main() -> None:
        own = tls_of(material, "log")
        service = await start(LogConfig(
            data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0",
            internal_tls_ca=own.ca, internal_tls_cert=own.cert, internal_tls_key=own.key))
        address = f"127.0.0.1:{service.port}"
        channels = []

        def stub(tls: InternalTls | None) -> log_pb2_grpc.LogServiceStub:
            if tls is None:  # TLS, trusting the CA, but no client certificate
                channel = grpc.aio.secure_channel(
                    address, grpc.ssl_channel_credentials(Path(own.ca).read_bytes()),
                    options=[("grpc.ssl_target_name_override", "kbroker-log")])
            else:
                channel = internal_channel(address, tls, "log")
            channels.append(channel)
            return log_pb2_grpc.LogServiceStub(channel)

        try:
            handler = stub(tls_of(material, "handler"))
            created = await handler.CreatePartitions(log_pb2.CreatePartitionsRequest(
                partitions=[log_pb2.PartitionSpec(topic="t", partition=0, topic_id="tid")]),
                timeout=10)
            assert [r.error_code for r in created.results] == [0]
            appended = await handler.Append(log_pb2.AppendRequest(partitions=[
                log_pb2.PartitionAppend(topic="t", partition=0,
                                        records=build_batch([b"secret"]))]), timeout=10)
            assert [r.error_code for r in appended.results] == [0]

            for refused in (stub(None), stub(tls_of(stranger, "handler")),
                            stub(InternalTls(own.ca, str(stranger / "handler.crt"),
                                             str(stranger / "handler.key")))):
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await refused.Read(log_pb2.ReadRequest(partitions=[
                        log_pb2.PartitionRead(topic="t", partition=0, offset=0,
                                              max_bytes=1 << 20)]), timeout=10)
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE

            read = await handler.Read(log_pb2.ReadRequest(partitions=[
                log_pb2.PartitionRead(topic="t", partition=0, offset=0, max_bytes=1 << 20)]),
                timeout=10)
            assert b"secret" in bytes(read.results[0].records)
        finally:
            for channel in channels:
                await channel.close()
            await service.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_log_node_without_tls_does_not_start_on_a_wildcard_address(tmp_path: Path):
    async def main() -> None:
        with pytest.raises(PlaintextNotAllowedError, match="0.0.0.0:0"):
            await start(LogConfig(data_dir=str(tmp_path / "data"), grpc_address="0.0.0.0:0"))

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))
