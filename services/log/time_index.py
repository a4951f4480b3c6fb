"""The sparse time index of one log segment (Kafka's ``TimeIndex``).

On disk, ``<base offset, 20 digits>.timeindex`` is a plain sequence of 12-byte entries,
big-endian (see :mod:`services.log.index_file`):

    timestamp       i64   the largest batch maxTimestamp in the segment up to that point
    relativeOffset  u32   the last offset of the first batch holding that timestamp, minus the
                          segment's base offset

Invariants: both fields strictly increase from entry to entry. An entry (T, o) is written when
the segment adds an offset index entry (every ``index.interval.bytes``) and the maximum
timestamp seen so far grew past the last entry's; so every batch before the one ending at ``o``
has maxTimestamp <= T, and batch ``o`` itself has exactly T. Consequently, for any target time
t, the batches before the one ending at the offset of the last entry whose timestamp is *below*
t all have maxTimestamp < t: the first batch with maxTimestamp >= t lies at or after it, and a
scan may start there (:meth:`TimeIndex.lookup`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import NamedTuple

from services.common.records.record_batch import NO_TIMESTAMP

from .index_file import IndexFile

ENTRY_SIZE = 12


class TimeEntry(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(IndexFile[TimeEntry]):
    """Maps timestamps to offsets of a segment; see the module docstring for the format."""

    FIELDS = "qI"
    OFFSET_FIELD = 1
    DEFERRED_ENTRIES = 128

    def _entry(self, slot: int) -> TimeEntry:
        timestamp, relative = self._row(slot)
        return TimeEntry(timestamp, self.base_offset + relative)

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Add an entry if ``timestamp`` is above the last entry's (and ``offset`` beyond its
        offset); returns whether it did. Entries that would not move the index are skipped, so
        callers may offer the running maximum at every offset index entry, also while it is
        still -1 (no batch had a timestamp), which is never indexed."""
        timestamps, offsets = self._columns
        if timestamp <= NO_TIMESTAMP or timestamps and (
                timestamp <= timestamps[-1] or offset - self.base_offset <= offsets[-1]):
            return False
        relative = self._relative(offset)
        self._add(timestamp, relative)
        return True

    def lookup(self, target_timestamp: int) -> int:
        """An offset from which to scan for the first batch whose maxTimestamp is >=
        ``target_timestamp``: the offset of the last entry whose timestamp is below the target
        (that batch and every earlier one are below it), or the base offset when there is no
        such entry (empty index, or a target at or below the first entry)."""
        slot = bisect_left(self._columns[0], target_timestamp) - 1
        return self.base_offset if slot < 0 else self._entry(slot).offset

    def truncate_to_offset(self, next_offset: int) -> None:
        """Drop the entries of offsets at or beyond ``next_offset``."""
        self._truncate_entries(bisect_right(self._columns[1], next_offset - 1 - self.base_offset))
