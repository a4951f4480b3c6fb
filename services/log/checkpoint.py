"""Checkpoint files (Kafka's ``CheckpointFile`` and ``OffsetCheckpointFile``), and the atomic
replacement every small state file of a log node uses.

Format (UTF-8 text, as Kafka writes it): a version, the number of entries, then one line per
entry of space-separated fields; for offset checkpoints, one offset per replica:

    0                       version
    2                       number of entries
    orders 0 1042           topic, partition, offset
    orders 1 77

A log node keeps three offset checkpoints in its data directory:

- ``recovery-point-offset-checkpoint``: for each replica, the offset below which everything is
  known to be on disk (flushed). Start-up validates only what lies at or past it.
- ``log-start-offset-checkpoint``: for each replica, its log start offset when DeleteRecords or
  retention moved it past the first segment's base offset.
- ``replication-offset-checkpoint`` (Kafka's file of that name, :class:`HighWatermarkCheckpoint`):
  each replicated replica's high watermark, written every few seconds while one moves, when a
  follower is cut back, and on a clean shutdown (see :mod:`services.log.partition_log`).
  Start-up takes it, never above the recovered log end, as the replica's high watermark. One
  file for the node: a node of a thousand replicated replicas writes one file every few
  seconds, not a thousand. (A replica opened on its own, without a node, keeps the file in its
  directory; a node found with such files takes them over and removes them.)

The leader epoch cache (:mod:`services.log.leader_epochs`) is a checkpoint of the same format.
A file is replaced atomically (:func:`replace_file`), so a crash leaves the old or the new
version. A missing file means no entries; an unreadable one is reported and treated as missing
(for recovery points, every replica is then recovered in full, which is safe).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"
VERSION = 0

TopicPartition = tuple[str, int]
T = TypeVar("T")


def fsync_directory(directory: Path) -> None:
    """Make renames and creations inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, text: str, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically: a temporary file beside it is renamed
    over it. With ``durable`` the temporary file is forced to disk first and the directory
    after, so a crash leaves either the old or the new version, never a mix."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    os.replace(temporary, path)
    if durable:
        fsync_directory(path.parent)


def write_entries(path: Path, entries: Sequence[Iterable[object]]) -> None:
    """Replace the checkpoint at ``path`` with ``entries``, each a line of fields."""
    lines = [str(VERSION), str(len(entries))] + [" ".join(map(str, e)) for e in entries]
    replace_file(path, "\n".join(lines) + "\n")


def read_entries(path: Path, parse: Callable[..., T]) -> list[T]:
    """The entries of the checkpoint at ``path``, each ``parse(*fields)``; none when the file
    is missing or unreadable (which is logged)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    try:
        if len(lines) < 2 or lines[0].strip() != str(VERSION):
            raise ValueError(f"unknown version {lines[0] if lines else ''!r}")
        if len(lines) - 2 != int(lines[1]):
            raise ValueError(f"{len(lines) - 2} entries where {lines[1]} were announced")
        return [parse(*line.split()) for line in lines[2:]]
    except (ValueError, TypeError) as exc:
        log.error("%s: unreadable checkpoint (%s); ignored", path, exc)
        return []


class OffsetCheckpoint:
    """One offset checkpoint file; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        write_entries(self.path, [(*key, offset) for key, offset in sorted(offsets.items())])

    def read(self) -> dict[TopicPartition, int]:
        return dict(read_entries(
            self.path, lambda topic, partition, offset: ((topic, int(partition)), int(offset))))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """High watermarks taken at one moment; a later snapshot has a larger ``generation``."""

    generation: int
    offsets: Mapping[TopicPartition, int]


class HighWatermarkCheckpoint:
    """A ``replication-offset-checkpoint``: the high watermarks ``source`` gives (those of the
    replicated replicas, taken on the event loop) written to one file, only when they changed
    since the last write. :meth:`take` and :meth:`write` split a write so the file can be
    written from a thread; a snapshot older than one already written is never written over
    it (a replica cut back meanwhile would otherwise find its old high watermark again after
    a restart). ``stored``: what the file held when it was read."""

    def __init__(self, path: Path,
                 source: Callable[[], Mapping[TopicPartition, int]]) -> None:
        self._file = OffsetCheckpoint(path)
        self._source = source
        self._lock = threading.Lock()
        self._generation = 0
        self._written_generation = 0
        self.stored: dict[TopicPartition, int] = {}
        self._written: Mapping[TopicPartition, int] = {}

    def read(self) -> dict[TopicPartition, int]:
        """Read the file: its entries become :attr:`stored` and what was last written."""
        self.stored = self._file.read()
        self._written = dict(self.stored)
        return self.stored

    def take(self) -> Snapshot:
        """The source's high watermarks now (call on the event loop)."""
        self._generation += 1
        return Snapshot(self._generation, dict(self._source()))

    def write(self, snapshot: Snapshot) -> bool:
        """Write ``snapshot`` unless a later one was written, or the file already holds it;
        returns whether it wrote. Thread-safe. Raises OSError."""
        with self._lock:
            if snapshot.generation <= self._written_generation:
                return False
            self._written_generation = snapshot.generation
            if snapshot.offsets == self._written:
                return False
            self._file.write(snapshot.offsets)
            self._written = snapshot.offsets
            return True

    def write_now(self) -> bool:
        """Take a snapshot and write it (on the event loop). Raises OSError."""
        return self.write(self.take())
