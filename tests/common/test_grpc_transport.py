"""The gRPC transport of the service processes (``services/common/grpc_transport.py``): a
process that imports it before gRPC carries its calls on gRPC's I/O manager endpoints
(``tcp_posix.cc`` in gRPC's ``tcp`` trace), an operator's own ``GRPC_EXPERIMENTS`` is kept, and
every service's ``__main__`` imports it before anything loads gRPC. Each case is a real process:
gRPC reads the setting once, when it loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("frontend", "handler", "log", "purgatory", "replicator")
# Where gRPC's trace of an EventEngine endpoint's reads and writes comes from (the I/O
# manager's: tcp_posix.cc).
EVENT_ENGINE_ENDPOINT = " endpoint.cc:"

# A health check of a services' server over a services' channel, both on port 0 of loopback,
# in a process that chooses the transport first, as a service does.
HEALTH_CHECK = """
import services.common.grpc_transport
import asyncio, os
from grpc_health.v1 import health_pb2, health_pb2_grpc
from services.common.channels import PLAINTEXT, internal_channel
from services.common.server import create_server

async def main():
    server, port, _ = await create_server("log", [], "127.0.0.1:0", tls=PLAINTEXT)
    try:
        async with internal_channel(f"127.0.0.1:{port}", PLAINTEXT, "log") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10)
            print(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
            print(os.environ.get("GRPC_EXPERIMENTS"))
    finally:
        await server.stop(0)

asyncio.run(main())
"""


def run_python(code: str, **env: str | None) -> tuple[list[str], str]:
    """(what ``code`` printed, what it wrote to stderr: gRPC's tcp trace) in a process with
    ``env`` set on top of this one's (None: unset)."""
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environment.update({k: v for k, v in env.items() if v is not None})
    environment.update(GRPC_VERBOSITY="debug", GRPC_TRACE="tcp")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines(), done.stderr


@pytest.mark.processes
def test_a_service_process_carries_its_calls_on_the_io_manager_endpoints() -> None:
    from services.common.grpc_transport import EXPERIMENTS

    printed, trace = run_python(HEALTH_CHECK, GRPC_EXPERIMENTS=None)
    assert printed == ["SERVING", EXPERIMENTS]
    assert "tcp_posix.cc" in trace
    assert EVENT_ENGINE_ENDPOINT not in trace


@pytest.mark.processes
def test_an_operators_grpc_experiments_are_kept() -> None:
    # Empty: gRPC's own defaults, its EventEngine endpoints.
    printed, trace = run_python(HEALTH_CHECK, GRPC_EXPERIMENTS="")
    assert printed == ["SERVING", ""]
    assert EVENT_ENGINE_ENDPOINT in trace
    assert "tcp_posix.cc" not in trace


@pytest.mark.processes
@pytest.mark.parametrize("service", SERVICES)
def test_every_service_chooses_the_transport_before_grpc_loads(service: str) -> None:
    # Imported, not run: what ``python -m services.<service>`` loads before serving.
    printed, _ = run_python(
        f"import importlib, sys\n"
        f"importlib.import_module('services.{service}.__main__')\n"
        f"from services.common import grpc_transport\n"
        f"print(grpc_transport.CHOSEN_IN_TIME, 'grpc' in sys.modules)\n")
    assert printed == ["True True"]
