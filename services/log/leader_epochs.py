"""A replica's leader epoch cache (Kafka's ``LeaderEpochFileCache``): for every leader epoch
that wrote to the log, the offset of its first batch. Followers use it to find where their log
parts from a new leader's (OffsetForLeaderEpoch, KIP-101/279), so they cut only what the new
leader never had.

File ``<topic>-<partition>/leader-epoch-checkpoint`` (Kafka's checkpoint format, see
:mod:`services.log.checkpoint`):

    0               version
    2               number of entries
    0 0             epoch, start offset; epochs and start offsets both strictly increase
    3 1042

Entries are added when a leader takes office (its epoch starts at the log end offset) and when
an append carries batches of an epoch newer than the latest one (followers learn epochs from
the batches they copy). Truncating the log removes the entries that start at or past the new
end. The file is replaced atomically on every change (changes are rare: once per leader
election); a missing or unreadable file is an empty cache. Not thread-safe.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

from .checkpoint import read_entries, write_entries

FILE_NAME = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The (epoch, start offset) entries of one replica, kept in its directory."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self._entries: list[EpochEntry] = self._read()

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, -1 when the cache is empty."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` unless an epoch as new is known
        already (Kafka's ``assign``: only newer epochs are added). An existing entry whose
        start offset is not below ``start_offset`` is replaced, so start offsets keep
        increasing. Returns whether the cache changed."""
        if epoch < 0 or (self._entries and epoch <= self._entries[-1].epoch):
            return False
        # Entries that would not start before the new epoch's start are empty epochs.
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self._write()
        return True

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's ``endOffsetFor``: (the largest known epoch <= ``requested``, the start offset
        of the first epoch after ``requested``), or (requested, log end) for the latest epoch;
        (-1, -1) for an undefined request or one newer than every known epoch. A request
        older than every known epoch answers (requested, first start offset)."""
        if requested == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested == self._entries[-1].epoch:
            return requested, log_end_offset
        epochs = [e.epoch for e in self._entries]
        higher = bisect_right(epochs, requested)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return requested, self._entries[0].start_offset
        return epochs[higher - 1], self._entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget the epochs starting at or past ``end_offset`` (the log was cut there)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._write()

    def _read(self) -> list[EpochEntry]:
        return read_entries(self.path, lambda epoch, start: EpochEntry(int(epoch), int(start)))

    def _write(self) -> None:
        write_entries(self.path, self._entries)
