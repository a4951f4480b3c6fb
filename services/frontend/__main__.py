"""``python -m services.frontend [--flags]``: run one frontend until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import sys

from services.common.config import load
from services.common.metrics import serve_prometheus
from services.common.runtime import run

from .config import FrontendConfig
from .server import start


def main() -> None:
    config = load(FrontendConfig, sys.argv[1:])

    async def serve(stop: asyncio.Event) -> None:
        if config.metrics_port:
            serve_prometheus(config.metrics_port)
        service = await start(config)
        try:
            await stop.wait()
        finally:
            await service.stop()

    run("frontend", serve)


if __name__ == "__main__":
    main()
