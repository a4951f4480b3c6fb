"""``helm upgrade`` keeps the internal certificates Helm generated: the chart looks the
installed Secrets up (helm's ``lookup``, run here by ``helm template --dry-run=server``
against a minimal API server holding them) and renders them unchanged, so running pods keep
trusting each other and are not rolled; only a missing certificate is made, signed by the
installed CA."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from .conftest import CHART, helm
from .kube_api import KubeApi

NAMESPACE = "kbroker"
RELEASE = "kb"
ROLES = ("frontend", "handler", "log", "purgatory", "replicator")
SECRETS = ("kb-kbroker-internal-ca", *(f"kb-kbroker-{r}-internal-tls" for r in ROLES))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeApi, Path]]:
    with KubeApi() as api:
        yield api, api.kubeconfig(tmp_path, NAMESPACE)


def upgrade(kubeconfig: Path) -> list[dict[str, Any]]:
    """What ``helm upgrade`` would apply: the chart rendered with the cluster's lookups."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
               "--dry-run=server", "--disable-openapi-validation",
               "--kubeconfig", str(kubeconfig)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def secrets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}


def pod_checksums(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"][
        "checksum/internal-tls"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def test_an_upgrade_renders_the_installed_certificates_unchanged(
        cluster: tuple[KubeApi, Path]) -> None:
    api, kubeconfig = cluster
    installed = upgrade(kubeconfig)
    assert set(secrets(installed)) == set(SECRETS)
    # The chart asked the cluster for each of them.
    for name in SECRETS:
        assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}" in api.requests
    # Nothing installed yet: a second rendering makes new ones (what lookup prevents).
    assert secrets(upgrade(kubeconfig)) != secrets(installed)
    for secret in secrets(installed).values():
        api.store_secret(secret, NAMESPACE, RELEASE)
    upgraded = upgrade(kubeconfig)
    assert {n: s["data"] for n, s in secrets(upgraded).items()} == {
        n: s["data"] for n, s in secrets(installed).items()}
    assert pod_checksums(upgraded) == pod_checksums(installed)


def test_a_deleted_certificate_is_reissued_by_the_installed_ca(
        cluster: tuple[KubeApi, Path]) -> None:
    api, kubeconfig = cluster
    installed = secrets(upgrade(kubeconfig))
    for name, secret in installed.items():
        if name != "kb-kbroker-handler-internal-tls":
            api.store_secret(secret, NAMESPACE, RELEASE)
    upgraded = secrets(upgrade(kubeconfig))
    for name in SECRETS:
        same = upgraded[name]["data"] == installed[name]["data"]
        assert same == (name != "kb-kbroker-handler-internal-tls"), name
    ca = x509.load_pem_x509_certificate(
        base64.b64decode(installed["kb-kbroker-internal-ca"]["data"]["tls.crt"]))
    handler = x509.load_pem_x509_certificate(
        base64.b64decode(upgraded["kb-kbroker-handler-internal-tls"]["data"]["tls.crt"]))
    handler.verify_directly_issued_by(ca)
