"""The frontend process's servers: the Kafka listener (TCP, one :class:`Connection` per
client) and the frontend's own gRPC port, which serves no API of its own, only health,
reflection and metrics."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc

from services.common.server import create_server
from services.common.tls import InternalTls

from .config import FrontendConfig
from .connection import Connection
from .dispatcher import Dispatcher
from .handler_pool import HandlerPool
from .network_receive import FrameChannel
from .quotas import ClientQuotas

log = logging.getLogger(__name__)

_WILDCARDS = ("", "0.0.0.0", "::")


class FrontendService:
    """A running frontend: ``port`` is its gRPC port, ``kafka_port`` the Kafka listener's."""

    def __init__(self, config: FrontendConfig, pool: HandlerPool, grpc_server: grpc.aio.Server,
                 port: int) -> None:
        self.config = config
        self.port = port
        self.kafka_port = 0
        self.advertised = ""
        self._pool = pool
        self._grpc_server = grpc_server
        self._listeners: list[asyncio.Server] = []
        self._dispatcher: Dispatcher | None = None
        self._connections: dict[asyncio.Task[None], Connection] = {}
        self._stopped = False
        # Client quotas: ``quotas.update(cluster_metadata.client_quotas)`` sets them.
        self.quotas = ClientQuotas(samples=config.quota_window_num,
                                   window_seconds=config.quota_window_size_seconds)

    async def _listen(self) -> None:
        """Bind the bootstrap port and one more per further broker id. Every port serves the
        same way; distinct ports exist because clients (older librdkafka among them) tell
        brokers apart by host:port, so each broker id needs an address of its own."""
        config = self.config
        first = await self._bind(config.listen_port)
        self.kafka_port = first.sockets[0].getsockname()[1]
        self._listeners.append(first)
        if config.broker_ports > 1 and config.listen_port == 0:
            raise ValueError("broker_ports > 1 needs an explicit listen_port")
        for offset in range(1, max(1, config.broker_ports)):
            self._listeners.append(await self._bind(self.kafka_port + offset))
        host = config.advertised_host or config.listen_host
        if host in _WILDCARDS:
            host = socket.gethostname()
        self.advertised = f"{host}:{config.advertised_port or self.kafka_port}"
        self._dispatcher = Dispatcher(self._pool, self.advertised, config.instance,
                                      max(1, config.broker_ports), self.kafka_port,
                                      self.quotas)
        for listener in self._listeners:
            await listener.start_serving()
        log.info("Kafka listeners on %s:%d-%d, advertised as %s (+broker id); handlers %s",
                 config.listen_host, self.kafka_port,
                 self.kafka_port + len(self._listeners) - 1, self.advertised,
                 ",".join(self._pool.addresses))

    async def _bind(self, port: int) -> asyncio.Server:
        max_frame_bytes = self.config.socket_request_max_bytes
        return await asyncio.get_running_loop().create_server(
            lambda: FrameChannel(max_frame_bytes, self._on_connect), self.config.listen_host,
            port, reuse_address=True, start_serving=False)

    async def _on_connect(self, channel: FrameChannel) -> None:
        assert self._dispatcher is not None
        connection = Connection(channel, self._dispatcher)
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = connection
        try:
            await connection.serve()
        finally:
            self._connections.pop(task, None)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; give requests in flight up to ``grace`` seconds, then close every
        connection, the handler channels and the gRPC port. Stopping twice is harmless."""
        if self._stopped:
            return
        self._stopped = True
        for listener in self._listeners:
            listener.close()
        busy = []
        for task, connection in list(self._connections.items()):
            if connection.idle:
                task.cancel()
            else:
                connection.stop_after_current()
                busy.append(task)
        if busy:
            _, pending = await asyncio.wait(busy, timeout=grace)
            for task in pending:
                task.cancel()
        tasks = list(self._connections)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for listener in self._listeners:
            await listener.wait_closed()
        await self._pool.close()
        await self._grpc_server.stop(grace)


async def start(config: FrontendConfig) -> FrontendService:
    """Start the frontend: its gRPC port, then the Kafka listener."""
    tls = InternalTls.of(config)
    pool = HandlerPool(config.handlers, tls=tls)
    await pool.start()
    try:
        grpc_server, port, _health = await create_server(
            "frontend", [], config.grpc_address, config.instance, tls=tls)
    except BaseException:
        await pool.close()
        raise
    service = FrontendService(config, pool, grpc_server, port)
    try:
        await service._listen()
    except BaseException:
        await service.stop(0)
        raise
    return service
