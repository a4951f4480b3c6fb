"""The batch header layout lives in one module: no other file of the repository spells its
struct format, or the halves of it that hand-built headers use (before and after the CRC)."""

from __future__ import annotations

import os
from pathlib import Path

from services.common.records import record_batch

ROOT = Path(__file__).resolve().parents[3]
SEARCHED = ("services", "tests", "bench", "tools", "spark")
SKIPPED_DIRECTORIES = {"__pycache__", "node_modules", ".hypothesis"}


def test_only_the_codec_module_knows_the_header_layout() -> None:
    # Read from the codec rather than written out here, so this file does not match itself.
    layout = record_batch._HEADER.format.lstrip(">!")
    crc = layout.index("I")
    needles = (layout[:crc], layout[crc + 1:])
    codec = Path(record_batch.__file__).resolve()
    offenders = []
    for top in SEARCHED:
        for directory, subdirectories, files in os.walk(ROOT / top):
            subdirectories[:] = [d for d in subdirectories if d not in SKIPPED_DIRECTORIES]
            for name in files:
                path = Path(directory, name)
                if path.resolve() == codec:
                    continue
                try:
                    text = path.read_text()
                except (UnicodeDecodeError, OSError):
                    continue  # not text
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in needles if n in text]
    assert len(needles[0]) == 4 and len(needles[1]) == 8
    assert offenders == [], "the header layout belongs to services/common/records/record_batch.py"
