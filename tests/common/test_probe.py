"""``python -m services.common.probe``: exit status 0 only when the port answers SERVING, over
mutual TLS with the KBROKER_INTERNAL_TLS_* material or flags, against real gRPC servers on
port 0."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from services.common.probe import main
from services.common.server import create_server
from services.common.tls import InternalTls

from ..tls_material import internal_tls_dir

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0


def tls_flags(directory: Path, kind: str) -> list[str]:
    return ["--internal-tls-ca", str(directory / "ca.crt"),
            "--internal-tls-cert", str(directory / f"{kind}.crt"),
            "--internal-tls-key", str(directory / f"{kind}.key")]


def tls_env(directory: Path, kind: str) -> dict[str, str]:
    return {"KBROKER_INTERNAL_TLS_CA": str(directory / "ca.crt"),
            "KBROKER_INTERNAL_TLS_CERT": str(directory / f"{kind}.crt"),
            "KBROKER_INTERNAL_TLS_KEY": str(directory / f"{kind}.key")}


def with_server(tls: InternalTls, body: Callable[[str], Awaitable[None]]) -> None:
    """Run ``body(address)`` beside a log-kind server with a NOT_SERVING "standby" name."""

    async def run() -> None:
        server, port, health = await create_server("log", [], "127.0.0.1:0", tls=tls)
        await health.set("standby", health_pb2.HealthCheckResponse.NOT_SERVING)
        try:
            await body(f"127.0.0.1:{port}")
        finally:
            await server.stop(0)

    asyncio.run(asyncio.wait_for(run(), TIMEOUT))


async def probe(*argv: str) -> int:
    # The probe blocks: in a thread, so that the server on this loop can answer it.
    return await asyncio.to_thread(main, list(argv))


async def probe_process(address: str, env: Mapping[str, str]) -> tuple[int, str]:
    """Exactly what a Kubernetes exec probe runs; (exit status, output)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KBROKER_INTERNAL_TLS")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.common.probe", address, cwd=REPO,
        env={**clean, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


@pytest.mark.processes
def test_probe_process_passes_with_the_pods_certificate_and_fails_without(tmp_path: Path):
    internal_tls_dir(tmp_path)
    own = tls_env(tmp_path, "log")

    async def body(address: str) -> None:
        status, out = await probe_process(address, own)
        assert (status, out.strip()) == (0, f"{address}: SERVING")
        status, out = await probe_process(address, {})
        assert status == 1, out

    with_server(InternalTls(own["KBROKER_INTERNAL_TLS_CA"], own["KBROKER_INTERNAL_TLS_CERT"],
                            own["KBROKER_INTERNAL_TLS_KEY"]), body)


def test_probe_exit_status_follows_the_health_answer(tmp_path: Path):
    internal_tls_dir(tmp_path)
    stranger = tmp_path / "stranger"
    internal_tls_dir(stranger)
    log = tls_flags(tmp_path, "log")

    async def body(address: str) -> None:
        assert await probe(address, *log) == 0
        assert await probe(address, *log, "--service", "standby") == 1
        assert await probe(address, *log, "--service", "no.such.Service") == 1
        # Another kind's certificate expects its own kind's server unless told otherwise.
        handler = tls_flags(tmp_path, "handler")
        assert await probe(address, *handler) == 1
        assert await probe(address, *handler, "--server-name", "kbroker-log") == 0
        assert await probe(address, *tls_flags(stranger, "log")) == 1
        # Plaintext to a TLS port.
        assert await probe(address, "--timeout", "2") == 1

    with_server(InternalTls(*log[1::2]), body)


def test_probe_of_a_plaintext_loopback_port_and_unusable_settings(tmp_path: Path):
    async def body(address: str) -> None:
        assert await probe(address) == 0
        assert await probe(address, "--service", "standby") == 1
        # Settings that cannot work: partial TLS, plaintext off loopback, missing files.
        assert await probe(address, "--internal-tls-ca", "ca.crt") == 2
        assert await probe("10.0.0.1:19200") == 2
        assert await probe(address, *tls_flags(tmp_path / "missing", "log")) == 2

    with_server(InternalTls(), body)

    # Nothing listens.
    async def closed() -> None:
        server, port, _ = await create_server("log", [], "127.0.0.1:0")
        await server.stop(0)
        assert await probe(f"127.0.0.1:{port}", "--timeout", "1") == 1

    asyncio.run(asyncio.wait_for(closed(), TIMEOUT))
