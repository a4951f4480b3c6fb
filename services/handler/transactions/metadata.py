"""A transactional id's transaction and its state machine (Kafka's ``TransactionMetadata`` with
the rules of ``TransactionCoordinator``), as pure data and decisions: no I/O, no clock (every
decision is given ``now``, wall-clock milliseconds), no producer id allocation (a decision that
needs a fresh producer id says so and is made again with one).

States and transitions (Kafka's ``TransactionState``; ids persist)::

    (none) ──InitProducerId──> Empty ──AddPartitions/AddOffsets──> Ongoing ──AddPartitions──┐
                                 ^                                   │   ^                  │
                                 │ InitProducerId                    │   └──────────────────┘
             CompleteCommit <────┤                    EndTxn commit  │  EndTxn abort, timeout,
                   ^             │                                   v  InitProducerId (fence)
              markers written    │            PrepareCommit <── Ongoing ──> PrepareAbort
                   └── PrepareCommit                                            │
                                 └──── CompleteAbort <── markers written ───────┘

Empty and Complete* go to Ongoing (a new transaction) or to Empty again (InitProducerId bumps
the epoch); an idle one expires (``transactional.id.expiration.ms``) and its record is deleted
(Kafka's Dead, which is never written). PrepareEpochFence is Kafka's pending state while it
fences an Ongoing transaction; it is never written either: the fence writes PrepareAbort at the
bumped epoch directly (:func:`fence`). Every transition here is the record Kafka would append
(``prepareTransitionTo``) taken as the state it leaves behind once written
(``completeTransitionTo``): with a conditional append per transition there is no pending state,
and a handler that computed a transition on a stale state loses its append and computes again.

Kafka keeps ``lastProducerEpoch`` in memory only; here it is persisted (see
``coordinator_records.TransactionExtension``), so every handler recognises a retried
InitProducerId. A Prepare* record written again with a later update time (:func:`claim`) is
this coordinator's own: a handler taking over a transaction whose markers nobody is writing.

Errors are Kafka error codes in the returned :class:`Decision`, never raised; a request the
machine cannot take in any state (a bug) raises :class:`IllegalTransitionError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from services.common.errors import ErrorCode

from ..coordinator_records import TransactionExtension, TransactionLogValue, TransactionPartitions

NONE = 0
INVALID_REQUEST = ErrorCode.invalid_request.value
INVALID_PRODUCER_ID_MAPPING = ErrorCode.invalid_producer_id_mapping.value
PRODUCER_FENCED = ErrorCode.producer_fenced.value
CONCURRENT_TRANSACTIONS = ErrorCode.concurrent_transactions.value
INVALID_TXN_STATE = ErrorCode.invalid_txn_state.value
TRANSACTION_ABORTABLE = ErrorCode.transaction_abortable.value

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# Java's Short.MAX_VALUE: the coordinator keeps the last epoch for itself, to fence with.
MAX_PRODUCER_EPOCH = 32767

# Kafka's TransactionVersion feature levels a client may use: 0 (and 1) the original protocol,
# 2 transactions v2 (KIP-890 part 2: the epoch bumped at every commit or abort).
TV_0 = 0
TV_2 = 2
# The version a fence (a timeout, or InitProducerId of a new producer) ends a transaction
# with, whatever the client's: the original protocol, whose one epoch bump no producer holds
# and whose record makes the fenced producer's EndTxn PRODUCER_FENCED (under transactions v2
# an epoch one above the client's would pass for the bump of its own EndTxn retried). Kafka
# 4.0 ends it at the cluster's version, bumping twice under v2, with the same answers to the
# fenced producer; one bump also cannot overflow an exhausted epoch.
FENCE_TRANSACTION_VERSION = TV_0

TopicPartition = tuple[str, int]


class IllegalTransitionError(Exception):
    """A transition Kafka's state machine never makes (a bug, not a client's error)."""


class TxnState(enum.IntEnum):
    """Kafka's transaction states; the values are the ids records store."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """``PrepareCommit`` for PREPARE_COMMIT, as DescribeTransactions and ListTransactions
        report it."""
        return self.name.title().replace("_", "")


STATES_BY_NAME = {state.kafka_name: state for state in TxnState}

# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                               TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                 TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_ABORT,
                              TxnState.COMPLETE_COMMIT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}
PREPARED = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
COMPLETED = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
# States an idle transactional id may expire in (Kafka's isExpirationAllowed).
EXPIRABLE = frozenset({TxnState.EMPTY, *COMPLETED})


def epoch_exhausted(epoch: int) -> bool:
    """Kafka's ``isEpochExhausted``: clients never get the last epoch, which the coordinator
    keeps to fence with."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


def bumps_epoch_at_end(transaction_version: int) -> bool:
    """Whether a client of this transaction version has its epoch bumped at every commit or
    abort (Kafka's ``supportsEpochBump``)."""
    return transaction_version >= TV_2


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionConfig:
    """Kafka's transaction.* broker settings the state machine needs, and how long a prepared
    transaction may go without word from the handler writing its markers before any handler
    takes over (this coordinator's own)."""

    max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    marker_takeover_ms: int = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionMetadata:
    """One transactional id's producer and transaction, as its latest record says."""

    transactional_id: str
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    # The epoch before the last bump (-1: none): a retried InitProducerId sends it.
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    # The producer id of the last committed transaction (transactions v2 id rotation).
    previous_producer_id: int = NO_PRODUCER_ID
    # The producer id the epoch overflow of a transaction v2 commit or abort moves to.
    next_producer_id: int = NO_PRODUCER_ID
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    start_ms: int = -1
    last_update_ms: int
    client_transaction_version: int = TV_0

    def deadline_ms(self, config: TransactionConfig) -> int:
        """When the transaction must be looked at by time alone (-1: never): an Ongoing one
        times out (aborted), a prepared one is taken over (its markers written by another
        handler), an idle one expires."""
        if self.state is TxnState.ONGOING:
            # Kafka aborts once start + timeout < now.
            return self.start_ms + self.timeout_ms + 1
        if self.state in PREPARED:
            return self.last_update_ms + config.marker_takeover_ms
        if self.state in EXPIRABLE:
            return self.last_update_ms + config.transactional_id_expiration_ms
        return -1

    @property
    def committing(self) -> bool:
        return self.state is TxnState.PREPARE_COMMIT

    def to_record(self) -> TransactionLogValue:
        """The record of this state: value v1 with its extension (Kafka writes no partitions
        for an Empty transaction: a null array)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self.partitions):
            by_topic.setdefault(topic, []).append(partition)
        return TransactionLogValue(
            producer_id=self.producer_id, previous_producer_id=self.previous_producer_id,
            next_producer_id=self.next_producer_id, producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.timeout_ms, transaction_status=int(self.state),
            transaction_partitions=None if self.state is TxnState.EMPTY else tuple(
                TransactionPartitions(topic=topic, partition_ids=tuple(ids))
                for topic, ids in by_topic.items()),
            transaction_last_update_timestamp_ms=self.last_update_ms,
            transaction_start_timestamp_ms=self.start_ms,
            client_transaction_version=self.client_transaction_version,
            extension=TransactionExtension(last_producer_epoch=self.last_producer_epoch))

    @classmethod
    def from_record(cls, transactional_id: str, value: TransactionLogValue
                    ) -> TransactionMetadata:
        """The state a record holds (Kafka's ``readTxnRecordValue``: an Empty transaction has
        no partitions whatever the record says). Raises ValueError for an unknown state."""
        state = TxnState(value.transaction_status)
        partitions = frozenset() if state is TxnState.EMPTY else frozenset(
            (p.topic, partition) for p in value.transaction_partitions or ()
            for partition in p.partition_ids)
        return cls(
            transactional_id=transactional_id, producer_id=value.producer_id,
            producer_epoch=value.producer_epoch,
            last_producer_epoch=value.extension.last_producer_epoch if value.extension
            else NO_PRODUCER_EPOCH,
            previous_producer_id=value.previous_producer_id,
            next_producer_id=value.next_producer_id, timeout_ms=value.transaction_timeout_ms,
            state=state, partitions=partitions, start_ms=value.transaction_start_timestamp_ms,
            last_update_ms=value.transaction_last_update_timestamp_ms,
            client_transaction_version=value.client_transaction_version)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerIdAndEpoch:
    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What a request does: ``write`` the new state (None: nothing to write) and, once it is
    written, answer ``error`` with ``producer_id`` and ``producer_epoch``. ``needs_producer_id``:
    decide again with a fresh producer id."""

    error: int = NONE
    write: TransactionMetadata | None = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    needs_producer_id: bool = False


NEEDS_PRODUCER_ID = Decision(needs_producer_id=True)


def _failed(error: int) -> Decision:
    return Decision(error=error)


def _transit(meta: TransactionMetadata, state: TxnState, **changes: object
             ) -> TransactionMetadata:
    if meta.state not in VALID_PREVIOUS_STATES[state]:
        raise IllegalTransitionError(f"{meta.transactional_id}: {meta.state.kafka_name} -> "
                                f"{state.kafka_name}")
    new = replace(meta, state=state, **changes)  # type: ignore[arg-type]
    if state is not TxnState.DEAD and new.producer_epoch < 0:
        raise IllegalTransitionError(f"{meta.transactional_id}: epoch {new.producer_epoch}")
    return new


# --- InitProducerId ------------------------------------------------------------------------------


def _valid_producer_id(meta: TransactionMetadata, expected: ProducerIdAndEpoch) -> bool:
    """Kafka's ``isValidProducerId``: a new transactional id, the current producer, or the
    previous one retrying with its exhausted epoch after an id rotation."""
    return (meta.producer_epoch == NO_PRODUCER_EPOCH
            or expected.producer_id == meta.producer_id
            or (expected.producer_id == meta.previous_producer_id
                and epoch_exhausted(expected.epoch)))


def init_producer_id(meta: TransactionMetadata | None, transactional_id: str, timeout_ms: int,
                     expected: ProducerIdAndEpoch | None, now: int,
                     fresh_producer_id: int | None = None) -> Decision:
    """Kafka's ``handleInitProducerId`` for a transactional id (the timeout already checked):
    a new id gets a fresh producer id at epoch 0, an existing one its epoch bumped (a fresh
    producer id once the epoch is exhausted); ``expected`` (KIP-360) must be the current
    producer, else PRODUCER_FENCED, and a retry of a bump that succeeded gets the same answer
    again. An Ongoing transaction is fenced and aborted (CONCURRENT_TRANSACTIONS: the client
    retries once it is complete); a prepared one is CONCURRENT_TRANSACTIONS."""
    if meta is None:
        if fresh_producer_id is None:
            return NEEDS_PRODUCER_ID
        meta = TransactionMetadata(
            transactional_id=transactional_id, producer_id=fresh_producer_id,
            timeout_ms=timeout_ms, last_update_ms=now)
        fresh_producer_id = None
    if expected is not None and not _valid_producer_id(meta, expected):
        return _failed(PRODUCER_FENCED)
    if meta.state in PREPARED:
        return _failed(CONCURRENT_TRANSACTIONS)
    if meta.state is TxnState.ONGOING:
        return Decision(error=CONCURRENT_TRANSACTIONS, write=fence(meta, now))
    if meta.state not in EXPIRABLE:
        raise IllegalTransitionError(f"{transactional_id} is {meta.state.kafka_name}")
    if epoch_exhausted(meta.producer_epoch) and (
            expected is None or expected.epoch == meta.producer_epoch):
        if fresh_producer_id is None:
            return NEEDS_PRODUCER_ID
        # Kafka's prepareProducerIdRotation.
        new = _transit(meta, TxnState.EMPTY, producer_id=fresh_producer_id, producer_epoch=0,
                       last_producer_epoch=meta.producer_epoch if expected is not None
                       else NO_PRODUCER_EPOCH,
                       previous_producer_id=meta.producer_id, next_producer_id=NO_PRODUCER_ID,
                       timeout_ms=timeout_ms, partitions=frozenset(), start_ms=-1,
                       last_update_ms=now, client_transaction_version=TV_0)
        return Decision(write=new, producer_id=new.producer_id, producer_epoch=0)
    # Kafka's prepareIncrementProducerEpoch.
    bumped = meta.producer_epoch + 1
    if expected is None:
        epoch, last = bumped, NO_PRODUCER_EPOCH
    elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected.epoch == meta.producer_epoch:
        epoch, last = bumped, meta.producer_epoch
    elif expected.epoch == meta.last_producer_epoch:
        # A retry of a bump that succeeded: the same answer again.
        epoch, last = meta.producer_epoch, meta.last_producer_epoch
    else:
        return _failed(PRODUCER_FENCED)
    new = _transit(meta, TxnState.EMPTY, producer_epoch=epoch, last_producer_epoch=last,
                   previous_producer_id=meta.producer_id, timeout_ms=timeout_ms,
                   partitions=frozenset(), start_ms=-1, last_update_ms=now,
                   client_transaction_version=TV_0)
    return Decision(write=new, producer_id=new.producer_id, producer_epoch=epoch)


def fence(meta: TransactionMetadata, now: int) -> TransactionMetadata:
    """Kafka's ``prepareFenceProducerEpoch`` followed by its abort (``endTransaction`` with
    isFromClient false): PrepareAbort at the next epoch, which no producer holds, so the
    current one is fenced wherever the markers land. Whatever the transaction's version, the
    abort is written as one of the original protocol (:data:`FENCE_TRANSACTION_VERSION`)."""
    if meta.state is not TxnState.ONGOING:
        raise IllegalTransitionError(f"fencing {meta.transactional_id} in {meta.state.kafka_name}")
    if meta.producer_epoch >= MAX_PRODUCER_EPOCH:
        raise IllegalTransitionError(f"cannot fence {meta.transactional_id} at epoch "
                                f"{meta.producer_epoch}: it would overflow")
    fenced = replace(meta, producer_epoch=meta.producer_epoch + 1,
                     last_producer_epoch=NO_PRODUCER_EPOCH)
    return _prepare_end(fenced, TxnState.PREPARE_ABORT, FENCE_TRANSACTION_VERSION,
                        NO_PRODUCER_ID, now)


# --- AddPartitionsToTxn, AddOffsetsToTxn, verification -----------------------------------------


def _check_producer(meta: TransactionMetadata | None, producer_id: int, epoch: int) -> int:
    if meta is not None and meta.state in PREPARED and (producer_id, epoch) == (
            meta.next_producer_id, 0):
        # A transactions v2 producer moved on to the next producer id its EndTxn gave it,
        # before the markers of the transaction that overflowed were written: not yet.
        return CONCURRENT_TRANSACTIONS
    if meta is None or meta.producer_id != producer_id:
        return INVALID_PRODUCER_ID_MAPPING
    if meta.producer_epoch != epoch:
        return PRODUCER_FENCED
    return NONE


def add_partitions(meta: TransactionMetadata | None, producer_id: int, epoch: int,
                   partitions: frozenset[TopicPartition], now: int,
                   transaction_version: int = TV_0) -> Decision:
    """Kafka's ``handleAddPartitionsToTransaction``: the producer must be the current one;
    a prepared transaction is CONCURRENT_TRANSACTIONS; partitions an Ongoing transaction has
    already are NONE without a write; otherwise the transaction is Ongoing with them (started
    now if it was not, which is how a transactions v2 producer begins one: its first produce
    or TxnOffsetCommit adds the partition) and the client's ``transaction_version`` (TV_2 for
    the implicit add of Produce v12 and TxnOffsetCommit v5, Kafka's ``prepareAddPartitions``)."""
    error = _check_producer(meta, producer_id, epoch)
    if error:
        return _failed(error)
    assert meta is not None
    if meta.state in PREPARED:
        return _failed(CONCURRENT_TRANSACTIONS)
    if meta.state is TxnState.ONGOING and partitions <= meta.partitions:
        return Decision()
    start = now if meta.state in EXPIRABLE else meta.start_ms
    return Decision(write=_transit(meta, TxnState.ONGOING, partitions=meta.partitions | partitions,
                                   start_ms=start, last_update_ms=now,
                                   client_transaction_version=transaction_version))


def verify_partitions(meta: TransactionMetadata | None, producer_id: int, epoch: int,
                      partitions: frozenset[TopicPartition]) -> dict[TopicPartition, int]:
    """Kafka's ``handleVerifyPartitionsInTransaction`` (AddPartitionsToTxn verify_only, and a
    partition leader's check before it stores a transaction's first batch): NONE for each
    partition of the producer's transaction, TRANSACTION_ABORTABLE for the others; one error
    for all when the producer is not the current one or the transaction is being prepared."""
    error = _check_producer(meta, producer_id, epoch)
    if not error and meta is not None and meta.state in PREPARED:
        error = CONCURRENT_TRANSACTIONS
    if error or meta is None:
        return dict.fromkeys(partitions, error)
    return {tp: NONE if tp in meta.partitions else TRANSACTION_ABORTABLE for tp in partitions}


# --- EndTxn ---------------------------------------------------------------------------------------


def _prepare_end(meta: TransactionMetadata, state: TxnState, transaction_version: int,
                 next_producer_id: int, now: int) -> TransactionMetadata:
    """Kafka's ``prepareAbortOrCommit``: transactions v2 bump the epoch here."""
    if bumps_epoch_at_end(transaction_version):
        epoch, last = meta.producer_epoch + 1, meta.producer_epoch
    else:
        epoch, last = meta.producer_epoch, meta.last_producer_epoch
    return _transit(meta, state, producer_epoch=epoch, last_producer_epoch=last,
                    next_producer_id=next_producer_id, last_update_ms=now,
                    client_transaction_version=transaction_version)


def complete(meta: TransactionMetadata, now: int) -> TransactionMetadata:
    """Kafka's ``prepareComplete``, once every marker is written: CompleteCommit or
    CompleteAbort, no partitions; a transaction v2 whose epoch overflowed moves to its next
    producer id at epoch 0."""
    if meta.state not in PREPARED:
        raise IllegalTransitionError(f"completing {meta.transactional_id} in "
                                f"{meta.state.kafka_name}")
    state = TxnState.COMPLETE_COMMIT if meta.committing else TxnState.COMPLETE_ABORT
    if not bumps_epoch_at_end(meta.client_transaction_version):
        return _transit(meta, state, partitions=frozenset(), last_update_ms=now)
    if meta.next_producer_id != NO_PRODUCER_ID:
        producer_id, epoch = meta.next_producer_id, 0
    else:
        producer_id, epoch = meta.producer_id, meta.producer_epoch
    return _transit(meta, state, producer_id=producer_id, producer_epoch=epoch,
                    last_producer_epoch=meta.producer_epoch,
                    previous_producer_id=meta.producer_id, next_producer_id=NO_PRODUCER_ID,
                    partitions=frozenset(), last_update_ms=now)


def end_transaction(meta: TransactionMetadata | None, producer_id: int, epoch: int,
                    commit: bool, transaction_version: int, now: int,
                    fresh_producer_id: int | None = None) -> Decision:
    """Kafka's ``handleEndTransaction`` (isFromClient): an Ongoing transaction of the current
    producer is prepared (PrepareCommit or PrepareAbort; markers follow), and the answer
    carries the producer id and epoch the client continues with (transactions v2: the bumped
    epoch, or the next producer id at epoch 0 when it overflowed). A retry is recognised: the
    same end of a complete transaction is NONE, of a prepared one CONCURRENT_TRANSACTIONS (v2
    retries carry the epoch before the bump, as Kafka's ``endTxnEpochBumped`` and
    ``retryOnOverflow`` accept); the other end is INVALID_TXN_STATE, as is ending an Empty
    transaction. A producer that is not the current one is INVALID_PRODUCER_ID_MAPPING or
    PRODUCER_FENCED."""
    if meta is None:
        return _failed(INVALID_PRODUCER_ID_MAPPING)
    v2 = bumps_epoch_at_end(meta.client_transaction_version)
    retry_on_overflow = (v2 and meta.previous_producer_id == producer_id
                         and epoch == MAX_PRODUCER_EPOCH - 1 and meta.producer_epoch == 0)
    retry_on_bump = v2 and meta.producer_epoch == epoch + 1
    if not v2 or meta.state in (TxnState.ONGOING, TxnState.EMPTY):
        valid_epoch = epoch == meta.producer_epoch
    elif meta.state in PREPARED:
        valid_epoch = retry_on_bump
    else:
        valid_epoch = retry_on_bump or retry_on_overflow
    if meta.producer_id != producer_id and not retry_on_overflow:
        return _failed(INVALID_PRODUCER_ID_MAPPING)
    if not valid_epoch:
        return _failed(PRODUCER_FENCED)
    same = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if meta.state is TxnState.ONGOING:
        next_producer_id = NO_PRODUCER_ID
        if bumps_epoch_at_end(transaction_version) and epoch_exhausted(meta.producer_epoch):
            if fresh_producer_id is None:
                return NEEDS_PRODUCER_ID
            next_producer_id = fresh_producer_id
        prepared = _prepare_end(meta, preparing, transaction_version, next_producer_id, now)
        continues = complete(prepared, now)
        return Decision(write=prepared, producer_id=continues.producer_id,
                        producer_epoch=continues.producer_epoch)
    if meta.state is same:
        return Decision(producer_id=meta.producer_id, producer_epoch=meta.producer_epoch)
    if meta.state is preparing:
        return _failed(CONCURRENT_TRANSACTIONS)
    if meta.state in (TxnState.EMPTY, *PREPARED, *COMPLETED):
        return _failed(INVALID_TXN_STATE)
    raise IllegalTransitionError(f"{meta.transactional_id} is {meta.state.kafka_name}")


# --- by time ------------------------------------------------------------------------------------


def timed_out(meta: TransactionMetadata, now: int) -> bool:
    """Kafka's ``timedOutTransactions``: an Ongoing transaction past its timeout (which is
    then fenced and aborted)."""
    return meta.state is TxnState.ONGOING and meta.start_ms + meta.timeout_ms < now


def expired(meta: TransactionMetadata, now: int, config: TransactionConfig) -> bool:
    """Kafka's ``shouldExpire``: an idle Empty or complete transactional id, whose record is
    then deleted."""
    return (meta.state in EXPIRABLE
            and meta.last_update_ms <= now - config.transactional_id_expiration_ms)


def claim(meta: TransactionMetadata, now: int, config: TransactionConfig
          ) -> TransactionMetadata | None:
    """A prepared transaction whose markers nobody has been writing for the takeover time,
    written again as it is with ``now`` as its update time, so that exactly one handler (the
    one whose write lands) writes the markers and completes it; None when it is not due."""
    if meta.state not in PREPARED or now < meta.deadline_ms(config):
        return None
    return replace(meta, last_update_ms=now)
