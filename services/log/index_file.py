"""The file under each of a segment's fixed-width indexes (Kafka's ``AbstractIndex``).

On disk: entries of one layout (:attr:`IndexFile.FIELDS`, big-endian ``struct`` codes) back
to back from byte 0, nothing else. Offsets are stored relative to the segment's base offset,
as u32 within :data:`MAX_RELATIVE_OFFSET`. The file is not preallocated: its length is a
multiple of the entry size unless a write was torn, which :meth:`IndexFile.problem` reports.
Entries are only added at the end and cut from the end.

The entries are mirrored in memory, one array per field, so lookups are a binary search
without I/O; opening an index loads its entries unchecked (:meth:`IndexFile.problem` says
whether to trust them). Not thread-safe: its segment changes it under the partition's append
lock.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from itertools import islice
from operator import ge
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

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

    def _write(self, *row: int) -> None:
        """Write ``row`` after the last entry; the caller adds it to the columns then."""
        os.pwrite(self._fd, self._layout.pack(*row), len(self._columns[0]) * self._layout.size)

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
        os.ftruncate(self._fd, keep * self._layout.size)
        self._torn_bytes = 0
        for column in self._columns:
            del column[keep:]

    def reset(self) -> None:
        """Remove every entry (before rebuilding the index from the log)."""
        self._truncate_entries(0)

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
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
