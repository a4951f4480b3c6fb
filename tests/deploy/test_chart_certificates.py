"""The internal certificates the chart generates work with the services' mutual TLS: a real
purgatory process started with its role's Secret (as the pod mounts it, through the
KBROKER_INTERNAL_TLS_* settings of its ConfigMap) answers the exact probe command the chart
renders, a handler's certificate may call it, while a log node's identity or another
rendering's CA is refused."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, one, probe_check, render

SINGLE = sorted((ROOT / "deploy" / "k8s" / "ci").glob("01-*-values.yaml"))[0]
START_TIMEOUT = 30.0


def _write_secret(docs: list[dict[str, Any]], name: str, directory: Path) -> None:
    directory.mkdir(parents=True)
    for key, value in one(docs, "Secret", name)["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
        (directory / key).chmod(0o600)


def _mounted_env(docs: list[dict[str, Any]], role: str, directory: Path) -> dict[str, str]:
    """The role's KBROKER_INTERNAL_TLS_* settings, with the mount path replaced by ``directory``."""
    data = one(docs, "ConfigMap", f"kb-kbroker-{role}")["data"]
    return {k: str(directory / Path(v).name) for k, v in data.items()
            if k.startswith("KBROKER_INTERNAL_TLS_")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KBROKER_")}


@pytest.fixture
def material(tmp_path: Path) -> dict[str, dict[str, str]]:
    """Settings of the purgatory, handler and log roles from one rendering, and the
    purgatory's from another (another CA)."""
    docs = render(SINGLE)
    out = {}
    for role in ("purgatory", "handler", "log"):
        _write_secret(docs, f"kb-kbroker-{role}-internal-tls", tmp_path / role)
        out[role] = _mounted_env(docs, role, tmp_path / role)
    other = render(SINGLE, sets=("logLevel=DEBUG",))
    _write_secret(other, "kb-kbroker-purgatory-internal-tls", tmp_path / "other")
    out["other"] = _mounted_env(other, "purgatory", tmp_path / "other")
    return out


@pytest.fixture
def purgatory(material: dict[str, dict[str, str]]) -> Iterator[int]:
    """A purgatory serving mutual TLS with the chart's certificate; yields its port."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.purgatory", f"--grpc-address=127.0.0.1:{port}",
         "--metrics-port=0"], cwd=ROOT, env={**_clean_env(), **material["purgatory"]},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _probe(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *command[1:], "--timeout=2"], cwd=ROOT,
                          env={**_clean_env(), **env}, capture_output=True, text=True,
                          timeout=30)


def test_generated_certificates_serve_and_call_over_mutual_tls(
        material: dict[str, dict[str, str]], purgatory: int) -> None:
    container = one(render(SINGLE), "Deployment", "kb-kbroker-purgatory")["spec"]["template"][
        "spec"]["containers"][0]
    command = list(container["readinessProbe"]["exec"]["command"])
    assert probe_check(container["readinessProbe"])[0] == 19300
    command[3] = f"127.0.0.1:{purgatory}"
    # The rendered probe, with the pod's own certificate, once the purgatory is up.
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        result = _probe(command, material["purgatory"])
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"127.0.0.1:{purgatory}: SERVING"
    # A handler calls the purgatory with its own certificate, checking the purgatory's identity.
    by_handler = _probe([*command, "--server-name=kbroker-purgatory"], material["handler"])
    assert by_handler.returncode == 0, by_handler.stderr
    # A caller expecting a log node is refused: the purgatory's certificate does not name one.
    as_log = _probe(command, material["log"])
    assert as_log.returncode == 1, as_log.stdout
    # Another CA's certificate is refused.
    foreign = _probe(command, material["other"])
    assert foreign.returncode == 1, foreign.stdout
