"""``python -m services.replicator [--flags]``: run the replicator until SIGTERM/SIGINT.

With ``--leader-election-lease`` it is one of several replicas: a standby until it holds the
Lease, and if it loses the Lease it exits with status 1 so that it starts again as a standby.
Either way, a replicator deposed from the cluster metadata log (another replicator took it over
at a newer controller epoch) stops acting at once and exits with status 1.
"""

import asyncio
import sys

import services.common.grpc_transport  # noqa: F401 - before grpc loads
from services.common.config import load
from services.common.metrics import serve_prometheus
from services.common.runtime import run

from .config import ReplicatorConfig
from .server import start, start_leased


def main() -> None:
    config = load(ReplicatorConfig, sys.argv[1:])
    exit_code = 0

    async def serve(stop: asyncio.Event) -> None:
        nonlocal exit_code
        if config.metrics_port:
            host = config.grpc_address.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
            serve_prometheus(config.metrics_port, host)
        replicator = await (start_leased(config) if config.leader_election_lease
                            else start(config))
        exit_code = await replicator.serve_until(stop)

    run("replicator", serve)
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
