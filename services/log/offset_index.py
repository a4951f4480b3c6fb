"""The sparse offset index of one log segment (Kafka's ``OffsetIndex``).

On disk, ``<base offset, 20 digits>.index`` is a plain sequence of 8-byte entries, big-endian
(see :mod:`services.log.index_file`):

    relativeOffset  u32   last offset of an indexed batch minus the segment's base offset
    position        u32   byte position where that batch starts in the segment's .log file

Invariants: both fields strictly increase from entry to entry; every position is the start of a
batch whose last offset is ``base + relativeOffset``. The segment adds an entry when more than
``index.interval.bytes`` of log were written since the previous one, so the batch holding any
offset ``o`` starts at or after the position of the last entry whose offset is <= ``o``, and at
most about ``index.interval.bytes`` later.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

from .index_file import IndexFile

ENTRY_SIZE = 8


class IndexEntry(NamedTuple):
    offset: int
    position: int


class OffsetIndex(IndexFile[IndexEntry]):
    """Maps offsets to file positions of a segment; see the module docstring for the format."""

    FIELDS = "II"
    OFFSET_FIELD = 0
    DEFERRED_ENTRIES = 128

    def _entry(self, slot: int) -> IndexEntry:
        relative, position = self._row(slot)
        return IndexEntry(self.base_offset + relative, position)

    def append(self, offset: int, position: int) -> None:
        """Add an entry; ``offset`` and ``position`` must exceed the last entry's."""
        relative, (offsets, positions) = self._relative(offset), self._columns
        if offsets and (relative <= offsets[-1] or position <= positions[-1]):
            raise ValueError(
                f"index entry ({offset}, {position}) is not after {self.last_entry} in {self.path}"
            )
        self._add(relative, position)

    def lookup(self, target_offset: int) -> IndexEntry:
        """The last entry whose offset is <= ``target_offset``: the batch holding the target
        starts at its position or later. With no such entry (empty index, or a target below
        the first entry) the answer is (base offset, 0), the start of the segment."""
        slot = bisect_right(self._columns[0], target_offset - self.base_offset) - 1
        return IndexEntry(self.base_offset, 0) if slot < 0 else self._entry(slot)

    def floor_position(self, position: int) -> int:
        """The greatest indexed batch start <= ``position`` (0 when there is none): a batch
        boundary from which to walk towards ``position``."""
        positions = self._columns[1]
        slot = bisect_right(positions, position) - 1
        return positions[slot] if slot >= 0 else 0

    def problem(self, next_offset: int | None = None, log_size: int | None = None) -> str | None:
        """As :meth:`IndexFile.problem`, and a position at or past ``log_size`` (the bytes of
        the segment's log) is one too."""
        positions = self._columns[1]
        if log_size is not None and positions and positions[-1] >= log_size:
            return f"position {positions[-1]} beyond the log's {log_size} bytes"
        return super().problem(next_offset)

    def truncate_to_position(self, log_size: int) -> None:
        """Drop the entries of batches at or beyond byte ``log_size`` of the log."""
        self._truncate_entries(bisect_right(self._columns[1], log_size - 1))
