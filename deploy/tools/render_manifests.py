"""Render the plain manifests in deploy/k8s/manifests from the Helm chart.

The chart is the single source: this runs ``helm template`` with the chart's default values
(release ``kbroker``) and writes ``manifests/kbroker.yaml``, which
``kubectl apply -k deploy/k8s/manifests`` installs. The tests fail while the committed file
differs from a fresh rendering.

One value differs from the defaults: the internal mTLS certificates come from existing Secrets
(``internalTls.certificates=existingSecrets``), since certificates Helm generates would put
private keys in the committed file and change at every rendering. The operator creates them
once (see deploy/k8s/README.md, "Plain manifests").

    python deploy/tools/render_manifests.py [--check]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parents[1] / "k8s"
OUTPUT = CHART / "manifests" / "kbroker.yaml"
RELEASE = "kbroker"
# Rendered for "default": kustomize's namespace transformer rewrites that namespace in the
# RoleBinding's subjects to the kustomization's own, so the manifests follow `namespace:`.
NAMESPACE = "default"
# Values that differ from the chart's defaults (no generated keys in a committed file).
SETS = ("internalTls.certificates=existingSecrets",)

HEADER = """\
# GENERATED from the Helm chart in deploy/k8s by deploy/tools/render_manifests.py
# (helm template, default values but internalTls.certificates=existingSecrets, release
# "kbroker"). Do not edit: change the chart and re-run the script. Install with:
# kubectl apply -k deploy/k8s/manifests (after creating the internal TLS Secrets: see
# deploy/k8s/README.md).
"""


def find_helm() -> str:
    beside_python = Path(sys.executable).parent / "helm"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("helm")
    if found is None:
        raise FileNotFoundError("helm not found: python deploy/tools/install_k8s_tools.py")
    return found


def render(helm: str | None = None) -> str:
    """The plain manifests as they should be committed."""
    out = subprocess.run(
        [helm or find_helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         *(arg for s in SETS for arg in ("--set", s))],
        check=True, capture_output=True, text=True,
    ).stdout
    return HEADER + out


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
