"""A frontend process's memory under many idle connections: 2,000 clients, each after an
ApiVersions round trip, cost under 20 KB of resident memory apiece, and once they close the
process's resident memory comes back near where it started."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
import struct
import sys
from pathlib import Path

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from .kafka_wire import encode_request

ROOT = Path(__file__).resolve().parents[2]
CONNECTIONS = 2000
# Resident memory an idle connection may cost the frontend (issue 16: under 20 KB each).
PER_CONNECTION_BYTES = 20_000
# How far above its starting point the frontend's resident memory may stay once every
# connection has closed: what the interpreter keeps of its own object pools after 2,000
# connections' worth of objects, far below the 40 MB the connections cost at the limit.
RETURN_SLACK_BYTES = 10 * 1024 * 1024
TIMEOUT = 20.0
# The frontend gives freed memory back this long after connections close.
RELEASE_DELAY_SECONDS = 1.0


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"{needed} open files needed, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


API_VERSIONS = encode_request(ApiVersionsRequest(client_software_name="memory-test",
                                                 client_software_version="1"), 7)


async def api_versions_round_trip(port: int) -> socket.socket:
    """A client connection that has sent ApiVersions and read its answer."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, API_VERSIONS)
        head = await receive_exactly(sock, 4)
        body = await receive_exactly(sock, struct.unpack(">i", head)[0])
        assert struct.unpack_from(">i", body)[0] == 7, "answer to another request"
        assert struct.unpack_from(">h", body, 4)[0] == 0, "ApiVersions failed"
    except BaseException:
        sock.close()
        raise
    return sock


async def receive_exactly(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = bytearray()
    while len(data) < size:
        chunk = await loop.sock_recv(sock, size - len(data))
        if not chunk:
            raise ConnectionError("frontend closed the connection")
        data += chunk
    return bytes(data)


async def open_idle_connections(port: int, count: int) -> list[socket.socket]:
    # At most as many connecting at once as the listener's accept backlog holds.
    gate = asyncio.Semaphore(64)
    socks: list[socket.socket] = []

    async def one() -> None:
        async with gate:
            socks.append(await api_versions_round_trip(port))

    try:
        await asyncio.gather(*(one() for _ in range(count)))
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


async def settled_resident_bytes(pid: int) -> int:
    """Resident memory once it stopped moving (the frontend has caught up with the closes)."""
    last = resident_bytes(pid)
    for _ in range(40):
        await asyncio.sleep(0.1)
        now = resident_bytes(pid)
        if abs(now - last) < 64 * 1024:
            return now
        last = now
    return last


@pytest.mark.processes
def test_idle_connections_are_cheap_and_their_memory_is_given_back() -> None:
    raise_open_files(CONNECTIONS * 2 + 200)

    async def main() -> None:
        port = free_port()
        env = dict(os.environ, KBROKER_LOG_LEVEL="WARNING")
        # No handler is needed: ApiVersions is answered by the frontend itself.
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.frontend", "--listen-port", str(port),
            "--grpc-address", "127.0.0.1:0", "--handlers", f"127.0.0.1:{free_port()}",
            cwd=ROOT, env=env)
        socks: list[socket.socket] = []
        try:
            for _ in range(200):
                try:
                    warm = await open_idle_connections(port, 1)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the frontend process never listened")
            # A first burst, closed again, so the baseline includes what any first use of
            # the code paths costs (imports, caches, interned strings).
            warm += await open_idle_connections(port, 50)
            for sock in warm:
                sock.close()
            await asyncio.sleep(RELEASE_DELAY_SECONDS + 0.5)
            baseline = await settled_resident_bytes(process.pid)

            socks = await open_idle_connections(port, CONNECTIONS)
            loaded = await settled_resident_bytes(process.pid)
            per_connection = (loaded - baseline) / CONNECTIONS
            for sock in socks:
                sock.close()
            socks = []
            await asyncio.sleep(RELEASE_DELAY_SECONDS + 0.5)
            after = await settled_resident_bytes(process.pid)
            print(f"frontend resident memory: baseline {baseline / 2**20:.1f} MiB, with "
                  f"{CONNECTIONS} idle connections {loaded / 2**20:.1f} MiB "
                  f"({per_connection / 1000:.1f} KB each), after they closed "
                  f"{after / 2**20:.1f} MiB")
            assert per_connection < PER_CONNECTION_BYTES, (
                f"{per_connection:.0f} bytes per idle connection")
            assert after - baseline < RETURN_SLACK_BYTES, (
                f"{(after - baseline) / 2**20:.1f} MiB kept after the connections closed")
        finally:
            for sock in socks:
                sock.close()
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await asyncio.wait_for(process.wait(), 10)

    asyncio.run(asyncio.wait_for(main(), 60))
