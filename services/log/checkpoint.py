"""Offset checkpoint files (Kafka's ``OffsetCheckpointFile``), one offset per replica.

A log node keeps two in its data directory:

- ``recovery-point-offset-checkpoint``: for each replica, the offset below which everything is
  known to be on disk (flushed). Start-up validates only what lies at or past it.
- ``log-start-offset-checkpoint``: for each replica, its log start offset when DeleteRecords or
  retention moved it past the first segment's base offset.

and each replicated replica one in its own directory (``<topic>-<partition>/``):

- ``replication-offset-checkpoint``: its high watermark (Kafka's file of that name, kept per
  replica here), written by the partition log every few seconds while it moves, when a
  follower is cut back, and on a clean shutdown (see :mod:`services.log.partition_log`).
  Start-up takes it, never above the recovered log end, as the replica's high watermark.

Format (UTF-8 text, as Kafka writes it):

    0                       version
    2                       number of entries
    orders 0 1042           topic, partition, offset; one line per entry
    orders 1 77

A file is replaced atomically (temporary file, fsync, rename, directory fsync), so a crash
leaves the old or the new version. A missing file means no entries; an unreadable one is
reported and treated as missing (every replica is then recovered in full, which is safe).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from .partition_metadata import fsync_directory

log = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"
VERSION = 0

TopicPartition = tuple[str, int]


class OffsetCheckpoint:
    """One checkpoint file; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        lines = [str(VERSION), str(len(offsets))]
        lines += [f"{topic} {partition} {offset}"
                  for (topic, partition), offset in sorted(offsets.items())]
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        fsync_directory(self.path.parent)

    def read(self) -> dict[TopicPartition, int]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            return _parse(text)
        except ValueError as exc:
            log.error("%s: unreadable checkpoint (%s); ignored", self.path, exc)
            return {}


def _parse(text: str) -> dict[TopicPartition, int]:
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        raise ValueError(f"unknown version {lines[0] if lines else ''!r}")
    count = int(lines[1])
    entries = lines[2:]
    if len(entries) != count:
        raise ValueError(f"{len(entries)} entries where {count} were announced")
    offsets: dict[TopicPartition, int] = {}
    for line in entries:
        topic, partition, offset = line.split(" ")
        offsets[(topic, int(partition))] = int(offset)
    return offsets
