"""The transaction state machine, decision by decision, with Kafka's answers: InitProducerId
(new ids, epoch bumps, KIP-360 retries and fencing, the fence of an Ongoing transaction, id
rotation), AddPartitions and verification, EndTxn (v1 and v2 with its retries and epoch
overflow), completion, timeouts, expiry, takeover, and the records."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.errors import ErrorCode
from services.handler.transactions.metadata import (
    MAX_PRODUCER_EPOCH,
    TV_0,
    TV_2,
    IllegalTransitionError,
    ProducerIdAndEpoch,
    TransactionConfig,
    TransactionMetadata,
    TxnState,
    add_partitions,
    claim,
    complete,
    end_transaction,
    expired,
    fence,
    init_producer_id,
    timed_out,
    verify_partitions,
)
from services.handler.transactions.state import PartitionState, transaction_record

E = ErrorCode
T0 = 1_700_000_000_000
CONFIG = TransactionConfig(transactional_id_expiration_ms=1000, marker_takeover_ms=100)
A, B, C = ("a", 0), ("a", 1), ("b", 0)


def started(producer_id: int = 7, epoch: int = 0, **fields: object) -> TransactionMetadata:
    meta = TransactionMetadata(transactional_id="tx", producer_id=producer_id,
                               producer_epoch=epoch, timeout_ms=60_000, last_update_ms=T0)
    return replace(meta, **fields)  # type: ignore[arg-type]


def ongoing(*partitions: tuple[str, int], **fields: object) -> TransactionMetadata:
    decision = add_partitions(started(**fields), 7, fields.get("producer_epoch", 0),  # type: ignore[arg-type]
                              frozenset(partitions or (A,)), T0 + 1)
    assert decision.write is not None
    return decision.write


def test_a_new_transactional_id_gets_a_fresh_producer_id_at_epoch_0() -> None:
    assert init_producer_id(None, "tx", 60_000, None, T0).needs_producer_id
    decision = init_producer_id(None, "tx", 60_000, None, T0, fresh_producer_id=7)
    assert (decision.error, decision.producer_id, decision.producer_epoch) == (0, 7, 0)
    assert decision.write == started(previous_producer_id=7)
    # A producer recovering (KIP-360) with an id the coordinator never saw gets one too.
    recovering = init_producer_id(None, "tx", 60_000, ProducerIdAndEpoch(producer_id=3, epoch=4),
                                  T0, fresh_producer_id=7)
    assert (recovering.error, recovering.producer_id, recovering.producer_epoch) == (0, 7, 0)


def test_init_bumps_the_epoch_recognises_a_retry_and_fences_anyone_else() -> None:
    meta = started(epoch=3, last_update_ms=T0 - 5)
    bumped = init_producer_id(meta, "tx", 30_000, None, T0)
    assert bumped.write is not None and (bumped.producer_id, bumped.producer_epoch) == (7, 4)
    assert (bumped.write.last_producer_epoch, bumped.write.timeout_ms,
            bumped.write.last_update_ms) == (-1, 30_000, T0)
    # KIP-360: the producer names itself; the epoch it had is remembered for a retry.
    mine = ProducerIdAndEpoch(producer_id=7, epoch=3)
    recovered = init_producer_id(meta, "tx", 30_000, mine, T0)
    assert recovered.write is not None and recovered.producer_epoch == 4
    assert recovered.write.last_producer_epoch == 3
    retried = init_producer_id(recovered.write, "tx", 30_000, mine, T0 + 1)
    assert (retried.error, retried.producer_epoch) == (0, 4)
    assert init_producer_id(recovered.write, "tx", 30_000, ProducerIdAndEpoch(
        producer_id=7, epoch=2), T0).error == E.producer_fenced.value
    assert init_producer_id(meta, "tx", 30_000, ProducerIdAndEpoch(
        producer_id=8, epoch=3), T0).error == E.producer_fenced.value


def test_init_during_a_transaction_fences_it_and_aborts_it_first() -> None:
    meta = ongoing(A, B)
    decision = init_producer_id(meta, "tx", 60_000, None, T0 + 10)
    assert decision.error == E.concurrent_transactions.value
    fenced = decision.write
    assert fenced is not None and fenced == fence(meta, T0 + 10)
    assert (fenced.state, fenced.producer_epoch, fenced.partitions, fenced.start_ms) == (
        TxnState.PREPARE_ABORT, 1, {A, B}, meta.start_ms)
    # The fenced producer cannot end it; a retried init waits until it is complete.
    assert end_transaction(fenced, 7, 0, True, TV_0, T0).error == E.producer_fenced.value
    assert init_producer_id(fenced, "tx", 60_000, None, T0).error == \
        E.concurrent_transactions.value
    done = complete(fenced, T0 + 20)
    assert (done.state, done.partitions, done.producer_epoch) == (
        TxnState.COMPLETE_ABORT, frozenset(), 1)
    again = init_producer_id(done, "tx", 60_000, None, T0 + 30)
    assert (again.error, again.producer_epoch) == (0, 2)


def test_an_exhausted_epoch_rotates_the_producer_id() -> None:
    meta = started(epoch=MAX_PRODUCER_EPOCH - 1, state=TxnState.COMPLETE_COMMIT)
    assert init_producer_id(meta, "tx", 60_000, None, T0).needs_producer_id
    rotated = init_producer_id(meta, "tx", 60_000, None, T0, fresh_producer_id=9)
    assert rotated.write is not None and (rotated.producer_id, rotated.producer_epoch) == (9, 0)
    assert (rotated.write.previous_producer_id, rotated.write.last_producer_epoch) == (7, -1)
    # A producer that asked for it by name, and retries, gets the same new id back.
    mine = ProducerIdAndEpoch(producer_id=7, epoch=MAX_PRODUCER_EPOCH - 1)
    asked = init_producer_id(meta, "tx", 60_000, mine, T0, fresh_producer_id=9)
    assert asked.write is not None
    retried = init_producer_id(asked.write, "tx", 60_000, mine, T0 + 1)
    assert (retried.error, retried.producer_id, retried.producer_epoch) == (0, 9, 0)


def test_adding_partitions_starts_a_transaction_and_checks_the_producer() -> None:
    meta = started()
    assert add_partitions(None, 7, 0, frozenset({A}), T0).error == \
        E.invalid_producer_id_mapping.value
    assert add_partitions(meta, 8, 0, frozenset({A}), T0).error == \
        E.invalid_producer_id_mapping.value
    assert add_partitions(meta, 7, 1, frozenset({A}), T0).error == E.producer_fenced.value
    first = add_partitions(meta, 7, 0, frozenset({A}), T0 + 1).write
    assert first is not None and (first.state, first.partitions, first.start_ms) == (
        TxnState.ONGOING, {A}, T0 + 1)
    assert add_partitions(first, 7, 0, frozenset({A}), T0 + 2) == add_partitions(
        first, 7, 0, frozenset(), T0) and add_partitions(first, 7, 0, frozenset({A}),
                                                          T0 + 2).write is None
    more = add_partitions(first, 7, 0, frozenset({B, C}), T0 + 3).write
    assert more is not None and (more.partitions, more.start_ms, more.last_update_ms) == (
        {A, B, C}, T0 + 1, T0 + 3)
    prepared = end_transaction(more, 7, 0, True, TV_0, T0).write
    assert prepared is not None
    assert add_partitions(prepared, 7, 0, frozenset({A}), T0).error == \
        E.concurrent_transactions.value
    # After a complete transaction the next one starts afresh.
    again = add_partitions(complete(prepared, T0 + 4), 7, 0, frozenset({C}), T0 + 5).write
    assert again is not None and (again.partitions, again.start_ms) == ({C}, T0 + 5)


def test_verification_answers_per_partition_as_the_coordinator_sees_the_transaction() -> None:
    meta = ongoing(A)
    assert verify_partitions(meta, 7, 0, frozenset({A, B})) == {
        A: 0, B: E.transaction_abortable.value}
    assert verify_partitions(meta, 7, 1, frozenset({A})) == {A: E.producer_fenced.value}
    assert verify_partitions(meta, 6, 0, frozenset({A})) == {
        A: E.invalid_producer_id_mapping.value}
    assert verify_partitions(None, 7, 0, frozenset({A})) == {
        A: E.invalid_producer_id_mapping.value}
    prepared = end_transaction(meta, 7, 0, False, TV_0, T0).write
    assert verify_partitions(prepared, 7, 0, frozenset({A})) == {
        A: E.concurrent_transactions.value}
    assert verify_partitions(started(), 7, 0, frozenset({A})) == {
        A: E.transaction_abortable.value}


def test_ending_a_transaction_v1_and_its_retries() -> None:
    assert end_transaction(None, 7, 0, True, TV_0, T0).error == \
        E.invalid_producer_id_mapping.value
    assert end_transaction(started(), 7, 0, True, TV_0, T0).error == E.invalid_txn_state.value
    meta = ongoing(A)
    assert end_transaction(meta, 7, 1, True, TV_0, T0).error == E.producer_fenced.value
    decision = end_transaction(meta, 7, 0, True, TV_0, T0 + 5)
    prepared = decision.write
    assert prepared is not None and (decision.producer_id, decision.producer_epoch) == (7, 0)
    assert (prepared.state, prepared.partitions, prepared.producer_epoch) == (
        TxnState.PREPARE_COMMIT, {A}, 0)
    assert end_transaction(prepared, 7, 0, True, TV_0, T0).error == \
        E.concurrent_transactions.value
    assert end_transaction(prepared, 7, 0, False, TV_0, T0).error == E.invalid_txn_state.value
    done = complete(prepared, T0 + 6)
    assert (done.state, done.partitions, done.start_ms) == (
        TxnState.COMPLETE_COMMIT, frozenset(), meta.start_ms)
    retried = end_transaction(done, 7, 0, True, TV_0, T0)
    assert (retried.error, retried.write) == (0, None)
    assert end_transaction(done, 7, 0, False, TV_0, T0).error == E.invalid_txn_state.value
    with pytest.raises(IllegalTransitionError):
        complete(done, T0)


def test_transactions_v2_bump_the_epoch_at_every_end_and_recognise_retries() -> None:
    meta = ongoing(A, producer_epoch=4)
    decision = end_transaction(meta, 7, 4, False, TV_2, T0 + 5)
    prepared = decision.write
    assert prepared is not None and (decision.producer_id, decision.producer_epoch) == (7, 5)
    assert (prepared.producer_epoch, prepared.last_producer_epoch) == (5, 4)
    # The retry carries the epoch before the bump.
    assert end_transaction(prepared, 7, 4, False, TV_2, T0).error == \
        E.concurrent_transactions.value
    assert end_transaction(prepared, 7, 5, False, TV_2, T0).error == E.producer_fenced.value
    done = complete(prepared, T0 + 6)
    assert (done.state, done.producer_epoch) == (TxnState.COMPLETE_ABORT, 5)
    retried = end_transaction(done, 7, 4, False, TV_2, T0)
    assert (retried.error, retried.producer_id, retried.producer_epoch) == (0, 7, 5)
    # The next transaction runs at the bumped epoch.
    assert add_partitions(done, 7, 5, frozenset({A}), T0).write is not None


def test_transactions_v2_epoch_overflow_moves_to_a_new_producer_id() -> None:
    meta = ongoing(A, producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert end_transaction(meta, 7, MAX_PRODUCER_EPOCH - 1, True, TV_2, T0).needs_producer_id
    decision = end_transaction(meta, 7, MAX_PRODUCER_EPOCH - 1, True, TV_2, T0,
                               fresh_producer_id=11)
    assert (decision.producer_id, decision.producer_epoch) == (11, 0)
    prepared = decision.write
    assert prepared is not None and prepared.next_producer_id == 11
    done = complete(prepared, T0 + 1)
    assert (done.producer_id, done.producer_epoch, done.previous_producer_id,
            done.next_producer_id) == (11, 0, 7, -1)
    retried = end_transaction(done, 7, MAX_PRODUCER_EPOCH - 1, True, TV_2, T0)
    assert (retried.error, retried.producer_id, retried.producer_epoch) == (0, 11, 0)


def test_time_decides_timeouts_expiry_and_takeovers() -> None:
    meta = ongoing(A)  # started at T0 + 1, 60 s timeout
    assert meta.deadline_ms(CONFIG) == T0 + 1 + 60_000 + 1
    assert not timed_out(meta, T0 + 1 + 60_000) and timed_out(meta, T0 + 1 + 60_001)
    prepared = end_transaction(meta, 7, 0, True, TV_0, T0 + 10).write
    assert prepared is not None and prepared.deadline_ms(CONFIG) == T0 + 110
    assert claim(prepared, T0 + 109, CONFIG) is None
    claimed = claim(prepared, T0 + 110, CONFIG)
    assert claimed == replace(prepared, last_update_ms=T0 + 110)
    done = complete(prepared, T0 + 20)
    assert done.deadline_ms(CONFIG) == T0 + 1020
    assert not expired(done, T0 + 1019, CONFIG) and expired(done, T0 + 1020, CONFIG)
    assert not expired(meta, T0 + 10**9, CONFIG) and claim(meta, T0 + 10**9, CONFIG) is None


def test_records_hold_the_whole_state_and_tombstones_delete_it() -> None:
    state = PartitionState()
    for meta in (started(), ongoing(A, C), started(epoch=3, last_producer_epoch=2),
                 complete(end_transaction(ongoing(B), 7, 0, True, TV_2, T0).write, T0)):  # type: ignore[arg-type]
        key, value = transaction_record("tx", meta)
        assert value is not None and value[:2] == b"\x00\x01"  # value v1
        state.replay(key, value)
        assert state.get("tx") == meta
    key, tombstone = transaction_record("tx", None)
    assert tombstone is None
    state.replay(key, tombstone)
    assert state.get("tx") is None
    # Kafka writes an Empty transaction's partitions as null.
    assert started().to_record().transaction_partitions is None


def test_transactions_v2_an_implicit_add_begins_the_next_transaction() -> None:
    """Produce v12 and TxnOffsetCommit v5 add their partition (Kafka's
    ``handleAddPartitionsToTransaction`` with the client's TV_2): from Empty or Complete* a
    transaction begins, recorded with the client's version, so its EndTxn retries are
    recognised by the bumped epoch."""
    meta = started(producer_epoch=2)
    decision = add_partitions(meta, 7, 2, frozenset({A}), T0 + 3, TV_2)
    begun = decision.write
    assert decision.error == 0 and begun is not None
    assert (begun.state, begun.partitions, begun.start_ms, begun.client_transaction_version) == (
        TxnState.ONGOING, {A}, T0 + 3, TV_2)
    # The same partitions again: nothing to write; another joins.
    assert add_partitions(begun, 7, 2, frozenset({A}), T0 + 4, TV_2) == add_partitions(
        begun, 7, 2, frozenset(), T0 + 4, TV_2)
    assert add_partitions(begun, 7, 2, frozenset({A}), T0 + 4, TV_2).write is None
    more = add_partitions(begun, 7, 2, frozenset({B}), T0 + 5, TV_2).write
    assert more is not None and more.partitions == {A, B} and more.start_ms == T0 + 3
    ended = end_transaction(more, 7, 2, True, TV_2, T0 + 6)
    assert (ended.producer_id, ended.producer_epoch) == (7, 3)
    prepared = ended.write
    assert prepared is not None
    # While its markers are written the producer's next transaction waits; after, it begins
    # at the bumped epoch, and the epoch before the bump is fenced.
    assert add_partitions(prepared, 7, 3, frozenset({C}), T0 + 7, TV_2).error == \
        E.concurrent_transactions.value
    done = complete(prepared, T0 + 8)
    nxt = add_partitions(done, 7, 3, frozenset({C}), T0 + 9, TV_2).write
    assert nxt is not None and (nxt.state, nxt.partitions, nxt.start_ms) == (
        TxnState.ONGOING, {C}, T0 + 9)
    assert add_partitions(done, 7, 2, frozenset({C}), T0 + 9, TV_2).error == \
        E.producer_fenced.value


def test_transactions_v2_the_next_producer_id_waits_for_the_markers() -> None:
    """After an epoch overflow the client continues with the next producer id at once; until
    the markers are written its implicit add is CONCURRENT_TRANSACTIONS (retried), not
    INVALID_PRODUCER_ID_MAPPING."""
    meta = ongoing(A, producer_epoch=MAX_PRODUCER_EPOCH - 1)
    prepared = end_transaction(meta, 7, MAX_PRODUCER_EPOCH - 1, True, TV_2, T0,
                               fresh_producer_id=11).write
    assert prepared is not None
    assert add_partitions(prepared, 11, 0, frozenset({B}), T0, TV_2).error == \
        E.concurrent_transactions.value
    assert add_partitions(prepared, 12, 0, frozenset({B}), T0, TV_2).error == \
        E.invalid_producer_id_mapping.value
    done = complete(prepared, T0 + 1)
    begun = add_partitions(done, 11, 0, frozenset({B}), T0 + 2, TV_2).write
    assert begun is not None and (begun.producer_id, begun.producer_epoch) == (11, 0)


def test_a_fence_ends_a_transactions_v2_transaction_the_original_way() -> None:
    """A timeout (or a new producer's InitProducerId) fences with one bump no producer holds,
    written as the original protocol, so the fenced producer's EndTxn v5 is PRODUCER_FENCED
    rather than taken for a retry of its own bump."""
    meta = add_partitions(started(producer_epoch=4), 7, 4, frozenset({A}), T0, TV_2).write
    assert meta is not None
    fenced = fence(meta, T0 + 1)
    assert (fenced.state, fenced.producer_epoch, fenced.last_producer_epoch,
            fenced.client_transaction_version) == (TxnState.PREPARE_ABORT, 5, -1, TV_0)
    done = complete(fenced, T0 + 2)
    assert (done.state, done.producer_epoch) == (TxnState.COMPLETE_ABORT, 5)
    for commit in (True, False):
        assert end_transaction(done, 7, 4, commit, TV_2, T0 + 3).error == \
            E.producer_fenced.value
    assert add_partitions(done, 7, 4, frozenset({A}), T0 + 3, TV_2).error == \
        E.producer_fenced.value
