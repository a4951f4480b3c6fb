"""The transaction coordinator (Kafka's ``TransactionCoordinator`` with its
``TransactionStateManager``) run by stateless handlers: the second user of the coordinator
runtime (:mod:`..coordinator`), whose internal topic is ``__transaction_state`` (created as
Kafka creates it, from the transaction.state.log.* settings: compacted, uncompressed) and whose
state per partition is its transactional ids' transactions (:mod:`.state`). Every handler can
serve every transactional id; the coordinator clients see is the leader of the id's partition,
and its leader epoch is the coordinator epoch markers carry.

Every transition is one record appended with the runtime's conditional append and answered only
once replicated (:mod:`.metadata` decides it on the fresh state). A transaction that reaches
PrepareCommit or PrepareAbort has its markers written at once by the handler that wrote the
record (:mod:`.markers`), which then writes CompleteCommit or CompleteAbort. If that handler
dies, the transaction is not lost: each transactional id has one timer in the purgatory, for
its next deadline (:meth:`~.metadata.TransactionMetadata.deadline_ms`):

    txn:<transactional id>    Ongoing: its timeout (fenced and aborted, Kafka's
                              abortTimedOutTransactions); Prepare*: the takeover time, kept
                              from running out by the handler writing its markers; Empty and
                              Complete*: transactional.id.expiration.ms (the record deleted)

Every handler hears every expiry; whoever's conditional write lands first acts (a takeover
writes the prepared record again with a new update time, which also tells the first writer,
should it be alive after all, to stop). Timers are soft state: the runtime arms those a
partition implies on a first load and when the expiry stream reconnects.

The coordinator epoch (the leader epoch of the id's partition) fences markers of a
coordinator that lost its partition, as Kafka's does; handlers of one epoch share it. A
handler stalled for longer than the takeover time inside one marker call could, in principle,
have that call land after another handler completed the transaction and after the producer
started its next one on that partition (at the same producer epoch), ending it early there; a
writer checks before every attempt that the transaction is still the one it prepared (but for
a first attempt within half the takeover time of its own write, when nobody else can have
acted on it yet), so only a call already in flight (bounded by its time limit) is exposed. A
new producer epoch in between (InitProducerId) fences such a marker at the partition
(INVALID_PRODUCER_EPOCH).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from kbroker.replicator.v1 import replicator_pb2
from services.common.coordinator_keys import TRANSACTION_STATE_TOPIC
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller, LogNodes, Purgatory
from ..config import HandlerConfig
from ..coordinator.placement import CoordinatorError, Placement
from ..coordinator.runtime import CoordinatorRuntime
from ..metadata_cache import MetadataCache
from ..metrics import TRANSACTION_TIMER_ACTIONS, TRANSACTION_WRITES, TRANSACTIONS_COMPLETED
from . import metadata as txn
from .markers import MarkerWriter
from .metadata import (
    NONE,
    PREPARED,
    Decision,
    ProducerIdAndEpoch,
    TopicPartition,
    TransactionConfig,
    TransactionMetadata,
    TxnState,
)
from .state import PartitionState, Record, transaction_record

log = logging.getLogger(__name__)

TIMER_PREFIX = "txn:"
# A deadline timer wakes this long after the deadline, so it has surely passed by then.
DEADLINE_SLACK_MS = 5
# Decisions made again with a fresh producer id before giving up (a race at most).
MAX_DECISIONS = 3
# First pause before a failed attempt to finish a prepared transaction is made again.
FINISH_BACKOFF_S = 0.2
# How long InitProducerId and AddPartitionsToTxn wait for a prepared transaction's markers
# before they answer CONCURRENT_TRANSACTIONS (see TransactionCoordinator._decide_when_settled).
SETTLE_WAIT_MS = 1_000

INVALID_REQUEST = ErrorCode.invalid_request.value
CONCURRENT_TRANSACTIONS = ErrorCode.concurrent_transactions.value
INVALID_TRANSACTION_TIMEOUT = ErrorCode.invalid_transaction_timeout.value
COORDINATOR_LOAD_IN_PROGRESS = ErrorCode.coordinator_load_in_progress.value
TRANSACTIONAL_ID_NOT_FOUND = ErrorCode.transactional_id_not_found.value

T = TypeVar("T")


class ProducerIds(Protocol):
    async def next_id(self) -> int:
        """A producer id no one else got; raises CallError when none can be had."""
        ...


def timer_key(transactional_id: str) -> str:
    return TIMER_PREFIX + transactional_id


def parse_timer_key(key: str) -> str | None:
    return key[len(TIMER_PREFIX):] if key.startswith(TIMER_PREFIX) else None


def timers_of(config: TransactionConfig) -> Callable[[PartitionState, int], dict[str, int]]:
    """The timers a partition's transactions imply: each one's next deadline."""

    def implied(state: PartitionState, now: int) -> dict[str, int]:
        return {timer_key(tid): _timeout(meta, now, config)
                for tid, meta in state.transactions.items() if meta.deadline_ms(config) >= 0}

    return implied


def _timeout(meta: TransactionMetadata, now: int, config: TransactionConfig) -> int:
    return max(meta.deadline_ms(config) - now, 0) + DEADLINE_SLACK_MS


def _records(transactional_id: str, decision: Decision) -> list[Record]:
    return [] if decision.write is None else [transaction_record(transactional_id,
                                                                 decision.write)]


class TransactionCoordinator:
    """Transactions over ``__transaction_state``, the purgatory, metadata and log nodes."""

    def __init__(self, cache: MetadataCache, log_nodes: LogNodes, controller: Controller,
                 purgatory: Purgatory, config: HandlerConfig, producer_ids: ProducerIds) -> None:
        self.config = TransactionConfig(
            max_timeout_ms=config.transaction_max_timeout_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
            marker_takeover_ms=config.transaction_marker_takeover_ms)
        self.placement = Placement(replicator_pb2.NewTopic(
            name=TRANSACTION_STATE_TOPIC,
            num_partitions=config.transaction_state_log_num_partitions,
            replication_factor=config.transaction_state_log_replication_factor,
            configs={"segment.bytes": str(config.transaction_state_log_segment_bytes),
                     "compression.type": "uncompressed",
                     "unclean.leader.election.enable": "false"}), cache, controller)
        self.runtime = CoordinatorRuntime(self.placement, log_nodes, purgatory, PartitionState,
                                          kind="transaction", timers_of=timers_of(self.config),
                                          writes=TRANSACTION_WRITES,
                                          leader_wait_ms=config.acks_all_leader_wait_ms)
        self.settle_wait_ms = SETTLE_WAIT_MS
        self.markers = MarkerWriter(cache, log_nodes, purgatory,
                                    leader_wait_ms=config.acks_all_leader_wait_ms)
        self._producer_ids = producer_ids
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> int:
        return self.runtime.now()

    # -- requests -------------------------------------------------------------------------------

    async def _decide(self, transactional_id: str,
                      decide: Callable[[TransactionMetadata | None, int, int | None], Decision],
                      ) -> Decision:
        """Apply ``decide(transaction, now, fresh producer id)`` as a conditional write; a
        decision that needs a producer id is made again with one. Raises CoordinatorError."""
        fresh: int | None = None
        for _ in range(MAX_DECISIONS):
            def change(state: PartitionState, now: int,
                       fresh: int | None = fresh) -> tuple[list[Record], Decision]:
                decision = decide(state.get(transactional_id), now, fresh)
                return _records(transactional_id, decision), decision

            decision, _ = await self.runtime.update(transactional_id, change)
            if not decision.needs_producer_id:
                if decision.write is not None:
                    await self._written(decision.write)
                return decision
            try:
                fresh = await self._producer_ids.next_id()
            except CallError as exc:
                raise CoordinatorError(COORDINATOR_LOAD_IN_PROGRESS, str(exc)) from exc
        raise CoordinatorError(COORDINATOR_LOAD_IN_PROGRESS,
                               f"{transactional_id}: no producer id decided")

    async def _decide_when_settled(
            self, transactional_id: str,
            decide: Callable[[TransactionMetadata | None, int, int | None], Decision],
    ) -> Decision:
        """:meth:`_decide`, except that a decision of CONCURRENT_TRANSACTIONS while the
        transaction's markers are being written (PrepareCommit or PrepareAbort) waits for it to
        complete, up to :attr:`settle_wait_ms`, and is made again. Kafka answers at once and the
        client retries after a backoff; a client that begins its next transaction right after
        EndTxn (whose answer does not wait for the markers) would otherwise pay that backoff on
        every transaction. The answers are Kafka's: only when they come differs."""
        give_up = time.monotonic() + self.settle_wait_ms / 1000
        while True:
            decision = await self._decide(transactional_id, decide)
            remaining_ms = (give_up - time.monotonic()) * 1000
            if decision.error != CONCURRENT_TRANSACTIONS or remaining_ms <= 0:
                return decision
            state, end = await self.runtime.read_at(transactional_id)
            meta = state.get(transactional_id)
            if meta is not None and meta.state in PREPARED:
                # Woken by the write that completes it (see _finish_once), or the time limit.
                await self.runtime.wait(transactional_id, end + 1, remaining_ms)

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               expected: ProducerIdAndEpoch | None) -> Decision:
        """InitProducerId with a transactional id (its own error when the decision is made;
        CoordinatorError when the partition cannot be served)."""
        if not transactional_id:
            return Decision(error=INVALID_REQUEST)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return Decision(error=INVALID_TRANSACTION_TIMEOUT)
        return await self._decide_when_settled(transactional_id, lambda meta, now, fresh: (
            txn.init_producer_id(meta, transactional_id, timeout_ms, expected, now, fresh)))

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: frozenset[TopicPartition],
                             transaction_version: int = txn.TV_0) -> int:
        """AddPartitionsToTxn and AddOffsetsToTxn (``transaction_version`` TV_0), and the
        implicit add of transactions v2 (TV_2: a partition leader's, or the group
        coordinator's, before it stores a transaction's first batch or offsets there): the
        error for every partition."""
        if not transactional_id:
            return INVALID_REQUEST
        decision = await self._decide_when_settled(transactional_id, lambda meta, now, fresh: (
            txn.add_partitions(meta, producer_id, epoch, partitions, now,
                               transaction_version)))
        return decision.error

    async def verify(self, transactional_id: str, producer_id: int, epoch: int,
                     partitions: frozenset[TopicPartition]) -> dict[TopicPartition, int]:
        """Whether each partition is in the producer's transaction (no write)."""
        if not transactional_id:
            return dict.fromkeys(partitions, INVALID_REQUEST)
        state = await self.runtime.read(transactional_id)
        return txn.verify_partitions(state.get(transactional_id), producer_id, epoch, partitions)

    async def end_transaction(self, transactional_id: str, producer_id: int, epoch: int,
                              commit: bool, transaction_version: int) -> Decision:
        """EndTxn: answered once the prepared state is written; the markers follow."""
        if not transactional_id:
            return Decision(error=INVALID_REQUEST)
        return await self._decide(transactional_id, lambda meta, now, fresh: (
            txn.end_transaction(meta, producer_id, epoch, commit, transaction_version, now,
                                fresh)))

    async def describe(self, transactional_id: str) -> tuple[int, TransactionMetadata | None]:
        """DescribeTransactions for one id: (error, its transaction)."""
        if not transactional_id:
            return INVALID_REQUEST, None
        meta = (await self.runtime.read(transactional_id)).get(transactional_id)
        return (NONE, meta) if meta is not None else (TRANSACTIONAL_ID_NOT_FOUND, None)

    async def list_transactions(self, broker_id: int | None) -> list[TransactionMetadata]:
        """Every transaction of the partitions ``broker_id`` leads (all when None)."""
        return [meta for state in await self.runtime.states_led_by(broker_id)
                for _, meta in sorted(state.transactions.items())]

    # -- after a write --------------------------------------------------------------------------

    async def _written(self, meta: TransactionMetadata) -> None:
        """Arm the transaction's timer for its new deadline; write the markers of a prepared
        one (in the background: the request that prepared it is answered at once)."""
        written_at = time.monotonic()
        await self.runtime.arm({timer_key(meta.transactional_id):
                                _timeout(meta, self.now(), self.config)})
        if meta.state in PREPARED:
            self._spawn(self._finish(meta, written_at))

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, prepared: TransactionMetadata, written_at: float | None) -> None:
        """Write the markers of a prepared transaction, then complete it; stop if it moves on
        (another handler took it over or finished it). A failed attempt (the partition's
        leader just died) is made again after a backoff for up to half the takeover time;
        after that the takeover timer runs out and another handler finishes it."""
        deadline = asyncio.get_running_loop().time() + self.config.marker_takeover_ms / 2000
        backoff = FINISH_BACKOFF_S
        while True:
            try:
                await self._finish_once(prepared, written_at)
                return
            except CoordinatorError as exc:
                if asyncio.get_running_loop().time() + backoff > deadline:
                    log.warning("finishing the transaction of %s: %s",
                                prepared.transactional_id, exc)
                    return
                log.info("finishing the transaction of %s, again in %.1f s: %s",
                         prepared.transactional_id, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            written_at = None  # a later attempt checks the state first

    async def _finish_once(self, prepared: TransactionMetadata,
                           written_at: float | None = None) -> None:
        """One attempt of :meth:`_finish`. Raises CoordinatorError. ``written_at``: when this
        handler wrote ``prepared`` (monotonic seconds), just before it armed the takeover
        timer; until half the takeover time has passed since, no other handler can have acted
        on the transaction, so the first marker attempt needs neither a read of the state nor
        the timer armed again."""
        tid = prepared.transactional_id
        key = timer_key(tid)
        unchecked = written_at

        async def still_due() -> int | None:
            nonlocal unchecked
            if unchecked is not None and (time.monotonic() - unchecked
                                          < self.config.marker_takeover_ms / 2000):
                unchecked = None
                return await self.runtime.leader_epoch(tid)
            unchecked = None
            meta = (await self.runtime.read(tid)).get(tid)
            if meta != prepared:
                return None
            # Alive and at work: keep the takeover timer from running out.
            await self.runtime.arm({key: self.config.marker_takeover_ms + DEADLINE_SLACK_MS})
            return await self.runtime.leader_epoch(tid)

        done = await self.markers.write(prepared.producer_id, prepared.producer_epoch,
                                        prepared.committing, prepared.partitions, still_due)
        if not done:
            return

        def change(state: PartitionState, now: int
                   ) -> tuple[list[Record], TransactionMetadata | None]:
            meta = state.get(tid)
            if meta is None or (meta.state, meta.producer_id, meta.producer_epoch) != (
                    prepared.state, prepared.producer_id, prepared.producer_epoch):
                return [], None
            completed = txn.complete(meta, now)
            return [transaction_record(tid, completed)], completed

        completed, end = await self.runtime.update(tid, change)
        if completed is not None:
            await self.runtime.signal(tid, end)  # what waits for it to settle
            TRANSACTIONS_COMPLETED.labels(
                "commit" if prepared.committing else "abort").inc()
            log.info("transaction of %s (producer %d, epoch %d) %s", tid,
                     completed.producer_id, completed.producer_epoch,
                     completed.state.kafka_name)
            await self._written(completed)

    # -- timers ---------------------------------------------------------------------------------

    async def expire(self, key: str) -> None:
        """A transaction's timer ran out: abort it if it timed out, take it over if nobody is
        writing its markers, delete it if it expired; re-arm the timer if the deadline moved.
        Keys of other timers are ignored."""
        tid = parse_timer_key(key)
        if tid is None:
            return
        try:
            if await self.runtime.rearmed(key):
                return
            meta = (await self.runtime.read(tid)).get(tid)
            if meta is None:
                return
            now = self.now()
            if now < meta.deadline_ms(self.config):
                await self.runtime.arm({key: _timeout(meta, now, self.config)})
                return
            await self._act_on_deadline(tid, meta)
        except CoordinatorError as exc:
            log.warning("the timer of transactional id %s: %s", tid, exc)

    async def _act_on_deadline(self, tid: str, seen: TransactionMetadata) -> None:
        config = self.config

        def change(state: PartitionState, now: int
                   ) -> tuple[list[Record], tuple[bool, TransactionMetadata | None]]:
            meta = state.get(tid)
            if meta is None or (meta.producer_id, meta.producer_epoch, meta.state) != (
                    seen.producer_id, seen.producer_epoch, seen.state):
                return [], (False, None)
            if txn.timed_out(meta, now):
                new: TransactionMetadata | None = txn.fence(meta, now)
            elif meta.state in PREPARED:
                new = txn.claim(meta, now, config)
            elif txn.expired(meta, now, config):
                return [transaction_record(tid, None)], (True, None)
            else:
                new = None
            return ([transaction_record(tid, new)] if new is not None else []), (False, new)

        (deleted, new), _ = await self.runtime.update(tid, change)
        if deleted:
            TRANSACTION_TIMER_ACTIONS.labels("expired").inc()
            log.info("transactional id %s expired", tid)
            await self.runtime.disarm([timer_key(tid)])
        elif new is not None:
            if seen.state is TxnState.ONGOING:
                TRANSACTION_TIMER_ACTIONS.labels("timeout").inc()
                log.info("transaction of %s timed out after %d ms: aborting", tid,
                         seen.timeout_ms)
            else:
                TRANSACTION_TIMER_ACTIONS.labels("takeover").inc()
                log.info("taking over the %s of %s", seen.state.kafka_name, tid)
            await self._written(new)

    async def follow_expirations(self) -> None:
        """Act on the transaction timers that run out, for the handler's whole life."""
        await self.runtime.follow_expirations(self.expire)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.runtime.close()

