"""Idempotent and transactional producers as one partition replica sees them (Kafka's
``ProducerStateManager``, ``ProducerStateEntry`` and ``ProducerAppendInfo``): per producer id,
its current epoch, the metadata of its last five batches (enough to recognise a retried batch,
to fence a zombie producer and to notice a lost batch), the epoch of the transaction
coordinator that last wrote a marker for it here, and the first offset of its ongoing
transaction on the partition; and for the partition, its transactions and its last stable
offset.

Everything is decided from batch headers alone (producer id, producer epoch, base sequence,
last offset delta, the transactional and control bits); records are never decoded, except the
one record of a control batch (a transaction marker). Batches without a producer id (-1) are
not tracked.

Rules for a batch appended by a client (Kafka's ``UnifiedLog.analyzeAndValidateProducerState``
and ``ProducerAppendInfo``), in this order:

- duplicate: same epoch and the same sequence range as one of the producer's five cached
  batches. The append stores nothing and answers that batch's original offsets, with no error.
  One duplicate batch makes the whole append of the partition a duplicate, as in Kafka.
- a transactional batch of a producer without an ongoing transaction here must carry the
  producer's verification guard, else INVALID_TXN_STATE with a guard to verify (see
  :mod:`services.log.verification`).
- epoch lower than the producer's current one: INVALID_PRODUCER_EPOCH (what Kafka answers a
  produce since 2.7; PRODUCER_FENCED is for transactional requests).
- a new epoch (higher than the current one) must start at sequence 0, else
  OUT_OF_ORDER_SEQUENCE_NUMBER. The producer's cached batches are dropped when it is stored.
- the same epoch: the base sequence must follow the last stored one (sequences wrap from
  2**31-1 to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER; so must it while a verification guard
  stands, and be no higher than the lowest sequence seen while verifying.
- a producer with no state here (new, expired, or whose batches were all removed) must start at
  sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER, which clients answer by bumping their epoch and
  starting again at 0. Kafka accepts any sequence there (KIP-360), relying on its one
  connection to the leader to keep a producer's requests in order. Here a request can be
  refused on its way to the log node (its handler could not reach it: NOT_LEADER_OR_FOLLOWER,
  nothing stored) while the next one on the same client connection gets through; accepted as
  the producer's first batch, that one would make the client take the refused records as stored
  (librdkafka acknowledges earlier records implicitly when a later batch succeeds), and they
  would be lost.
- a batch that is not transactional from a producer with an ongoing transaction here:
  INVALID_TXN_STATE. A transactional batch of a producer without one starts it, at its offset.

Appends of the coordinators (Kafka's AppendOrigin COORDINATOR: the conditional appends of
transactional offset commits) skip the duplicate, verification and sequence rules, and still
check epochs and start or continue transactions.

Several batches of one append are validated in order, each against the state the previous ones
leave, and recorded only once the append is stored (:meth:`ProducerStateManager.validate`
then :meth:`ProducerStateManager.complete`), so a rejected append changes nothing (but the
verification guard it was answered with).

Transactions (Kafka's ``TxnMetadata`` and ``CompletedTxn``): a transaction is *ongoing* from
its producer's first transactional batch on the partition until a marker (a COMMIT or ABORT
control batch, written by the leader for the coordinator, :meth:`end_transaction`) ends it;
then it is *unreplicated* until the high watermark passes its marker. The first unstable offset
is the lowest first offset of an ongoing or unreplicated transaction; the partition's last
stable offset is that, capped by the high watermark (read_committed readers stop there). An
ABORT that ends a transaction yields the entry the partition log puts in the transaction index
of the marker's segment, with the last stable offset of that moment (the first offset of the
oldest transaction of another producer still ongoing, else the marker offset + 1). A marker is
refused when its producer epoch is older than the producer's (INVALID_PRODUCER_EPOCH) or its
coordinator epoch older than the last one seen for the producer
(TRANSACTION_COORDINATOR_FENCED); one for a producer without an ongoing transaction here
still counts (it sets the epochs), as in Kafka. Any marker voids the producer's guard.

Persistence (Kafka's producer snapshots): ``<offset>.snapshot`` in the replica's directory
(20-digit offset, like segment files) holds the state of every producer as of that offset, i.e.
after every batch below it, and the transactions then unreplicated. The partition log writes
one when a segment rolls (at the new segment's base offset) and on a clean shutdown (at the log
end); only the newest :data:`SNAPSHOTS_TO_KEEP` are kept. Start-up
(:meth:`ProducerStateManager.load`) drops snapshots past the log end (the log was cut there),
reads the newest readable one and replays the stored batch headers (and markers) from its
offset to the log end; with no usable snapshot it replays the whole log. The same replay
rebuilds the transaction indexes of the segments that need it (their file was lost, or they
were recovered after a crash), starting from a snapshot no later than the first of them. A
snapshot that is lost or torn only makes start-up replay more, so snapshots are replaced
atomically (temporary file, rename) but not forced to disk. Format 2 (UTF-8 JSON; format 1,
without the transaction fields, is still read)::

    {"format": 2, "offset": 1042,
     "producers": [{"id": 4000, "epoch": 0, "last_timestamp": 1700000000000,
                    "coordinator_epoch": 3, "txn_first_offset": 1017,
                    "batches": [[first_seq, last_seq, first_offset, last_offset, timestamp],
                                ...]}],
     "unreplicated": [[first_offset, producer_id, marker_offset], ...]}

``batches`` are oldest first, at most :data:`BATCHES_TO_RETAIN`; ``coordinator_epoch`` and
``txn_first_offset`` are -1 when there is none.

Expiry (``producer.id.expiration.ms``, a day by default): a producer whose newest batch
timestamp is that old is forgotten when a snapshot is taken or loaded, unless its transaction
is ongoing; so is a verification guard that old. Retention and DeleteRecords do not remove
producer state; expiry does, as in Kafka.

Not thread-safe: the owning partition log calls it under its append lock.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

from services.common.errors import ErrorCode, KafkaError
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    read_end_transaction_marker,
)
from services.common.records.record_batch import (
    CONTROL_BIT,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    TRANSACTIONAL_BIT,
    Batch,
    BatchHeader,
    Buffer,
    RecordError,
)

from .checkpoint import replace_file
from .segment import LogSegment, file_offsets, file_stem
from .transaction_index import AbortedTxn
from .verification import NO_GUARD, VerificationRequiredError, VerificationState, new_guard

log = logging.getLogger(__name__)

MAX_SEQUENCE = 2**31 - 1
# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN: a producer has at most five requests in
# flight per partition (max.in.flight.requests.per.connection <= 5 with idempotence).
BATCHES_TO_RETAIN = 5
# Kafka's producer.id.expiration.ms default (a day).
PRODUCER_ID_EXPIRATION_MS = 86_400_000
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_FORMAT = 2
# Snapshots of this format are read too (written before transactions: none in them).
_FORMATS_READ = (1, 2)
SNAPSHOTS_TO_KEEP = 2
NO_OFFSET = -1
NO_COORDINATOR_EPOCH = -1


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` on Kafka's sequence circle (2**31-1 is followed by 0)."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


def last_sequence(header: BatchHeader) -> int:
    """The sequence number of a batch's last record (-1 for a batch without sequences)."""
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return increment_sequence(header.base_sequence, header.last_offset_delta)


def marker_of(batch: Buffer, header: BatchHeader) -> EndTransactionMarker | None:
    """The transaction marker that control batch ``batch`` (header first) holds, or None when
    it holds none: another control type, no record (the log cleaner emptied it), or a record
    that cannot be read (logged; nothing stored here is ever refused on reading)."""
    if header.record_count == 0:
        return None
    try:
        return read_end_transaction_marker(batch, header)
    except RecordError as exc:
        log.warning("control batch at offset %d of producer %d unreadable: %s",
                    header.base_offset, header.producer_id, exc)
        return None


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
    """One producer's epoch and its last :data:`BATCHES_TO_RETAIN` batches, oldest first; the
    epoch of the coordinator that last ended one of its transactions here, and the first offset
    of its ongoing transaction (-1: none)."""

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    txn_first_offset: int = NO_OFFSET

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def in_transaction(self) -> bool:
        return self.txn_first_offset >= 0

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


class CompletedTxn(NamedTuple):
    """A transaction a marker ended (Kafka's ``CompletedTxn``), with the partition's last
    stable offset as the marker completed it (what the transaction index keeps of an abort)."""

    producer_id: int
    first_offset: int
    # The marker's offset.
    last_offset: int
    aborted: bool
    last_stable_offset: int

    @property
    def aborted_txn(self) -> AbortedTxn:
        return AbortedTxn(self.producer_id, self.first_offset, self.last_offset,
                          self.last_stable_offset)


class ProducerStateManager:
    """The producer state of one partition replica; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._producers: dict[int, ProducerStateEntry] = {}
        # Ongoing transactions, first offset -> producer id, in first offset order (each
        # starts at the log end, past every earlier one; loading inserts them sorted).
        self._ongoing: dict[int, int] = {}
        # Ended transactions whose marker the high watermark has not passed yet:
        # first offset -> (producer id, marker offset).
        self._unreplicated: dict[int, tuple[int, int]] = {}
        # Standing verification guards, by producer id (memory only).
        self._verifications: dict[int, VerificationState] = {}
        # The lowest first offset of an ongoing or unreplicated transaction (None: none).
        self.first_unstable_offset: int | None = None

    # ------------------------------------------------------------------------------ reads

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    @property
    def producer_ids(self) -> list[int]:
        return sorted(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    def entries(self) -> list[ProducerStateEntry]:
        """Every producer's state, by producer id (Kafka's active producers)."""
        return [self._producers[pid] for pid in sorted(self._producers)]

    @property
    def ongoing_count(self) -> int:
        """Transactions ongoing on the partition."""
        return len(self._ongoing)

    def ongoing_transactions(self) -> list[tuple[int, int]]:
        """(first offset, producer id) of the ongoing transactions, oldest first."""
        return list(self._ongoing.items())

    def unreplicated_transactions(self) -> list[tuple[int, int, int]]:
        """(first offset, producer id, marker offset) of the ended transactions whose marker
        the high watermark has not passed, by first offset."""
        return sorted((first, pid, last) for first, (pid, last) in self._unreplicated.items())

    def verification_guard(self, producer_id: int) -> int:
        """The producer's standing guard (0: none)."""
        state = self._verifications.get(producer_id)
        return NO_GUARD if state is None else state.guard

    def last_records(self) -> dict[int, tuple[int, int]]:
        """(last offset of its newest data batch, or -1 if none is cached, current epoch) of
        each producer (Kafka's ``lastRecordsOfActiveProducers``): the log cleaner keeps the
        batch that holds a producer's last sequence, or else the marker of its epoch."""
        return {pid: (entry.batches[-1].last_offset if entry.batches else NO_OFFSET, entry.epoch)
                for pid, entry in self._producers.items()}

    # ---------------------------------------------------------------------------- appends

    def validate(self, batches: Sequence[Batch], *, verification_guard: int = NO_GUARD,
                 coordinator: bool = False, now_ms: int | None = None
                 ) -> ProducerAppend | None:
        """Check an append's batches (a client's, or with ``coordinator`` a coordinator's);
        None when none of them has a producer id. ``verification_guard`` is the guard the
        caller got for this append's producer.

        Raises :class:`KafkaError` INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER or
        INVALID_TXN_STATE (:class:`~services.log.verification.VerificationRequiredError` when the
        coordinator must confirm the transaction first) per the module docstring; changes
        nothing but the guard of that last error."""
        # (epoch, last sequence, in a transaction: truthy) of producers after the earlier
        # batches.
        pending: dict[int, tuple[int, int, int]] = {}
        verifications = self._verifications
        for _, header in batches:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            epoch, first_seq = header.producer_epoch, header.base_sequence
            last_seq = last_sequence(header)
            entry = self._producers.get(producer_id)
            if not coordinator and entry is not None and (
                duplicate := entry.find_duplicate(epoch, first_seq, last_seq)
            ):
                return ProducerAppend(batches, duplicate)
            current_epoch, current_last, in_txn = pending.get(producer_id) or (
                (entry.epoch, entry.last_seq, entry.txn_first_offset >= 0) if entry
                else (NO_PRODUCER_EPOCH, NO_SEQUENCE, False))
            transactional = header.attributes & TRANSACTIONAL_BIT
            # A batch of a newer epoch does not continue the transaction ongoing here: it
            # begins the next one (transactions v2 bump the epoch at every commit or abort,
            # and the producer may send before this partition has the marker of its last
            # transaction), so the coordinator must confirm it first, as Kafka's
            # hasOngoingTransaction(producerId, producerEpoch) has it.
            if transactional and not coordinator and (not in_txn or epoch > current_epoch):
                self._check_verified(producer_id, epoch, first_seq, verification_guard, now_ms)
            if epoch < current_epoch:
                raise KafkaError(
                    ErrorCode.invalid_producer_epoch,
                    f"epoch {epoch} of producer {producer_id} is older than its current "
                    f"epoch {current_epoch}")
            if not coordinator:
                if verifications and (state := verifications.get(producer_id)) is not None and (
                    first_seq > state.lowest_sequence
                ):
                    raise KafkaError(
                        ErrorCode.out_of_order_sequence_number,
                        f"sequence {first_seq} of producer {producer_id} is past "
                        f"{state.lowest_sequence}, the lowest still being verified")
                # A producer unknown here starts at sequence 0 (see the module docstring).
                if (entry is None or entry.epoch == NO_PRODUCER_EPOCH) and (
                    producer_id not in pending and first_seq != 0
                ):
                    raise KafkaError(
                        ErrorCode.out_of_order_sequence_number,
                        f"producer {producer_id} is unknown to this partition: its first "
                        f"batch must start at sequence 0, not {first_seq}")
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
                            f"out of order sequence {first_seq} of producer {producer_id} "
                            f"(epoch {epoch}): the last stored sequence is {current_last}")
            if in_txn and not transactional:
                raise KafkaError(
                    ErrorCode.invalid_txn_state,
                    f"producer {producer_id} has a transaction ongoing on this partition: "
                    "its batches must be transactional")
            pending[producer_id] = (epoch, last_seq, in_txn or transactional)
        return ProducerAppend(batches) if pending else None

    def _check_verified(self, producer_id: int, epoch: int, sequence: int, guard: int,
                        now_ms: int | None) -> None:
        """A transactional batch would start the producer's transaction here: ``guard`` must
        be the producer's standing one. Else raises the error with that guard (handed out now
        if none stands)."""
        state = self._verifications.get(producer_id)
        if state is not None and state.verifies(guard):
            return
        if state is None:
            now_ms = int(time.time() * 1000) if now_ms is None else now_ms
            state = self._verifications[producer_id] = VerificationState(
                new_guard(), now_ms, sequence, epoch)
        else:
            state.note(sequence, epoch)
        raise VerificationRequiredError(producer_id, state.guard)

    def complete(
        self, append: ProducerAppend, base_offset: int, append_time_ms: int | None = None
    ) -> None:
        """Record the batches with a producer id of a stored append whose first batch got
        ``base_offset`` (starting transactions); ``append_time_ms`` is the time stamped under
        LogAppendTime."""
        offset = base_offset
        started = False
        for _, header in append.batches:
            next_offset = offset + header.last_offset_delta + 1
            if header.producer_id >= 0:
                timestamp = header.max_timestamp if append_time_ms is None else append_time_ms
                entry = self._record(header, offset, next_offset - 1, timestamp)
                if header.attributes & TRANSACTIONAL_BIT:
                    started |= self._continue_transaction(entry, offset)
            offset = next_offset
        if started:
            self._update_first_unstable()

    def replay(self, header: BatchHeader,
               marker: EndTransactionMarker | None = None) -> CompletedTxn | None:
        """Account for a batch already in the log, offsets assigned (start-up replay, or a
        follower's copy of the leader's batches): recorded without validation. A control batch
        comes with the marker it holds (None: it holds none, and changes nothing, unless it
        is a marker the log cleaner emptied, which still ends its producer's transaction);
        returns the transaction it ended, if any."""
        producer_id = header.producer_id
        if producer_id < 0:
            return None
        if header.attributes & CONTROL_BIT:
            if marker is None:
                entry = self._producers.get(producer_id)
                if header.record_count or entry is None or not entry.in_transaction:
                    return None  # not a marker, or nothing to end
                # A marker the log cleaner emptied: its transaction's data went before it.
                marker = EndTransactionMarker(type=ControlRecordType.COMMIT,
                                              coordinator_epoch=entry.coordinator_epoch)
            return self.end_transaction(producer_id, header.producer_epoch, marker,
                                        header.base_offset, header.max_timestamp)
        entry = self._record(header, header.base_offset, header.last_offset,
                             header.max_timestamp)
        if header.attributes & TRANSACTIONAL_BIT and self._continue_transaction(
            entry, header.base_offset
        ):
            self._update_first_unstable()
        return None

    def _record(self, header: BatchHeader, first_offset: int, last_offset: int,
                timestamp: int) -> ProducerStateEntry:
        entry = self._producers.get(header.producer_id)
        if entry is None:
            entry = self._producers[header.producer_id] = ProducerStateEntry(header.producer_id)
        entry.add(header.producer_epoch, BatchMetadata(
            header.base_sequence, last_sequence(header), first_offset, last_offset, timestamp))
        return entry

    def _continue_transaction(self, entry: ProducerStateEntry, offset: int) -> bool:
        """A transactional batch of ``entry`` stored at ``offset``: its transaction starts
        there unless one is ongoing; its guard has served. Returns whether one started."""
        if self._verifications:
            self._verifications.pop(entry.producer_id, None)
        if entry.txn_first_offset >= 0:
            return False
        entry.txn_first_offset = offset
        self._ongoing[offset] = entry.producer_id
        return True

    # ---------------------------------------------------------------------------- markers

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Whether the leader may write a marker of these epochs for the producer (Kafka's
        ``appendEndTxnMarker`` checks): raises INVALID_PRODUCER_EPOCH for an epoch older than
        the producer's, TRANSACTION_COORDINATOR_FENCED for a coordinator epoch older than the
        last one seen for it."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"marker epoch {epoch} of producer {producer_id} is older than its current "
                f"epoch {entry.epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(
                ErrorCode.transaction_coordinator_fenced,
                f"marker of coordinator epoch {coordinator_epoch} for producer {producer_id}: "
                f"a coordinator of epoch {entry.coordinator_epoch} wrote here already")

    def end_transaction(self, producer_id: int, epoch: int, marker: EndTransactionMarker,
                        offset: int, timestamp: int) -> CompletedTxn | None:
        """Account for the marker stored at ``offset`` (stamped ``timestamp``): the producer
        takes its epochs, its guard is void, and its ongoing transaction, if any, ends (it is
        unreplicated until the high watermark passes ``offset``). Returns that transaction."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerStateEntry(producer_id)
        completed = None
        first = entry.txn_first_offset
        if first >= 0:
            # The last stable offset once this one ends: the oldest transaction of another
            # producer still ongoing (Kafka's lastStableOffset(completedTxn)).
            last_stable = next((start for start, pid in self._ongoing.items()
                                if pid != producer_id), offset + 1)
            completed = CompletedTxn(producer_id, first, offset,
                                     marker.type is ControlRecordType.ABORT, last_stable)
            self._ongoing.pop(first, None)
            self._unreplicated[first] = (producer_id, offset)
        if epoch != entry.epoch:
            entry.batches.clear()
            entry.epoch = epoch
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.txn_first_offset = NO_OFFSET
        entry.last_timestamp = timestamp
        if self._verifications:
            self._verifications.pop(producer_id, None)
        if completed is not None:
            self._update_first_unstable()
        return completed

    def on_high_watermark(self, high_watermark: int) -> None:
        """The high watermark moved: the transactions whose markers are now below it are
        stable (Kafka's ``onHighWatermarkUpdated``)."""
        if not self._unreplicated:
            return
        replicated = [first for first, (_, last) in self._unreplicated.items()
                      if last < high_watermark]
        if replicated:
            for first in replicated:
                del self._unreplicated[first]
            self._update_first_unstable()

    def _update_first_unstable(self) -> None:
        first = next(iter(self._ongoing), None)
        if self._unreplicated:
            unreplicated = min(self._unreplicated)
            first = unreplicated if first is None else min(first, unreplicated)
        self.first_unstable_offset = first

    def remove_expired(self, now_ms: int | None = None) -> int:
        """Forget producers whose newest batch is older than the expiration (unless their
        transaction is ongoing), and guards as old; returns how many producers."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        expired = [pid for pid, entry in self._producers.items()
                   if not entry.in_transaction
                   and now_ms - entry.last_timestamp >= PRODUCER_ID_EXPIRATION_MS]
        for producer_id in expired:
            del self._producers[producer_id]
        for producer_id in [pid for pid, state in self._verifications.items()
                            if now_ms - state.timestamp >= PRODUCER_ID_EXPIRATION_MS]:
            del self._verifications[producer_id]
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
                 "coordinator_epoch": entry.coordinator_epoch,
                 "txn_first_offset": entry.txn_first_offset,
                 "batches": [list(batch) for batch in entry.batches]}
                for entry in self._producers.values()
            ],
            "unreplicated": [list(txn) for txn in self.unreplicated_transactions()],
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
        now_ms: int | None = None, rebuild_from: int | None = None,
    ) -> int:
        """Rebuild the state on start-up from the newest usable snapshot and the batch
        headers stored after it (see the module docstring). Also the way to rebuild it after
        the log was cut back (a follower truncated to its leader): snapshots past the new end
        are dropped. With ``rebuild_from``, the transaction indexes of the segments from that
        base offset on are rebuilt too, replaying from a snapshot no later than it. Returns
        the offset replay started from."""
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        self._verifications.clear()
        for leftover in self.directory.glob("*" + SNAPSHOT_SUFFIX + ".tmp"):
            leftover.unlink(missing_ok=True)
        start = segments[0].base_offset if segments else 0
        usable = log_end_offset if rebuild_from is None else min(rebuild_from, log_end_offset)
        for offset in reversed(self.snapshot_offsets()):
            path = self.directory / snapshot_name(offset)
            if offset > log_end_offset:
                log.info("%s: past the log end %d; deleted", path, log_end_offset)
                path.unlink(missing_ok=True)
                continue
            if offset > usable:
                continue
            try:
                self._producers, unreplicated = _read_snapshot(path, offset)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: unreadable producer snapshot (%s); deleted", path, exc)
                path.unlink(missing_ok=True)
                continue
            self._unreplicated = {first: (pid, last) for first, pid, last in unreplicated}
            self._ongoing = {entry.txn_first_offset: entry.producer_id for entry in sorted(
                self._producers.values(), key=attrgetter("txn_first_offset"))
                if entry.in_transaction}
            start = offset
            break
        for segment in segments:
            rebuild = rebuild_from is not None and segment.base_offset >= rebuild_from
            if rebuild:
                segment.txn_index.reset()
            elif segment.next_offset <= start:
                continue
            for batch in segment.batches():
                header = batch.header
                if header.last_offset < start:
                    continue
                marker = marker_of(segment.read_batch(batch), header) if (
                    header.attributes & CONTROL_BIT and header.producer_id >= 0) else None
                completed = self.replay(header, marker)
                if rebuild and completed is not None and completed.aborted:
                    segment.txn_index.append(completed.aborted_txn)
            if rebuild:
                # The segment's data is on disk (below the recovery point from now on): so
                # must its index be.
                segment.txn_index.flush()
                segment.txn_index_stale = False
                log.info("%s: rebuilt the transaction index of segment %d (%d aborted)",
                         self.directory, segment.base_offset, len(segment.txn_index))
        self._update_first_unstable()
        self.remove_expired(now_ms)
        return start


def _read_snapshot(
    path: Path, offset: int
) -> tuple[dict[int, ProducerStateEntry], list[tuple[int, int, int]]]:
    """The producers of a snapshot file and its unreplicated transactions (first offset,
    producer id, marker offset)."""
    document: Any = json.loads(path.read_text(encoding="utf-8"))
    if document.get("format") not in _FORMATS_READ or document.get("offset") != offset:
        raise ValueError("not a producer snapshot of a known format for its offset")
    producers: dict[int, ProducerStateEntry] = {}
    for item in document["producers"]:
        entry = ProducerStateEntry(
            int(item["id"]), int(item["epoch"]),
            coordinator_epoch=int(item.get("coordinator_epoch", NO_COORDINATOR_EPOCH)),
            txn_first_offset=int(item.get("txn_first_offset", NO_OFFSET)))
        for values in item["batches"][-BATCHES_TO_RETAIN:]:
            entry.batches.append(BatchMetadata(*(int(v) for v in values)))
        entry.last_timestamp = int(item["last_timestamp"])
        producers[entry.producer_id] = entry
    unreplicated = [(int(first), int(pid), int(last))
                    for first, pid, last in document.get("unreplicated", ())]
    return producers, unreplicated
