"""The aborted transactions of one log segment (Kafka's ``TransactionIndex``): what a
read_committed reader needs to drop the records of aborted transactions.

On disk, ``<base offset, 20 digits>.txnindex`` is a plain sequence of 34-byte entries,
big-endian (see :mod:`services.log.index_file`), one per transaction whose ABORT marker is in
the segment, in the order of the markers:

    version           i16   0
    producerId        i64
    firstOffset       i64   the transaction's first offset on this partition (possibly in an
                            earlier segment)
    lastOffset        i64   the offset of its ABORT marker, in this segment
    lastStableOffset  i64   the partition's last stable offset as the marker completed it: the
                            first offset of the oldest transaction of another producer still
                            undecided then, else lastOffset + 1

Offsets are absolute, as in Kafka (a transaction may begin before the segment does). A
transaction that ends without data on the partition (a marker with no transaction ongoing
there) has no entry, nor has a committed one.

Invariants: lastOffset strictly increases from entry to entry and lies within the segment;
firstOffset <= lastOffset and lastStableOffset <= lastOffset + 1 (lower while an older
transaction of another producer is open). Every segment has the file, empty when nothing
was aborted in it, created with the segment: a missing file is a lost one, rebuilt from the
log with the producer state (see :meth:`services.log.producer_state.ProducerStateManager.load`),
as is the index of a segment recovered after a crash.

The entries are mirrored in memory (:class:`~services.log.index_file.IndexFile`), so finding
the aborted transactions of a read costs no I/O. Not thread-safe: the partition's append lock
serialises changes; the log cleaner's thread gets copies of the entries.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice
from operator import ge, gt
from pathlib import Path
from typing import NamedTuple

from .index_file import IndexFile

ENTRY_SIZE = 34
VERSION = 0


class AbortedTxn(NamedTuple):
    """One aborted transaction: its producer, first offset, marker offset and the last stable
    offset when it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex(IndexFile[AbortedTxn]):
    """The aborted transactions whose markers a segment holds; see the module docstring."""

    FIELDS = "hqqqq"
    OFFSET_FIELD = 3

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        # Whether entries were written or cut since the last flush (an fsync is skipped else:
        # most segments never get an entry).
        self._dirty = False

    def _entry(self, slot: int) -> AbortedTxn:
        _, producer_id, first, last, last_stable = self._row(slot)
        return AbortedTxn(producer_id, first, last, last_stable)

    def append(self, txn: AbortedTxn) -> None:
        """Add the transaction whose marker was just written; its last offset must exceed the
        last entry's."""
        lasts = self._columns[3]
        if lasts and txn.last_offset <= lasts[-1]:
            raise ValueError(f"aborted transaction {txn} is not after {self.last_entry} in "
                             f"{self.path}")
        self._add(VERSION, *txn)
        self._dirty = True

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """The aborted transactions overlapping offsets [``fetch_offset``, ``upper_bound``)
        (last offset at or past the first, first offset below the second), and whether the
        search may stop at this segment (Kafka's ``collectAbortedTxns``): once an entry's last
        stable offset reaches ``upper_bound``, every transaction that began below it had been
        decided, by that marker or an earlier one."""
        _, producer_ids, firsts, lasts, last_stables = self._columns
        found: list[AbortedTxn] = []
        # Entries before ``start`` end below the fetch offset, so their last stable offsets
        # (at most last offset + 1) are at most the fetch offset: none of them completes the
        # search either.
        for slot in range(bisect_left(lasts, fetch_offset), len(lasts)):
            if firsts[slot] < upper_bound:
                found.append(AbortedTxn(producer_ids[slot], firsts[slot], lasts[slot],
                                        last_stables[slot]))
            if last_stables[slot] >= upper_bound:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose markers are at or beyond ``offset`` (the log is cut there)."""
        keep = bisect_left(self._columns[3], offset)
        if keep < len(self):
            self._truncate_entries(keep)
            self._dirty = True

    def reset(self) -> None:
        super().reset()
        self._dirty = True

    def problem(self, next_offset: int | None = None) -> str | None:
        """Why the index cannot be trusted for a segment whose offsets end before
        ``next_offset``, or None: a torn entry, an unknown version, markers out of order or
        outside the segment, or a transaction that ends before it begins."""
        if self._torn_bytes:
            return f"{self._torn_bytes} trailing bytes of a torn entry"
        versions, _, firsts, lasts, _ = self._columns
        if not lasts:
            return None
        if any(version != VERSION for version in versions):
            return "an entry of an unknown version"
        if any(map(ge, lasts, islice(lasts, 1, None))):
            return "entries out of order"
        if any(map(gt, firsts, lasts)):
            return "a transaction whose first offset is past its marker"
        if lasts[0] < self.base_offset:
            return f"marker offset {lasts[0]} below the segment's base {self.base_offset}"
        if next_offset is not None and lasts[-1] >= next_offset:
            return f"marker offset {lasts[-1]} beyond the end {next_offset}"
        return None

    def flush(self) -> None:
        if self._dirty:
            super().flush()
            self._dirty = False
