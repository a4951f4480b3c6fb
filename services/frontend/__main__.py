"""``python -m services.frontend [--flags]``: run one frontend until SIGTERM/SIGINT."""

from services.common.runtime import serve_main

from .config import FrontendConfig
from .server import start

if __name__ == "__main__":
    serve_main("frontend", FrontendConfig, start)
