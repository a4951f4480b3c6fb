"""The coordinator runtime with a state of its own that is not a group: named counters, one
record per counter. Conditional appends serialise handlers racing on one key, a new handler
rebuilds the state from the log, waits and signals, the high watermark wait, timers a state
implies, placement, and transactional writes that count once their producer's COMMIT marker
follows. Nothing here knows groups: the runtime is generic."""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from dataclasses import replace

import pytest

from kbroker.log.v1 import log_pb2
from kbroker.replicator.v1 import replicator_pb2
from services.common.coordinator_keys import java_string_hash, partition_for
from services.common.errors import ErrorCode
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record_batch import read_header
from services.handler.coordinator import runtime as runtime_module
from services.handler.coordinator.partition import TransactionalRecords
from services.handler.coordinator.placement import (
    CoordinatorError,
    Placement,
    leader_error,
)
from services.handler.coordinator.runtime import CoordinatorRuntime
from services.handler.metadata_cache import ClusterMetadata, LogNode

from ..fakes import FakeController, cache_of, cluster, topic
from ..fakes import MemoryLog as Log
from ..fakes import MemoryPurgatory as Purgatory

TOPIC = replicator_pb2.NewTopic(name="__counters", num_partitions=2, replication_factor=1)
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value


class Counters:
    """The fake coordinator's state: counters by name (key: the name, value: the count)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def replay(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.counts.pop(key.decode(), None)
        else:
            self.counts[key.decode()] = int(value)


def increment(name: str):  # type: ignore[no-untyped-def]
    def change(state: Counters, now: int) -> tuple[list[tuple[bytes, bytes | None]], int]:
        count = state.counts.get(name, 0) + 1
        return [(name.encode(), str(count).encode())], count
    return change


def timers_of(state: Counters, now: int) -> dict[str, int]:
    return {f"counter:{name}": 1000 for name in state.counts}


class Writes:
    """A labelled counter, as the runtime counts its writes."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def labels(self, outcome: str) -> Writes:
        self._outcome = outcome
        return self

    def inc(self) -> None:
        self.counts[self._outcome] += 1


def runtime(log: Log, purgatory: Purgatory, writes: Writes | None = None,
            configs: dict[str, str] | None = None,
            leader_wait_ms: int = 0) -> CoordinatorRuntime[Counters]:
    info = topic(TOPIC.name, 2, topic_id="0123456789abcdef")
    metadata = cluster(replace(info, configs=configs or {}))
    return CoordinatorRuntime(
        Placement(TOPIC, cache_of(metadata), FakeController(metadata)), log,  # type: ignore[arg-type]
        purgatory, Counters, kind="counter", timers_of=timers_of, writes=writes,
        leader_wait_ms=leader_wait_ms)


def test_changes_are_appended_conditionally_and_replayed() -> None:
    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        counters = runtime(log, purgatory)
        assert await counters.update("a", increment("a")) == (1, 1)
        assert await counters.update("a", increment("a")) == (2, 2)
        assert (await counters.read("a")).counts == {"a": 2}
        # A change without records writes nothing and answers on the state read.
        assert await counters.update("a", lambda state, now: ([], state.counts["a"])) == (2, 2)
        assert sum(len(b) for b in log.batches.values()) == 2
        await counters.close()

    asyncio.run(main())


def test_handlers_racing_on_one_key_are_serialised_by_conditional_appends() -> None:
    async def main() -> None:
        log, purgatory, writes = Log(), Purgatory(), Writes()
        handlers = [runtime(log, purgatory, writes), runtime(log, purgatory, writes)]
        results = await asyncio.gather(*(handlers[i % 2].update("hot", increment("hot"))
                                         for i in range(30)))
        assert sorted(count for count, _ in results) == list(range(1, 31))
        for handler in handlers:
            assert (await handler.read("hot")).counts == {"hot": 30}
        assert writes.counts["appended"] == 30 and writes.counts["conflict"] > 0

    asyncio.run(main())


def test_a_handler_that_wrote_last_appends_on_its_cached_state_without_reading() -> None:
    async def main() -> None:
        log, purgatory, writes = Log(), Purgatory(), Writes()
        counters = runtime(log, purgatory, writes)
        assert await counters.update("a", increment("a")) == (1, 1)  # loads: one read
        reads = log.reads
        for count in range(2, 12):
            assert (await counters.update("a", increment("a")))[0] == count
        assert log.reads == reads
        assert writes.counts == {"appended": 11}
        await counters.close()

    asyncio.run(main())


def test_a_cached_state_another_handler_moved_on_is_read_again_before_the_change_counts(
) -> None:
    async def main() -> None:
        log, purgatory, writes = Log(), Purgatory(), Writes()
        first, second = runtime(log, purgatory, writes), runtime(log, purgatory, writes)
        assert (await first.update("a", increment("a")))[0] == 1
        assert (await second.update("a", increment("a")))[0] == 2
        # first's cache says 1: its append is refused, and the change is computed again on
        # the state read then.
        assert (await first.update("a", increment("a")))[0] == 3
        assert writes.counts["stale"] == 1 and writes.counts["appended"] == 3
        assert (await second.update("a", increment("a")))[0] == 4
        # A change that writes nothing is answered from the state read now, never the cache.
        peek = lambda state, now: ([], state.counts["a"])  # noqa: E731
        assert (await first.update("a", peek))[0] == 4
        assert (await first.read("a")).counts == {"a": 4}
        await first.close()
        await second.close()

    asyncio.run(main())


def test_a_new_handler_rebuilds_the_state_from_the_log_skipping_unreadable_records() -> None:
    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        first = runtime(log, purgatory)
        for name in ("a", "b", "a", "c"):
            await first.update(name, increment(name))
        partition = partition_for("a", 2)
        await first.update("a", lambda state, now: ([(b"a", b"not a count")], None))
        await first.update("a", lambda state, now: ([(b"a", b"7")], None))
        fresh = runtime(log, purgatory)
        state = await fresh.read("a")
        assert state.counts["a"] == 7
        assert {n for n in ("a", "b", "c") if partition_for(n, 2) == partition} <= set(
            state.counts)
        # Tombstones delete.
        await fresh.update("a", lambda state, now: ([(b"a", None)], None))
        assert "a" not in (await first.read("a")).counts

    asyncio.run(main())


def test_waiters_wake_when_a_change_is_signalled_and_time_out_otherwise() -> None:
    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        waiter, writer = runtime(log, purgatory), runtime(log, purgatory)
        state, end = await waiter.read_at("k")
        assert (state.counts, end) == ({}, 0)
        parked = asyncio.ensure_future(waiter.wait("k", end + 1, 5000))
        await asyncio.sleep(0.05)
        assert not parked.done()
        _, after = await writer.update("k", increment("k"))
        await writer.signal("k", after)
        assert await parked == after
        assert "counter:0123456" in next(iter(purgatory.positions))  # kind and topic id
        assert await waiter.wait("k", after + 1, 50) == after  # nothing new: times out

    asyncio.run(main())


def test_a_write_answers_only_once_replicated() -> None:
    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        counters = runtime(log, purgatory)
        log.lagging = True
        assert await counters.update("a", increment("a")) == (1, 1)
        assert purgatory.produce_waits == [
            {f"{TOPIC.name}-{partition_for('a', 2)}@0@id-{TOPIC.name}": 1}]
        purgatory.replicated = False
        with pytest.raises(CoordinatorError) as failed:
            await counters.update("a", increment("a"))
        assert failed.value.code == COORDINATOR_NOT_AVAILABLE

    asyncio.run(main())


def test_a_write_needs_the_topics_min_insync_replicas_as_the_leader_has_its_isr() -> None:
    """An operator's min.insync.replicas on the internal topic holds for the coordinator's
    writes, as Kafka's coordinators append with acks=all: refused by a leader with a smaller
    ISR (nothing stored), or stored but not answered when the ISR shrank below it as the high
    watermark passed; both COORDINATOR_NOT_AVAILABLE, which clients retry."""

    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        counters = runtime(log, purgatory, configs={"min.insync.replicas": "2"})
        where = (TOPIC.name, partition_for("a", 2))
        log.isr[where] = (0,)
        with pytest.raises(CoordinatorError) as refused:
            await counters.update("a", increment("a"))
        assert refused.value.code == COORDINATOR_NOT_AVAILABLE
        assert "min.isr requirement of 2" in str(refused.value)
        assert log.batches[where] == []
        log.isr[where], log.lagging, purgatory.isr = (0, 1), True, (0,)
        with pytest.raises(CoordinatorError) as after:
            await counters.update("a", increment("a"))
        assert after.value.code == COORDINATOR_NOT_AVAILABLE
        assert "ISR [0]" in str(after.value)
        assert len(log.batches[where]) == 1  # stored: the next change counts it
        purgatory.isr = (0, 1)
        assert await counters.update("a", increment("a")) == (2, 2)
        # Unset, the default of one asks nothing of the ISR.
        plain_log, plain_purgatory = Log(), Purgatory()
        plain = runtime(plain_log, plain_purgatory)
        plain_log.isr[where], plain_log.lagging, plain_purgatory.isr = (0,), True, (0,)
        assert await plain.update("a", increment("a")) == (1, 1)
        await counters.close()
        await plain.close()

    asyncio.run(main())


def test_a_write_the_leader_saw_replicated_while_holding_its_answer_waits_in_no_purgatory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a leader wait, the leader holds the answer to a write until it is replicated (as
    for an acks=all produce): one replicated meanwhile answers without the purgatory, if the
    ISR that replicated it still meets min.insync.replicas. One the leader handed on waits in
    the purgatory, and the partition's writes ask for no hold for a while after it."""
    monkeypatch.setattr(runtime_module, "HOLD_PAUSE_S", 0.2)

    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        counters = runtime(log, purgatory, configs={"min.insync.replicas": "2"},
                           leader_wait_ms=100)
        where = (TOPIC.name, partition_for("a", 2))
        log.isr[where], log.lagging, log.appends_commit_with = (0, 1), True, (0, 1)
        assert await counters.update("a", increment("a")) == (1, 1)
        assert log.append_waits == [100]
        assert purgatory.produce_waits == []
        # Replicated within the hold, but by an ISR below min.insync.replicas: stored, and
        # not answered, as after a wait in the purgatory.
        log.appends_commit_with = (0,)
        with pytest.raises(CoordinatorError) as short:
            await counters.update("a", increment("a"))
        assert short.value.code == COORDINATOR_NOT_AVAILABLE
        assert "ISR [0]" in str(short.value)
        assert len(log.batches[where]) == 2
        assert purgatory.produce_waits == []
        # Not replicated within the hold: the purgatory waits, and the next write asks for
        # no hold until the pause is over.
        log.appends_commit_with = None
        assert await counters.update("a", increment("a")) == (3, 3)
        assert len(purgatory.produce_waits) == 1
        assert await counters.update("a", increment("a")) == (4, 4)
        assert log.append_waits[-2:] == [100, 0]
        assert len(purgatory.produce_waits) == 2
        await asyncio.sleep(0.25)
        log.appends_commit_with = (0, 1)
        assert await counters.update("a", increment("a")) == (5, 5)
        assert log.append_waits[-1] == 100
        assert len(purgatory.produce_waits) == 2
        # Without a leader wait (the default) every write asks for none.
        plain_log = Log()
        plain = runtime(plain_log, Purgatory())
        assert await plain.update("a", increment("a")) == (1, 1)
        assert plain_log.append_waits == [0]
        await counters.close()
        await plain.close()

    asyncio.run(main())


def test_timers_the_state_implies_are_armed_on_load_and_on_resubscription() -> None:
    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        await runtime(log, purgatory).update("a", increment("a"))
        counters = runtime(log, purgatory)
        await counters.read("a")
        await asyncio.sleep(0.01)
        assert purgatory.armed_timers == {"counter:a": 1000}  # armed on the first load
        purgatory.armed_timers.clear()  # the purgatory restarted
        expired: list[str] = []

        async def on_expiry(key: str) -> None:
            expired.append(key)

        follower = asyncio.ensure_future(counters.follow_expirations(on_expiry))
        await purgatory.expired.put("counter:a")
        for _ in range(100):
            if expired:
                break
            await asyncio.sleep(0.01)
        assert expired == ["counter:a"] and purgatory.subscriptions == 1
        assert purgatory.armed_timers == {"counter:a": 1000}  # re-armed on subscribing
        assert await counters.rearmed("counter:a") and not await counters.rearmed("other")
        follower.cancel()
        await counters.close()

    asyncio.run(main())


def test_placement_creates_the_topic_once_and_hashes_keys_as_java() -> None:
    async def main() -> None:
        metadata = cluster()
        controller = FakeController(metadata)
        placement = Placement(TOPIC, cache_of(metadata), controller)
        await asyncio.gather(placement.find("a"), placement.find("b"))
        [(created, _)] = controller.created
        assert (created[0].name, created[0].num_partitions,
                created[0].configs["cleanup.policy"]) == (TOPIC.name, 2, "compact")

    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0
    asyncio.run(main())


class TransactionalCounters(Counters):
    """Counters that take part in transactions: a producer's writes count once its COMMIT
    marker follows them, and never after an ABORT."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, dict[str, int]] = {}
        self.offsets: dict[str, int] = {}

    def replay_record(self, offset: int, producer_id: int, key: bytes,
                      value: bytes | None) -> None:
        if producer_id >= 0:
            self.pending.setdefault(producer_id, {})[key.decode()] = int(value or 0)
            return
        self.offsets[key.decode()] = offset
        self.replay(key, value)

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        for name, count in self.pending.pop(producer_id, {}).items():
            if committed:
                self.counts[name] = count


def write_marker(log: Log, partition: int, producer_id: int, committed: bool) -> None:
    """A COMMIT or ABORT marker appended to the fake log, as a log node writes it."""
    where = (TOPIC.name, partition)
    batch = bytearray(build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.COMMIT if committed
                             else ControlRecordType.ABORT, coordinator_epoch=0),
        producer_id=producer_id, producer_epoch=0, timestamp=0))
    batch[0:8] = struct.pack(">q", log.ends[where])
    log.batches[where].append((log.ends[where], 1, bytes(batch)))
    log.ends[where] += 1


def transactional_runtime(log: Log, purgatory: Purgatory
                          ) -> CoordinatorRuntime[TransactionalCounters]:
    metadata = cluster(topic(TOPIC.name, 2, topic_id="0123456789abcdef"))
    return CoordinatorRuntime(
        Placement(TOPIC, cache_of(metadata), FakeController(metadata)), log,  # type: ignore[arg-type]
        purgatory, TransactionalCounters, kind="counter")


def test_transactional_writes_count_once_committed_and_never_once_aborted() -> None:
    async def main() -> None:
        log, purgatory = Log(), Purgatory()
        writer = transactional_runtime(log, purgatory)
        partition = partition_for("a", 2)
        assert partition_for("c", 2) == partition

        def write(name: str, count: int, producer_id: int):  # type: ignore[no-untyped-def]
            return lambda state, now: (TransactionalRecords(
                producer_id=producer_id, producer_epoch=0,
                records=[(name.encode(), str(count).encode())]), None)

        await writer.update("a", write("a", 5, producer_id=7))
        await writer.update("c", write("c", 9, producer_id=8))
        state = await writer.read("a")
        assert state.counts == {} and set(state.pending) == {7, 8}
        write_marker(log, partition, 7, committed=True)
        write_marker(log, partition, 8, committed=False)
        await writer.update("a", increment("a"))  # the markers moved the end: read, retry
        assert (await writer.read("a")).counts == {"a": 6}
        # A new handler replays the same from the log, offsets included.
        fresh = await transactional_runtime(log, purgatory).read("a")
        assert (fresh.counts, fresh.pending, fresh.offsets) == ({"a": 6}, {}, {"a": 4})
        [batch] = [b for base, _, b in log.batches[(TOPIC.name, partition)] if base == 0]
        header = read_header(batch)
        assert (header.is_transactional, header.producer_id, header.base_sequence) == (
            True, 7, 0)
        # A state that does not take part in transactions never sees their records.
        assert (await runtime(log, purgatory).read("a")).counts == {"a": 6}

    asyncio.run(main())


def test_a_transactional_write_refused_for_its_producer_fails_with_the_producer_error() -> None:
    class Refusing(Log):
        async def append(self, node: LogNode, request: log_pb2.AppendRequest,
                         time_limit: float, records=None) -> log_pb2.AppendResponse:
            [append] = request.partitions
            return log_pb2.AppendResponse(results=[log_pb2.PartitionAppendResult(
                topic=append.topic, partition=append.partition,
                error_code=ErrorCode.invalid_producer_epoch.value)])

    async def main() -> None:
        counters = transactional_runtime(Refusing(), Purgatory())
        with pytest.raises(CoordinatorError) as failed:
            await counters.update("a", lambda state, now: (TransactionalRecords(
                producer_id=1, producer_epoch=0, records=[(b"a", b"1")]), None))
        assert failed.value.code == ErrorCode.invalid_producer_epoch.value
        with pytest.raises(CoordinatorError) as failed:
            await counters.update("a", increment("a"))
        assert failed.value.code == COORDINATOR_NOT_AVAILABLE
        assert await counters.leader_epoch("a") == 0

    asyncio.run(main())


def test_a_leader_that_stopped_answering_is_found_until_it_is_fenced() -> None:
    """As Kafka's FindCoordinator: the leader of the key's partition is named while it is not
    fenced, answering or not; a fenced one (its partition offline) is no coordinator."""
    def placement_with(node: LogNode) -> Placement:
        metadata = ClusterMetadata(
            version=1, cluster_id="c", controller_id=0,
            topics=[topic(TOPIC.name, 2, leaders=[1, 1])],
            log_nodes=[LogNode(node_id=0, address="node-0:1"), node])
        return Placement(TOPIC, cache_of(metadata), FakeController(metadata))

    async def main() -> None:
        answering = placement_with(LogNode(node_id=1, address="node-1:1"))
        silent = placement_with(LogNode(node_id=1, address="node-1:1", alive=False))
        fenced = placement_with(LogNode(node_id=1, address="node-1:1", alive=False,
                                        fenced=True))
        assert await answering.find("a") == (0, 1)
        assert await silent.find("a") == (0, 1)
        assert await fenced.find("a") == (COORDINATOR_NOT_AVAILABLE, -1)

    asyncio.run(main())


def test_a_leader_that_leads_no_more_or_lost_its_disk_sends_clients_to_find_the_coordinator():
    # As Kafka maps a failed group append: NOT_COORDINATOR when leadership is (about to be)
    # elsewhere, COORDINATOR_NOT_AVAILABLE for anything that may pass where it is.
    not_coordinator = ErrorCode.not_coordinator.value
    assert leader_error(ErrorCode.not_leader_or_follower.value, "").code == not_coordinator
    assert leader_error(ErrorCode.kafka_storage_error.value, "").code == not_coordinator
    assert leader_error(ErrorCode.not_enough_replicas.value, "").code == COORDINATOR_NOT_AVAILABLE
    assert leader_error(0, "").code == COORDINATOR_NOT_AVAILABLE
