"""``python -m services.replicator [--flags]``: run the replicator until SIGTERM/SIGINT."""

from services.common.runtime import serve_main

from .config import ReplicatorConfig
from .server import start

if __name__ == "__main__":
    serve_main("replicator", ReplicatorConfig, start)
