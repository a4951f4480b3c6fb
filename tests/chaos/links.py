"""Network partitions between the services of a local cluster, on loopback: a TCP proxy in
front of a service's gRPC port, which every other service is given in place of the real
address, and which the test can cut and restore.

Why proxies and not network namespaces: a service in a namespace of its own would have to
listen on a veth address, and the services refuse plaintext gRPC on anything but loopback; a
proxy keeps every address on 127.0.0.1 and cuts exactly the streams between services, while
the launcher's own health checks go straight to the real port.

A cut is one of two kinds:

- ``reset``: every open connection through the proxy is closed at once and new ones are
  closed as they arrive (a peer that went away: callers see UNAVAILABLE at once);
- ``blackhole``: nothing moves any more, in either direction, on open or new connections,
  and nothing is closed (packets dropped: callers only notice through their deadlines and
  keepalives).

``restore`` lets traffic flow again (held bytes are delivered, as TCP would retransmit them).
The proxies run on one asyncio loop in a daemon thread of the test process; every method is
called from other threads and is thread-safe.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Coroutine
from typing import Any

from services.local_cluster import LocalCluster, free_port

CUT_KINDS = ("reset", "blackhole")


class _ProxyLoop:
    """One event loop in a daemon thread, shared by every proxy."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="chaos-links",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


class Link:
    """A proxy on 127.0.0.1:``port`` in front of 127.0.0.1:``target_port`` (service
    ``name``)."""

    def __init__(self, loop: _ProxyLoop, name: str, target_port: int) -> None:
        self.name = name
        self.target_port = target_port
        self.port = free_port()
        self.cut_kind: str | None = None
        self._loop = loop
        self._server: asyncio.base_events.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._transports: set[asyncio.BaseTransport] = set()
        self.connections = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._loop.run(self._start())

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def cut(self, kind: str = "reset") -> None:
        if kind not in CUT_KINDS:
            raise ValueError(f"unknown cut {kind!r}: one of {CUT_KINDS}")
        self._loop.run(self._cut(kind))

    async def _cut(self, kind: str) -> None:
        assert self._flowing is not None
        self.cut_kind = kind
        if kind == "blackhole":
            self._flowing.clear()
            return
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()

    def restore(self) -> None:
        self._loop.run(self._restore())

    async def _restore(self) -> None:
        assert self._flowing is not None
        self.cut_kind = None
        self._flowing.set()

    def close(self) -> None:
        self._loop.run(self._close())

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        if self._flowing is not None:
            self._flowing.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        if self.cut_kind == "reset":
            writer.transport.abort()
            return
        self._transports.add(writer.transport)
        await self._flowing.wait()  # a blackholed link holds new connections unconnected
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self._transports.discard(writer.transport)
            writer.transport.abort()
            return
        if self.cut_kind == "reset" or writer.transport.is_closing():
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self._transports.add(up_writer.transport)
        self.connections += 1
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for transport in (writer.transport, up_writer.transport):
                self._transports.discard(transport)
                transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(1 << 16)
                if not data:
                    break
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()


class Links:
    """The proxies in front of some services of one cluster, set up before it starts."""

    def __init__(self, cluster: LocalCluster, names: list[str]) -> None:
        self._loop = _ProxyLoop()
        self.links: dict[str, Link] = {}
        for name in names:
            svc = cluster.services[name]
            link = Link(self._loop, name, svc.grpc_port)
            link.start()
            self.links[name] = link
            _route_through(cluster, name, link)

    def __getitem__(self, name: str) -> Link:
        return self.links[name]

    def restore_all(self) -> None:
        for link in self.links.values():
            if link.cut_kind is not None:
                link.restore()

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self._loop.close()


def _route_through(cluster: LocalCluster, name: str, link: Link) -> None:
    """Give every service but ``name`` the proxy's address wherever its flags name ``name``'s
    gRPC address (the planned command lines, before the cluster starts)."""
    real = re.compile(rf"127\.0\.0\.1:{cluster.services[name].grpc_port}(?!\d)")
    for other, svc in cluster.services.items():
        if other != name:
            svc.args = [real.sub(link.address, arg) for arg in svc.args]
