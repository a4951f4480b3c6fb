"""Idempotent producers as one partition replica sees them (Kafka's ``ProducerStateManager``,
``ProducerStateEntry`` and ``ProducerAppendInfo``): per producer id, its current epoch and the
metadata of its last five batches, enough to recognise a retried batch, to fence a zombie
producer and to notice a lost batch.

Everything is decided from batch headers alone (producer id, producer epoch, base sequence,
last offset delta); records are never decoded. Batches without a producer id (-1), and control
batches, are not tracked.

Rules for a batch appended by a client (Kafka's ``UnifiedLog.analyzeAndValidateProducerState``):

- duplicate: same epoch and the same sequence range as one of the producer's five cached
  batches. The append stores nothing and answers that batch's original offsets, with no error.
  One duplicate batch makes the whole append of the partition a duplicate, as in Kafka.
- epoch lower than the producer's current one: INVALID_PRODUCER_EPOCH (what Kafka answers a
  produce since 2.7; PRODUCER_FENCED is for transactional requests).
- a new epoch (higher than the current one) must start at sequence 0, else
  OUT_OF_ORDER_SEQUENCE_NUMBER. The producer's cached batches are dropped when it is stored.
- the same epoch: the base sequence must follow the last stored one (sequences wrap from
  2**31-1 to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER.
- a producer with no state here (new, expired, or whose batches were all removed) is accepted
  with any sequence (KIP-360; older Kafka answered UNKNOWN_PRODUCER_ID).

Several batches of one append are validated in order, each against the state the previous ones
leave, and recorded only once the append is stored (:meth:`ProducerStateManager.validate`
then :meth:`ProducerStateManager.complete`), so a rejected append changes nothing.

Persistence (Kafka's producer snapshots): ``<offset>.snapshot`` in the replica's directory
(20-digit offset, like segment files) holds the state of every producer as of that offset, i.e.
after every batch below it. The partition log writes one when a segment rolls (at the new
segment's base offset) and on a clean shutdown (at the log end); only the newest
:data:`SNAPSHOTS_TO_KEEP` are kept. Start-up (:meth:`ProducerStateManager.load`) drops snapshots
past the log end (the log was cut there), reads the newest readable one and replays the stored
batch headers from its offset to the log end; with no usable snapshot it replays the whole log.
A snapshot that is lost or torn only makes start-up replay more, so snapshots are replaced
atomically (temporary file, rename) but not forced to disk. Format (UTF-8 JSON)::

    {"format": 1, "offset": 1042,
     "producers": [{"id": 4000, "epoch": 0, "last_timestamp": 1700000000000,
                    "batches": [[first_seq, last_seq, first_offset, last_offset, timestamp],
                                ...]}]}

``batches`` are oldest first, at most :data:`BATCHES_TO_RETAIN`.

Expiry (``producer.id.expiration.ms``, a day by default): a producer whose newest batch
timestamp is that old is forgotten when a snapshot is taken or loaded. Retention and
DeleteRecords do not remove producer state; expiry does, as in Kafka.

Not thread-safe: the owning partition log calls it under its append lock.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record_batch import (
    CONTROL_BIT,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    Batch,
    BatchHeader,
)

from .checkpoint import replace_file
from .segment import LogSegment, file_offsets, file_stem

log = logging.getLogger(__name__)

MAX_SEQUENCE = 2**31 - 1
# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN: a producer has at most five requests in
# flight per partition (max.in.flight.requests.per.connection <= 5 with idempotence).
BATCHES_TO_RETAIN = 5
# Kafka's producer.id.expiration.ms default (a day).
PRODUCER_ID_EXPIRATION_MS = 86_400_000
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_FORMAT = 1
SNAPSHOTS_TO_KEEP = 2


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` on Kafka's sequence circle (2**31-1 is followed by 0)."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


def last_sequence(header: BatchHeader) -> int:
    """The sequence number of a batch's last record."""
    return increment_sequence(header.base_sequence, header.last_offset_delta)


def snapshot_name(offset: int) -> str:
    return file_stem(offset) + SNAPSHOT_SUFFIX


class BatchMetadata(NamedTuple):
    """What is remembered of one stored batch of a producer."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    # maxTimestamp as stored (the append time under LogAppendTime).
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    """One producer's epoch and its last :data:`BATCHES_TO_RETAIN` batches, oldest first."""

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly this epoch and sequence range, if any."""
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, epoch: int, batch: BatchMetadata) -> None:
        """Record a stored batch; a different epoch starts the cache afresh."""
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        self.batches.append(batch)
        self.last_timestamp = batch.timestamp


@dataclass(frozen=True, slots=True)
class ProducerAppend:
    """An append whose idempotent batches passed validation: either a duplicate of a stored
    batch (nothing to store), or batches to record with :meth:`ProducerStateManager.complete`
    once the append is stored."""

    batches: Sequence[Batch]
    duplicate: BatchMetadata | None = None


class ProducerStateManager:
    """The producer state of one partition replica; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._producers: dict[int, ProducerStateEntry] = {}

    # ------------------------------------------------------------------------------ reads

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    @property
    def producer_ids(self) -> list[int]:
        return sorted(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    def last_offsets(self) -> dict[int, int]:
        """The last offset of each tracked producer's newest batch."""
        return {pid: entry.batches[-1].last_offset
                for pid, entry in self._producers.items() if entry.batches}

    # ---------------------------------------------------------------------------- appends

    def validate(self, batches: Sequence[Batch]) -> ProducerAppend | None:
        """Check a client append's batches; None when none of them has a producer id.

        Raises :class:`KafkaError` INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER (see
        the module docstring); changes nothing."""
        # (epoch, last sequence) of producers after the earlier batches of this append.
        pending: dict[int, tuple[int, int]] = {}
        for _, header in batches:
            producer_id = header.producer_id
            if producer_id < 0 or header.attributes & CONTROL_BIT:
                continue
            epoch, first_seq = header.producer_epoch, header.base_sequence
            last_seq = last_sequence(header)
            entry = self._producers.get(producer_id)
            if entry is not None and (duplicate := entry.find_duplicate(epoch, first_seq,
                                                                         last_seq)):
                return ProducerAppend(batches, duplicate)
            current_epoch, current_last = pending.get(producer_id) or (
                (entry.epoch, entry.last_seq) if entry else (NO_PRODUCER_EPOCH, NO_SEQUENCE))
            if epoch < current_epoch:
                raise KafkaError(
                    ErrorCode.invalid_producer_epoch,
                    f"epoch {epoch} of producer {producer_id} is older than its current "
                    f"epoch {current_epoch}")
            # A producer unknown here may continue at any sequence (KIP-360).
            if entry is not None and entry.epoch != NO_PRODUCER_EPOCH:
                if epoch != current_epoch:
                    if first_seq != 0:
                        raise KafkaError(
                            ErrorCode.out_of_order_sequence_number,
                            f"producer {producer_id} starts epoch {epoch} at sequence "
                            f"{first_seq}, not 0")
                elif first_seq != increment_sequence(current_last, 1):
                    raise KafkaError(
                        ErrorCode.out_of_order_sequence_number,
                        f"out of order sequence {first_seq} of producer {producer_id} (epoch "
                        f"{epoch}): the last stored sequence is {current_last}")
            pending[producer_id] = (epoch, last_seq)
        return ProducerAppend(batches) if pending else None

    def complete(
        self, append: ProducerAppend, base_offset: int, append_time_ms: int | None = None
    ) -> None:
        """Record the idempotent batches of a stored append whose first batch got
        ``base_offset``; ``append_time_ms`` is the time stamped under LogAppendTime."""
        offset = base_offset
        for _, header in append.batches:
            next_offset = offset + header.last_offset_delta + 1
            if header.producer_id >= 0 and not header.attributes & CONTROL_BIT:
                timestamp = header.max_timestamp if append_time_ms is None else append_time_ms
                self._record(header, offset, next_offset - 1, timestamp)
            offset = next_offset

    def replay(self, header: BatchHeader) -> None:
        """Account for a batch already in the log, offsets assigned (start-up replay, or a
        follower's copy of the leader's batches): recorded without validation."""
        if header.producer_id >= 0 and not header.attributes & CONTROL_BIT:
            self._record(header, header.base_offset, header.last_offset, header.max_timestamp)

    def _record(self, header: BatchHeader, first_offset: int, last_offset: int,
                timestamp: int) -> None:
        entry = self._producers.get(header.producer_id)
        if entry is None:
            entry = self._producers[header.producer_id] = ProducerStateEntry(header.producer_id)
        entry.add(header.producer_epoch, BatchMetadata(
            header.base_sequence, last_sequence(header), first_offset, last_offset, timestamp))

    def remove_expired(self, now_ms: int | None = None) -> int:
        """Forget producers whose newest batch is older than the expiration; returns how many."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        expired = [pid for pid, entry in self._producers.items()
                   if now_ms - entry.last_timestamp >= PRODUCER_ID_EXPIRATION_MS]
        for producer_id in expired:
            del self._producers[producer_id]
        return len(expired)

    # -------------------------------------------------------------------------- snapshots

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files present, ascending."""
        return file_offsets(self.directory, SNAPSHOT_SUFFIX)

    def take_snapshot(self, offset: int, now_ms: int | None = None) -> None:
        """Write the state as of ``offset`` (every batch below it recorded, none at or past
        it), after expiring old producers; older snapshots beyond the newest
        :data:`SNAPSHOTS_TO_KEEP` are deleted. A write failure is logged: the snapshot only
        saves replay work at start-up."""
        self.remove_expired(now_ms)
        document = {
            "format": SNAPSHOT_FORMAT,
            "offset": offset,
            "producers": [
                {"id": entry.producer_id, "epoch": entry.epoch,
                 "last_timestamp": entry.last_timestamp,
                 "batches": [list(batch) for batch in entry.batches]}
                for entry in self._producers.values()
            ],
        }
        path = self.directory / snapshot_name(offset)
        try:
            replace_file(path, json.dumps(document, separators=(",", ":")), durable=False)
        except OSError as exc:
            log.error("%s: cannot write a producer snapshot: %s", path, exc)
            return
        for old in self.snapshot_offsets()[:-SNAPSHOTS_TO_KEEP]:
            (self.directory / snapshot_name(old)).unlink(missing_ok=True)

    def load(
        self, segments: Sequence[LogSegment], log_end_offset: int,
        now_ms: int | None = None,
    ) -> int:
        """Rebuild the state on start-up from the newest usable snapshot and the batch
        headers stored after it (see the module docstring). Also the way to rebuild it after
        the log was cut back (a follower truncated to its leader): snapshots past the new end
        are dropped. Returns the offset replay started from."""
        self._producers.clear()
        for leftover in self.directory.glob("*" + SNAPSHOT_SUFFIX + ".tmp"):
            leftover.unlink(missing_ok=True)
        start = segments[0].base_offset if segments else 0
        for offset in reversed(self.snapshot_offsets()):
            path = self.directory / snapshot_name(offset)
            if offset > log_end_offset:
                log.info("%s: past the log end %d; deleted", path, log_end_offset)
                path.unlink(missing_ok=True)
                continue
            try:
                self._producers = _read_snapshot(path, offset)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: unreadable producer snapshot (%s); deleted", path, exc)
                path.unlink(missing_ok=True)
                continue
            start = offset
            break
        for segment in segments:
            if segment.next_offset <= start:
                continue
            for batch in segment.batches():
                if batch.header.last_offset >= start:
                    self.replay(batch.header)
        self.remove_expired(now_ms)
        return start


def _read_snapshot(path: Path, offset: int) -> dict[int, ProducerStateEntry]:
    document: Any = json.loads(path.read_text(encoding="utf-8"))
    if document.get("format") != SNAPSHOT_FORMAT or document.get("offset") != offset:
        raise ValueError("not a producer snapshot of format 1 for its offset")
    producers: dict[int, ProducerStateEntry] = {}
    for item in document["producers"]:
        entry = ProducerStateEntry(int(item["id"]), int(item["epoch"]))
        for values in item["batches"][-BATCHES_TO_RETAIN:]:
            entry.batches.append(BatchMetadata(*(int(v) for v in values)))
        entry.last_timestamp = int(item["last_timestamp"])
        producers[entry.producer_id] = entry
    return producers
