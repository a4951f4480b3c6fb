"""One log segment (Kafka's ``LogSegment``): a file of record batches and its three indexes.

Files, named by the segment's base offset in 20 digits (``00000000000000000000.log``):

- ``<base>.log``: whole record batches back to back, exactly as appended (offsets assigned).
  Invariants: the base offset is <= the first batch's base offset; each batch starts after the
  previous batch's last offset; the file holds only whole, CRC-valid batches once recovered.
- ``<base>.index``: the sparse :class:`~services.log.offset_index.OffsetIndex` of that file.
- ``<base>.timeindex``: its sparse :class:`~services.log.time_index.TimeIndex`, which gets an
  entry (the largest maxTimestamp so far, and the batch holding it) whenever the offset index
  does and that maximum grew.
- ``<base>.txnindex``: the :class:`~services.log.transaction_index.TransactionIndex` of the
  transactions aborted by markers in the file. Only the partition log can fill it (it needs the
  producer state); a segment whose file was missing, or that was recovered, says so
  (:attr:`LogSegment.txn_index_stale`) and the partition log rebuilds it.

Bytes are read with ``os.pread`` straight from the page cache and never decoded past the batch
headers. Writes are plain OS writes; flushing to disk is left to the OS (page cache), as Kafka
does by default. Not thread-safe: the owning partition log serialises appends.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from services.common.records.record import iter_record_times
from services.common.records.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    Batch,
    read_header,
    read_log_overhead,
)

from .index_file import MAX_RELATIVE_OFFSET
from .log_validator import stored_batch_problem
from .metrics import FLUSH_SECONDS
from .offset_index import IndexEntry, OffsetIndex
from .time_index import TimeIndex
from .transaction_index import TransactionIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
OFFSET_DIGITS = 20

# Header scans read this much at a time, so walking small batches costs few system calls.
_SCAN_CHUNK = 16 * 1024
# Recovery reads (and CRC-checks) the log in pieces of this size.
_RECOVERY_CHUNK = 1024 * 1024


def file_stem(base_offset: int) -> str:
    return f"{base_offset:0{OFFSET_DIGITS}d}"


def file_offsets(directory: Path, suffix: str) -> list[int]:
    """The offsets naming the files ``<offset, 20 digits><suffix>`` in ``directory``, sorted."""
    names = (path.name[:-len(suffix)] for path in directory.glob("*" + suffix))
    return sorted(int(name) for name in names if len(name) == OFFSET_DIGITS and name.isdigit())


def scan_batches(fd: int, start: int, end: int) -> Iterator[Batch]:
    """The batches of the log file ``fd`` from ``start`` (a batch boundary) whose headers lie
    before ``end``, by framing alone. Stops at a header that cannot be a batch."""
    chunk, chunk_start = b"", start
    position = start
    while position + HEADER_SIZE <= end:
        in_chunk = position - chunk_start
        if in_chunk + HEADER_SIZE > len(chunk):
            chunk = os.pread(fd, min(_SCAN_CHUNK, end - position), position)
            chunk_start, in_chunk = position, 0
            if len(chunk) < HEADER_SIZE:
                return
        header = read_header(chunk, in_chunk)
        if header.batch_length < MIN_BATCH_LENGTH:
            return
        yield Batch(position, header)
        position += header.size


class LogSegment:
    """A segment's files and what is known about them: size, next offset, max timestamp."""

    def __init__(
        self, directory: Path, base_offset: int, index_interval_bytes: int, suffix: str = ""
    ) -> None:
        """Open the segment's files (creating them if missing); call :meth:`load` or
        :meth:`recover` before use, unless the segment is new and empty. A ``suffix`` after
        each file name makes a segment that is not (yet) part of the log, such as the log
        cleaner's ``.cleaned`` output."""
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        stem = file_stem(base_offset)
        self.log_path = directory / (stem + LOG_SUFFIX + suffix)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.index = OffsetIndex(directory / (stem + INDEX_SUFFIX + suffix), base_offset)
        self.time_index = TimeIndex(directory / (stem + TIME_INDEX_SUFFIX + suffix), base_offset)
        self.txn_index = TransactionIndex(
            directory / (stem + TXN_INDEX_SUFFIX + suffix), base_offset)
        stat = os.fstat(self._fd)
        self.size = stat.st_size
        # What a reader on this host opens to read the segment's batches itself
        # (services.common.file_records).
        self.file_identity = (str(self.log_path.absolute()), stat.st_ino)
        # Whether the transaction index may not match the data (its file was lost, or the
        # segment was recovered): the partition log rebuilds it from the batches.
        self.txn_index_stale = bool(self.size) and not self.txn_index.existed
        # When the segment came into being, for segment.ms when its batches carry no time.
        self.created_ms = int(stat.st_mtime * 1000) if self.size else int(time.time() * 1000)
        self.next_offset = base_offset
        self._bytes_since_index_entry = 0
        # The largest maxTimestamp noted so far and the last offset of its first batch: what
        # the time index gets at its next entry (Kafka's maxTimestampAndOffsetSoFar).
        self._max_so_far = (NO_TIMESTAMP, base_offset - 1)
        self._first_timestamp: int | None = None
        # Whether appends since the last flush may still be only in the page cache.
        self.dirty = False
        # Background work (a flush in a thread) using the files: not to be deleted meanwhile.
        self.pinned = 0

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, index_interval_bytes: int, suffix: str = ""
    ) -> LogSegment:
        """A new, empty segment (any stale files of that name are emptied)."""
        segment = cls(directory, base_offset, index_interval_bytes, suffix)
        if segment.size or len(segment.index) or len(segment.time_index) or len(
            segment.txn_index
        ):
            segment._truncate(0)
            segment.index.reset()
            segment.time_index.reset()
            segment.txn_index.reset()
        segment.txn_index_stale = False
        return segment

    # ----------------------------------------------------------------- loading and recovery

    def load(self) -> None:
        """Open a segment that is not the last one: its data was complete before the last
        segment was rolled, so batches are only walked by their framing, from the last index
        entry on, to find the next offset and add any index entries that are missing (a
        missing index file is rebuilt that way). An inconsistent index, or framing that does
        not end exactly at the end of the file, makes it a full :meth:`recover`."""
        last = self.index.last_entry
        problem = self._indexes_problem()
        if problem is None:
            start = last.position if last else 0
            # Every batch before the last offset index entry's has a maxTimestamp at most the
            # last time index entry's: the time index goes on from there.
            last_time = self.time_index.last_entry
            if last_time is not None:
                self._max_so_far = (last_time.timestamp, last_time.offset)
            self._bytes_since_index_entry = 0
            end = start
            for batch in scan_batches(self._fd, start, self.size):
                if batch.position + batch.header.size > self.size:
                    break
                self._note_batch(batch)
                end = batch.position + batch.header.size
            if end != self.size:
                problem = f"batches end at byte {end} of {self.size}"
        if problem is not None:
            log.warning("%s: index unusable (%s); recovering the segment", self.log_path, problem)
            self.recover()
        elif (txn_problem := self.txn_index.problem(self.next_offset)) is not None:
            log.warning("%s: transaction index unusable (%s); to be rebuilt", self.log_path,
                        txn_problem)
            self.txn_index_stale = True

    def recover(self) -> int:
        """Validate every batch (framing, magic, CRC, growing offsets), rebuilding the
        offset and time indexes, and truncate the file at the first one that is torn or
        corrupt, as after a crash; the transaction index is then stale (the partition log
        rebuilds it). Returns the number of bytes truncated."""
        self.index.reset()
        self.time_index.reset()
        self.txn_index_stale = True
        self._max_so_far = (NO_TIMESTAMP, self.base_offset - 1)
        self._bytes_since_index_entry = 0
        valid_end, bad = self._validate()
        truncated = self.size - valid_end
        if truncated:
            log.warning(
                "%s: truncated %d bytes at byte %d (%s)", self.log_path, truncated, valid_end, bad
            )
            self._truncate(valid_end)
            self.index.truncate_to_position(valid_end)
            self.time_index.truncate_to_offset(self.next_offset)
            self.dirty = True
        return truncated

    def _indexes_problem(self) -> str | None:
        """Why the two indexes cannot be trusted as a starting point, or None. Both get their
        entries together, so a time index entry past the last offset entry, or an empty time
        index beside a non-empty offset index (a lost file), is a problem too."""
        problem = self.index.problem(log_size=self.size) or self.time_index.problem()
        last, last_time = self.index.last_entry, self.time_index.last_entry
        if problem is None and last is not None:
            problem = self._entry_problem(last)
            if problem is None and last_time is None:
                problem = "time index missing"
        if problem is None and last_time is not None and (
            last is None or last_time.offset > last.offset
        ):
            problem = f"time index entry {last_time} beyond the offset index"
        return problem

    def _entry_problem(self, entry: IndexEntry) -> str | None:
        raw = os.pread(self._fd, HEADER_SIZE, entry.position)
        if len(raw) < HEADER_SIZE:
            return f"entry {entry} points past the log"
        header = read_header(raw)
        if header.batch_length < MIN_BATCH_LENGTH or header.last_offset != entry.offset:
            return f"entry {entry} does not point at its batch"
        return None

    def _validate(self) -> tuple[int, str | None]:
        """Walk the batches, indexing and noting them; return where the valid data ends and
        why it ends there (None at the end of the file)."""
        position = 0
        self.next_offset = self.base_offset
        while position < self.size:
            chunk = os.pread(self._fd, _RECOVERY_CHUNK, position)
            if len(chunk) >= LOG_OVERHEAD:
                first_size = read_log_overhead(chunk, 0)[1] + LOG_OVERHEAD
                if len(chunk) < first_size <= self.size - position:
                    chunk = os.pread(self._fd, first_size, position)
            offset_in_chunk = 0
            while offset_in_chunk < len(chunk):
                remaining = len(chunk) - offset_in_chunk
                if offset_in_chunk and (
                    remaining < HEADER_SIZE
                    or read_log_overhead(chunk, offset_in_chunk)[1] + LOG_OVERHEAD > remaining
                ) and position + len(chunk) < self.size:
                    break  # the batch continues past this chunk: read on from it
                problem = stored_batch_problem(chunk, offset_in_chunk, self.next_offset)
                if problem is not None:
                    return position + offset_in_chunk, problem
                header = read_header(chunk, offset_in_chunk)
                self._note_batch(Batch(position + offset_in_chunk, header))
                offset_in_chunk += header.size
            position += offset_in_chunk
        return position, None

    def _note_batch(self, batch: Batch) -> None:
        """Account for a batch now at the end of the segment: index entry, offsets, times."""
        header = batch.header
        if header.max_timestamp > self._max_so_far[0]:
            self._max_so_far = (header.max_timestamp, header.last_offset)
        if batch.position == 0:
            self._first_timestamp = header.max_timestamp
        if self._bytes_since_index_entry > self.index_interval_bytes:
            self.index.append(header.last_offset, batch.position)
            self.time_index.maybe_append(*self._max_so_far)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size
        self.next_offset = header.next_offset

    # ----------------------------------------------------------------------------- appends

    def can_hold(self, last_offset: int) -> bool:
        """Whether offsets up to ``last_offset`` fit the index's relative-offset range."""
        return last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    def append(self, buffer: bytearray | bytes, positions: Iterable[int]) -> None:
        """Write batches (offsets already assigned) at the end of the segment; ``positions``
        are where each batch starts in ``buffer``. All or nothing: on a write error (of the
        data or an index entry) the segment is as it was before, its files cut back to their
        previous sizes, so no partial append stays visible (what the cut could not remove,
        recovery removes at the next start)."""
        physical = self.size
        view = memoryview(buffer)
        before = (self.next_offset, self._bytes_since_index_entry, self._max_so_far,
                  self._first_timestamp)
        try:
            written = 0
            while written < len(view):
                written += os.pwrite(self._fd, view[written:], physical + written)
            self.size = physical + len(view)
            self.dirty = True
            for position in positions:
                self._note_batch(Batch(physical + position, read_header(view, position)))
        except OSError:
            (self.next_offset, self._bytes_since_index_entry, self._max_so_far,
             self._first_timestamp) = before
            self.size = physical
            try:
                self.index.truncate_to_position(physical)
                self.time_index.truncate_to_offset(self.next_offset)
                self._truncate(physical)
            except OSError as exc:
                log.error("%s: cannot cut back a failed append: %s", self.log_path, exc)
            raise

    # ------------------------------------------------------------------------------- reads

    def batches(self) -> Iterator[Batch]:
        """Every batch of the segment, in offset order."""
        return scan_batches(self._fd, 0, self.size)

    def find_batch(self, offset: int) -> Batch | None:
        """The first batch whose last offset is >= ``offset`` (the batch that holds it, or the
        next one after a gap), or None when the segment ends before ``offset``."""
        if offset >= self.next_offset:
            return None
        for batch in scan_batches(self._fd, self.index.lookup(offset).position, self.size):
            if batch.header.last_offset >= offset:
                return batch
        return None

    def truncate_to(self, offset: int) -> int:
        """Cut the segment before the batch holding ``offset``, and everything after it (a
        follower's log going back to its new leader's); the indexes are rebuilt. Returns the
        bytes removed."""
        position = self.position_of(offset)
        removed = self.size - position
        if removed:
            self._truncate(position)
            self.recover()
            # The markers left are as they were: so are their entries.
            self.txn_index.truncate_to(self.next_offset)
            self.txn_index_stale = False
            self.dirty = True
        return removed

    def position_of(self, offset: int) -> int:
        """Where the batch holding ``offset`` starts; the segment size if none does. Batches
        from here on hold ``offset`` or later ones."""
        batch = self.find_batch(offset)
        return self.size if batch is None else batch.position

    def batch_at(self, position: int) -> Batch:
        """The batch starting at ``position`` (a batch boundary within the segment)."""
        return Batch(position, read_header(os.pread(self._fd, HEADER_SIZE, position)))

    def read_batch(self, batch: Batch) -> bytes:
        """The bytes of one batch of the segment, header first."""
        return os.pread(self._fd, batch.header.size, batch.position)

    def read(self, first: Batch, end_position: int, max_bytes: int, min_one: bool) -> bytes:
        """Whole batches from ``first`` up to ``end_position`` (a batch boundary), at most
        ``max_bytes`` of them, except that with ``min_one`` the first batch comes whole even if
        larger (KIP-74). Empty when nothing fits."""
        return self.read_range(*self.locate(first, end_position, max_bytes, min_one))

    def read_range(self, start: int, stop: int) -> bytes:
        """The bytes at [start, stop) of the file (batch boundaries)."""
        return os.pread(self._fd, stop - start, start) if stop > start else b""

    def locate(self, first: Batch, end_position: int, max_bytes: int,
               min_one: bool) -> tuple[int, int]:
        """Where the batches :meth:`read` returns lie in the file: [start, stop), empty when
        nothing fits."""
        start = first.position
        first_end = start + first.header.size
        if first_end > end_position:
            return start, start
        limit = min(end_position, start + (max(max_bytes, first.header.size) if min_one
                                           else max_bytes))
        stop = limit
        if limit < end_position:
            # The greatest batch boundary <= limit, walking from the nearest indexed batch.
            stop = max(self.index.floor_position(limit), start)
            for batch in scan_batches(self._fd, stop, end_position):
                batch_end = batch.position + batch.header.size
                if batch_end > limit:
                    break
                stop = batch_end
        return start, max(stop, start)

    @property
    def max_timestamp(self) -> int:
        """The largest maxTimestamp of the segment's batches (-1 if none has one)."""
        return self._max_so_far[0]

    def find_by_timestamp(self, timestamp: int, starting_offset: int
                          ) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record whose own timestamp is >=
        ``timestamp`` and whose offset is >= ``starting_offset``, or None (Kafka's
        findOffsetByTimestamp). The time index says where to start scanning headers (the scan
        never starts past the answer, see :meth:`~services.log.time_index.TimeIndex.lookup`);
        only batches whose maxTimestamp reaches ``timestamp`` are read and their records'
        timestamps decoded (decompressed if need be)."""
        if self.max_timestamp < timestamp:
            return None
        start = self.index.lookup(max(self.time_index.lookup(timestamp), starting_offset)
                                  ).position
        for batch in scan_batches(self._fd, start, self.size):
            header = batch.header
            if header.max_timestamp < timestamp or header.last_offset < starting_offset:
                continue
            for offset, record_timestamp in iter_record_times(self.read_batch(batch), header):
                if record_timestamp >= timestamp and offset >= starting_offset:
                    return offset, record_timestamp, header.partition_leader_epoch
        return None

    def offset_of_max_timestamp(self) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record carrying the segment's
        largest timestamp (in the first batch with that maxTimestamp), or None if the
        segment is empty."""
        batch = self.find_batch(max(self._max_so_far[1], self.base_offset))
        if batch is None:
            return None
        header = batch.header
        for offset, record_timestamp in iter_record_times(self.read_batch(batch), header):
            if record_timestamp == header.max_timestamp:
                return offset, record_timestamp, header.partition_leader_epoch
        return None

    def first_timestamp(self) -> int:
        """The first batch's maxTimestamp (what segment.ms counts from, as Kafka does), or -1
        for an empty segment."""
        if self._first_timestamp is None:
            if self.size < HEADER_SIZE:
                return NO_TIMESTAMP
            self._first_timestamp = read_header(os.pread(self._fd, HEADER_SIZE, 0)).max_timestamp
        return self._first_timestamp

    def largest_timestamp(self) -> int:
        """The largest maxTimestamp of the segment, or the file's modification time when its
        batches carry none (what retention.ms compares with, as Kafka does)."""
        if self.max_timestamp > NO_TIMESTAMP:
            return self.max_timestamp
        return int(os.fstat(self._fd).st_mtime * 1000)

    # --------------------------------------------------------------------------- life cycle

    def _truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self.size = size
        if size == 0:
            self._first_timestamp = None

    def flush(self) -> None:
        """Force the segment's files to disk."""
        self.dirty = False
        started = time.perf_counter()
        try:
            os.fsync(self._fd)
            self.index.flush()
            self.time_index.flush()
            self.txn_index.flush()
        except BaseException:
            self.dirty = True
            raise
        FLUSH_SECONDS.observe(time.perf_counter() - started)

    def close(self, write_waiting: bool = True) -> None:
        """Close the files; ``write_waiting`` False leaves index entries not yet written
        unwritten (a failed log directory gets no more writes: start-up rebuilds them)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.index.close(write_waiting)
        self.time_index.close(write_waiting)
        self.txn_index.close(write_waiting)

    def delete(self) -> None:
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.txn_index.path.unlink(missing_ok=True)
        self.time_index.path.unlink(missing_ok=True)
        self.index.path.unlink(missing_ok=True)
