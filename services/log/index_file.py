"""The file under each of a segment's fixed-width indexes (Kafka's ``AbstractIndex``).

On disk: entries of one layout (:attr:`IndexFile.FIELDS`, big-endian ``struct`` codes) back
to back from byte 0, nothing else. Offsets are stored relative to the segment's base offset,
as u32 within :data:`MAX_RELATIVE_OFFSET`. The file is not preallocated: its length is a
multiple of the entry size unless a write was torn, which :meth:`IndexFile.problem` reports.
Entries are only added at the end and cut from the end.

The entries are mirrored in memory, one array per field, so lookups are a binary search
without I/O; opening an index loads its entries unchecked (:meth:`IndexFile.problem` says
whether to trust them). Not thread-safe: its segment changes it under the partition's append
lock, except that a flush may run in a thread meanwhile (writing the entries that wait is
guarded by a lock of the index's own).

An index may defer its writes (:attr:`IndexFile.DEFERRED_ENTRIES`, the offset and time
indexes do): new entries are written together once that many wait, and whenever the index is
flushed or closed, as Kafka's memory-mapped indexes reach the disk when the page cache writes
them back. A process killed meanwhile leaves a file whose entries are a prefix of the index:
the segment is past the recovery point then (a flush writes every waiting entry before it
forces the file), so start-up rebuilds its indexes from the batches
(:meth:`~services.log.segment.LogSegment.recover`). A failed log directory gets nothing more
written, waiting entries included, when its logs close. Appending 3 KB batches, an entry every
other batch, the write of each entry was a third of a log node's write system calls.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
from array import array
from itertools import islice
from operator import ge
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

log = logging.getLogger(__name__)

# Relative offsets are u32 on disk; Kafka keeps them (and positions) within a signed int.
MAX_RELATIVE_OFFSET = 2**31 - 1

Entry = TypeVar("Entry")


class IndexFile(Generic[Entry]):
    """Fixed-width entries of a segment; subclasses name the fields and what they mean
    (:meth:`_entry`)."""

    # One struct code per field (each also an array type code of the same width).
    FIELDS: ClassVar[str]
    # Which field holds (relative) offsets.
    OFFSET_FIELD: ClassVar[int]
    # New entries wait in memory until this many do (0: each is written as it is added).
    DEFERRED_ENTRIES: ClassVar[int] = 0

    def __init__(self, path: Path, base_offset: int) -> None:
        """Open (or create) the index at ``path``; existing entries are loaded unchecked."""
        self.path = path
        self.base_offset = base_offset
        self._layout = struct.Struct(">" + self.FIELDS)
        # Whether the file was there before it was opened (False: created just now).
        self.existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        raw = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        self._torn_bytes = len(raw) % self._layout.size
        self._columns = _columns(raw[:len(raw) - self._torn_bytes], self.FIELDS)
        # The entries in the file; those after them wait to be written.
        self._on_disk = len(self._columns[0])
        # Held to add, write or cut entries (a segment is flushed in a thread).
        self._writing = threading.Lock()

    def __len__(self) -> int:
        return len(self._columns[0])

    def _row(self, slot: int) -> tuple[int, ...]:
        return tuple(column[slot] for column in self._columns)

    def _entry(self, slot: int) -> Entry:
        raise NotImplementedError

    @property
    def last_entry(self) -> Entry | None:
        return self._entry(-1) if len(self) else None

    def entries(self) -> list[Entry]:
        return [self._entry(slot) for slot in range(len(self))]

    def _relative(self, offset: int) -> int:
        relative = offset - self.base_offset
        if not 0 <= relative <= MAX_RELATIVE_OFFSET:
            raise ValueError(
                f"offset {offset} cannot be indexed in a segment at {self.base_offset}")
        return relative

    def _add(self, *row: int) -> None:
        """Add ``row`` after the last entry, writing it now or, deferred, with the others
        waiting once there are :attr:`DEFERRED_ENTRIES` of them. On a write error the index
        is as it was, less entries it had not written yet if the error came from those."""
        with self._writing:
            for column, value in zip(self._columns, row, strict=True):
                column.append(value)
            if len(self._columns[0]) - self._on_disk >= self.DEFERRED_ENTRIES:
                try:
                    self._write_waiting()
                except OSError:
                    self._cut(self._on_disk)
                    raise

    def write_waiting(self) -> None:
        """Write the entries added since the last write (one system call)."""
        with self._writing:
            self._write_waiting()

    def _write_waiting(self) -> None:
        count = len(self._columns[0])
        if count > self._on_disk:
            rows = zip(*(column[self._on_disk:] for column in self._columns), strict=True)
            pack = self._layout.pack
            os.pwrite(self._fd, b"".join(pack(*row) for row in rows),
                      self._on_disk * self._layout.size)
            self._on_disk = count

    def problem(self, next_offset: int | None = None) -> str | None:
        """Why the index cannot be trusted for a segment whose offsets end before
        ``next_offset``, or None if it is sane: a torn entry, or fields that do not strictly
        increase from entry to entry."""
        if self._torn_bytes:
            return f"{self._torn_bytes} trailing bytes of a torn entry"
        for column in self._columns:
            if any(map(ge, column, islice(column, 1, None))):
                return "entries out of order"
        offsets = self._columns[self.OFFSET_FIELD]
        if next_offset is not None and offsets and self.base_offset + offsets[-1] >= next_offset:
            return f"offset {self.base_offset + offsets[-1]} beyond the end {next_offset}"
        return None

    def _truncate_entries(self, keep: int) -> None:
        with self._writing:
            self._cut(keep)

    def _cut(self, keep: int) -> None:
        on_disk = min(keep, self._on_disk)
        os.ftruncate(self._fd, on_disk * self._layout.size)
        self._on_disk = on_disk
        self._torn_bytes = 0
        for column in self._columns:
            del column[keep:]

    def reset(self) -> None:
        """Remove every entry (before rebuilding the index from the log)."""
        self._truncate_entries(0)

    def flush(self) -> None:
        self.write_waiting()
        os.fsync(self._fd)

    def close(self, write: bool = True) -> None:
        """Write what waits (unless ``write`` is False) and close the file; a write error is
        logged (the segment is past the recovery point then, and start-up rebuilds the
        index)."""
        if self._fd >= 0:
            try:
                if write:
                    self.write_waiting()
            except OSError as exc:
                log.error("%s: %d index entries not written: %s", self.path,
                          len(self) - self._on_disk, exc)
            os.close(self._fd)
            self._fd = -1


def _columns(raw: bytes, fields: str) -> list[array[int]]:
    """The fields of the whole entries in ``raw``, one array each: every field's bytes are
    gathered with strided slices and converted at once, without a Python loop per entry."""
    size = struct.calcsize(">" + fields)
    count, position, columns = len(raw) // size, 0, []
    for code in fields:
        width = struct.calcsize(">" + code)
        gathered = bytearray(count * width)
        for byte in range(width):
            gathered[byte::width] = raw[position + byte::size]
        column = array(code)
        assert column.itemsize == width
        column.frombytes(gathered)
        if sys.byteorder == "little":
            column.byteswap()
        columns.append(column)
        position += width
    return columns
