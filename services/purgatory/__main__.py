"""``python -m services.purgatory [--flags]``: run the purgatory service until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.common.config import load
from services.common.metrics import serve_prometheus
from services.common.runtime import run

from .config import PurgatoryConfig
from .server import start

log = logging.getLogger("services.purgatory")


def main() -> None:
    config = load(PurgatoryConfig, sys.argv[1:])

    async def serve(stop: asyncio.Event) -> None:
        if config.metrics_port:
            host = config.grpc_address.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
            serve_prometheus(config.metrics_port, host)
        service = await start(config)
        log.info("purgatory ready on %s", config.grpc_address)
        try:
            await stop.wait()
        finally:
            await service.stop()

    run("purgatory", serve)


if __name__ == "__main__":
    main()
