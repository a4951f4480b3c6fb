"""Process life cycle shared by every service's ``__main__``: uvloop, logging, and a graceful
stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable


def setup_logging(service: str) -> None:
    level = os.environ.get("KBROKER_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )


def run(service: str, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop_event)`` on uvloop until it returns; SIGTERM/SIGINT set the event."""
    import uvloop

    setup_logging(service)

    async def _wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    uvloop.run(_wrapper())
