"""Start and stop the purgatory service: a gRPC server over one :class:`Purgatories`."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.server import ServiceBinding, create_server
from services.common.tls import InternalTls

from .config import PurgatoryConfig
from .purgatories import Purgatories
from .servicer import PurgatoryServicer
from .timer import SystemTimer

log = logging.getLogger(__name__)

SERVICE_NAME = purgatory_pb2.DESCRIPTOR.services_by_name["Purgatory"].full_name


class PurgatoryService:
    """A running purgatory: its gRPC server, bound port and domain state."""

    def __init__(self, server: grpc.aio.Server, port: int, purgatories: Purgatories,
                 sweeper: asyncio.Task[None]) -> None:
        self._server = server
        self.port = port
        self.purgatories = purgatories
        self._sweeper = sweeper

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving; waiters still parked after ``grace`` seconds are cancelled (their
        operations abandoned), then the timer stops."""
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        await self._server.stop(grace)
        self.purgatories.shutdown()


async def _sweep_watched_keys(purgatories: Purgatories, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        purgatories.sweep_watched_keys()


async def start(config: PurgatoryConfig) -> PurgatoryService:
    timer = SystemTimer(loop=asyncio.get_running_loop(), tick_ms=config.tick_ms,
                        wheel_size=config.wheel_size)
    linger = max(config.watch_linger_ms, 1) / 1000
    purgatories = Purgatories(timer, purge_interval=config.purge_interval, watch_linger=linger)
    server, port, _health = await create_server(
        "purgatory",
        [ServiceBinding(SERVICE_NAME, purgatory_pb2_grpc.add_PurgatoryServicer_to_server,
                        PurgatoryServicer(purgatories))],
        config.grpc_address,
        instance=config.instance,
        tls=InternalTls.of(config),
    )
    sweeper = asyncio.create_task(_sweep_watched_keys(purgatories, min(linger, 10.0) / 2),
                                  name="watched-keys-sweep")
    log.info("purgatory serving on port %d", port)
    return PurgatoryService(server, port, purgatories, sweeper)
