"""The frontend's handler pool follows the handlers a resolver names: new handlers get traffic,
handlers that left get none, and an empty set answers UNAVAILABLE without hanging."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kbroker.kafka.v1 import kafka_pb2 as k
from services.frontend.handler_pool import HandlerCallError, HandlerPool, StreamCallError

from .fake_handler import FakeHandler


class MutableResolver:
    def __init__(self, *addresses: str) -> None:
        self.addresses = tuple(addresses)

    async def resolve(self) -> tuple[str, ...]:
        return self.addresses


async def metadata(pool: HandlerPool) -> str:
    answer, _remote = await pool.call("Metadata", k.MetadataRequest(topics_is_null=True),
                                      metadata=(), time_limit=5, retry_safe=True)
    return answer.cluster_id


async def wait_for_addresses(pool: HandlerPool, expected: tuple[str, ...]) -> None:
    for _ in range(200):
        if pool.addresses == expected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{pool.addresses} != {expected}")


def test_pool_follows_handlers_as_they_come_and_go() -> None:
    async def main() -> None:
        first, second = await FakeHandler("first").start(), await FakeHandler("second").start()
        resolver = MutableResolver(first.address)
        pool = HandlerPool("dns:///unused:1", resolve_interval=0.02, resolver=resolver)
        try:
            await pool.start()
            assert pool.addresses == (first.address,)
            assert {await metadata(pool) for _ in range(4)} == {"first"}

            resolver.addresses = (first.address, second.address)
            await wait_for_addresses(pool, (first.address, second.address))
            assert {await metadata(pool) for _ in range(4)} == {"first", "second"}

            resolver.addresses = (second.address,)
            await wait_for_addresses(pool, (second.address,))
            assert {await metadata(pool) for _ in range(4)} == {"second"}

            resolver.addresses = ()
            await wait_for_addresses(pool, ())
            with pytest.raises(HandlerCallError) as failed:
                await metadata(pool)
            assert failed.value.status == grpc.StatusCode.UNAVAILABLE
            assert failed.value.reached is False
        finally:
            await pool.close()
            await first.stop()
            await second.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_static_list_is_used_in_the_order_given() -> None:
    async def main() -> None:
        pool = HandlerPool(("127.0.0.1:2", "127.0.0.1:1"))
        try:
            await pool.start()
            assert pool.addresses == ("127.0.0.1:2", "127.0.0.1:1")
        finally:
            await pool.close()

    asyncio.run(main())


def test_a_request_a_handler_stream_refused_to_take_never_reached_it() -> None:
    """Sent or not is what decides a retry elsewhere: a request the stream refused to take
    never reached the handler, whatever gRPC's wording; one that was sent and then lost the
    connection did (its outcome is unknown)."""

    assert StreamCallError.not_sent(grpc.StatusCode.UNAVAILABLE, "Socket closed").never_reached
    assert not StreamCallError(grpc.StatusCode.UNAVAILABLE, "Socket closed").never_reached
    assert StreamCallError(grpc.StatusCode.UNAVAILABLE,
                           "failed to connect to all addresses").never_reached
