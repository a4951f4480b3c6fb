"""The sparse offset index of one log segment (Kafka's ``OffsetIndex``).

On disk, ``<base offset, 20 digits>.index`` is a plain sequence of 8-byte entries, big-endian:

    relativeOffset  u32   last offset of an indexed batch minus the segment's base offset
    position        u32   byte position where that batch starts in the segment's .log file

Invariants: both fields strictly increase from entry to entry; every position is the start of a
batch whose last offset is ``base + relativeOffset``. The segment adds an entry when more than
``index.interval.bytes`` of log were written since the previous one, so the batch holding any
offset ``o`` starts at or after the position of the last entry whose offset is <= ``o``, and at
most about ``index.interval.bytes`` later. The file is not preallocated: its length is always
a multiple of 8 unless a write was torn, which :meth:`OffsetIndex.problem` reports.

The entries are mirrored in memory (two arrays), so lookups are a binary search without I/O.
Not thread-safe: its segment changes it under the partition's append lock.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

ENTRY_SIZE = 8
# Relative offsets and positions are u32 on disk; Kafka keeps both within a signed int.
MAX_RELATIVE_OFFSET = 2**31 - 1

_ENTRY = struct.Struct(">II")


class IndexEntry(NamedTuple):
    offset: int
    position: int


class OffsetIndex:
    """Maps offsets to file positions of a segment; see the module docstring for the format."""

    def __init__(self, path: Path, base_offset: int) -> None:
        """Open (or create) the index at ``path``; existing entries are loaded unchecked."""
        self.path = path
        self.base_offset = base_offset
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._offsets = array("q")
        self._positions = array("q")
        self._torn_bytes = 0
        self._load()

    def _load(self) -> None:
        raw = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        self._torn_bytes = len(raw) % ENTRY_SIZE
        words = array("I")
        words.frombytes(raw[:len(raw) - self._torn_bytes])
        if sys.byteorder == "little":
            words.byteswap()
        base = self.base_offset
        self._offsets = array("q", (base + relative for relative in words[0::2]))
        self._positions = array("q", words[1::2])

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def last_entry(self) -> IndexEntry | None:
        if not self._offsets:
            return None
        return IndexEntry(self._offsets[-1], self._positions[-1])

    def append(self, offset: int, position: int) -> None:
        """Add an entry; ``offset`` and ``position`` must exceed the last entry's."""
        if self._offsets and (offset <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(
                f"index entry ({offset}, {position}) is not after {self.last_entry} in {self.path}"
            )
        relative = offset - self.base_offset
        if not 0 <= relative <= MAX_RELATIVE_OFFSET:
            raise ValueError(
                f"offset {offset} cannot be indexed in a segment at {self.base_offset}")
        os.pwrite(self._fd, _ENTRY.pack(relative, position), len(self._offsets) * ENTRY_SIZE)
        self._offsets.append(offset)
        self._positions.append(position)

    def lookup(self, target_offset: int) -> IndexEntry:
        """The last entry whose offset is <= ``target_offset``: the batch holding the target
        starts at its position or later. With no such entry (empty index, or a target below
        the first entry) the answer is (base offset, 0), the start of the segment."""
        slot = bisect_right(self._offsets, target_offset) - 1
        if slot < 0:
            return IndexEntry(self.base_offset, 0)
        return IndexEntry(self._offsets[slot], self._positions[slot])

    def floor_position(self, position: int) -> int:
        """The greatest indexed batch start <= ``position`` (0 when there is none): a batch
        boundary from which to walk towards ``position``."""
        slot = bisect_right(self._positions, position) - 1
        return self._positions[slot] if slot >= 0 else 0

    def problem(self, log_size: int, next_offset: int | None = None) -> str | None:
        """Why the index cannot be trusted for a log of ``log_size`` bytes whose offsets end
        before ``next_offset``, or None if it is sane."""
        if self._torn_bytes:
            return f"{self._torn_bytes} trailing bytes of a torn entry"
        previous_offset, previous_position = self.base_offset - 1, -1
        for offset, position in zip(self._offsets, self._positions, strict=True):
            if offset <= previous_offset or position <= previous_position:
                return f"entry ({offset}, {position}) out of order"
            previous_offset, previous_position = offset, position
        if self._positions and self._positions[-1] >= log_size:
            return f"position {self._positions[-1]} beyond the log's {log_size} bytes"
        if next_offset is not None and self._offsets and self._offsets[-1] >= next_offset:
            return f"offset {self._offsets[-1]} beyond the log's end {next_offset}"
        return None

    def truncate_to_position(self, log_size: int) -> None:
        """Drop the entries of batches at or beyond byte ``log_size`` of the log."""
        keep = bisect_right(self._positions, log_size - 1)
        self._truncate_entries(keep)

    def reset(self, entries: list[IndexEntry]) -> None:
        """Replace every entry (rebuilding the index from the log)."""
        self._truncate_entries(0)
        payload = b"".join(
            _ENTRY.pack(offset - self.base_offset, position) for offset, position in entries
        )
        os.pwrite(self._fd, payload, 0)
        self._offsets = array("q", (offset for offset, _ in entries))
        self._positions = array("q", (position for _, position in entries))

    def _truncate_entries(self, keep: int) -> None:
        os.ftruncate(self._fd, keep * ENTRY_SIZE)
        self._torn_bytes = 0
        del self._offsets[keep:]
        del self._positions[keep:]

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
