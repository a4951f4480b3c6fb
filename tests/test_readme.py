"""The README tells the truth about what the broker speaks: its table of APIs and versions is
the frontend's (``services/frontend/api_versions.py``), row for row."""

from __future__ import annotations

import re
from pathlib import Path

from services.frontend.api_versions import SUPPORTED_APIS

README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"^\| (\w+) \| (\d+) \| (\d+)(?:-(\d+))? \|$")


def test_the_readme_lists_every_supported_api_and_version_range():
    rows = []
    for line in README.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, key, low, high = match.groups()
            rows.append((int(key), name, int(low), int(high if high is not None else low)))
    table = [(a.key, a.name, a.min_version, a.max_version)
             for a in sorted(SUPPORTED_APIS.values(), key=lambda a: a.key)]
    assert rows == table
