"""The transaction coordinator on the coordinator runtime, against in-memory log nodes and
purgatory: a transaction from InitProducerId to its markers and completion, EndTxn answered
before the markers, a handler that dies between Prepare and Complete (another one takes over
when the timer runs out), the timeout abort with its fence, expiry, InitProducerId fencing an
Ongoing transaction, handlers racing, and what marker errors mean."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kbroker.replicator.v1 import replicator_pb2
from services.common.coordinator_keys import partition_for
from services.common.errors import ErrorCode
from services.handler.config import HandlerConfig
from services.handler.metadata_cache import MetadataCache
from services.handler.metrics import (
    TRANSACTION_TIMER_ACTIONS,
    TRANSACTION_WRITES,
    TRANSACTIONS_COMPLETED,
)
from services.handler.transactions.coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
    timer_key,
)
from services.handler.transactions.metadata import (
    TV_0,
    TV_2,
    Decision,
    ProducerIdAndEpoch,
    TxnState,
)

from ..fakes import (
    FakeController,
    MemoryLog,
    MemoryPurgatory,
    cache_of,
    cluster,
    topic,
)

E = ErrorCode
TIMEOUT = 20.0
A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)
METADATA = cluster(topic(TRANSACTION_STATE_TOPIC, 2, topic_id="7a", epoch=3), topic("a", 2),
                   topic("b", 1))


def run(coroutine: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))  # type: ignore[arg-type]


class ProducerIds:
    def __init__(self) -> None:
        self._ids = itertools.count(1000)

    async def next_id(self) -> int:
        return next(self._ids)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def coordinator(log: MemoryLog, purgatory: MemoryPurgatory, clock: Clock | None = None,
                ids: ProducerIds | None = None, **options: Any) -> TransactionCoordinator:
    config = HandlerConfig(**{"transaction_marker_takeover_ms": 1000,
                              "transactional_id_expiration_ms": 60_000, **options})
    made = TransactionCoordinator(cache_of(METADATA), log, FakeController(METADATA),  # type: ignore[arg-type]
                                  purgatory, config, ids or ProducerIds())
    made.markers.time_limit_s = 2.0
    if clock is not None:
        made.runtime.now = clock
    return made


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(400):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def state_of(txn: TransactionCoordinator, tid: str) -> TxnState | None:
    _, meta = await txn.describe(tid)
    return None if meta is None else meta.state


async def begin(txn: TransactionCoordinator, tid: str, *partitions: tuple[str, int],
                timeout_ms: int = 60_000) -> tuple[int, int]:
    init = await txn.init_producer_id(tid, timeout_ms, None)
    assert init.error == 0, init
    assert await txn.add_partitions(tid, init.producer_id, init.producer_epoch,
                                    frozenset(partitions)) == 0
    return init.producer_id, init.producer_epoch


def test_a_transaction_commits_its_markers_on_every_partition_then_completes() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        commits = TRANSACTIONS_COMPLETED.labels("commit")._value.get()
        writes = TRANSACTION_WRITES.labels("appended")._value.get()
        pid, epoch = await begin(txn, "tx", A0, A1, B0)
        assert (pid, epoch) == (1000, 0)
        assert await txn.verify("tx", pid, epoch, frozenset({A0, ("c", 0)})) == {
            A0: 0, ("c", 0): E.transaction_abortable.value}
        log.lagging = True  # every write waits to be replicated
        end = await txn.end_transaction("tx", pid, epoch, True, TV_0)
        assert (end.error, end.producer_id, end.producer_epoch) == (0, pid, epoch)
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        # Each partition got a COMMIT at the coordinator epoch (the state partition's leader
        # epoch), replicated before the transaction completed.
        assert sorted(log.markers) == [(pid, epoch, True, 3, tp) for tp in (A0, A1, B0)]
        assert {key.split("@")[0] for w in purgatory.produce_waits for key in w} >= {
            "a-0", "a-1", "b-0"}
        # The id's timer now waits for its expiry.
        assert purgatory.armed_timers[timer_key("tx")] >= 59_000
        retried = await txn.end_transaction("tx", pid, epoch, True, TV_0)
        assert (retried.error, retried.write) == (0, None)
        assert TRANSACTIONS_COMPLETED.labels("commit")._value.get() == commits + 1
        # Init, add, prepare, complete.
        assert TRANSACTION_WRITES.labels("appended")._value.get() == writes + 4
        await txn.close()

    run(main())


async def _error(decision: Awaitable[Decision]) -> int:
    return (await decision).error


async def _is(txn: TransactionCoordinator, tid: str, state: TxnState) -> bool:
    return await state_of(txn, tid) is state


def test_end_txn_answers_once_prepared_and_markers_are_retried_until_written() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        pid, epoch = await begin(txn, "tx", A0, B0)
        log.marker_errors[B0] = E.not_leader_or_follower.value
        end = await txn.end_transaction("tx", pid, epoch, False, TV_0)
        assert end.error == 0
        await log.marker_written.wait()
        await asyncio.sleep(0.1)
        assert await state_of(txn, "tx") is TxnState.PREPARE_ABORT
        assert (await txn.end_transaction("tx", pid, epoch, False, TV_0)).error == \
            E.concurrent_transactions.value
        assert (await txn.add_partitions("tx", pid, epoch, frozenset({A1}))) == \
            E.concurrent_transactions.value
        del log.marker_errors[B0]  # the leader is back
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_ABORT), "complete")
        assert {m[4] for m in log.markers} == {A0, B0}
        assert all(not committed for _, _, committed, _, _ in log.markers)
        await txn.close()

    run(main())


def test_a_handler_that_dies_between_prepare_and_complete_leaves_it_to_another() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        clock = Clock()
        first, second = coordinator(log, purgatory, clock), coordinator(log, purgatory, clock)
        follower = asyncio.ensure_future(second.follow_expirations())
        pid, epoch = await begin(first, "tx", A0, A1)
        log.marker_errors[A1] = E.not_leader_or_follower.value
        assert (await first.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await log.marker_written.wait()
        await first.close()  # killed: its markers stop, its timer is not kept alive
        purgatory.armed_timers.clear()
        del log.marker_errors[A1]
        # Before the takeover time the expiry only re-arms the timer.
        await purgatory.expire(timer_key("tx"))
        await eventually(lambda: _armed(purgatory, "tx"), "re-armed")
        assert await state_of(second, "tx") is TxnState.PREPARE_COMMIT
        clock.now += 1000
        await purgatory.expire(timer_key("tx"))
        await eventually(lambda: _is(second, "tx", TxnState.COMPLETE_COMMIT), "taken over")
        assert {(m[2], m[4]) for m in log.markers} >= {(True, A0), (True, A1)}
        follower.cancel()
        await second.close()

    run(main())


async def fire(txn: TransactionCoordinator, purgatory: MemoryPurgatory, tid: str) -> None:
    """The timer of ``tid`` runs out and ``txn`` hears it."""
    purgatory.armed_timers.pop(timer_key(tid), None)
    await txn.expire(timer_key(tid))


async def _armed(purgatory: MemoryPurgatory, tid: str) -> bool:
    return timer_key(tid) in purgatory.armed_timers


def test_a_takeover_stops_the_first_writer_and_a_rearmed_timer_is_news_from_the_past() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        clock = Clock()
        first, second = coordinator(log, purgatory, clock), coordinator(log, purgatory, clock)
        pid, epoch = await begin(first, "tx", A0)
        log.marker_errors[A0] = E.not_leader_or_follower.value
        assert (await first.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await log.marker_written.wait()
        # The first writer is alive and keeps its timer armed: an expiry heard now is old.
        await eventually(lambda: _armed(purgatory, "tx"), "kept armed")
        clock.now += 5000
        await second.expire(timer_key("tx"))
        assert await state_of(second, "tx") is TxnState.PREPARE_COMMIT
        assert len(first._tasks) == 1
        # Once it stops keeping it armed, the second handler takes over; the first stops.
        purgatory.armed_timers.clear()
        await second.expire(timer_key("tx"))
        _, meta = await second.describe("tx")
        assert meta is not None and meta.last_update_ms == clock.now
        await eventually(lambda: _no_tasks(first), "first writer stopped")
        del log.marker_errors[A0]
        await eventually(lambda: _is(first, "tx", TxnState.COMPLETE_COMMIT), "complete")
        await first.close()
        await second.close()

    run(main())


async def _no_tasks(txn: TransactionCoordinator) -> bool:
    return not txn._tasks


def test_a_timed_out_transaction_is_fenced_and_aborted() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        clock = Clock()
        txn = coordinator(log, purgatory, clock)
        pid, epoch = await begin(txn, "tx", A0, timeout_ms=1000)
        assert purgatory.armed_timers[timer_key("tx")] == 1000 + 1 + 5
        timeouts = TRANSACTION_TIMER_ACTIONS.labels("timeout")._value.get()
        clock.now += 1001
        await fire(txn, purgatory, "tx")
        assert TRANSACTION_TIMER_ACTIONS.labels("timeout")._value.get() == timeouts + 1
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_ABORT), "aborted")
        assert [(m[1], m[2], m[4]) for m in log.markers] == [(epoch + 1, False, A0)]
        # The producer that timed out is fenced; starting again bumps the epoch once more.
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == \
            E.producer_fenced.value
        assert (await txn.add_partitions("tx", pid, epoch, frozenset({A0}))) == \
            E.producer_fenced.value
        again = await txn.init_producer_id("tx", 1000, ProducerIdAndEpoch(producer_id=pid,
                                                                          epoch=epoch))
        assert (again.error, again.producer_epoch) == (E.producer_fenced.value, -1)
        again = await txn.init_producer_id("tx", 1000, None)
        assert (again.error, again.producer_id, again.producer_epoch) == (0, pid, epoch + 2)
        await txn.close()

    run(main())


def test_init_producer_id_fences_an_ongoing_transaction_first() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        pid, epoch = await begin(txn, "tx", A0, B0)
        # A new instance of the producer (same transactional id) starts: the ongoing
        # transaction is fenced and aborted, and the answer waits for the abort's markers
        # (Kafka answers CONCURRENT_TRANSACTIONS at once, and the client's retry this).
        again = await txn.init_producer_id("tx", 60_000, None)
        assert (again.error, again.producer_id, again.producer_epoch) == (0, pid, epoch + 2)
        assert sorted((m[1], m[2], m[4]) for m in log.markers) == [
            (epoch + 1, False, A0), (epoch + 1, False, B0)]
        await txn.close()

    run(main())


def test_the_first_marker_attempt_after_its_own_write_reads_nothing_again() -> None:
    """The handler that prepared a transaction writes its markers at once: nobody else acts
    on it before its takeover timer (just armed) runs out, so that attempt needs no read of
    the state; a later attempt, or a first one late by half the takeover time, checks."""
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        pid, epoch = await begin(txn, "tx", A0)
        reads = log.reads
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await asyncio.wait_for(log.marker_written.wait(), 5)
        assert log.reads == reads
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        # A failed first attempt is made again after a read of the state.
        pid, epoch = await begin(txn, "tx", A0)
        log.marker_errors[A0] = E.not_leader_or_follower.value
        log.marker_written.clear()
        reads = log.reads
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await asyncio.wait_for(log.marker_written.wait(), 5)
        log.marker_written.clear()
        await asyncio.wait_for(log.marker_written.wait(), 5)
        assert log.reads > reads
        del log.marker_errors[A0]
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        # Late (as after a stall): the state is read, and a transaction that moved on gets no
        # marker.
        _, meta = await txn.describe("tx")
        assert meta is not None
        prepared = dataclasses.replace(meta, state=TxnState.PREPARE_COMMIT,
                                       partitions=frozenset({A0}))
        reads, markers = log.reads, len(log.markers)
        await txn._finish_once(prepared, time.monotonic() - 1.0)  # takeover: 1 s
        assert log.reads > reads and len(log.markers) == markers
        await txn.close()

    run(main())


def test_markers_not_written_within_the_settle_wait_are_concurrent_transactions() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        txn.settle_wait_ms = 300
        pid, epoch = await begin(txn, "tx", A0)
        log.marker_errors[A0] = E.not_leader_or_follower.value  # written again and again
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        for ask in (lambda: txn.add_partitions("tx", pid, epoch, frozenset({A0})),
                    lambda: _error(txn.init_producer_id("tx", 60_000, None))):
            started = time.monotonic()
            assert await ask() == E.concurrent_transactions.value
            assert 0.25 <= time.monotonic() - started < 5
        # Once the markers are written, a waiting request is decided again: the next
        # transaction begins.
        txn.settle_wait_ms = 10_000
        waiting = asyncio.ensure_future(txn.add_partitions("tx", pid, epoch, frozenset({A0})))
        await asyncio.sleep(0.1)
        del log.marker_errors[A0]
        assert await asyncio.wait_for(waiting, 5) == 0
        assert await _is(txn, "tx", TxnState.ONGOING)
        await txn.close()

    run(main())


def test_an_idle_transactional_id_expires() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        clock = Clock()
        txn = coordinator(log, purgatory, clock, transactional_id_expiration_ms=5000)
        init = await txn.init_producer_id("tx", 60_000, None)
        assert purgatory.armed_timers[timer_key("tx")] == 5005
        clock.now += 4000
        await fire(txn, purgatory, "tx")  # early: re-armed for the rest
        assert purgatory.armed_timers[timer_key("tx")] == 1005
        clock.now += 1000
        await fire(txn, purgatory, "tx")
        assert await txn.describe("tx") == (E.transactional_id_not_found.value, None)
        assert timer_key("tx") not in purgatory.armed_timers
        # The id starts afresh with a new producer id.
        fresh = await txn.init_producer_id("tx", 60_000, None)
        assert (fresh.error, fresh.producer_epoch) == (0, 0)
        assert fresh.producer_id != init.producer_id
        await txn.close()

    run(main())


def test_handlers_racing_on_one_transaction_prepare_it_once() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        handlers = [coordinator(log, purgatory), coordinator(log, purgatory)]
        pid, epoch = await begin(handlers[0], "tx", A0)
        log.marker_errors[A0] = E.not_leader_or_follower.value
        ends = await asyncio.gather(*(h.end_transaction("tx", pid, epoch, True, TV_0)
                                      for h in handlers))
        assert sorted(e.error for e in ends) == [0, E.concurrent_transactions.value]
        del log.marker_errors[A0]
        await eventually(lambda: _is(handlers[1], "tx", TxnState.COMPLETE_COMMIT), "complete")
        for h in handlers:
            await h.close()

    run(main())


def test_transactions_v2_answer_the_bumped_epoch() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        pid, epoch = await begin(txn, "tx", A0)
        end = await txn.end_transaction("tx", pid, epoch, True, TV_2)
        assert (end.error, end.producer_id, end.producer_epoch) == (0, pid, epoch + 1)
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        # Markers carry the bumped epoch.
        assert [(m[1], m[4]) for m in log.markers] == [(epoch + 1, A0)]
        retried = await txn.end_transaction("tx", pid, epoch, True, TV_2)
        assert (retried.error, retried.producer_epoch) == (0, epoch + 1)
        await txn.close()

    run(main())


def test_what_marker_errors_mean() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        # A partition past this transaction, and one deleted since, need no marker; a fenced
        # coordinator epoch is asked for again and retried.
        pid, epoch = await begin(txn, "tx", A0, A1, B0)
        log.marker_errors[A0] = E.invalid_producer_epoch.value
        log.marker_errors[A1] = E.transaction_coordinator_fenced.value
        txn.placement._cache.install(cluster(  # type: ignore[attr-defined]
            topic(TRANSACTION_STATE_TOPIC, 2, topic_id="7a", epoch=4), topic("a", 2),
            version=2), authoritative=True)
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await log.marker_written.wait()
        await asyncio.sleep(0.1)
        assert await state_of(txn, "tx") is TxnState.PREPARE_COMMIT
        del log.marker_errors[A1]
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        assert [(m[3], m[4]) for m in log.markers] == [(4, A1)]
        await txn.close()

    run(main())


def test_replication_of_markers_is_awaited_and_the_timeout_retried() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        txn.markers.replication_timeout_ms = 10
        pid, epoch = await begin(txn, "tx", A0)
        log.lagging_partitions.add(A0)
        purgatory.replicated = False
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await asyncio.sleep(0.3)
        assert len(log.markers) >= 2  # written again after each timeout
        purgatory.replicated = True
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        await txn.close()

    run(main())


def test_markers_committed_while_their_leader_holds_the_answer_need_no_purgatory() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory, acks_all_leader_wait_ms=250)
        pid, epoch = await begin(txn, "tx", A0)
        log.lagging_partitions.add(A0)
        log.markers_commit_in_wait = True
        purgatory.replicated = False  # the purgatory would never see the marker replicated
        waits = len(purgatory.produce_waits)
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        assert log.marker_waits == [250]
        assert len(purgatory.produce_waits) == waits
        # With no leader wait, the marker's replication is awaited in the purgatory.
        txn.markers.leader_wait_ms = 0
        pid, epoch = await begin(txn, "tx", A0)
        purgatory.replicated = True
        assert (await txn.end_transaction("tx", pid, epoch, True, TV_0)).error == 0
        await eventually(lambda: _is(txn, "tx", TxnState.COMPLETE_COMMIT), "complete")
        assert log.marker_waits == [250, 0]
        assert len(purgatory.produce_waits) == waits + 1
        await txn.close()

    run(main())


def test_requests_and_listings() -> None:
    async def main() -> None:
        log, purgatory = MemoryLog(), MemoryPurgatory()
        txn = coordinator(log, purgatory)
        assert (await txn.init_producer_id("", 1000, None)).error == E.invalid_request.value
        for bad in (0, -1, 900_001):
            assert (await txn.init_producer_id("tx", bad, None)).error == \
                E.invalid_transaction_timeout.value
        assert await txn.add_partitions("", 1, 0, frozenset({A0})) == E.invalid_request.value
        assert await txn.add_partitions("nobody", 1, 0, frozenset({A0})) == \
            E.invalid_producer_id_mapping.value
        assert (await txn.end_transaction("nobody", 1, 0, True, TV_0)).error == \
            E.invalid_producer_id_mapping.value
        assert await txn.describe("") == (E.invalid_request.value, None)
        ids = [f"tx-{i}" for i in range(6)]
        for tid in ids:
            await begin(txn, tid, A0)
        listed = await txn.list_transactions(None)
        assert sorted(m.transactional_id for m in listed) == ids
        # Each broker lists the partitions it leads (node 0 leads both here).
        assert await txn.list_transactions(5) == []
        assert {partition_for(tid, 2) for tid in ids} == {0, 1}
        await txn.close()

    run(main())


def test_the_topic_is_created_as_kafka_creates_it() -> None:
    async def main() -> None:
        controller = FakeController(cluster(nodes=(0, 1)))
        txn = TransactionCoordinator(MetadataCache(controller.load_metadata), MemoryLog(),  # type: ignore[arg-type]
                                     controller,
                                     MemoryPurgatory(), HandlerConfig(
                                         transaction_state_log_num_partitions=4),
                                     ProducerIds())
        assert (await txn.placement.find("tx"))[0] == 0
        [([created], _)] = controller.created
        assert created == replicator_pb2.NewTopic(
            name=TRANSACTION_STATE_TOPIC, num_partitions=4, replication_factor=2, configs={
                "cleanup.policy": "compact", "segment.bytes": "104857600",
                "compression.type": "uncompressed", "unclean.leader.election.enable": "false"})
        await txn.close()

    run(main())
