"""FrameChannel over a real loopback socket: frames cut from any split of the byte stream,
large frames received in place, arrival times, size limits, a stream cut inside a frame, back
pressure on a client that pipelines, and responses written back, ranges of files among them
(sent with sendfile)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import uvloop
from prometheus_client import REGISTRY

from services.common.file_records import FileSlice
from services.frontend.framing import FrameError
from services.frontend.network_receive import _QUEUED_BYTES_LIMIT, _SCRATCH_BYTES, FrameChannel

TIMEOUT = 20
MAX_FRAME = 4 << 20


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


Serve = Callable[[FrameChannel], Awaitable[None]]


@asynccontextmanager
async def listening(serve: Serve) -> AsyncIterator[tuple[str, int]]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FrameChannel(MAX_FRAME, serve), "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()
        await server.wait_closed()


async def collect(channel: FrameChannel, out: list[object]) -> None:
    """Every frame (as bytes) until the end, then None or the FrameError."""
    try:
        while True:
            read = await channel.read_frame()
            if read is None:
                out.append(None)
                return
            out.append(bytes(read[0]))
    except FrameError as e:
        out.append(e)
    finally:
        channel.close()


async def send_and_collect(chunks: list[bytes], pause: float = 0.0) -> list[object]:
    got: list[object] = []
    done = asyncio.Event()

    async def serve(channel: FrameChannel) -> None:
        await collect(channel, got)
        done.set()

    async with listening(serve) as address:
        reader, writer = await asyncio.open_connection(*address)
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        writer.write_eof()
        await asyncio.wait_for(done.wait(), TIMEOUT)
        writer.close()
    return got


def run(coroutine: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))  # type: ignore[arg-type]


@pytest.mark.parametrize("split", ["whole", "bytewise", "random"])
def test_frames_are_cut_from_any_split_of_the_stream(split: str) -> None:
    rng = random.Random(7)
    bodies = [b"", b"x", rng.randbytes(3), rng.randbytes(_SCRATCH_BYTES - 4),
              rng.randbytes(_SCRATCH_BYTES + 1), rng.randbytes(300_000), b"tail"]
    stream = b"".join(frame(b) for b in bodies)
    if split == "whole":
        chunks = [stream]
    elif split == "bytewise":
        # Byte by byte through the prefixes and small frames, then in large pieces.
        head = len(frame(bodies[0])) + len(frame(bodies[1])) + len(frame(bodies[2])) + 2
        chunks = [stream[i:i + 1] for i in range(head)] + [
            stream[i:i + 50_000] for i in range(head, len(stream), 50_000)]
    else:
        chunks, at = [], 0
        while at < len(stream):
            step = rng.choice([1, 2, 3, 5, 4096, 70_000])
            chunks.append(stream[at:at + step])
            at += step

    async def main() -> None:
        got = await send_and_collect(chunks)
        assert got == [*bodies, None]

    run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_connections_reading_at_once_each_get_their_own_frames(loop: str) -> None:
    """Connections share one scratch buffer: frames taken late, and starts of frames carried
    over between reads, must not see what other connections read into it since."""
    connections = 20
    rng = random.Random(11)
    streams = [[rng.randbytes(rng.choice([0, 1, 7, 300, 5000, 40_000, 70_000]))
                for _ in range(30)] for _ in range(connections)]

    async def main() -> None:
        got: dict[bytes, list[bytes]] = {}
        all_in = asyncio.Event()

        async def serve(channel: FrameChannel) -> None:
            first = await channel.read_frame()
            assert first is not None
            mine = got.setdefault(bytes(first[0]), [])
            await all_in.wait()  # every connection's frames queue while the others read
            while (read := await channel.read_frame()) is not None:
                mine.append(bytes(read[0]))
            channel.close()

        async def client(address: tuple[str, int], name: bytes, bodies: list[bytes]) -> None:
            reader, writer = await asyncio.open_connection(*address)
            stream = frame(name) + b"".join(frame(b) for b in bodies)
            at = 0
            while at < len(stream):
                step = rng.choice([1, 3, 4096, 30_000])
                writer.write(stream[at:at + step])
                at += step
                await writer.drain()
                await asyncio.sleep(0)
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(1), TIMEOUT) == b""
            writer.close()

        async with listening(serve) as address:
            clients = [asyncio.create_task(client(address, b"c%d" % i, bodies))
                       for i, bodies in enumerate(streams)]
            await asyncio.sleep(0.3)
            all_in.set()
            await asyncio.wait_for(asyncio.gather(*clients), TIMEOUT)
        assert got == {b"c%d" % i: bodies for i, bodies in enumerate(streams)}

    if loop == "uvloop":
        uvloop.run(asyncio.wait_for(main(), TIMEOUT))
    else:
        run(main())


def test_a_large_frame_is_a_read_only_view_and_a_small_one_bytes() -> None:
    async def main() -> None:
        kinds: list[tuple[type, bool]] = []

        async def serve(channel: FrameChannel) -> None:
            for _ in range(2):
                read = await channel.read_frame()
                assert read is not None
                body = read[0]
                kinds.append((type(body), isinstance(body, memoryview) and body.readonly))
            channel.close()

        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(frame(b"small") + frame(b"L" * (_SCRATCH_BYTES * 3)))
            assert await asyncio.wait_for(reader.read(1), TIMEOUT) == b""
            writer.close()
        assert kinds == [(bytes, False), (memoryview, True)]

    run(main())


def test_each_frame_is_stamped_when_its_last_byte_arrived() -> None:
    async def main() -> None:
        stamps: list[float] = []

        async def serve(channel: FrameChannel) -> None:
            for _ in range(2):
                read = await channel.read_frame()
                assert read is not None
                stamps.append(read[1])
            channel.close()

        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            data = frame(b"a") + frame(b"b" * 200_000)
            first_sent = time.perf_counter()
            writer.write(data[:4 + 1 + 4 + 1000])
            await writer.drain()
            await asyncio.sleep(0.05)
            rest_sent = time.perf_counter()
            writer.write(data[4 + 1 + 4 + 1000:])
            await writer.drain()
            assert await asyncio.wait_for(reader.read(1), TIMEOUT) == b""
            writer.close()
        # The first frame was complete with the first write, the second only with the rest.
        assert first_sent <= stamps[0] < rest_sent <= stamps[1]

    run(main())


@pytest.mark.parametrize("size", [MAX_FRAME + 1, -1, 0x7FFFFFFF])
def test_a_size_out_of_bounds_fails_after_the_frames_before_it(size: int) -> None:
    async def main() -> None:
        got = await send_and_collect([frame(b"ok") + struct.pack(">i", size) + b"junk"])
        assert got[0] == b"ok"
        assert isinstance(got[1], FrameError) and "outside" in str(got[1])
        assert len(got) == 2

    run(main())


@pytest.mark.parametrize("cut", [2, 4 + 3, 4 + _SCRATCH_BYTES + 10])
def test_a_stream_cut_inside_a_frame_fails(cut: int) -> None:
    async def main() -> None:
        whole = frame(b"z" * (_SCRATCH_BYTES * 2))
        got = await send_and_collect([whole[:cut]])
        assert len(got) == 1 and isinstance(got[0], FrameError)

    run(main())


def test_a_pipelining_client_is_paused_and_loses_nothing() -> None:
    async def main() -> None:
        bodies = [i.to_bytes(4, "big") * 2500 for i in range(400)]  # 4 MB of 10 KB frames
        got: list[bytes] = []
        paused_seen = []

        async def serve(channel: FrameChannel) -> None:
            await asyncio.sleep(0.2)  # let the client fill the queue
            paused_seen.append(channel._reading_paused)
            assert channel._queued_bytes < _QUEUED_BYTES_LIMIT + 64 * 1024
            while True:
                read = await channel.read_frame()
                if read is None:
                    break
                got.append(bytes(read[0]))
            channel.close()

        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"".join(frame(b) for b in bodies))
            writer.write_eof()
            await asyncio.wait_for(writer.drain(), TIMEOUT)
            assert await asyncio.wait_for(reader.read(1), TIMEOUT) == b""
            writer.close()
        assert paused_seen == [True]
        assert got == bodies

    run(main())


def test_responses_are_written_back_in_pieces() -> None:
    async def main() -> None:
        async def serve(channel: FrameChannel) -> None:
            while (read := await channel.read_frame()) is not None:
                body = bytes(read[0])
                channel.write([struct.pack(">i", len(body)), body[:3], memoryview(body)[3:]])
                await channel.drain()
            channel.close()

        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            bodies = [b"hello world", b"r" * 2_000_000]
            for body in bodies:
                writer.write(frame(body))
                prefix = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
                size = struct.unpack(">i", prefix)[0]
                assert await asyncio.wait_for(reader.readexactly(size), TIMEOUT) == body
            writer.close()

    run(main())


def sendfile_bytes() -> float:
    return REGISTRY.get_sample_value("kbroker_frontend_sendfile_bytes_total") or 0.0


def open_descriptors() -> set[str]:
    """What this process's descriptors refer to (a socket as ``socket:[inode]``)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_file_slice_goes_to_the_socket_after_what_the_transport_holds(loop: str,
                                                                       tmp_path) -> None:
    """A response of bytes, a slice of a file and bytes again, to a client that starts reading
    only after the transport has buffered megabytes: the slice waits for them, then goes out
    with sendfile as the socket takes it, and is closed once sent."""
    rng = random.Random(5)
    content = rng.randbytes(6 << 20)
    path = tmp_path / "segment"
    path.write_bytes(b"skip" + content + b"more")
    before, tail = rng.randbytes(5 << 20), b"tail"
    size = len(before) + len(content) + len(tail)

    async def main() -> None:
        slices: list[FileSlice] = []
        sent = asyncio.Event()

        async def serve(channel: FrameChannel) -> None:
            piece = FileSlice(os.open(path, os.O_RDONLY), 4, len(content))
            slices.append(piece)
            await channel.send([struct.pack(">i", size), before, piece, tail])
            sent.set()
            channel.close()

        counted = sendfile_bytes()
        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            await asyncio.sleep(0.3)  # the transport holds what the socket did not take
            prefix = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
            assert struct.unpack(">i", prefix)[0] == size
            body = await asyncio.wait_for(reader.readexactly(size), TIMEOUT)
            assert body == before + content + tail
            await asyncio.wait_for(sent.wait(), TIMEOUT)
            writer.close()
        assert slices[0].fd == -1
        assert sendfile_bytes() - counted == len(content)

    if loop == "uvloop":
        uvloop.run(asyncio.wait_for(main(), TIMEOUT))
    else:
        run(main())


def test_a_slice_cut_short_while_sent_closes_the_connection(tmp_path) -> None:
    """The frame's size is out before the file is read: a file cut meanwhile cannot be sent
    whole, so the send fails and the client sees the connection end inside the frame."""
    content = b"c" * (1 << 20)
    path = tmp_path / "segment"
    path.write_bytes(content)

    async def main() -> None:
        failures: list[BaseException] = []

        async def serve(channel: FrameChannel) -> None:
            piece = FileSlice(os.open(path, os.O_RDONLY), 0, len(content))
            os.truncate(path, 1000)
            try:
                await channel.send([struct.pack(">i", len(content)), piece])
            except ConnectionError as e:
                failures.append(e)
            finally:
                channel.close()

        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            prefix = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
            assert struct.unpack(">i", prefix)[0] == len(content)
            with pytest.raises(asyncio.IncompleteReadError) as cut:
                await asyncio.wait_for(reader.readexactly(len(content)), TIMEOUT)
            assert cut.value.partial == content[:1000]
            writer.close()
        assert [type(e) for e in failures] == [ConnectionAbortedError]

    uvloop.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_client_gone_while_a_slice_waits_for_the_socket_ends_the_send(tmp_path) -> None:
    """The client closes while the slice waits for room in the socket: the send fails, and
    neither the slice's descriptor nor any descriptor of the socket stays open."""
    path = tmp_path / "segment"
    path.write_bytes(b"d" * (32 << 20))

    async def main() -> None:
        failures: list[BaseException] = []
        ended = asyncio.Event()
        waiting = asyncio.Event()
        piece = FileSlice(os.open(path, os.O_RDONLY), 0, 32 << 20)
        sockets: list[str] = []

        async def serve(channel: FrameChannel) -> None:
            socket_fd = channel.extra_info("socket").fileno()  # type: ignore[attr-defined]
            sockets.append(os.readlink(f"/proc/self/fd/{socket_fd}"))
            try:
                task = asyncio.ensure_future(channel.send([struct.pack(">i", 32 << 20), piece]))
                for _ in range(200):
                    if channel._writable_waiter is not None:
                        break
                    await asyncio.sleep(0.01)
                assert channel._writable_waiter is not None, "the slice never waited"
                waiting.set()
                await task
            except ConnectionError as e:
                failures.append(e)
            finally:
                channel.close()
                ended.set()

        async with listening(serve) as address:
            reader, writer = await asyncio.open_connection(*address)
            await asyncio.wait_for(waiting.wait(), TIMEOUT)
            writer.transport.abort()  # a reset: the server's next write fails at once
            await asyncio.wait_for(ended.wait(), TIMEOUT)
        assert len(failures) == 1
        assert piece.fd == -1
        assert sockets[0].startswith("socket:[")
        for _ in range(100):  # the transport closes its own descriptor on the next turns
            if sockets[0] not in open_descriptors():
                break
            await asyncio.sleep(0.01)
        assert sockets[0] not in open_descriptors()

    uvloop.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_slice_to_a_fast_reader_leaves_other_connections_their_turn(tmp_path) -> None:
    """While one connection sends a large slice to a client reading as fast as it can (in
    another thread), another connection's requests are still answered: the sender gives the
    loop back whenever the socket is full instead of sending on until the slice is done."""
    size = 256 << 20
    path = tmp_path / "segment"
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: read as zeros, no disk written

    def drain(sock: socket.socket, done: list[float]) -> None:
        left = size + 4
        while left > 0:
            got = sock.recv(1 << 20)
            if not got:
                break
            left -= len(got)
        done.append(time.perf_counter())

    async def main() -> None:
        async def serve(channel: FrameChannel) -> None:
            read = await channel.read_frame()
            assert read is not None
            if bytes(read[0]) == b"slice":
                piece = FileSlice(os.open(path, os.O_RDONLY), 0, size)
                await channel.send([struct.pack(">i", size), piece])
            else:  # echo every frame until the end
                while read is not None:
                    body = bytes(read[0])
                    await channel.send([struct.pack(">i", len(body)), body])
                    read = await channel.read_frame()
            channel.close()

        async with listening(serve) as address:
            loop = asyncio.get_running_loop()
            echo_reader, echo_writer = await asyncio.open_connection(*address)
            echo_writer.write(frame(b"warm"))
            await asyncio.wait_for(echo_reader.readexactly(8), TIMEOUT)
            bulk = socket.create_connection(address)
            bulk.sendall(frame(b"slice"))
            done: list[float] = []
            reading = loop.run_in_executor(None, drain, bulk, done)
            started = time.perf_counter()
            round_trips = []
            while not done and time.perf_counter() - started < TIMEOUT:
                sent = time.perf_counter()
                echo_writer.write(frame(b"ping"))
                await asyncio.wait_for(echo_reader.readexactly(8), TIMEOUT)
                round_trips.append(time.perf_counter() - sent)
            await asyncio.wait_for(reading, TIMEOUT)
            bulk.close()
            echo_writer.close()
            transfer = done[0] - started
            assert len(round_trips) >= 5, (transfer, round_trips)
            assert max(round_trips) < transfer / 4, (transfer, max(round_trips))

    uvloop.run(asyncio.wait_for(main(), TIMEOUT))
