"""One partition replica's log (Kafka's ``UnifiedLog`` over a ``LocalLog``): its segments, log
start and end offsets and high watermark, and the append, read and offset-lookup operations.

Directory ``<data_dir>/<topic>-<partition>/`` holds the segments (``<base>.log`` and
``<base>.index``, see :mod:`services.log.segment`) and ``partition.metadata.json``.

Invariants: segments are ordered by base offset and only the last (active) one is appended to;
log start offset = the first segment's base offset; log end offset (LEO) = the active
segment's next offset; log start <= high watermark <= LEO.

Appends are serialised per partition by an asyncio lock and assign offsets by patching batch
headers; reads and lookups run on the event loop without the lock, which is safe because an
append changes the in-memory state only after its bytes are written, with no await in between.
Not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from services.common.errors import ErrorCode, KafkaError

from .offset_index import MAX_RELATIVE_OFFSET
from .record_batch import NO_TIMESTAMP, assign_offsets, validate_append
from .segment import INDEX_SUFFIX, LOG_SUFFIX, OFFSET_DIGITS, LogSegment
from .topic_config import TimestampType, TopicConfig

log = logging.getLogger(__name__)

# Special timestamps of ListOffsets (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5

NO_OFFSET = -1
NO_LEADER_EPOCH = -1

HighWatermarkListener = Callable[[str, int, int], None]
"""Called with (topic, partition, new high watermark) whenever the high watermark moves."""


class ReadLimit(Enum):
    """How far a reader may see: consumers up to the high watermark, followers to the end."""

    HIGH_WATERMARK = "high_watermark"
    LOG_END = "log_end"


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    # The time the batches were stamped with under LogAppendTime, else -1.
    log_append_time_ms: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    batch_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadInfo:
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetAndTimestamp:
    offset: int
    timestamp: int
    leader_epoch: int


NOT_FOUND = OffsetAndTimestamp(
    offset=NO_OFFSET, timestamp=NO_TIMESTAMP, leader_epoch=NO_LEADER_EPOCH)


def directory_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


class PartitionLog:
    """A partition replica's log; build it with :meth:`open`."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        topic_id: str,
        config: TopicConfig,
        segments: list[LogSegment],
        on_high_watermark: HighWatermarkListener | None = None,
        advance_high_watermark_on_append: bool = True,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.config = config
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._on_high_watermark = on_high_watermark
        # Without replication the leader is the only replica, so an append is committed at
        # once; replication turns this off and moves the high watermark through the setter.
        self.advance_high_watermark_on_append = advance_high_watermark_on_append
        self._high_watermark = self.log_end_offset
        self._lock = asyncio.Lock()
        self._closed = False
        # Bytes of torn or corrupt tail that recovery removed when the log was opened.
        self.truncated_at_open = 0

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        topic_id: str,
        config: TopicConfig,
        on_high_watermark: HighWatermarkListener | None = None,
    ) -> PartitionLog:
        """Load the segments in ``directory`` (created if missing): the last one is recovered
        (torn or corrupt tail truncated), earlier ones have their index checked; an empty
        directory gets an empty segment at offset 0."""
        directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(
            int(path.stem) for path in directory.glob("*" + LOG_SUFFIX)
            if len(path.stem) == OFFSET_DIGITS and path.stem.isdigit()
        )
        for index_path in directory.glob("*" + INDEX_SUFFIX):
            if not index_path.stem.isdigit() or int(index_path.stem) not in bases:
                log.warning("%s: removing an index without its log", index_path)
                index_path.unlink()
        segments: list[LogSegment] = []
        truncated = 0
        try:
            for position, base in enumerate(bases):
                segment = LogSegment(directory, base, config.index_interval_bytes)
                segments.append(segment)
                if position == len(bases) - 1:
                    truncated = segment.recover()
                else:
                    segment.load()
            if not segments:
                segments.append(LogSegment.create(directory, 0, config.index_interval_bytes))
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        partition_log = cls(
            directory, topic, partition, topic_id, config, segments, on_high_watermark
        )
        partition_log.truncated_at_open = truncated
        return partition_log

    # ---------------------------------------------------------------------------- offsets

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        """Move the high watermark, kept within [log start, log end] as Kafka does; listeners
        hear of every change."""
        offset = min(max(offset, self.log_start_offset), self.log_end_offset)
        if offset != self._high_watermark:
            self._high_watermark = offset
            if self._on_high_watermark is not None:
                self._on_high_watermark(self.topic, self.partition, offset)

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    # ----------------------------------------------------------------------------- append

    async def append(self, records: bytes, now_ms: int | None = None) -> AppendInfo:
        """Validate and append the record batches of one produce to this partition (as its
        leader), assigning offsets from the log end offset on. All or nothing: a bad batch
        (see :func:`~services.log.record_batch.validate_append`) stores none of them."""
        config = self.config
        batches = validate_append(records, config.max_message_bytes)
        if len(records) > config.segment_bytes:
            raise KafkaError(
                ErrorCode.record_list_too_large,
                f"{len(records)} bytes of batches exceed segment.bytes {config.segment_bytes}",
            )
        buffer = bytearray(records)
        append_time: int | None = None
        if config.message_timestamp_type is TimestampType.LOG_APPEND_TIME:
            append_time = int(time.time() * 1000) if now_ms is None else now_ms
        async with self._lock:
            if self._closed:
                raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                 f"{self.topic}-{self.partition} was deleted")
            base_offset = self.log_end_offset
            next_offset = assign_offsets(buffer, batches, base_offset, append_time)
            if next_offset - 1 - base_offset > MAX_RELATIVE_OFFSET:
                raise KafkaError(ErrorCode.invalid_record, "offset range of the append too large")
            segment = self._maybe_roll(len(buffer), next_offset - 1)
            segment.append(buffer, [batch.position for batch in batches])
            if self.advance_high_watermark_on_append:
                self.high_watermark = self.log_end_offset
            return AppendInfo(
                base_offset=base_offset,
                last_offset=next_offset - 1,
                log_append_time_ms=NO_TIMESTAMP if append_time is None else append_time,
                log_start_offset=self.log_start_offset,
                log_end_offset=self.log_end_offset,
                high_watermark=self._high_watermark,
                size_bytes=len(buffer),
                batch_count=len(batches),
            )

    def _maybe_roll(self, append_size: int, last_offset: int) -> LogSegment:
        """The segment to append to: a new one when the active one would grow past
        segment.bytes or cannot index ``last_offset``. An empty segment always takes the
        append, so a set of batches larger than segment.bytes still fits somewhere."""
        active = self._segments[-1]
        if active.size == 0:
            return active
        if active.size + append_size <= self.config.segment_bytes and active.can_hold(last_offset):
            return active
        rolled = LogSegment.create(
            self.directory, self.log_end_offset, self.config.index_interval_bytes
        )
        self._segments.append(rolled)
        self._bases.append(rolled.base_offset)
        log.debug("%s-%d: rolled segment %d", self.topic, self.partition, rolled.base_offset)
        return rolled

    # ------------------------------------------------------------------------------ reads

    def _fetchable_end(self, limit: ReadLimit) -> int:
        return self._high_watermark if limit is ReadLimit.HIGH_WATERMARK else self.log_end_offset

    def read(
        self, offset: int, max_bytes: int, limit: ReadLimit, min_one: bool = True
    ) -> ReadInfo:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (with
        ``min_one``, the first batch whole even if larger) and never past ``limit``. Like
        Kafka, a read returns data of a single segment. ``offset`` equal to the log end offset
        (or between the high watermark and the end for consumers) gives no records; outside
        [log start, log end] it is OFFSET_OUT_OF_RANGE."""
        start, end = self.log_start_offset, self.log_end_offset
        if offset < start or offset > end:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"offset {offset} is outside [{start}, {end}] of {self.topic}-{self.partition}",
            )
        fetchable_end = self._fetchable_end(limit)
        records = b""
        if offset < fetchable_end:
            slot = max(bisect_right(self._bases, offset) - 1, 0)
            for segment in self._segments[slot:]:
                if segment.base_offset >= fetchable_end:
                    break
                first = segment.find_batch(offset)
                if first is None:
                    continue
                end_position = (
                    segment.size if fetchable_end >= segment.next_offset
                    else segment.position_of(fetchable_end)
                )
                records = segment.read(first, end_position, max_bytes, min_one)
                break
        return ReadInfo(
            records=records,
            high_watermark=self._high_watermark,
            log_start_offset=start,
            log_end_offset=end,
        )

    def list_offset(self, timestamp: int, limit: ReadLimit) -> OffsetAndTimestamp:
        """Kafka's ListOffsets for one partition.

        -1 (latest): the high watermark or log end offset (per ``limit``); -2 (earliest) and
        -4 (earliest local): the log start offset; -5 (latest tiered): none, as nothing is
        tiered. -3 (max timestamp): the batch with the largest maxTimestamp (the first such
        batch), answered with its last offset and that timestamp. Any other timestamp t: the
        first batch whose maxTimestamp >= t, answered with its base offset and maxTimestamp.
        Kafka answers with the first record whose own timestamp is >= t; without decoding
        records the batch's base offset is the closest answer, and a consumer seeking there
        receives that record among the batch. Like Kafka, a batch found at or beyond
        ``limit`` counts as not found: (-1, -1).
        """
        fetchable_end = self._fetchable_end(limit)
        if timestamp == LATEST_TIMESTAMP:
            return OffsetAndTimestamp(
                offset=fetchable_end, timestamp=NO_TIMESTAMP, leader_epoch=NO_LEADER_EPOCH
            )
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            return OffsetAndTimestamp(
                offset=self.log_start_offset, timestamp=NO_TIMESTAMP,
                leader_epoch=NO_LEADER_EPOCH,
            )
        if timestamp == LATEST_TIERED_TIMESTAMP:
            return NOT_FOUND
        if timestamp == MAX_TIMESTAMP:
            best = None
            for segment in self._segments:
                mark = segment.max_timestamp_mark()
                if mark is not None and (best is None or mark.timestamp > best.timestamp):
                    best = mark
            if best is None or best.last_offset >= fetchable_end:
                return NOT_FOUND
            return OffsetAndTimestamp(
                offset=best.last_offset, timestamp=best.timestamp, leader_epoch=best.leader_epoch
            )
        for segment in self._segments:
            batch = segment.find_by_timestamp(timestamp)
            if batch is not None:
                header = batch.header
                if header.base_offset >= fetchable_end:
                    return NOT_FOUND
                return OffsetAndTimestamp(
                    offset=header.base_offset,
                    timestamp=header.max_timestamp,
                    leader_epoch=header.partition_leader_epoch,
                )
        return NOT_FOUND

    # ------------------------------------------------------------------------- life cycle

    def update_config(self, config: TopicConfig) -> None:
        """Apply new topic settings to future appends (and index entries)."""
        self.config = config
        for segment in self._segments:
            segment.index_interval_bytes = config.index_interval_bytes

    def close(self, flush: bool = True) -> None:
        """Close the files; with ``flush``, first force what is only in the page cache to
        disk (as on a clean shutdown)."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            if flush and segment.dirty:
                segment.flush()
            segment.close()
