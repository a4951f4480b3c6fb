"""The services' channels on real servers on port 0: a new channel to a service restarted on
the address of one that went away reaches it at once, whatever older channels to that address
went through."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.channels import PLAINTEXT, insecure_channel, internal_channel
from services.common.server import create_server


async def _check(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


@pytest.mark.parametrize("make", [
    insecure_channel,
    lambda address: internal_channel(address, PLAINTEXT, "log"),
], ids=["insecure_channel", "internal_channel"])
def test_a_new_channel_reaches_a_service_restarted_on_the_same_address(make) -> None:
    async def scenario() -> None:
        first, port, _ = await create_server("before", [], "127.0.0.1:0")
        address = f"127.0.0.1:{port}"
        old = make(address)
        try:
            assert await _check(old) == health_pb2.HealthCheckResponse.SERVING
            await first.stop(0)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await _check(old)  # the old channel saw the service go away
            assert failed.value.code() is grpc.StatusCode.UNAVAILABLE

            second, again, _ = await create_server("after", [], address)
            assert again == port
            new = make(address)
            try:
                # wait_for_ready is not set: a call on a channel that inherited the old
                # connection's failure fails at once.
                assert await _check(new) == health_pb2.HealthCheckResponse.SERVING
            finally:
                await new.close()
                await second.stop(0)
        finally:
            await old.close()

    asyncio.run(scenario())
