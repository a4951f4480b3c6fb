"""``python -m services.handler [--flags]``: run one handler until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import sys

from services.common.config import load
from services.common.metrics import serve_prometheus
from services.common.runtime import run

from .config import HandlerConfig
from .server import start


async def main(stop: asyncio.Event) -> None:
    config = load(HandlerConfig, sys.argv[1:])
    if config.metrics_port != 0:
        serve_prometheus(config.metrics_port)
    service = await start(config)
    try:
        await stop.wait()
    finally:
        await service.stop()


if __name__ == "__main__":
    run("handler", main)
