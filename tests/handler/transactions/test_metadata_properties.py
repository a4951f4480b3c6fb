"""Property test of the transaction state machine against Kafka's transition rules: random
sequences of InitProducerId (with and without the producer naming itself), AddPartitions,
EndTxn (v1 and v2), marker completion, timeouts, expiry, takeovers and the passing of time, by
the live producer, producers it replaced, and strangers. Every write must be a transition
Kafka's ``TransactionMetadata`` accepts (``validPreviousStates`` and the checks of
``completeTransitionTo``), survive its record, and no replaced producer may ever change the
transaction."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from services.common.errors import ErrorCode
from services.handler.transactions.metadata import (
    COMPLETED,
    MAX_PRODUCER_EPOCH,
    PREPARED,
    TV_0,
    TV_2,
    VALID_PREVIOUS_STATES,
    Decision,
    ProducerIdAndEpoch,
    TransactionConfig,
    TransactionMetadata,
    TxnState,
    add_partitions,
    bumps_epoch_at_end,
    claim,
    complete,
    end_transaction,
    expired,
    fence,
    init_producer_id,
    timed_out,
)
from services.handler.transactions.state import PartitionState, transaction_record

E = ErrorCode
T0 = 1_700_000_000_000
CONFIG = TransactionConfig(transactional_id_expiration_ms=5_000, marker_takeover_ms=500)
PARTITIONS = [("a", 0), ("a", 1), ("b", 0), ("__consumer_offsets", 3)]
Producer = tuple[int, int]


def kafka_accepts(old: TransactionMetadata | None, new: TransactionMetadata) -> None:
    """Kafka's rules for a transition from ``old`` (None: a new transactional id) to
    ``new`` (its ``validPreviousStates`` and ``completeTransitionTo``'s checks)."""
    assert new.state not in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE)
    assert 0 <= new.producer_epoch <= MAX_PRODUCER_EPOCH
    if old is None:
        assert (new.state, new.producer_epoch, new.partitions) == (TxnState.EMPTY, 0, set())
        return
    assert new.last_update_ms >= old.last_update_ms
    if new.state is old.state and new.state in PREPARED and new != old:
        # A takeover: the same prepared transaction, only its update time moves.
        assert replace(new, last_update_ms=old.last_update_ms) == old
        return
    assert old.state in VALID_PREVIOUS_STATES[new.state], (old.state, new.state)
    same_producer = (new.producer_id, new.producer_epoch) == (old.producer_id, old.producer_epoch)
    if new.state is TxnState.EMPTY:
        assert same_producer or (new.producer_id == old.producer_id
                                 and new.producer_epoch == old.producer_epoch + 1) or (
            new.producer_epoch == 0 and new.producer_id != old.producer_id)
        assert (new.partitions, new.start_ms) == (set(), -1)
    elif new.state is TxnState.ONGOING:
        assert same_producer and old.partitions <= new.partitions
        assert new.timeout_ms == old.timeout_ms and new.partitions
    elif new.state in PREPARED:
        assert new.producer_id == old.producer_id
        assert (new.partitions, new.timeout_ms, new.start_ms) == (
            old.partitions, old.timeout_ms, old.start_ms)
        if bumps_epoch_at_end(new.client_transaction_version):
            assert (new.producer_epoch, new.last_producer_epoch) == (
                old.producer_epoch + 1, old.producer_epoch)
        elif old.state is TxnState.ONGOING and new.producer_epoch == old.producer_epoch + 1:
            assert new.state is TxnState.PREPARE_ABORT  # a fence
        else:
            assert new.producer_epoch == old.producer_epoch
    else:
        assert new.state in COMPLETED
        assert (new.partitions, new.timeout_ms) == (set(), old.timeout_ms)
        assert new.start_ms != -1
        if new.producer_id != old.producer_id:  # a v2 epoch overflow
            assert bumps_epoch_at_end(new.client_transaction_version)
            assert (new.producer_epoch, new.previous_producer_id, new.last_producer_epoch) == (
                0, old.producer_id, old.producer_epoch)
        else:
            assert new.producer_epoch == old.producer_epoch


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.meta: TransactionMetadata | None = None
        self.now = T0
        self.last_producer_id = 100
        # The producer the client holds now, and every one it held before (replaced).
        self.current: Producer | None = None
        self.replaced: set[Producer] = set()
        self.log = PartitionState()

    def fresh_producer_id(self) -> int:
        self.last_producer_id += 1
        return self.last_producer_id

    def write(self, decision: Decision) -> None:
        new = decision.write
        assert new is not None
        kafka_accepts(self.meta, new)
        key, value = transaction_record("tx", new)
        self.log.replay(key, value)
        assert self.log.get("tx") == new
        self.meta = new

    def hand_out(self, producer: Producer) -> None:
        if self.current is not None and self.current != producer:
            self.replaced.add(self.current)
        self.replaced.discard(producer)
        self.current = producer

    def lose_producer(self) -> None:
        if self.current is not None:
            self.replaced.add(self.current)
        self.current = None

    def producer(self, data: st.DataObject) -> Producer:
        choices: list[Producer] = [(7, 0), (self.last_producer_id + 5, 3)]
        if self.current is not None:
            choices += [self.current] * 3
        choices += sorted(self.replaced)
        if self.meta is not None:
            choices.append((self.meta.producer_id, self.meta.producer_epoch))
        return data.draw(st.sampled_from(choices))

    @rule(data=st.data(), timeout=st.sampled_from([1_000, 60_000]),
          name_itself=st.booleans())
    def init(self, data: st.DataObject, timeout: int, name_itself: bool) -> None:
        expected = None
        if name_itself:
            pid, epoch = self.producer(data)
            expected = ProducerIdAndEpoch(producer_id=pid, epoch=epoch)
        decision = init_producer_id(self.meta, "tx", timeout, expected, self.now)
        if decision.needs_producer_id:
            decision = init_producer_id(self.meta, "tx", timeout, expected, self.now,
                                        self.fresh_producer_id())
        if decision.error == E.concurrent_transactions.value and decision.write is not None:
            self.write(decision)  # an Ongoing transaction fenced
            self.lose_producer()
        elif decision.error == 0:
            self.write(decision)
            assert decision.write is not None
            assert (decision.producer_id, decision.producer_epoch) == (
                decision.write.producer_id, decision.write.producer_epoch)
            self.hand_out((decision.producer_id, decision.producer_epoch))
        else:
            assert decision.write is None
            assert decision.error in (E.producer_fenced.value, E.concurrent_transactions.value)

    @rule(data=st.data(), partitions=st.sets(st.sampled_from(PARTITIONS), min_size=1))
    def add(self, data: st.DataObject, partitions: set[tuple[str, int]]) -> None:
        pid, epoch = self.producer(data)
        decision = add_partitions(self.meta, pid, epoch, frozenset(partitions), self.now)
        if (pid, epoch) in self.replaced:
            assert decision.write is None and decision.error
        if decision.error:
            assert decision.write is None
            return
        assert self.meta is not None and (pid, epoch) == (
            self.meta.producer_id, self.meta.producer_epoch)
        if decision.write is not None:
            self.write(decision)
        # Whoever holds the transaction's epoch (a client that never got it only by guessing
        # the epoch of a fence) is its producer.
        self.hand_out((pid, epoch))
        assert self.meta.state is TxnState.ONGOING and partitions <= self.meta.partitions

    @rule(data=st.data(), commit=st.booleans(), version=st.sampled_from([TV_0, TV_2]))
    def end(self, data: st.DataObject, commit: bool, version: int) -> None:
        pid, epoch = self.producer(data)
        decision = end_transaction(self.meta, pid, epoch, commit, version, self.now)
        if decision.needs_producer_id:
            decision = end_transaction(self.meta, pid, epoch, commit, version, self.now,
                                       self.fresh_producer_id())
        if decision.write is None:
            if decision.error == 0:  # a retry of an end that is complete
                assert self.meta is not None and self.meta.state in COMPLETED
                assert (decision.producer_id, decision.producer_epoch) == (
                    self.meta.producer_id, self.meta.producer_epoch)
            return
        assert (pid, epoch) not in self.replaced and decision.error == 0
        self.hand_out((pid, epoch))
        self.write(decision)
        assert self.meta is not None and self.meta.state is (
            TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
        assert (decision.producer_id, decision.producer_epoch) == (
            complete(self.meta, self.now).producer_id, complete(self.meta, self.now).producer_epoch)
        if bumps_epoch_at_end(version):
            self.hand_out((decision.producer_id, decision.producer_epoch))

    @precondition(lambda self: self.meta is not None and self.meta.state in PREPARED)
    @rule()
    def markers_written(self) -> None:
        assert self.meta is not None
        self.write(Decision(write=complete(self.meta, self.now)))

    @precondition(lambda self: self.meta is not None and self.meta.state in PREPARED)
    @rule()
    def takeover(self) -> None:
        assert self.meta is not None
        claimed = claim(self.meta, self.now, CONFIG)
        assert (claimed is not None) == (self.now >= self.meta.deadline_ms(CONFIG))
        if claimed is not None:
            self.write(Decision(write=claimed))

    @precondition(lambda self: self.meta is not None)
    @rule()
    def by_time(self) -> None:
        assert self.meta is not None
        if timed_out(self.meta, self.now):
            assert self.now >= self.meta.deadline_ms(CONFIG)
            self.write(Decision(write=fence(self.meta, self.now)))
            self.lose_producer()
        elif expired(self.meta, self.now, CONFIG):
            assert self.now >= self.meta.deadline_ms(CONFIG)
            key, tombstone = transaction_record("tx", None)
            self.log.replay(key, tombstone)
            self.meta = None
            self.lose_producer()
        elif self.meta.state in (TxnState.ONGOING, *COMPLETED, TxnState.EMPTY):
            assert self.now < self.meta.deadline_ms(CONFIG)

    @rule(ms=st.sampled_from([1, 400, 1_001, 6_000, 61_000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def consistent(self) -> None:
        meta = self.meta
        if meta is None:
            return
        if meta.state is TxnState.EMPTY:
            assert not meta.partitions and meta.start_ms == -1
        if meta.state in COMPLETED:
            assert not meta.partitions
        if meta.state in (TxnState.ONGOING, *PREPARED):
            assert meta.partitions and meta.start_ms >= 0
        if self.current is not None and meta.state not in PREPARED:
            # Outside an end in progress, the client's producer is the transaction's.
            assert self.current == (meta.producer_id, meta.producer_epoch)


TransactionMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                                deadline=None)
test_transaction_state_machine = TransactionMachine.TestCase
