"""Start and stop the purgatory service: a gRPC server over one :class:`Purgatories`."""

from __future__ import annotations

import asyncio
import logging

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.server import ServiceBinding, create_server

from .config import PurgatoryConfig
from .purgatories import Purgatories
from .servicer import PurgatoryServicer
from .timer import SystemTimer

log = logging.getLogger(__name__)

SERVICE_NAME = purgatory_pb2.DESCRIPTOR.services_by_name["Purgatory"].full_name


class PurgatoryService:
    """A running purgatory: its gRPC server, bound port and domain state."""

    def __init__(self, server: grpc.aio.Server, port: int, purgatories: Purgatories) -> None:
        self._server = server
        self.port = port
        self.purgatories = purgatories

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving; waiters still parked after ``grace`` seconds are cancelled (their
        operations abandoned), then the timer stops."""
        await self._server.stop(grace)
        self.purgatories.shutdown()


async def start(config: PurgatoryConfig) -> PurgatoryService:
    timer = SystemTimer(loop=asyncio.get_running_loop(), tick_ms=config.tick_ms,
                        wheel_size=config.wheel_size)
    purgatories = Purgatories(timer, purge_interval=config.purge_interval)
    server, port, _health = await create_server(
        "purgatory",
        [ServiceBinding(SERVICE_NAME, purgatory_pb2_grpc.add_PurgatoryServicer_to_server,
                        PurgatoryServicer(purgatories))],
        config.grpc_address,
        instance=config.grpc_address,
    )
    log.info("purgatory serving on port %d", port)
    return PurgatoryService(server, port, purgatories)
