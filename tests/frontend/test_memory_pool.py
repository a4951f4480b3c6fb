"""queued.max.request.bytes: the frontend's request memory pool, alone and under FrameChannel
connections over real loopback sockets. A connection takes a frame's size from the pool before
receiving it and gives it back when the request is done; with the pool used up, connections are
not read and wait their turn; nothing is lost or reordered on the way, and every byte comes
back when requests are done or connections close."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import uvloop

from services.frontend.memory_pool import MemoryPool
from services.frontend.network_receive import FrameChannel

TIMEOUT = 20
MAX_FRAME = 16 << 20
MiB = 1 << 20


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def run(coroutine: Awaitable[None]) -> None:
    uvloop.run(asyncio.wait_for(coroutine, TIMEOUT))  # type: ignore[arg-type]


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(int(TIMEOUT / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


@asynccontextmanager
async def listening(pool: MemoryPool, serve: Callable[[FrameChannel], Awaitable[None]]
                    ) -> AsyncIterator[tuple[str, int]]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FrameChannel(MAX_FRAME, serve, pool),
                                      "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()
        await server.wait_closed()


# -- the pool alone ---------------------------------------------------------------------------

def test_an_allocation_succeeds_while_any_memory_is_left_as_in_kafka() -> None:
    async def main() -> None:
        pool = MemoryPool(100)
        assert pool.try_allocate(60) and pool.try_allocate(60)  # 20 over: not strict
        assert pool.available == -20
        assert not pool.try_allocate(1)
        pool.release(60)
        assert pool.available == 40 and pool.try_allocate(500)
        assert pool.used == 560

    run(main())


def test_no_capacity_is_no_limit() -> None:
    async def main() -> None:
        pool = MemoryPool(-1)
        assert all(pool.try_allocate(1 << 30) for _ in range(10))
        assert not pool.bounded and pool.depleted_seconds() == 0

    run(main())


def test_waiters_are_woken_in_order_while_memory_is_left() -> None:
    async def main() -> None:
        pool = MemoryPool(10)
        assert pool.try_allocate(10)
        woken: list[str] = []

        def waiter(name: str, size: int) -> Callable[[], None]:
            def on_available() -> None:
                if pool.try_allocate(size):
                    woken.append(name)
                else:
                    pool.wait(on_available)
            return on_available

        first, second, gone = waiter("first", 8), waiter("second", 8), waiter("gone", 1)
        pool.wait(first)
        pool.wait(gone)
        pool.wait(second)
        pool.cancel_wait(gone)
        pool.release(5)
        await asyncio.sleep(0)
        # "first" takes 8 of the 5 left: the pool is used up again, "second" waits on.
        assert woken == ["first"] and pool.waiting == 1
        pool.release(13)
        await asyncio.sleep(0)
        assert woken == ["first", "second"] and pool.waiting == 0
        assert pool.depleted_seconds() > 0

    run(main())


# -- connections --------------------------------------------------------------------------

def test_a_connection_is_not_read_until_another_request_is_done() -> None:
    async def main() -> None:
        pool = MemoryPool(1 * MiB)
        frames: dict[int, asyncio.Queue[bytes]] = {}
        channels: dict[int, FrameChannel] = {}

        async def serve(channel: FrameChannel) -> None:
            # One request each, held until the test calls request_done.
            peer = channel.extra_info("peername")[1]  # type: ignore[index]
            channels[peer] = channel
            read = await channel.read_frame()
            assert read is not None
            await frames.setdefault(peer, asyncio.Queue()).put(bytes(read[0]))

        async with listening(pool, serve) as address:
            first = await asyncio.open_connection(*address)
            second = await asyncio.open_connection(*address)
            ports = [w.get_extra_info("sockname")[1] for _, w in (first, second)]
            big = [bytes([i]) * (3 * MiB) for i in (1, 2)]
            first[1].write(frame(big[0]))
            await until(lambda: ports[0] in frames and not frames[ports[0]].empty(),
                        "the first frame arrived")
            # Larger than the whole pool, it went through: the pool is now over-used.
            assert pool.used == 3 * MiB
            second[1].write(frame(big[1]))
            await until(lambda: ports[1] in channels and pool.waiting == 1,
                        "the second connection waits for memory")
            await asyncio.sleep(0.2)
            assert ports[1] not in frames, "read although the pool was used up"
            assert pool.used == 3 * MiB
            assert await frames[ports[0]].get() == big[0]
            channels[ports[0]].request_done()
            await until(lambda: ports[1] in frames, "the second frame arrived")
            assert await frames[ports[1]].get() == big[1]
            assert pool.used == 3 * MiB and pool.waiting == 0
            channels[ports[1]].request_done()
            assert pool.used == 0
            for port, (_, writer) in zip(ports, (first, second), strict=True):
                channels[port].close()
                writer.close()

    run(main())


def test_frames_waiting_for_memory_arrive_whole_and_in_order() -> None:
    """Many connections pipelining frames of mixed sizes (scratch-sized and larger, in random
    pieces) through a pool far smaller than what they send: every frame arrives, in order per
    connection, and the pool ends empty."""
    async def main() -> None:
        rng = random.Random(7)
        pool = MemoryPool(256 * 1024)
        got: dict[int, list[bytes]] = {}

        async def serve(channel: FrameChannel) -> None:
            peer = channel.extra_info("peername")[1]  # type: ignore[index]
            mine = got.setdefault(peer, [])
            try:
                while (read := await channel.read_frame()) is not None:
                    mine.append(bytes(read[0]))
                    await asyncio.sleep(rng.random() * 0.002)  # the request is processed
                    channel.request_done()
            finally:
                channel.close()

        async def client(address: tuple[str, int], index: int) -> tuple[int, list[bytes]]:
            reader, writer = await asyncio.open_connection(*address)
            bodies = [bytes([index, n % 256]) * (rng.choice((10, 900, 40_000, 150_000)) // 2)
                      for n in range(40)]
            stream = b"".join(frame(b) for b in bodies)
            position = 0
            while position < len(stream):
                step = rng.randint(1, 200_000)
                writer.write(stream[position:position + step])
                await writer.drain()
                position += step
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(1), TIMEOUT) == b""
            port = writer.get_extra_info("sockname")[1]
            writer.close()
            return port, bodies

        async with listening(pool, serve) as address:
            sent = await asyncio.gather(*(client(address, i) for i in range(8)))
        for port, bodies in sent:
            assert got[port] == bodies
        assert pool.used == 0 and pool.waiting == 0
        assert pool.depleted_seconds() > 0, "the pool was never used up: the test tests nothing"

    run(main())


def test_closed_connections_give_back_all_they_held() -> None:
    async def main() -> None:
        pool = MemoryPool(1 * MiB)
        reading, finish = asyncio.Event(), asyncio.Event()

        async def serve(channel: FrameChannel) -> None:
            # Each connection's first request is done when the test says so.
            try:
                if await channel.read_frame() is not None:
                    reading.set()
                    await finish.wait()
                while await channel.read_frame() is not None:
                    pass
            except ConnectionError:
                pass
            finally:
                channel.close()

        async with listening(pool, serve) as address:
            holder = await asyncio.open_connection(*address)
            holder[1].write(frame(b"a" * (2 * MiB)) + frame(b"b" * 100))
            await asyncio.wait_for(reading.wait(), TIMEOUT)
            waiter = await asyncio.open_connection(*address)
            waiter[1].write(frame(b"c" * MiB))
            half = await asyncio.open_connection(*address)
            half[1].write(struct.pack(">i", 5 * MiB) + b"d" * 1000)  # a frame cut short
            # The holder's next frame, and both others, wait for memory.
            await until(lambda: pool.waiting == 3, "three connections wait")
            # Connections waiting for memory are not read, so their closing is noticed when
            # their turn comes (as for a muted Kafka channel).
            for _, writer in (waiter, half, holder):
                writer.transport.abort()
            await asyncio.sleep(0.1)
            assert pool.used == 2 * MiB
            finish.set()
            await until(lambda: pool.used == 0 and pool.waiting == 0, "every byte is back")

    run(main())
