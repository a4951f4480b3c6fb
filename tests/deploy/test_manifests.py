"""The plain manifests (`kubectl apply -k deploy/k8s/manifests`) are the chart's rendering,
current, buildable by kustomize and valid Kubernetes."""

from __future__ import annotations

import runpy
import subprocess
from typing import Any

import kubernetes_validate
import yaml

from .conftest import CHART, KUBE_VERSION, TOOLS, tool

MANIFESTS = CHART / "manifests"


def test_committed_manifests_are_the_current_rendering_of_the_chart() -> None:
    renderer = runpy.run_path(str(TOOLS / "render_manifests.py"))
    fresh = renderer["render"](tool("helm"))
    committed = (MANIFESTS / "kbroker.yaml").read_text()
    assert committed == fresh, (
        "deploy/k8s/manifests/kbroker.yaml is stale: run python deploy/tools/render_manifests.py")


def test_kustomize_builds_valid_resources_in_the_kustomization_namespace() -> None:
    built = subprocess.run([tool("kubectl"), "kustomize", str(MANIFESTS)], capture_output=True,
                           text=True, check=True, timeout=60).stdout
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(built) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "StatefulSet", "Deployment", "HorizontalPodAutoscaler",
            "PodDisruptionBudget", "NetworkPolicy", "Role", "RoleBinding"} <= kinds
    namespace = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["namespace"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]["name"]
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == namespace


def test_manifests_hold_no_key_and_the_chart_prints_the_secrets_they_mount() -> None:
    docs = [d for d in yaml.safe_load_all((MANIFESTS / "kbroker.yaml").read_text()) if d]
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert "PRIVATE KEY" not in (MANIFESTS / "kbroker.yaml").read_text()
    mounted = {v["secret"]["secretName"] for d in docs
               if d["kind"] in ("Deployment", "StatefulSet")
               for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    # What the README has operators create before `kubectl apply -k`.
    printed = subprocess.run(
        [tool("helm"), "template", "kbroker", str(CHART), "--namespace", "kbroker",
         "--show-only", "templates/common/internal-tls.yaml"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    secrets = {d["metadata"]["name"] for d in yaml.safe_load_all(printed) if d}
    assert mounted == {f"kbroker-{r}-internal-tls" for r in
                       ("frontend", "handler", "log", "purgatory", "replicator")}
    assert secrets == mounted | {"kbroker-internal-ca"}
    assert "--show-only templates/common/internal-tls.yaml" in (CHART / "README.md").read_text()
