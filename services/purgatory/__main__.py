"""``python -m services.purgatory [--flags]``: run the purgatory until SIGTERM/SIGINT."""

import services.common.grpc_transport  # noqa: F401 - before grpc loads
from services.common.runtime import serve_main

from .config import PurgatoryConfig
from .server import start

if __name__ == "__main__":
    serve_main("purgatory", PurgatoryConfig, start)
