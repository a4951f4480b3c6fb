"""A frontend with security settings in front of a fake handler, for the SASL and TLS tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from services.frontend.config import FrontendConfig
from services.frontend.server import FrontendService, start

from .fake_handler import FakeHandler


@contextlib.asynccontextmanager
async def secure_frontend(handler: FakeHandler | None = None, **settings: Any
                          ) -> AsyncIterator[tuple[FrontendService, FakeHandler]]:
    """A frontend with ``settings`` (FrontendConfig fields) and a fake handler, both stopped
    on exit."""
    handler = handler or FakeHandler()
    await handler.start()
    try:
        config = FrontendConfig(grpc_address="127.0.0.1:0", instance="frontend-test",
                                handlers=(handler.address,), **settings)
        service = await start(config)
        try:
            yield service, handler
        finally:
            await service.stop(0)
    finally:
        await handler.stop()
