"""``python -m services.log [--flags]``: run a log node until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import sys

from services.common.config import load
from services.common.metrics import serve_prometheus
from services.common.runtime import run

from .config import LogConfig
from .server import start


async def main(stop: asyncio.Event) -> None:
    config = load(LogConfig, sys.argv[1:])
    if config.metrics_port:
        serve_prometheus(config.metrics_port)
    service = await start(config)
    try:
        await stop.wait()
    finally:
        await service.stop()


if __name__ == "__main__":
    run("log", main)
