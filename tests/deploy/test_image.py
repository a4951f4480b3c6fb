"""The container image matches what the chart expects of it."""

from __future__ import annotations

import re

import yaml

from .conftest import CHART, ROOT


def test_image_user_is_the_non_root_uid_the_pods_run_as() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    security = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert (int(user[0]), int(user[1])) == (security["runAsUser"], security["runAsGroup"])
    assert int(user[0]) != 0
    assert f"--uid {user[0]}" in dockerfile


def test_image_context_holds_what_the_build_copies() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text(),
                        re.MULTILINE)
    sources = {s for line in copied for s in line.split()}
    assert sources == {"pyproject.toml", "README.md", "services", "proto"}
    for source in sources:
        assert f"!{source}" in ignored or f"!{source}/" in ignored
        assert (ROOT / source).exists()
