"""The sparse time index of one log segment (Kafka's ``TimeIndex``).

On disk, ``<base offset, 20 digits>.timeindex`` is a plain sequence of 12-byte entries,
big-endian:

    timestamp       i64   the largest batch maxTimestamp in the segment up to that point
    relativeOffset  u32   the last offset of the first batch holding that timestamp, minus the
                          segment's base offset

Invariants: both fields strictly increase from entry to entry. An entry (T, o) is written when
the segment adds an offset index entry (every ``index.interval.bytes``) and the maximum
timestamp seen so far grew past the last entry's; so every batch before the one ending at ``o``
has maxTimestamp <= T, and batch ``o`` itself has exactly T. Consequently, for any target time
t, the batches before the one ending at the offset of the last entry whose timestamp is *below*
t all have maxTimestamp < t: the first batch with maxTimestamp >= t lies at or after it, and a
scan may start there (:meth:`TimeIndex.lookup`). The file is not preallocated; a length that is
not a multiple of 12 means a torn write, which :meth:`TimeIndex.problem` reports.

The entries are mirrored in memory, so lookups are a binary search without I/O. Not
thread-safe: its segment changes it under the partition's append lock.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import NamedTuple

from .offset_index import MAX_RELATIVE_OFFSET

ENTRY_SIZE = 12

_ENTRY = struct.Struct(">qI")


class TimeEntry(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex:
    """Maps timestamps to offsets of a segment; see the module docstring for the format."""

    def __init__(self, path: Path, base_offset: int) -> None:
        """Open (or create) the index at ``path``; existing entries are loaded unchecked."""
        self.path = path
        self.base_offset = base_offset
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._timestamps = array("q")
        self._offsets = array("q")
        self._torn_bytes = 0
        self._load()

    def _load(self) -> None:
        raw = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        self._torn_bytes = len(raw) % ENTRY_SIZE
        base = self.base_offset
        for timestamp, relative in _ENTRY.iter_unpack(raw[:len(raw) - self._torn_bytes]):
            self._timestamps.append(timestamp)
            self._offsets.append(base + relative)

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def last_entry(self) -> TimeEntry | None:
        if not self._offsets:
            return None
        return TimeEntry(self._timestamps[-1], self._offsets[-1])

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Add an entry if ``timestamp`` is above the last entry's (and ``offset`` beyond its
        offset); returns whether it did. Entries that would not move the index are skipped, so
        callers may offer the running maximum at every offset index entry."""
        if self._offsets and (timestamp <= self._timestamps[-1] or offset <= self._offsets[-1]):
            return False
        relative = offset - self.base_offset
        if not 0 <= relative <= MAX_RELATIVE_OFFSET:
            raise ValueError(
                f"offset {offset} cannot be indexed in a segment at {self.base_offset}")
        os.pwrite(self._fd, _ENTRY.pack(timestamp, relative), len(self._offsets) * ENTRY_SIZE)
        self._timestamps.append(timestamp)
        self._offsets.append(offset)
        return True

    def lookup(self, target_timestamp: int) -> int:
        """An offset from which to scan for the first batch whose maxTimestamp is >=
        ``target_timestamp``: the offset of the last entry whose timestamp is below the target
        (that batch and every earlier one are below it), or the base offset when there is no
        such entry (empty index, or a target at or below the first entry)."""
        slot = bisect_left(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return self.base_offset
        return self._offsets[slot]

    def entries(self) -> list[TimeEntry]:
        return [TimeEntry(t, o) for t, o in zip(self._timestamps, self._offsets, strict=True)]

    def problem(self, next_offset: int | None = None) -> str | None:
        """Why the index cannot be trusted for a segment whose offsets end before
        ``next_offset``, or None if it is sane."""
        if self._torn_bytes:
            return f"{self._torn_bytes} trailing bytes of a torn entry"
        previous_time, previous_offset = None, self.base_offset - 1
        for timestamp, offset in zip(self._timestamps, self._offsets, strict=True):
            if offset <= previous_offset or (
                previous_time is not None and timestamp <= previous_time
            ):
                return f"entry ({timestamp}, {offset}) out of order"
            previous_time, previous_offset = timestamp, offset
        if next_offset is not None and self._offsets and self._offsets[-1] >= next_offset:
            return f"offset {self._offsets[-1]} beyond the segment's end {next_offset}"
        return None

    def truncate_to_offset(self, next_offset: int) -> None:
        """Drop the entries of offsets at or beyond ``next_offset``."""
        keep = bisect_right(self._offsets, next_offset - 1)
        os.ftruncate(self._fd, keep * ENTRY_SIZE)
        self._torn_bytes = 0
        del self._timestamps[keep:]
        del self._offsets[keep:]

    def reset(self) -> None:
        """Remove every entry (before rebuilding the index from the log)."""
        self.truncate_to_offset(self.base_offset)

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
