"""``python -m services.log [--flags]``: run one log node until SIGTERM/SIGINT."""

import services.common.grpc_transport  # noqa: F401 - before grpc loads
from services.common.runtime import serve_main

from .config import LogConfig
from .server import start

if __name__ == "__main__":
    serve_main("log", LogConfig, start)
