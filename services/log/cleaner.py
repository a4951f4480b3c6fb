"""The log cleaner (Kafka's ``LogCleaner``, ``Cleaner`` and ``LogCleanerManager``): compaction of
the partition logs whose ``cleanup.policy`` includes ``compact``, keeping the latest record of
every key.

Sections of a log, as Kafka names them: the *clean* section (below the first dirty offset,
compacted by an earlier pass), the *dirty* section (from the first dirty offset on), and its
*cleanable* part, which ends at the first uncleanable offset: the active segment's base offset,
the last stable offset (so the high watermark and every transaction not yet decided), and the
base offset of the first dirty segment holding a record younger than ``min.compaction.lag.ms``
(its largest timestamp, as Kafka compares), whichever is lowest, rounded down to a segment
boundary. Only whole non-active segments below it are ever cleaned, so the active segment and
anything at or past the last stable offset are never touched.

When: every ``log.cleaner.backoff.ms`` (:class:`~services.log.log_manager.LogManager` runs the
rounds) a compacted partition is cleaned if its dirty ratio, the cleanable dirty bytes over the
clean plus cleanable dirty bytes, exceeds ``min.cleanable.dirty.ratio``; or a dirty record is
older than ``max.compaction.lag.ms`` (the earliest first-batch timestamp of the dirty
segments); or the delete horizon of a tombstone or marker it kept has passed. The filthiest go
first.

How (Kafka's ``Cleaner.doClean``):

1. An offset map, key -> offset of its latest record, is built from the cleanable dirty
   section (keys compared as raw bytes), leaving out the records of aborted transactions. It
   holds at most ``max_map_keys`` keys; when it is full the pass stops at the end of the
   segment that filled it, and cleans up to there.
2. The segments from the log's first one up to the end of the map are taken in groups of
   consecutive segments totalling at most ``segment.bytes`` (and an offset range the offset
   index can address). Each group is rewritten as one new segment at the group's first base
   offset, ``<base>.log.cleaned`` with its indexes, in a thread, reading the old files through
   file handles of its own. A record is kept unless: a later record of its key is in the map;
   it has no key (Kafka drops those); it is a tombstone (null value) in a batch whose delete
   horizon has passed; or it belongs to an aborted transaction.
3. The new segment is swapped in under the partition's lock (crash-safely, see
   :mod:`services.log.segment_swap`), then the next group is cleaned. Reads never see a mix:
   they run on the event loop between swaps.
4. The first dirty offset becomes the end of the map, kept in ``cleaner-offset-checkpoint``.

Batches (Kafka's ``MemoryRecords.filterTo``): a batch whose records are all kept, and that needs
no delete horizon, is copied byte for byte. Otherwise it is rebuilt with the same base offset,
partition leader epoch, producer id, epoch and base sequence, and its original lastOffsetDelta
(so a producer's sequence numbers still add up; offsets are never changed and the survivors
keep theirs, leaving gaps in the offset deltas); it is compressed again with its own codec and
gets a new CRC32C; its record count is what is left, its maxTimestamp the largest kept record
timestamp (the append time under LogAppendTime), its baseTimestamp the delete horizon if it has
one, else the first kept record's timestamp. A batch left without records is dropped, except
the last batch of a producer the partition still tracks, which stays as an empty batch (a
header) so the producer's last sequence survives, as Kafka does. Reads step over the gaps:
a segment may end below the next one's base offset, or be empty, until a later pass merges it.

Transactions (:mod:`services.log.cleaned_transactions`): the records of aborted transactions
are removed (their batches are not even decoded); a marker (a control batch) is copied as it is
while batches of its transaction are still in the log; then it gets a delete horizon as
tombstones do, and a pass after that removes it, or empties it (a header) when it is the last
record of a producer the partition tracks with no data batch cached, whose epoch it keeps, as
Kafka does. The kept ABORT markers' transactions make up the cleaned segment's transaction
index. The aborted transactions of the range are collected from the transaction indexes on the
event loop before the thread starts.

Tombstones (KIP-534, Kafka 3.1 and later, documented for ``delete.retention.ms``): the first
pass that keeps a tombstone gives its batch a delete horizon, that pass's time plus
``delete.retention.ms``, stored in the batch (attribute bit 6, the horizon in baseTimestamp).
A pass at or after the horizon removes the batch's tombstones. So a consumer that reads from
the start and reaches the end of the log within ``delete.retention.ms`` of a tombstone being
first cleaned sees it. As in Kafka, the earliest pending horizon is remembered only in memory;
after a restart a partition's tombstones wait for its next pass for another reason.

Not thread-safe: used from the event loop, with the CPU and file work in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from services.common.records.compression import SNAPPY, is_xerial
from services.common.records.record import Record, decode_records, encode_batch
from services.common.records.record_batch import (
    COMPRESSION_MASK,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    BatchHeader,
    RecordError,
)

from .checkpoint import OffsetCheckpoint, TopicPartition
from .cleaned_transactions import CleanedTransactions
from .index_file import MAX_RELATIVE_OFFSET
from .partition_log import PartitionLog, now_ms
from .producer_state import marker_of
from .segment import LogSegment, scan_batches
from .segment_swap import CLEANED_SUFFIX, discard
from .topic_config import NEVER
from .transaction_index import AbortedTxn

log = logging.getLogger(__name__)

CLEANER_OFFSET_FILE = "cleaner-offset-checkpoint"
# Keys of one pass's offset map (Kafka bounds it by log.cleaner.dedupe.buffer.size instead).
DEFAULT_MAX_MAP_KEYS = 4_000_000
# The cleaner writes the new segment this much at a time.
_IO_CHUNK = 1024 * 1024

OffsetMap = dict[bytes, int]


class SegmentRef(NamedTuple):
    """An old segment as the cleaner saw it: the offsets it may hold (up to the next segment's
    base offset) and its size then. The thread reads its file through handles of its own."""

    segment: LogSegment
    end_offset: int
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cleanable:
    """What one partition log offers the cleaner now (Kafka's ``LogToClean``)."""

    first_dirty: int
    # Every segment below the first uncleanable offset.
    segments: tuple[SegmentRef, ...]
    clean_bytes: int
    dirty_bytes: int
    needs_compaction_now: bool
    # Whether a pass is due: see the module docstring.
    worth_cleaning: bool

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


@dataclass(slots=True)
class CleanResult:
    """What one pass over one partition did (added up group by group)."""

    topic: str
    partition: int
    # Where the pass stopped: the partition's first dirty offset from now on.
    end_offset: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0

    @property
    def bytes_removed(self) -> int:
        return self.bytes_read - self.bytes_written


class LogCleaner:
    """Cleans compacted partition logs; remembers each one's first dirty offset."""

    def __init__(
        self, checkpoint_path: Path | None = None, max_map_keys: int = DEFAULT_MAX_MAP_KEYS
    ) -> None:
        self._checkpoint = OffsetCheckpoint(checkpoint_path) if checkpoint_path else None
        self.max_map_keys = max_map_keys
        self._first_dirty: dict[TopicPartition, int] = {}
        self._saved: dict[TopicPartition, int] = {}
        # The earliest delete horizon among the tombstones each partition kept in its last pass.
        self._horizons: dict[TopicPartition, int] = {}
        # Partitions whose data the cleaner cannot decode: left alone until a restart.
        self._uncleanable: set[TopicPartition] = set()

    # ---------------------------------------------------------------------- checkpoint

    def load(self) -> None:
        if self._checkpoint is not None:
            self._first_dirty = self._checkpoint.read()
            self._saved = dict(self._first_dirty)

    def write_checkpoint(self) -> None:
        """Persist the first dirty offsets, if they changed since the last write."""
        if self._checkpoint is not None and self._first_dirty != self._saved:
            self._checkpoint.write(self._first_dirty)
            self._saved = dict(self._first_dirty)

    def forget(self, topic: str, partition: int) -> None:
        """A replica was deleted: a new one of that name starts dirty."""
        self._first_dirty.pop((topic, partition), None)
        self._horizons.pop((topic, partition), None)
        self._uncleanable.discard((topic, partition))

    def first_dirty_offset(self, partition_log: PartitionLog) -> int:
        """Where the partition's dirty section starts: the checkpointed offset, or the log
        start offset when it has none or it lies outside the log (as Kafka resets it)."""
        start, end = partition_log.log_start_offset, partition_log.log_end_offset
        offset = self._first_dirty.get((partition_log.topic, partition_log.partition), start)
        return offset if start <= offset <= end else start

    # ------------------------------------------------------------------------ choosing

    def cleanable(self, partition_log: PartitionLog, now: int | None = None) -> Cleanable | None:
        """The cleanable part of a compacted log (None if it is not compacted or has no
        cleanable segment)."""
        config = partition_log.config
        key = (partition_log.topic, partition_log.partition)
        if not config.compacts or key in self._uncleanable:
            return None
        now = now_ms() if now is None else now
        segments = partition_log.segments
        first_dirty = self.first_dirty_offset(partition_log)
        limit = min(segments[-1].base_offset, partition_log.last_stable_offset)
        ends = [segment.base_offset for segment in segments[1:]]
        if config.min_compaction_lag_ms > 0:
            for segment, end in zip(segments, ends, strict=False):
                if end <= first_dirty:
                    continue
                if segment.largest_timestamp() > now - config.min_compaction_lag_ms:
                    limit = min(limit, segment.base_offset)
                    break
        refs = tuple(
            SegmentRef(segment, end, segment.size)
            for segment, end in zip(segments, ends, strict=False) if end <= limit
        )
        if not refs:
            return None
        dirty = [(ref, segment) for ref, segment in zip(refs, segments, strict=False)
                 if ref.end_offset > first_dirty]
        needs_now = False
        if dirty and config.max_compaction_lag_ms < NEVER:
            firsts = [s.first_timestamp() for _, s in dirty if s.first_timestamp() > 0]
            needs_now = bool(firsts) and min(firsts) < now - config.max_compaction_lag_ms
        horizon = self._horizons.get(key)
        clean_bytes = sum(ref.size for ref in refs if ref.end_offset <= first_dirty)
        dirty_bytes = sum(ref.size for ref, _ in dirty)
        return Cleanable(
            first_dirty=first_dirty, segments=refs, clean_bytes=clean_bytes,
            dirty_bytes=dirty_bytes, needs_compaction_now=needs_now,
            worth_cleaning=bool(dirty_bytes) and (
                dirty_bytes / (clean_bytes + dirty_bytes) > config.min_cleanable_dirty_ratio
                or needs_now) or (horizon is not None and horizon <= now),
        )

    async def clean_logs(
        self, logs: Iterable[PartitionLog], now: int | None = None
    ) -> list[CleanResult]:
        """One round: clean every compacted log worth it, the filthiest first."""
        candidates = [(cleanable, partition_log) for partition_log in logs
                      if (cleanable := self.cleanable(partition_log, now)) is not None
                      and cleanable.worth_cleaning]
        candidates.sort(key=lambda item: (item[0].needs_compaction_now, item[0].dirty_ratio),
                        reverse=True)
        results = [await self.clean(partition_log, now) for _, partition_log in candidates]
        return [result for result in results if result is not None]

    # ------------------------------------------------------------------------ cleaning

    async def clean(
        self, partition_log: PartitionLog, now: int | None = None
    ) -> CleanResult | None:
        """Clean the log's cleanable segments now, whatever its dirty ratio (see the module
        docstring). None if there was nothing to clean, or the log changed underneath (a
        later round tries again)."""
        key = (partition_log.topic, partition_log.partition)
        # Rolled segments are flushed in the background; their swap must wait for that.
        await partition_log.drain()
        now = now_ms() if now is None else now
        cleanable = self.cleanable(partition_log, now)
        if cleanable is None:
            return None
        started = time.perf_counter()
        config = partition_log.config
        segments_before = partition_log.segment_count
        dirty = [ref for ref in cleanable.segments if ref.end_offset > cleanable.first_dirty]
        result = CleanResult(*key)
        # Every aborted transaction with data in the cleanable segments (markers may be later,
        # even in the active segment): read here, as the indexes change on the event loop.
        aborted = partition_log.collect_aborted_transactions(
            cleanable.segments[0].segment.base_offset, cleanable.segments[-1].end_offset)
        try:
            offset_map, map_end = await asyncio.to_thread(
                build_offset_map, dirty, cleanable.first_dirty, self.max_map_keys, aborted)
            if not dirty:
                map_end = cleanable.first_dirty
            to_clean = [ref for ref in cleanable.segments if ref.end_offset <= max(
                map_end, cleanable.first_dirty)]
            last_records = partition_log.producer_state.last_records()
            transactions = CleanedTransactions(aborted)
            horizons: list[int] = []
            for group in group_segments(to_clean, config.segment_bytes):
                changed, horizon = await asyncio.to_thread(
                    clean_group, partition_log.directory, group, offset_map, now,
                    config.delete_retention_ms, config.index_interval_bytes, last_records,
                    transactions, result)
                if horizon is not None:
                    horizons.append(horizon)
                if not changed:
                    discard(partition_log.directory, group[0].segment.base_offset)
                    continue
                if not await partition_log.replace_segments(
                        [ref.segment for ref in group], [ref.size for ref in group]):
                    log.info("%s-%d: the log changed while it was cleaned; retrying later",
                             *key)
                    return None
        except RecordError as exc:
            log.error("%s-%d: cannot clean (%s); the partition is left uncleaned", *key, exc)
            self._uncleanable.add(key)
            return None
        except OSError as exc:
            log.warning("%s-%d: cleaning failed: %s", *key, exc)
            return None
        self._first_dirty[key] = result.end_offset = map_end
        if horizons:
            self._horizons[key] = min(horizons)
        else:
            self._horizons.pop(key, None)
        log.info(
            "%s-%d: cleaned offsets [0, %d) (dirty from %d): %d -> %d bytes, %d of %d records "
            "removed, %d -> %d segments, %.3f s", key[0], key[1], map_end,
            cleanable.first_dirty, result.bytes_read, result.bytes_written,
            result.records_removed, result.records_read, segments_before,
            partition_log.segment_count, time.perf_counter() - started)
        return result


# ------------------------------------------------------------- the work of the thread


def read_batches(path: Path) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every whole batch of a segment file, with its bytes, by header framing; stops at a
    torn tail (or where the file was cut meanwhile). Raises :class:`RecordError` for framing
    that cannot be a batch."""
    with path.open("rb", buffering=0) as file:
        fd, size, end = file.fileno(), os.fstat(file.fileno()).st_size, 0
        for position, header in scan_batches(fd, 0, size):
            batch = os.pread(fd, header.size, position)
            if len(batch) < header.size:
                return
            # Let the event loop's thread have the GIL at once if it waits for it, rather than
            # after a whole switch interval: appends and reads stay quick.
            time.sleep(0)
            yield header, batch
            end = position + header.size
        if size - end >= HEADER_SIZE:
            raise RecordError(f"{path}: no batch at byte {end}")


def build_offset_map(
    segments: Sequence[SegmentRef], start: int, max_keys: int,
    aborted: Sequence[AbortedTxn] = (),
) -> tuple[OffsetMap, int]:
    """Key -> offset of its latest record, over the records at or past ``start`` of
    ``segments`` (Kafka's ``buildOffsetMap``) outside the ``aborted`` transactions, and the
    offset the map covers up to: the end of the last segment read, which is the segment that
    filled the map if it filled."""
    offsets: OffsetMap = {}
    end = start
    # Transactions aborted before ``start`` end before the batches read.
    transactions = CleanedTransactions(txn for txn in aborted if txn.last_offset >= start)
    for ref in segments:
        for header, batch in read_batches(ref.segment.log_path):
            if header.last_offset < start:
                continue
            if header.is_control:
                transactions.on_control_batch(header, marker_of(batch, header))
                continue
            if transactions.on_data_batch(header):
                continue
            base = header.base_offset
            for record in decode_records(batch, header):
                offset = base + record.offset_delta
                if record.key is not None and offset >= start:
                    offsets[record.key] = offset
        end = ref.end_offset
        if len(offsets) >= max_keys:
            break
    return offsets, end


def group_segments(segments: Sequence[SegmentRef], max_size: int) -> list[list[SegmentRef]]:
    """Consecutive segments in groups of at most ``max_size`` bytes whose offsets an index
    can address from the group's base (Kafka's ``groupSegmentsBySize``)."""
    groups: list[list[SegmentRef]] = []
    size = 0
    for ref in segments:
        if groups and size + ref.size <= max_size and (
            ref.end_offset - 1 - groups[-1][0].segment.base_offset <= MAX_RELATIVE_OFFSET
        ):
            groups[-1].append(ref)
            size += ref.size
        else:
            groups.append([ref])
            size = ref.size
    return groups


def clean_group(
    directory: Path,
    group: Sequence[SegmentRef],
    offset_map: Mapping[bytes, int],
    now: int,
    delete_retention_ms: int,
    index_interval_bytes: int,
    producer_last_records: Mapping[int, tuple[int, int]],
    transactions: CleanedTransactions,
    totals: CleanResult,
) -> tuple[bool, int | None]:
    """Write the cleaned segment of ``group`` as ``<base>.log.cleaned`` (and its indexes),
    flushed, its modification time the newest of the old files' (retention by time falls back
    on it), adding what it read, wrote and removed to ``totals``. ``transactions`` follows the
    pass from group to group. Returns whether the result differs from the old segment byte
    for byte, and the earliest delete horizon of a batch that kept tombstones or of a marker
    waiting to go (None if none did)."""
    base = group[0].segment.base_offset
    cleaned = LogSegment.create(directory, base, index_interval_bytes, CLEANED_SUFFIX)
    transactions.index = cleaned.txn_index
    changed = len(group) > 1
    horizon: int | None = None
    pending, positions = bytearray(), []

    def write_pending() -> None:
        nonlocal pending, positions
        cleaned.append(pending, positions)
        totals.bytes_written += len(pending)
        pending, positions = bytearray(), []

    try:
        for ref in group:
            for header, batch in read_batches(ref.segment.log_path):
                totals.bytes_read += len(batch)
                out, count, kept, kept_horizon = filter_batch(
                    batch, header, offset_map, now, delete_retention_ms, producer_last_records,
                    transactions)
                totals.records_read += count
                totals.records_removed += count - kept
                if kept_horizon is not None:
                    horizon = kept_horizon if horizon is None else min(horizon, kept_horizon)
                changed = changed or out is not batch
                if out is not None:
                    positions.append(len(pending))
                    pending += out
                if len(pending) >= _IO_CHUNK:
                    write_pending()
        if pending:
            write_pending()
        cleaned.flush()
    finally:
        transactions.index = None
        cleaned.close()
    newest = max(os.stat(ref.segment.log_path).st_mtime_ns for ref in group)
    os.utime(cleaned.log_path, ns=(newest, newest))
    return changed, horizon


def _is_last_of_producer(header: BatchHeader,
                         producer_last_records: Mapping[int, tuple[int, int]]) -> bool:
    """Whether the batch keeps what the producer state needs of a producer it tracks (Kafka's
    ``isBatchLastRecordOfProducer``): its last data batch (its last sequence), or, with no
    data batch cached, a marker of its current epoch."""
    last = producer_last_records.get(header.producer_id)
    if last is None:
        return False
    last_data_offset, epoch = last
    if last_data_offset >= 0:
        return header.last_offset == last_data_offset
    return header.is_control and header.producer_epoch == epoch


def _emptied(header: BatchHeader) -> bytes:
    """``header``'s batch without records (what stays of a producer's last batch)."""
    return encode_batch(header._replace(
        attributes=header.attributes & ~(COMPRESSION_MASK | DELETE_HORIZON_BIT),
        base_timestamp=header.max_timestamp), [])


def _filter_control_batch(
    batch: bytes, header: BatchHeader, now: int, delete_retention_ms: int,
    producer_last_records: Mapping[int, tuple[int, int]], transactions: CleanedTransactions,
) -> tuple[bytes | None, int, int, int | None]:
    """:func:`filter_batch` for a control batch: kept while its transaction has data, then
    given a delete horizon, removed (or emptied) once it passed."""
    count = header.record_count
    if not transactions.on_control_batch(header, marker_of(batch, header)):
        return batch, count, count, None
    if count == 0:  # emptied by an earlier pass
        return (batch if _is_last_of_producer(header, producer_last_records) else None), 0, 0, None
    horizon = header.delete_horizon
    if horizon is None:
        horizon = now + delete_retention_ms
        records = decode_records(batch, header)
        timestamps = [header.base_timestamp + record.timestamp_delta for record in records]
        stamped = encode_batch(
            header._replace(attributes=header.attributes | DELETE_HORIZON_BIT,
                            base_timestamp=horizon),
            [record._replace(timestamp_delta=timestamp - horizon)
             for record, timestamp in zip(records, timestamps, strict=True)])
        return stamped, count, count, horizon
    if now < horizon:
        return batch, count, count, horizon
    if _is_last_of_producer(header, producer_last_records):
        return _emptied(header), count, 0, None
    return None, count, 0, None


def filter_batch(
    batch: bytes,
    header: BatchHeader,
    offset_map: Mapping[bytes, int],
    now: int,
    delete_retention_ms: int,
    producer_last_records: Mapping[int, tuple[int, int]],
    transactions: CleanedTransactions | None = None,
) -> tuple[bytes | None, int, int, int | None]:
    """One batch through the cleaner (Kafka's ``filterTo`` with the cleaner's record filter):
    the batch to write (``batch`` itself when unchanged, None when dropped), its record count
    before and after, and its delete horizon if it keeps tombstones (or is a marker waiting
    for it). ``transactions`` follows the pass (none: no transactions in the log)."""
    if transactions is None:
        transactions = CleanedTransactions(())
    if header.is_control:
        return _filter_control_batch(batch, header, now, delete_retention_ms,
                                     producer_last_records, transactions)
    if transactions.on_data_batch(header):
        # Aborted: none of its records stays.
        count = header.record_count
        if not _is_last_of_producer(header, producer_last_records):
            return None, count, 0, None
        return (batch if count == 0 else _emptied(header)), count, 0, None
    records = decode_records(batch, header)
    horizon = header.delete_horizon
    base = header.base_offset
    kept: list[Record] = []
    for record in records:
        if record.key is None:
            continue
        latest = offset_map.get(record.key)
        if latest is not None and base + record.offset_delta < latest:
            continue
        if record.value is None and horizon is not None and now >= horizon:
            continue
        kept.append(record)
    has_tombstones = any(record.value is None for record in kept)
    needs_horizon = has_tombstones and horizon is None
    if len(kept) == len(records) and not needs_horizon:
        return batch, len(records), len(kept), horizon if has_tombstones else None
    if not kept:
        if _is_last_of_producer(header, producer_last_records):
            return _emptied(header), len(records), 0, None
        return None, len(records), 0, None
    if needs_horizon:
        horizon = now + delete_retention_ms
    timestamps = [header.base_timestamp + record.timestamp_delta for record in kept]
    new_base = horizon if horizon is not None else timestamps[0]
    max_timestamp = header.max_timestamp if header.is_log_append_time else max(timestamps)
    attributes = header.attributes | DELETE_HORIZON_BIT if horizon is not None else (
        header.attributes & ~DELETE_HORIZON_BIT)
    rebuilt = encode_batch(
        header._replace(attributes=attributes, base_timestamp=new_base,
                        max_timestamp=max_timestamp),
        [record._replace(timestamp_delta=timestamp - new_base)
         for record, timestamp in zip(kept, timestamps, strict=True)],
        xerial=header.compression == SNAPPY and is_xerial(memoryview(batch)[HEADER_SIZE:]),
    )
    return rebuilt, len(records), len(kept), horizon if has_tombstones else None
