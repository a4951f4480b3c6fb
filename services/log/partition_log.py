"""One partition replica's log (Kafka's ``UnifiedLog`` over a ``LocalLog``): its segments, log
start and end offsets and high watermark, and the append, read and offset-lookup operations.

Directory ``<data_dir>/<topic>-<partition>/`` holds the segments (``<base>.log``,
``<base>.index``, ``<base>.timeindex`` and ``<base>.txnindex``, see :mod:`services.log.segment`),
the producer snapshots (:mod:`services.log.producer_state`), the leader epoch cache, the
replica state and high watermark checkpoint of a replicated replica, and
``partition.metadata.json``.

Invariants: segments are ordered by base offset and only the last (active) one is appended to;
first segment's base offset <= log start offset <= last stable offset <= high watermark <= LEO,
where LEO (log end offset) is the active segment's next offset, and the last stable offset
(LSO) is the first unstable offset of the producer state (the oldest transaction not yet
decided, or decided by a marker the high watermark has not passed) kept within the log start
offset and the high watermark. The log start offset moves forward only, when
retention deletes the oldest segments or DeleteRecords moves it; offsets below it are out of
range for readers. The recovery point is the offset below which everything is known to be
flushed to disk; opening the log validates what lies past it (:func:`load_segments`).

Retention (``retention.ms``, ``retention.bytes``) and the log start offset delete whole
segments, never the active one and never one holding offsets at or past the high watermark.
The active segment rolls when it would pass ``segment.bytes`` or its first batch is more than
``segment.ms`` older than an append's; the rolled segment is flushed in the background and the
recovery point moves to the new segment. ``flush.messages`` and ``flush.ms`` force flushes
(default: never, relying on the page cache as Kafka does).

Transactions (:mod:`services.log.producer_state`): a leader refuses client control batches
and checks transactional batches against the producer state (verification guards, see
:mod:`services.log.verification`); it writes the markers that end transactions itself
(:meth:`PartitionLog.write_txn_marker`), and each ABORT that ends a transaction here adds an
entry to the transaction index of the segment the marker lands in. Followers take markers as
any batch and account for them the same way, so their producer state, LSO and transaction
indexes match the leader's. READ_LIMIT_LAST_STABLE readers stop at the LSO and get the aborted
transactions of what they read (:meth:`PartitionLog.read_committed`). The LSO moves only when
the high watermark does (a marker is appended at the log end, at or past the high watermark),
so the high watermark reports to the listener cover it.

Compaction (:mod:`services.log.cleaner`) swaps cleaned segments in under the lock
(:meth:`PartitionLog.replace_segments`, crash-safely per :mod:`services.log.segment_swap`); a
cleaned segment may end below the next one's base offset, or be empty, and reads step over
such gaps. Appends to a compacted topic must give every record a key.

Replication (:mod:`services.log.replica_state`, :mod:`services.log.leader_epochs`): a replica
is a leader or a follower at a leader epoch, as the replicator says. Only a leader takes client
appends, stamping each batch's partition leader epoch (a replica created without a state keeps
what the writer gave); a follower takes the leader's batches as they are, gaps included
(:meth:`PartitionLog.append_as_follower`). A leader alone in the ISR commits its appends at
once (high watermark = LEO); otherwise the high watermark moves as its followers' fetches
say they have the records (:mod:`services.log.replica_manager`), and only a leader reports its
moves to the listener (the purgatory). A follower's log is cut back where it
parts from a new leader's (:meth:`PartitionLog.truncate_to`), or started over at the leader's
log start when it ends below it (:meth:`PartitionLog.start_over_at`). A replicated replica's
high watermark is checkpointed (in the node's file, see :mod:`services.log.checkpoint`) every
:data:`HIGH_WATERMARK_CHECKPOINT_MS` while it moves, when it is cut back and on a clean close;
everything below it was committed, so consumers may read it again after a restart before the
replicator confirms the replica's state (without a checkpoint it starts at the log start).

Mutations (appends, segment deletion, flushes) are serialised per partition by an asyncio lock;
offsets are assigned by patching batch headers; reads and lookups run on the event loop without
the lock, which is safe because a mutation changes the in-memory state only after its bytes are
written, with no await in between. Not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, KafkaError, NotEnoughReplicasError
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record_batch import (
    CONTROL_BIT,
    HEADER_SIZE,
    NO_TIMESTAMP,
    Batch,
    read_header,
    set_partition_leader_epoch,
)

from . import metrics, replica_state, segment_swap
from .checkpoint import HIGH_WATERMARK_FILE, HighWatermarkCheckpoint, Snapshot
from .index_file import MAX_RELATIVE_OFFSET
from .leader_epochs import LeaderEpochCache
from .log_dir_failure import LogDirFailureChannel
from .log_validator import assign_offsets, check_keys, stored_batch_problem, validate_append
from .producer_state import (
    CompletedTxn,
    ProducerStateEntry,
    ProducerStateManager,
    marker_of,
    snapshot_name,
)
from .replica_state import FOLLOWER, LEADER, ROLE_NAMES, ReplicaState, commits_alone
from .segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    file_offsets,
)
from .topic_config import TimestampType, TopicConfig
from .transaction_index import AbortedTxn
from .verification import NO_GUARD

log = logging.getLogger(__name__)

# Special timestamps of ListOffsets (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5

NO_OFFSET = -1
NO_LEADER_EPOCH = -1
# Kafka's replica.high.watermark.checkpoint.interval.ms.
HIGH_WATERMARK_CHECKPOINT_MS = 5_000

# How far a reader may see (the log service's ReadLimit): consumers up to the high watermark
# (read_committed ones up to the last stable offset), followers to the end.
HIGH_WATERMARK, LOG_END = log_pb2.READ_LIMIT_HIGH_WATERMARK, log_pb2.READ_LIMIT_LOG_END
LAST_STABLE = log_pb2.READ_LIMIT_LAST_STABLE

HighWatermarkListener = Callable[[str, int, int, int, str, Sequence[int]], None]
"""Called with (topic, partition, new high watermark, leader epoch, topic id, ISR) whenever a
leader's high watermark moves; the ISR is the leader's at that moment."""


def now_ms() -> int:
    return int(time.time() * 1000)


class AppendInfo(NamedTuple):
    """What an append stored: one per partition of every produce, so a tuple (built in
    half the time of a frozen dataclass)."""

    base_offset: int
    last_offset: int
    # The time the batches were stamped with under LogAppendTime, else -1.
    log_append_time_ms: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    batch_count: int
    # The epoch of the leader that stored the batches (-1: a replica without a state).
    leader_epoch: int = NO_LEADER_EPOCH
    # The partition epoch of its state then (the metadata version of its ISR).
    partition_epoch: int = 0


class FoundRecords(NamedTuple):
    """What a read of ``offset`` found: the batches at [start, stop) of ``segment``'s file
    (none when ``segment`` is None or the range is empty)."""

    offset: int
    segment: LogSegment | None
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def read(self) -> bytes:
        """The batches' bytes."""
        if self.segment is None or self.stop <= self.start:
            return b""
        return self.segment.read_range(self.start, self.stop)

    def name_in(self, files: log_pb2.FileRecords) -> bool:
        """Set ``files`` to where the batches lie, for a reader on this host to read them
        there (services.common.file_records); False, leaving it unset, when there are none."""
        if self.segment is None or self.stop <= self.start:
            return False
        files.path, files.inode = self.segment.file_identity
        files.position, files.size = self.start, self.size
        return True


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int = NO_TIMESTAMP
    leader_epoch: int = NO_LEADER_EPOCH


NOT_FOUND = OffsetAndTimestamp(NO_OFFSET)


def directory_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


# Commit waits given up are dropped when the high watermark moves, or once this many wait.
_COMMIT_WAITERS_PRUNED_FROM = 64


class PartitionLog:
    """A partition replica's log."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        topic_id: str,
        config: TopicConfig,
        on_high_watermark: HighWatermarkListener | None = None,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        log_dir: LogDirFailureChannel | None = None,
        high_watermarks: HighWatermarkCheckpoint | None = None,
    ) -> None:
        """Open the log in ``directory`` (created if missing), recovering it (see
        :func:`load_segments`) with the node's checkpointed ``recovery_point``;
        ``log_start_offset`` (from the node's checkpoint) is kept within the loaded offsets.
        ``log_dir`` is the node's log directory: once it has failed, every mutation answers
        KAFKA_STORAGE_ERROR, each write first reserves its bytes under the free-space floor,
        and a write failure in the background (a rolled segment's flush, a checkpoint) fails
        it. ``high_watermarks``: the node's high watermark checkpoint, read already and
        written by the node except when this log is cut back; without one the log keeps its
        own in its directory and writes it itself."""
        self.directory = directory
        self.log_dir = log_dir or LogDirFailureChannel(directory.parent)
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.config = config
        # The topic's configs as given (raw strings, Kafka names), those the log does not act
        # on included (replication throttles).
        self.topic_configs: dict[str, str] = {}
        # Bytes of torn or corrupt data that recovery removed when the log was opened.
        self._segments, self.truncated_at_open = load_segments(directory, config, recovery_point)
        self._on_high_watermark = on_high_watermark
        self._log_start_offset = min(
            max(log_start_offset, self._segments[0].base_offset), self.log_end_offset)
        self._high_watermark = self.log_end_offset
        self._lock = asyncio.Lock()
        self._closed = False
        # Everything below this offset is on disk.
        self.recovery_point = self.log_end_offset
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._background: set[asyncio.Task[None]] = set()
        # Producers' epochs, last batches and transactions; the replay also rebuilds the
        # transaction indexes that were lost or whose segments were recovered.
        self.producer_state = ProducerStateManager(directory)
        self.producer_state.load(self._segments, self.log_end_offset, rebuild_from=min(
            (s.base_offset for s in self._segments if s.txn_index_stale), default=None))
        self.leader_epochs = LeaderEpochCache(directory)
        self.leader_epochs.truncate_from_end(self.log_end_offset)
        # Where the high watermark is checkpointed: the node's file, or this log's own.
        self._owns_high_watermarks = high_watermarks is None
        if high_watermarks is None:
            high_watermarks = HighWatermarkCheckpoint(directory / HIGH_WATERMARK_FILE,
                                                      self._replicated_high_watermark)
            high_watermarks.read()
        self._high_watermarks = high_watermarks
        self._last_high_watermark_checkpoint_ms = now_ms()
        # Long-poll readers waiting for the log end offset to grow (or the state to change).
        self._waiters: set[asyncio.Future[None]] = set()
        # Counts changes a follower is told of: appends, high watermark, log start offset,
        # state, cuts, the close (a follower's fetch session skips a partition it told all
        # while this stands still, see services.log.replica_manager).
        self.changes = 0
        # Acks=all appends whose answers wait for the high watermark to pass them: (their end
        # offset, the future of the ISR it passed them with; None: the state changed first).
        self._commit_waiters: list[tuple[int, asyncio.Future[tuple[int, ...] | None]]] = []
        self.state = replica_state.restored(replica_state.read(directory))
        if not commits_alone(self.state):
            # What was committed when the high watermark was last checkpointed, never past
            # what recovery kept; without a checkpoint nothing is known to be committed, and
            # consumers see nothing they might later have to unsee until the replicator says.
            stored = high_watermarks.stored.get((topic, partition))
            self._high_watermark = self._log_start_offset if stored is None else min(
                max(stored, self._log_start_offset), self.log_end_offset)
        self.producer_state.on_high_watermark(self._high_watermark)

    # ---------------------------------------------------------------------------- offsets

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

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
        offset = min(max(offset, self._log_start_offset), self.log_end_offset)
        if offset != self._high_watermark:
            self._high_watermark = offset
            self.changes += 1
            if self.producer_state.first_unstable_offset is not None:
                self.producer_state.on_high_watermark(offset)
            # Readers and producers wait on the leader's high watermark only.
            if self._on_high_watermark is not None and self.state.role == LEADER:
                self._on_high_watermark(self.topic, self.partition, offset,
                                        self.state.leader_epoch, self.topic_id,
                                        tuple(self.state.isr))
            if self._commit_waiters and self.state.role == LEADER:
                self._commit_passed(offset)

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: every offset below it is decided (no transaction of it is still open,
        or ended by a marker the high watermark has not passed); the high watermark when
        nothing is undecided below it."""
        first_unstable = self.producer_state.first_unstable_offset
        high_watermark = self._high_watermark
        if first_unstable is None or first_unstable >= high_watermark:
            return high_watermark
        return max(first_unstable, self._log_start_offset)

    @property
    def last_stable_offset_lag(self) -> int:
        return self._high_watermark - self.last_stable_offset

    @property
    def ongoing_transactions(self) -> int:
        return self.producer_state.ongoing_count

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

    async def append(
        self, records: bytes | bytearray | memoryview, now_ms: int | None = None,
        expected_log_end_offset: int | None = None, verification_guard: int = NO_GUARD,
        min_insync_replicas: int = 0,
    ) -> AppendInfo:
        """Validate and append the record batches of one produce to this partition (as its
        leader), assigning offsets from the log end offset on. All or nothing: a bad batch
        (see :func:`~services.log.log_validator.validate_append` and
        :meth:`~services.log.producer_state.ProducerStateManager.validate`) stores none of
        them. With ``expected_log_end_offset`` the append is conditional (a compare-and-set):
        it happens only if the log end offset equals it, else INVALID_UPDATE_VERSION; such
        appends are a coordinator's (not verified, no sequences needed). A transactional batch
        that would start its producer's transaction here needs ``verification_guard`` (see
        :mod:`services.log.verification`). An acks=all write passes ``min_insync_replicas``:
        with a smaller ISR (as this leader has it at that moment) nothing is stored,
        NOT_ENOUGH_REPLICAS (Kafka's check in ``Partition.appendRecordsToLeader``).

        The batches are patched (offsets, leader epoch) in a buffer of the append's own: a
        copy of ``records``, or ``records`` itself when it is a bytearray, which the caller
        hands over (it must not use it afterwards)."""
        config = self.config
        coordinator = expected_log_end_offset is not None
        batches = validate_append(records, config.max_message_bytes, coordinator)
        if config.compacts:
            check_keys(records, batches, f"{self.topic}-{self.partition}")  # decodes records
        if len(records) > config.segment_bytes:
            raise KafkaError(
                ErrorCode.record_list_too_large,
                f"{len(records)} bytes of batches exceed segment.bytes {config.segment_bytes}",
            )
        buffer = records if isinstance(records, bytearray) else bytearray(records)
        append_time: int | None = None
        if config.message_timestamp_type is TimestampType.LOG_APPEND_TIME:
            append_time = int(time.time() * 1000) if now_ms is None else now_ms
        async with self._lock:
            self._check_open()
            self._check_role(LEADER)
            state = self.state
            # Checked under the lock: two writes see the ISR in the order they are stored.
            if min_insync_replicas > 1 and min_insync_replicas > len(state.isr):
                raise NotEnoughReplicasError(state.isr, min_insync_replicas, self.topic,
                                             self.partition)
            base_offset = self.log_end_offset
            if expected_log_end_offset is not None and expected_log_end_offset != base_offset:
                raise KafkaError(ErrorCode.invalid_update_version,
                                 f"log end offset is {base_offset}, not {expected_log_end_offset}")
            producers = self.producer_state.validate(
                batches, verification_guard=verification_guard, coordinator=coordinator)
            if producers is not None and producers.duplicate is not None:
                duplicate = producers.duplicate  # stored already: its offsets, nothing appended
                return self._answer(duplicate.first_offset, duplicate.last_offset,
                                    None if append_time is None else duplicate.timestamp, 0, 0)
            next_offset = assign_offsets(buffer, batches, base_offset, append_time)
            if next_offset - 1 - base_offset > MAX_RELATIVE_OFFSET:
                raise KafkaError(ErrorCode.invalid_record, "offset range of the append too large")
            if state.leader_epoch >= 0:
                # Outside the CRC, like the base offset: stamped in place.
                for batch in batches:
                    set_partition_leader_epoch(buffer, batch.position, state.leader_epoch)
                self.leader_epochs.assign(state.leader_epoch, base_offset)
            max_timestamp = append_time if append_time is not None else max(
                batch.header.max_timestamp for batch in batches)
            self.log_dir.reserve(len(buffer))
            segment = self._maybe_roll(len(buffer), next_offset - 1, max_timestamp)
            segment.append(buffer, [batch.position for batch in batches])
            if producers is not None:
                self.producer_state.complete(producers, base_offset, append_time)
            if self._appended_locked(next_offset - base_offset):
                await self._flush_locked()
            return self._answer(base_offset, next_offset - 1, append_time, len(buffer),
                                len(batches))

    def _answer(self, base_offset: int, last_offset: int, append_time: int | None, size: int,
                batch_count: int) -> AppendInfo:
        state = self.state
        # By position, in the order of AppendInfo's fields (half the cost of keywords).
        return AppendInfo(
            base_offset, last_offset, NO_TIMESTAMP if append_time is None else append_time,
            self._log_start_offset, self.log_end_offset, self._high_watermark, size,
            batch_count, state.leader_epoch, state.partition_epoch)

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, committed: bool, coordinator_epoch: int,
        now_ms: int | None = None,
    ) -> AppendInfo:
        """End the producer's transaction on this partition (as its leader): append a COMMIT
        or ABORT control batch for it, stamped with the broker time (Kafka's
        ``appendAsLeader`` of a marker from the coordinator). Raises INVALID_PRODUCER_EPOCH or
        TRANSACTION_COORDINATOR_FENCED for a marker older than what the producer state has
        seen (see :meth:`ProducerStateManager.check_marker`), NOT_LEADER_OR_FOLLOWER on a
        follower. A producer without an ongoing transaction here gets its marker too; an ABORT
        that ends one is added to the transaction index of the marker's segment; and
        INVALID_PRODUCER_EPOCH for an epoch no producer can have (Kafka's is an INT16)."""
        if not -0x8000 <= producer_epoch <= 0x7FFF:
            raise KafkaError(ErrorCode.invalid_producer_epoch,
                             f"producer epoch {producer_epoch} is not an INT16")
        marker = EndTransactionMarker(
            type=ControlRecordType.COMMIT if committed else ControlRecordType.ABORT,
            coordinator_epoch=coordinator_epoch)
        timestamp = int(time.time() * 1000) if now_ms is None else now_ms
        append_time = timestamp if (
            self.config.message_timestamp_type is TimestampType.LOG_APPEND_TIME) else None
        async with self._lock:
            self._check_open()
            self._check_role(LEADER)
            self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            state = self.state
            base_offset = self.log_end_offset
            buffer = bytearray(build_end_transaction_batch(
                marker, producer_id=producer_id, producer_epoch=producer_epoch,
                timestamp=timestamp, partition_leader_epoch=state.leader_epoch))
            assign_offsets(buffer, [Batch(0, read_header(buffer))], base_offset, append_time)
            if state.leader_epoch >= 0:
                self.leader_epochs.assign(state.leader_epoch, base_offset)
            self.log_dir.reserve(len(buffer))
            segment = self._maybe_roll(len(buffer), base_offset, timestamp)
            segment.append(buffer, (0,))
            completed = self.producer_state.end_transaction(
                producer_id, producer_epoch, marker, base_offset, timestamp)
            self._index_completed(segment, completed)
            metrics.TXN_MARKERS.labels(marker.type.name).inc()
            if self._appended_locked(1):
                await self._flush_locked()
            return self._answer(base_offset, base_offset, append_time, len(buffer), 1)

    @staticmethod
    def _index_completed(segment: LogSegment, completed: CompletedTxn | None) -> None:
        """A marker in ``segment`` ended a transaction: an abort goes in its index."""
        if completed is not None and completed.aborted:
            segment.txn_index.append(completed.aborted_txn)
            metrics.ABORTED_TRANSACTIONS.inc()

    def active_producers(self) -> list[ProducerStateEntry]:
        """The producers this leader knows (Kafka's DescribeProducers), by producer id;
        NOT_LEADER_OR_FOLLOWER on a follower."""
        self._check_open()
        self._check_role(LEADER)
        return self.producer_state.entries()

    def _appended_locked(self, messages: int) -> bool:
        """After an append of either kind: wake the long-poll readers, commit at once if
        alone in the ISR; returns whether flush.messages asks for a flush now."""
        self.wake_readers()
        if commits_alone(self.state):
            self.high_watermark = self.log_end_offset
        self._unflushed_messages += messages
        return self._unflushed_messages >= self.config.flush_messages

    def _maybe_roll(self, append_size: int, last_offset: int, max_timestamp: int) -> LogSegment:
        """The segment to append to: a new one when the active one would grow past
        segment.bytes, cannot index ``last_offset``, or is too old for segment.ms: its first
        batch's timestamp (else its creation time) is more than segment.ms before the append's
        largest timestamp (else now). An empty segment always takes the append, so a set of
        batches larger than segment.bytes still fits somewhere."""
        active = self._segments[-1]
        if active.size == 0:
            return active
        first = active.first_timestamp()
        if first >= 0 and max_timestamp >= 0:
            waited = max_timestamp - first
        else:
            waited = now_ms() - active.created_ms
        if (
            active.size + append_size <= self.config.segment_bytes
            and active.can_hold(last_offset)
            and waited <= self.config.segment_ms
        ):
            return active
        return self._roll()

    def _roll(self) -> LogSegment:
        """Start a new active segment at the log end; the previous one is flushed in the
        background, after which the recovery point moves to the new segment."""
        previous = self._segments[-1]
        self.producer_state.take_snapshot(self.log_end_offset)
        rolled = LogSegment.create(
            self.directory, self.log_end_offset, self.config.index_interval_bytes
        )
        self._segments.append(rolled)
        log.debug("%s-%d: rolled segment %d", self.topic, self.partition, rolled.base_offset)
        flush = self._flush_rolled(previous, rolled.base_offset)
        try:
            task = asyncio.get_running_loop().create_task(flush)
        except RuntimeError:
            flush.close()  # no loop (a synchronous caller): the next flush covers it
            return rolled
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return rolled

    async def _flush_rolled(self, segment: LogSegment, upto: int) -> None:
        """Flush a segment that just stopped being active, then advance the recovery point.
        Its data no longer changes, so the fsync runs in a thread without the lock; the
        segment is kept from deletion meanwhile."""
        segment.pinned += 1
        try:
            if segment.dirty:
                await asyncio.to_thread(segment.flush)
        except OSError as exc:
            self.log_dir.fail(exc, f"flushing {segment.log_path}")
            return
        finally:
            segment.pinned -= 1
        if not self._closed and all(
            not s.dirty for s in self._segments if s.base_offset < upto
        ):
            self.recovery_point = max(self.recovery_point, upto)

    # ------------------------------------------------------------------------ replication

    async def become(self, state: ReplicaState) -> bool:
        """Take the place the replicator gives this replica (Kafka's ``makeLeader`` and
        ``makeFollower``). A state from an older leader epoch than the replica's is refused
        with FENCED_LEADER_EPOCH. A leader taking office at a new epoch records that the epoch
        starts at the log end offset; a leader alone in the ISR commits everything it has.
        The state is stored before it takes effect. Returns whether anything changed."""
        if state.role not in (LEADER, FOLLOWER):
            raise KafkaError(ErrorCode.invalid_request, "a replica state must lead or follow")
        state = replica_state.copy(state)
        async with self._lock:
            self._check_open()
            current = self.state
            if state.leader_epoch < current.leader_epoch:
                raise KafkaError(
                    ErrorCode.fenced_leader_epoch,
                    f"{self.topic}-{self.partition} is at leader epoch {current.leader_epoch}, "
                    f"newer than {state.leader_epoch}")
            if state == current:
                return False
            replica_state.write(self.directory, state)
            self.state = state
            if (state.role, state.leader_epoch) != (LEADER, current.leader_epoch):
                self._end_commit_waits()
            if state.role == LEADER:
                self.leader_epochs.assign(state.leader_epoch, self.log_end_offset)
            if commits_alone(state):
                self.high_watermark = self.log_end_offset
            self.wake_readers()  # a long poll answers for the new state at once
            if not replica_state.same_place(state, current):
                log.info("%s-%d: %s at leader epoch %d%s%s", self.topic, self.partition,
                         ROLE_NAMES[state.role], state.leader_epoch,
                         f", ISR {list(state.isr)}" if state.isr else "",
                         " (alone in the ISR)" if commits_alone(state) else "")
            return True

    def _check_role(self, role: int) -> None:
        if self.state.role != role:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"this replica of {self.topic}-{self.partition} is not "
                             f"{'the' if role == LEADER else 'a'} {ROLE_NAMES[role]} "
                             f"(it is {ROLE_NAMES[self.state.role]})")

    def _check_epoch(self, leader_epoch: int) -> None:
        current = self.state.leader_epoch
        if leader_epoch < current:
            raise KafkaError(ErrorCode.fenced_leader_epoch,
                             f"leader epoch {leader_epoch} is older than {current}")
        if leader_epoch > current:
            raise KafkaError(ErrorCode.unknown_leader_epoch,
                             f"leader epoch {leader_epoch} is newer than {current}")

    async def append_as_follower(
        self, records: bytes, leader_epoch: int, high_watermark: int = NO_OFFSET
    ) -> None:
        """Append the leader's batches as they are (Kafka's ``appendAsFollower``): offsets,
        epochs and timestamps were set by the leader. The batches must be intact (framing,
        magic, CRC) and go on from this log: the first starts at or after the log end offset,
        each next one at or after the end of the one before. Gaps are allowed, as in Kafka: a
        compacted leader's log has them where the cleaner removed whole batches. An overlap
        stores nothing and is OFFSET_OUT_OF_RANGE (the caller resumes from the log end).
        ``leader_epoch`` must be this replica's epoch (FENCED_LEADER_EPOCH when older,
        UNKNOWN_LEADER_EPOCH when newer) and the replica a follower (else
        NOT_LEADER_OR_FOLLOWER). Then the high watermark moves up to ``high_watermark``
        (within the log end; -1: unchanged)."""
        self._check_role(FOLLOWER)
        self._check_epoch(leader_epoch)
        if records:
            async with self._lock:
                self._check_open()
                # The lock was awaited: the state may have moved on meanwhile.
                self._check_role(FOLLOWER)
                self._check_epoch(leader_epoch)
                self._maybe_restart_empty(records)
                batches = _validate_replicated(records, self.log_end_offset)
                last = batches[-1].header
                max_timestamp = max(b.header.max_timestamp for b in batches)
                self.log_dir.reserve(len(records))
                segment = self._maybe_roll(len(records), last.last_offset, max_timestamp)
                segment.append(records, [b.position for b in batches])
                for position, header in batches:
                    if header.attributes & CONTROL_BIT and header.producer_id >= 0:
                        marker = marker_of(memoryview(records)[position:position + header.size],
                                           header)
                        self._index_completed(segment, self.producer_state.replay(header,
                                                                                  marker))
                    else:
                        self.producer_state.replay(header)
                    self.leader_epochs.assign(header.partition_leader_epoch, header.base_offset)
                if self._appended_locked(last.next_offset - batches[0].header.base_offset):
                    await self._flush_locked()
        if high_watermark >= 0 and high_watermark > self._high_watermark:
            self.high_watermark = high_watermark

    def _maybe_restart_empty(self, records: bytes) -> None:
        """An empty log started at an offset inside the leader's first batch (its log start
        offset was inside that batch, see :meth:`start_over_at`), and the leader sends that
        batch whole: the log starts at the batch's base offset instead (as Kafka's follower
        does on an UnexpectedAppendOffsetException). Call with the lock held."""
        if self.size_bytes or len(self._segments) != 1 or len(records) < HEADER_SIZE:
            return
        header = read_header(records)
        end = self.log_end_offset
        if header.base_offset < end <= header.last_offset:
            self._start_over_locked(header.base_offset)
            log.info("%s-%d: empty log now starts at %d, the leader's first batch", self.topic,
                     self.partition, header.base_offset)

    def advance_high_watermark(self, high_watermark: int) -> bool:
        """A leader's high watermark computed over its ISR: it only moves forward, and never
        past the log end offset. Returns whether it moved."""
        if high_watermark > self._high_watermark:
            before = self._high_watermark
            self.high_watermark = high_watermark
            return self._high_watermark != before
        return False

    async def truncate_to(self, offset: int) -> int:
        """Cut the log so that it ends at ``offset`` (Kafka's ``truncateTo``): a follower's log
        that went past its new leader's, found through the leader epochs. Whole batches go: an
        offset inside a batch cuts before that batch. An offset at or past the log end changes
        nothing; one below the log start offset cuts down to it. A leader's log is never cut
        (NOT_LEADER_OR_FOLLOWER). The producer state and the leader epochs follow the new log
        end; the high watermark and the recovery point do not stay beyond it. Returns the log
        end offset after the cut."""
        async with self._lock:
            self._check_cut()
            end = self.log_end_offset
            if offset >= end:
                return end
            offset = max(offset, self._log_start_offset)
            await self.drain()  # no background flush may hold a segment about to go
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                self._segments.pop().delete()
            removed = self._segments[-1].truncate_to(offset)
            new_end = self.log_end_offset
            self.producer_state.load(self._segments, new_end)
            self.leader_epochs.truncate_from_end(new_end)
            self._high_watermark = min(self._high_watermark, new_end)
            self.changes += 1
            self.producer_state.on_high_watermark(self._high_watermark)
            self.recovery_point = min(self.recovery_point, new_end)
            self.checkpoint_high_watermark()  # a restart must not find the old one
            log.warning("%s-%d: truncated from %d to %d (%d byte(s) of the last segment)",
                        self.topic, self.partition, end, new_end, removed)
            return new_end

    async def start_over_at(self, offset: int) -> None:
        """Drop the whole log and continue, empty, at ``offset`` (Kafka's
        ``truncateFullyAndStartAt``): a follower whose log ends below its leader's log start
        offset can never catch up by copying. The producer state and leader epochs go with
        the data. Only a follower (NOT_LEADER_OR_FOLLOWER for a leader)."""
        async with self._lock:
            self._check_cut()
            await self.drain()
            end = self.log_end_offset
            self._start_over_locked(offset)
            log.warning("%s-%d: log [.., %d) dropped; starting over at %d", self.topic,
                        self.partition, end, offset)

    def _check_cut(self) -> None:
        self._check_open()
        if self.state.role == LEADER:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"the leader of {self.topic}-{self.partition} is never cut")

    def _start_over_locked(self, offset: int) -> None:
        """Replace the log by one empty segment at ``offset``, with the producer snapshots
        and leader epochs of the data that goes."""
        for segment in self._segments:
            segment.delete()
        self._segments = [
            LogSegment.create(self.directory, offset, self.config.index_interval_bytes)]
        self._log_start_offset = self._high_watermark = self.recovery_point = offset
        self.changes += 1
        self.checkpoint_high_watermark()
        for snapshot in self.producer_state.snapshot_offsets():
            (self.directory / snapshot_name(snapshot)).unlink(missing_ok=True)
        self.producer_state.load(self._segments, offset)
        self.leader_epochs.truncate_from_end(0)

    def wake_on_change(self, waiter: asyncio.Future[None]) -> None:
        """Complete ``waiter`` at the next append of either kind, or change of the replica's
        state (a long-poll reader awaits it; one future may wait on many logs)."""
        self._waiters.add(waiter)

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def committed(self, offset: int) -> asyncio.Future[tuple[int, ...] | None]:
        """The ISR with which this leader's high watermark passes ``offset`` (the end of an
        acks=all append), once it does; None if the replica's state changes first (it no longer
        leads, or leads at another epoch, or closes): what it appended is then not known to be
        committed here. The caller cancels the future when it stops waiting."""
        future: asyncio.Future[tuple[int, ...] | None] = (
            asyncio.get_running_loop().create_future())
        if self._high_watermark >= offset and self.state.role == LEADER:
            future.set_result(tuple(self.state.isr))
            return future
        if len(self._commit_waiters) >= _COMMIT_WAITERS_PRUNED_FROM:
            # Waits given up (cancelled) while the high watermark stood still.
            self._commit_waiters = [w for w in self._commit_waiters if not w[1].done()]
        self._commit_waiters.append((offset, future))
        return future

    def _commit_passed(self, high_watermark: int) -> None:
        isr = tuple(self.state.isr)
        waiting = []
        for offset, future in self._commit_waiters:
            if future.done():
                continue
            if offset <= high_watermark:
                future.set_result(isr)
            else:
                waiting.append((offset, future))
        self._commit_waiters = waiting

    def _end_commit_waits(self) -> None:
        waiters, self._commit_waiters = self._commit_waiters, []
        for _, future in waiters:
            if not future.done():
                future.set_result(None)

    def wake_readers(self) -> None:
        """Complete every waiting long-poll reader now (the node stops)."""
        self.changes += 1
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # ------------------------------------------------------------------------------ reads

    def _slot_of(self, offset: int) -> int:
        """Where in the segments the one that would hold ``offset`` is."""
        return max(bisect_right(self._segments, offset, key=attrgetter("base_offset")) - 1, 0)

    def _fetchable_end(self, limit: int) -> int:
        if limit == LOG_END:
            return self.log_end_offset
        return self.last_stable_offset if limit == LAST_STABLE else self._high_watermark

    def read(self, offset: int, max_bytes: int, limit: int, min_one: bool = True) -> bytes:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (with
        ``min_one``, the first batch whole even if larger) and never past ``limit``. Like
        Kafka, a read returns data of a single segment. ``offset`` equal to the log end offset
        (or between the high watermark, or the last stable offset, and the end for consumers)
        gives no records; outside [log start, log end] it is OFFSET_OUT_OF_RANGE."""
        return self.locate(offset, max_bytes, limit, min_one).read()

    def read_committed(self, offset: int, max_bytes: int,
                       min_one: bool = True) -> tuple[bytes, list[AbortedTxn]]:
        """A read_committed read (Kafka's READ_COMMITTED fetch): :meth:`read` up to the last
        stable offset, with the aborted transactions that overlap the records returned, by
        first offset (none without records)."""
        found = self.locate(offset, max_bytes, LAST_STABLE, min_one)
        return found.read(), self.aborted_within(found)

    def aborted_within(self, found: FoundRecords) -> list[AbortedTxn]:
        """The aborted transactions overlapping the records of ``found`` (a read_committed
        :meth:`locate`). Their range ends, as Kafka bounds it, at the offset of the first
        batch after the data (the next segment's base offset or the log end offset when the
        data ends its segment)."""
        segment = found.segment
        if segment is None or not found.size:
            return []
        if found.stop < segment.size:
            upper = segment.batch_at(found.stop).header.base_offset
        else:
            slot = self._slot_of(segment.base_offset) + 1
            upper = self._segments[slot].base_offset if slot < len(self._segments) else (
                self.log_end_offset)
        return self.collect_aborted_transactions(found.offset, upper)

    def collect_aborted_transactions(self, start: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping offsets [``start``, ``upper_bound``), by first
        offset, from the transaction indexes of the segment holding ``start`` and on, until
        one says the search is complete (Kafka's ``collectAbortedTransactions``)."""
        found: list[AbortedTxn] = []
        for segment in self._segments[self._slot_of(start):]:
            txns, complete = segment.txn_index.collect(start, upper_bound)
            found += txns
            if complete:
                break
        found.sort(key=attrgetter("first_offset"))
        return found

    def locate(self, offset: int, max_bytes: int, limit: int,
               min_one: bool = True) -> FoundRecords:
        """Where the batches :meth:`read` returns lie: a segment and a range of its file
        (no segment when there are none), without reading them."""
        start, end = self.log_start_offset, self.log_end_offset
        if offset < start or offset > end:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"offset {offset} is outside [{start}, {end}] of {self.topic}-{self.partition}",
            )
        fetchable_end = self._fetchable_end(limit)
        if offset < fetchable_end:
            for segment in self._segments[self._slot_of(offset):]:
                if segment.base_offset >= fetchable_end:
                    break
                first = segment.find_batch(offset)
                if first is None:
                    continue
                end_position = (
                    segment.size if fetchable_end >= segment.next_offset
                    else segment.position_of(fetchable_end)
                )
                return FoundRecords(offset, segment,
                                    *segment.locate(first, end_position, max_bytes, min_one))
        return FoundRecords(offset, None, 0, 0)

    def list_offset(self, timestamp: int, limit: int) -> OffsetAndTimestamp:
        """Kafka's ListOffsets for one partition.

        -1 (latest): the high watermark or log end offset (per ``limit``); -2 (earliest) and
        -4 (earliest local): the log start offset; -5 (latest tiered): none, as nothing is
        tiered. -3 (max timestamp): the first record carrying the largest timestamp (in the
        first batch with the largest maxTimestamp), with that timestamp. Any other timestamp t:
        the first record at or after the log start whose own timestamp is >= t, with its
        timestamp; the records of the batches that may hold it are decoded (it is not a hot
        path). Each answer carries its batch's leader epoch. Like Kafka, a record found at or
        beyond ``limit`` counts as not found: (-1, -1).
        """
        fetchable_end = self._fetchable_end(limit)
        if timestamp == LATEST_TIMESTAMP:
            return OffsetAndTimestamp(fetchable_end)
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            return OffsetAndTimestamp(self.log_start_offset)
        if timestamp == LATEST_TIERED_TIMESTAMP:
            return NOT_FOUND
        found: tuple[int, int, int] | None = None
        if timestamp == MAX_TIMESTAMP:
            stored = [segment for segment in self._segments if segment.size]
            if stored:
                found = max(stored, key=attrgetter("max_timestamp")).offset_of_max_timestamp()
        else:
            start = self._log_start_offset
            for segment in self._segments[self._slot_of(start):]:
                found = segment.find_by_timestamp(timestamp, start)
                if found is not None:
                    break
        if found is None or found[0] >= fetchable_end:
            return NOT_FOUND
        return OffsetAndTimestamp(*found)

    # ------------------------------------------------------- log start offset and retention

    async def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords for this partition: move the log start offset up to
        ``offset`` (-1: the high watermark) and delete the segments wholly below it. Returns
        the new log start offset (the "low watermark"). An offset beyond the high watermark,
        or negative other than -1, is OFFSET_OUT_OF_RANGE; one below the current log start
        changes nothing."""
        async with self._lock:
            self._check_open()
            if offset == -1:
                offset = self._high_watermark
            if offset < 0 or offset > self._high_watermark:
                raise KafkaError(
                    ErrorCode.offset_out_of_range,
                    f"cannot delete records of {self.topic}-{self.partition} before {offset}: "
                    f"the high watermark is {self._high_watermark}",
                )
            if offset > self._log_start_offset:
                log.info("%s-%d: log start offset %d -> %d (DeleteRecords)", self.topic,
                         self.partition, self._log_start_offset, offset)
                self._log_start_offset = offset
                self.changes += 1
            self._delete_segments(lambda segment, next_base: next_base <= self._log_start_offset,
                                  "log start offset")
            return self._log_start_offset

    async def enforce_retention(self, now: int | None = None) -> int:
        """Kafka's ``deleteOldSegments``: with cleanup.policy delete, remove the oldest
        segments whose newest batch is older than retention.ms, then the oldest ones while
        the log exceeds retention.bytes; whatever the policy, the segments wholly below the
        log start offset. Never the active segment, nor one reaching the high watermark.
        Returns the number of segments deleted."""
        now = now_ms() if now is None else now
        async with self._lock:
            if self._closed:
                return 0
            config = self.config
            deleted = 0
            if config.deletes and config.retention_ms >= 0:
                deleted += self._delete_segments(
                    lambda segment, _: now - segment.largest_timestamp() > config.retention_ms,
                    "retention.ms")
            if config.deletes and config.retention_bytes >= 0:
                excess = self.size_bytes - config.retention_bytes

                def over_size(segment: LogSegment, _: int) -> bool:
                    nonlocal excess
                    if excess - segment.size < 0:
                        return False
                    excess -= segment.size
                    return True

                deleted += self._delete_segments(over_size, "retention.bytes")
            deleted += self._delete_segments(
                lambda segment, next_base: next_base <= self._log_start_offset,
                "log start offset")
            return deleted

    def _delete_segments(
        self, deletable: Callable[[LogSegment, int], bool], reason: str
    ) -> int:
        """Delete segments from the oldest on while ``deletable(segment, next base offset)``,
        leaving the active one and any reaching the high watermark; the log start offset
        follows the first remaining segment. Call with the lock held."""
        count = 0
        while len(self._segments) > 1:
            segment, next_base = self._segments[0], self._segments[1].base_offset
            if next_base > self._high_watermark or segment.pinned or not deletable(
                segment, next_base
            ):
                break
            self._segments.pop(0)
            segment.delete()
            count += 1
            log.info("%s-%d: deleted segment %d (%s)", self.topic, self.partition,
                     segment.base_offset, reason)
        if count:
            self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
            self.changes += 1
        return count

    async def replace_segments(
        self, old: Sequence[LogSegment], sizes: Sequence[int] | None = None
    ) -> bool:
        """Swap in the cleaned segment written beside this log's files (``<base>.log.cleaned``
        and its indexes, flushed, at the first old segment's base offset) for ``old``,
        consecutive non-active segments of this log (see :mod:`services.log.segment_swap`),
        whose sizes are still ``sizes`` (what was cleaned). Returns False, with the cleaned
        files removed, if the log was closed, ``old`` are no longer all its non-active segments
        (retention, DeleteRecords or a truncation removed some), one changed size or is in use
        by a background flush; nothing changes then."""
        async with self._lock:
            count, cleaned_base = len(old), old[0].base_offset
            first = next((i for i, s in enumerate(self._segments) if s is old[0]), -1)
            if (
                self._closed or first < 0 or first + count >= len(self._segments)
                or self._segments[first:first + count] != list(old)
                or any(s.pinned for s in old)
                or (sizes is not None and [s.size for s in old] != list(sizes))
            ):
                segment_swap.discard(self.directory, cleaned_base)
                return False
            deleted = segment_swap.commit(
                self.directory, cleaned_base, [s.base_offset for s in old])
            cleaned = LogSegment(self.directory, cleaned_base, self.config.index_interval_bytes)
            cleaned.load()
            self._segments[first:first + count] = [cleaned]
            for segment in old:
                segment.close()
            segment_swap.remove_deleted(deleted)
            log.info("%s-%d: swapped in cleaned segment %d for %d segment(s)", self.topic,
                     self.partition, cleaned_base, count)
            return True

    # ------------------------------------------------------------------------------ flush

    async def flush(self) -> None:
        """Force everything appended so far to disk; the recovery point becomes the log
        end offset."""
        async with self._lock:
            self._check_open()
            await self._flush_locked()

    async def maybe_flush_by_time(self, now: int | None = None) -> bool:
        """Flush if flush.ms passed since the last flush and something is unflushed. Also
        checkpoints the high watermark when :data:`HIGH_WATERMARK_CHECKPOINT_MS` passed since
        the last time (the node calls this every second or so)."""
        now = now_ms() if now is None else now
        if self._closed:
            return False
        if (self._owns_high_watermarks
                and now - self._last_high_watermark_checkpoint_ms >= HIGH_WATERMARK_CHECKPOINT_MS):
            self._last_high_watermark_checkpoint_ms = now
            snapshot = self._high_watermarks.take()
            await asyncio.to_thread(self._write_high_watermark, snapshot)
        if now - self._last_flush_ms < self.config.flush_ms:
            return False
        if not any(segment.dirty for segment in self._segments):
            return False
        await self.flush()
        return True

    async def _flush_locked(self) -> None:
        end = self.log_end_offset
        dirty = [segment for segment in self._segments if segment.dirty]
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        if dirty:
            await asyncio.to_thread(lambda: [segment.flush() for segment in dirty])
        self.recovery_point = max(self.recovery_point, end)

    def checkpoint_high_watermark(self) -> bool:
        """Write the high watermarks of the checkpoint this log uses (its own, or the node's:
        see :mod:`services.log.checkpoint`) if they changed since the last write. Returns
        whether it wrote. A write failure is logged: a missing or older checkpoint only hides
        more from consumers after a restart."""
        return self._write_high_watermark(self._high_watermarks.take())

    def _write_high_watermark(self, snapshot: Snapshot) -> bool:
        try:
            return self._high_watermarks.write(snapshot)
        except OSError as exc:
            self.log_dir.fail(exc, f"checkpointing the high watermark of {self.directory}")
            return False

    def _replicated_high_watermark(self) -> dict[tuple[str, int], int]:
        """This log's entry in its own checkpoint: none while it commits alone."""
        if commits_alone(self.state):
            return {}
        return {(self.topic, self.partition): self._high_watermark}

    def _check_open(self) -> None:
        """Raise UNKNOWN_TOPIC_OR_PARTITION once deleted, KAFKA_STORAGE_ERROR once the log
        directory failed (checked under the lock: nothing is written after a failure)."""
        if self._closed:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             f"{self.topic}-{self.partition} was deleted")
        self.log_dir.check_online()

    # ------------------------------------------------------------------------- life cycle

    def update_config(self, config: TopicConfig) -> None:
        """Apply new topic settings to future appends (and index entries)."""
        self.config = config
        for segment in self._segments:
            segment.index_interval_bytes = config.index_interval_bytes

    async def drain(self) -> None:
        """Wait for background flushes to finish (before closing)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def close(self, flush: bool = True) -> None:
        """Close the files; with ``flush``, first force what is only in the page cache to
        disk (as on a clean shutdown), after which the recovery point is the log end."""
        if self._closed:
            return
        self._closed = True
        self.changes += 1
        self._end_commit_waits()
        try:
            if flush and not self.log_dir.offline:
                for segment in self._segments:
                    if segment.dirty:
                        segment.flush()
                self.recovery_point = self.log_end_offset
                self.producer_state.take_snapshot(self.log_end_offset)
                if self._owns_high_watermarks:
                    self.checkpoint_high_watermark()
        finally:
            for segment in self._segments:
                segment.close(write_waiting=not self.log_dir.offline)


def load_segments(
    directory: Path, config: TopicConfig, recovery_point: int
) -> tuple[list[LogSegment], int]:
    """The segments in ``directory`` (Kafka's ``LogLoader``), after settling an interrupted
    segment swap, and the bytes recovery truncated; an empty directory gets an empty segment
    at offset 0.

    Segments wholly below ``recovery_point`` were flushed before: only their indexes are
    checked (and rebuilt if unusable). Every segment holding offsets at or past it is
    validated batch by batch with its indexes rebuilt; the first torn or corrupt batch
    truncates the log there and any later segment is deleted, as nothing after a hole can be
    trusted. What was recovered is flushed, so the recovery point is then the log end."""
    directory.mkdir(parents=True, exist_ok=True)
    segment_swap.recover(directory)
    bases = file_offsets(directory, LOG_SUFFIX)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        for index_path in directory.glob("*" + suffix):
            if not index_path.stem.isdigit() or int(index_path.stem) not in bases:
                log.warning("%s: removing an index without its log", index_path)
                index_path.unlink()
    segments: list[LogSegment] = []
    truncated = 0
    try:
        for position, base in enumerate(bases):
            segment = LogSegment(directory, base, config.index_interval_bytes)
            segments.append(segment)
            is_last = position == len(bases) - 1
            if truncated:
                log.warning("%s: deleting segment %d after a truncated one",
                            directory, base)
                segments.pop().delete()
                continue
            if not is_last and bases[position + 1] <= recovery_point:
                segment.load()
                continue
            if is_last and base < recovery_point:
                segment.load()
                if segment.next_offset <= recovery_point:
                    continue
            cut = segment.recover()
            log.info("%s: validated segment %d past the recovery point %d: offsets up "
                     "to %d, %d byte(s) truncated", directory, base, recovery_point,
                     segment.next_offset, cut)
            truncated += cut
            segment.flush()
        if not segments:
            segments.append(LogSegment.create(directory, 0, config.index_interval_bytes))
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments, truncated


def _validate_replicated(records: bytes, log_end_offset: int) -> list[Batch]:
    """The batches of a follower append, each intact and starting at or after the end of the
    log and of the batch before it (gaps allowed, overlaps not); raises CORRUPT_MESSAGE or
    OFFSET_OUT_OF_RANGE (see :meth:`PartitionLog.append_as_follower`)."""
    batches: list[Batch] = []
    position, expected = 0, log_end_offset
    while position < len(records):
        if len(records) - position >= HEADER_SIZE:
            base_offset = read_header(records, position).base_offset
            if base_offset < expected:
                raise KafkaError(ErrorCode.offset_out_of_range,
                                 f"replicated batch starts at offset {base_offset}, below "
                                 f"{expected} where the log continues")
        problem = stored_batch_problem(records, position, expected)
        if problem is not None:
            raise KafkaError(ErrorCode.corrupt_message,
                             f"replicated batch at byte {position}: {problem}")
        header = read_header(records, position)
        batches.append(Batch(position, header))
        position += header.size
        expected = header.next_offset
    return batches

