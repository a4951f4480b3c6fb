"""The transaction APIs as clients and admin tools call them, with Kafka's answers per version,
over a real transaction coordinator and group coordinator on in-memory log nodes and purgatory:
InitProducerId, AddPartitionsToTxn (v3 and below, batched and verify-only from v4),
AddOffsetsToTxn, EndTxn (v1 and v5), TxnOffsetCommit with its pending offsets and OffsetFetch
require_stable, DescribeTransactions, ListTransactions, WriteTxnMarkers and
DescribeProducers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.coordinator_keys import partition_for
from services.common.errors import ErrorCode
from services.handler.apis.group_offsets import OffsetFetchApi, TxnOffsetCommitApi
from services.handler.apis.producer_ids import InitProducerIdApi, ProducerIdBlocks
from services.handler.apis.producers import DescribeProducersApi
from services.handler.apis.transactions import (
    AddOffsetsToTxnApi,
    AddPartitionsToTxnApi,
    DescribeTransactionsApi,
    EndTxnApi,
    ListTransactionsApi,
)
from services.handler.apis.txn_markers import WriteTxnMarkersApi
from services.handler.config import HandlerConfig
from services.handler.groups.coordinator import OFFSETS_TOPIC, GroupCoordinator
from services.handler.groups.group import Group, GroupState, Member
from services.handler.groups.state import group_record
from services.handler.metrics import remote_time
from services.handler.request_context import RequestContext
from services.handler.transactions.coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
)
from services.handler.transactions.metadata import TxnState

from ..fakes import FakeController, MemoryLog, MemoryPurgatory, cache_of, cluster, topic

E = ErrorCode
TIMEOUT = 20.0
METADATA = cluster(
    topic(TRANSACTION_STATE_TOPIC, 2, topic_id="7a", epoch=2),
    replace(topic(OFFSETS_TOPIC, 2), internal=True),
    topic("a", 2), topic("b", 1), topic("gone", 1, leaders=[1]), nodes=(0, 1), dead=(2,))
GROUP_PARTITION = (OFFSETS_TOPIC, partition_for("g", 2))


class Source:
    """The replicator's producer id blocks."""

    def __init__(self) -> None:
        self._starts = itertools.count(5000, 100)

    async def allocate_producer_ids(self, request: Any, time_limit: float) -> Any:
        from kbroker.replicator.v1 import replicator_pb2
        return replicator_pb2.AllocateProducerIdsResponse(
            producer_id_start=next(self._starts), producer_id_len=100)


class Cluster:
    """The APIs of one handler, its coordinators on shared in-memory services."""

    def __init__(self) -> None:
        self.log, self.purgatory = MemoryLog(), MemoryPurgatory()
        cache, controller = cache_of(METADATA), FakeController(METADATA)
        config = HandlerConfig(offsets_topic_num_partitions=2,
                               transaction_state_log_num_partitions=2)
        blocks = ProducerIdBlocks(Source())  # type: ignore[arg-type]
        self.txn = TransactionCoordinator(cache, self.log, controller,  # type: ignore[arg-type]
                                          self.purgatory, config, blocks)
        self.groups = GroupCoordinator(cache, self.log, controller,  # type: ignore[arg-type]
                                       self.purgatory, config)
        self.init = InitProducerIdApi(blocks, self.txn)
        self.add = AddPartitionsToTxnApi(cache, self.txn)
        self.add_offsets = AddOffsetsToTxnApi(self.txn, self.groups)
        self.end = EndTxnApi(self.txn)
        self.txn_commit = TxnOffsetCommitApi(cache, self.groups, self.txn)
        self.fetch_offsets = OffsetFetchApi(self.groups)
        self.describe = DescribeTransactionsApi(self.txn)
        self.list = ListTransactionsApi(self.txn)
        self.markers = WriteTxnMarkersApi(cache, self.log, self.purgatory)  # type: ignore[arg-type]
        self.producers = DescribeProducersApi(cache, self.log)  # type: ignore[arg-type]

    async def close(self) -> None:
        await self.txn.close()
        await self.groups.close()

    async def begin(self, tid: str, *partitions: tuple[str, int]) -> tuple[int, int]:
        init = await self.init.handle(k.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000), at(4))
        assert init.error_code == 0, init
        if partitions:
            added = await self.add.handle(add_v3(tid, init.producer_id, init.producer_epoch,
                                                 *partitions), at(3))
            assert all(r.partition_error_code == 0 for t in added.results_by_topic_v3_and_below
                       for r in t.results_by_partition), added
        return init.producer_id, init.producer_epoch

    async def state(self, tid: str) -> TxnState | None:
        _, meta = await self.txn.describe(tid)
        return None if meta is None else meta.state


def at(version: int | None, broker_id: int | None = 0) -> RequestContext:
    return RequestContext(advertised_host="kafka.test", advertised_port=9092,
                          api_version=version, broker_id=broker_id)


def run(test: Callable[[Cluster], Awaitable[None]]) -> None:
    async def main() -> None:
        cluster = Cluster()
        try:
            await test(cluster)
        finally:
            await cluster.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def add_v3(tid: str, pid: int, epoch: int, *partitions: tuple[str, int]
           ) -> k.AddPartitionsToTxnRequest:
    return k.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch, v3_and_below_topics=_topics(partitions))


def _topics(partitions: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for name, p in partitions:
        by_topic.setdefault(name, []).append(p)
    return [{"name": name, "partitions": ps} for name, ps in by_topic.items()]


def errors_v3(response: k.AddPartitionsToTxnResponse) -> dict[tuple[str, int], int]:
    return {(t.name, r.partition_index): r.partition_error_code
            for t in response.results_by_topic_v3_and_below for r in t.results_by_partition}


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(400):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_init_producer_id_for_transactional_ids() -> None:
    async def test(c: Cluster) -> None:
        request = k.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=60_000)
        first = await c.init.handle(request, at(4))
        assert (first.error_code, first.producer_id, first.producer_epoch) == (0, 5000, 0)
        second = await c.init.handle(request, at(4))
        assert (second.error_code, second.producer_id, second.producer_epoch) == (0, 5000, 1)
        # KIP-360: naming an epoch that was bumped away is fenced (INVALID_PRODUCER_EPOCH for
        # clients before v4).
        stale = k.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=60_000,
                                        producer_id=5000, producer_epoch=0)
        assert (await c.init.handle(stale, at(4))).error_code == E.producer_fenced.value
        old = await c.init.handle(stale, at(3))
        assert (old.error_code, old.producer_id, old.producer_epoch) == (
            E.invalid_producer_epoch.value, -1, -1)
        too_long = k.InitProducerIdRequest(transactional_id="tx",
                                           transaction_timeout_ms=900_001)
        assert (await c.init.handle(too_long, at(4))).error_code == \
            E.invalid_transaction_timeout.value
        assert (await c.init.handle(k.InitProducerIdRequest(
            transactional_id="", transaction_timeout_ms=1000), at(4))).error_code == \
            E.invalid_request.value
        # Broker 1 is alive and does not lead the id's partition.
        assert (await c.init.handle(request, at(4, broker_id=1))).error_code == \
            E.not_coordinator.value

    run(test)


def test_add_partitions_v3_and_below() -> None:
    async def test(c: Cluster) -> None:
        pid, epoch = await c.begin("tx")
        unknown = await c.add.handle(add_v3("tx", pid, epoch, ("a", 0), ("a", 7), ("zz", 0)),
                                     at(3))
        assert errors_v3(unknown) == {("a", 0): E.operation_not_attempted.value,
                                      ("a", 7): E.unknown_topic_or_partition.value,
                                      ("zz", 0): E.unknown_topic_or_partition.value}
        assert await c.state("tx") is TxnState.EMPTY
        # Clients may not name internal topics (AddOffsetsToTxn adds a group's partition).
        internal = await c.add.handle(add_v3("tx", pid, epoch, ("a", 0), (OFFSETS_TOPIC, 0)),
                                      at(3))
        assert errors_v3(internal) == {("a", 0): E.operation_not_attempted.value,
                                       (OFFSETS_TOPIC, 0): E.topic_authorization_failed.value}
        added = await c.add.handle(add_v3("tx", pid, epoch, ("a", 0), ("b", 0)), at(3))
        assert errors_v3(added) == {("a", 0): 0, ("b", 0): 0}
        assert not added.results_by_transaction
        assert await c.state("tx") is TxnState.ONGOING
        # A fenced epoch: PRODUCER_FENCED from v2, INVALID_PRODUCER_EPOCH before.
        fenced = add_v3("tx", pid, epoch + 1, ("a", 1))
        assert set(errors_v3(await c.add.handle(fenced, at(2))).values()) == {
            E.producer_fenced.value}
        assert set(errors_v3(await c.add.handle(fenced, at(1))).values()) == {
            E.invalid_producer_epoch.value}
        assert set(errors_v3(await c.add.handle(add_v3("tx", pid + 1, epoch, ("a", 1)),
                                                at(3))).values()) == {
            E.invalid_producer_id_mapping.value}
        assert set(errors_v3(await c.add.handle(add_v3("tx", pid, epoch, ("a", 1)),
                                                at(3, broker_id=1))).values()) == {
            E.not_coordinator.value}

    run(test)


def test_add_partitions_v4_batches_transactions_and_verifies_only_when_asked() -> None:
    async def test(c: Cluster) -> None:
        p1, e1 = await c.begin("one", ("a", 0))
        p2, e2 = await c.begin("two")
        request = k.AddPartitionsToTxnRequest(transactions=[
            {"transactional_id": "one", "producer_id": p1, "producer_epoch": e1,
             "verify_only": True, "topics": _topics((("a", 0), ("a", 1)))},
            {"transactional_id": "two", "producer_id": p2, "producer_epoch": e2,
             "verify_only": False, "topics": _topics((("b", 0),))}])
        response = await c.add.handle(request, at(5))
        assert response.error_code == 0 and not response.results_by_topic_v3_and_below
        got = {(t.transactional_id, r.name, p.partition_index): p.partition_error_code
               for t in response.results_by_transaction for r in t.topic_results
               for p in r.results_by_partition}
        assert got == {("one", "a", 0): 0, ("one", "a", 1): E.transaction_abortable.value,
                       ("two", "b", 0): 0}
        _, one = await c.txn.describe("one")
        assert one is not None and one.partitions == {("a", 0)}  # verifying added nothing
        assert await c.state("two") is TxnState.ONGOING

    run(test)


def test_end_txn_v1_and_v5() -> None:
    async def test(c: Cluster) -> None:
        pid, epoch = await c.begin("tx", ("a", 0))
        fenced = await c.end.handle(k.EndTxnRequest(transactional_id="tx", producer_id=pid,
                                                    producer_epoch=epoch + 1, committed=True),
                                    at(1))
        assert (fenced.error_code, fenced.producer_id, fenced.producer_epoch) == (
            E.invalid_producer_epoch.value, -1, -1)
        v5 = await c.end.handle(k.EndTxnRequest(transactional_id="tx", producer_id=pid,
                                                producer_epoch=epoch, committed=True), at(5))
        assert (v5.error_code, v5.producer_id, v5.producer_epoch) == (0, pid, epoch + 1)
        await eventually(lambda: _is(c, "tx", TxnState.COMPLETE_COMMIT), "complete")
        assert [(m[1], m[2], m[4]) for m in c.log.markers] == [(epoch + 1, True, ("a", 0))]
        # Transactions v2 accept the epoch before the bump only, as a retry; anything else is
        # fenced (Kafka: "producer fenced even where the epoch is higher").
        other = await c.end.handle(k.EndTxnRequest(transactional_id="tx", producer_id=pid,
                                                   producer_epoch=epoch + 1, committed=False),
                                   at(5))
        assert other.error_code == E.producer_fenced.value
        retry = await c.end.handle(k.EndTxnRequest(transactional_id="tx", producer_id=pid,
                                                   producer_epoch=epoch, committed=True), at(5))
        assert (retry.error_code, retry.producer_epoch) == (0, epoch + 1)

    run(test)


async def _is(c: Cluster, tid: str, state: TxnState) -> bool:
    return await c.state(tid) is state


async def _member_of_generation_3(c: Cluster) -> None:
    group = Group(group_id="g", state=GroupState.STABLE, generation=3, protocol_type="consumer",
                  protocol_name="range", leader_id="m", members={
                      "m": Member(member_id="m", session_timeout_ms=30_000,
                                  rebalance_timeout_ms=30_000, protocol_type="consumer",
                                  protocols=(("range", b""),))})
    await c.groups.runtime.update("g", lambda state, now: ([group_record("g", group)], None))


def txn_commit(pid: int, epoch: int, offsets: dict[tuple[str, int], int], *,
               generation: int = -1, member: str = "") -> k.TxnOffsetCommitRequest:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, p), offset in offsets.items():
        by_topic.setdefault(name, []).append({"partition_index": p, "committed_offset": offset,
                                              "committed_metadata": "m"})
    return k.TxnOffsetCommitRequest(
        transactional_id="tx", group_id="g", producer_id=pid, producer_epoch=epoch,
        generation_id=generation, member_id=member,
        topics=[{"name": n, "partitions": ps} for n, ps in by_topic.items()])


def commit_errors(response: k.TxnOffsetCommitResponse) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.error_code for t in response.topics
            for p in t.partitions}


async def fetched(c: Cluster, stable: bool) -> dict[tuple[str, int], tuple[int, int]]:
    response = await c.fetch_offsets.handle(k.OffsetFetchRequest(
        group_id="g", topics=[{"name": "a", "partition_indexes": [0, 1]}],
        require_stable=stable), at(7))
    return {(t.name, p.partition_index): (p.committed_offset, p.error_code)
            for t in response.topics for p in t.partitions}


def test_transactional_offsets_count_once_the_transaction_commits() -> None:
    async def test(c: Cluster) -> None:
        await _member_of_generation_3(c)
        pid, epoch = await c.begin("tx", ("a", 0))
        # The offsets partition is not in the transaction yet.
        early = await c.txn_commit.handle(txn_commit(pid, epoch, {("a", 0): 5}), at(4))
        assert commit_errors(early) == {("a", 0): E.transaction_abortable.value}
        early = await c.txn_commit.handle(txn_commit(pid, epoch, {("a", 0): 5}), at(3))
        assert commit_errors(early) == {("a", 0): E.invalid_txn_state.value}
        added = await c.add_offsets.handle(k.AddOffsetsToTxnRequest(
            transactional_id="tx", producer_id=pid, producer_epoch=epoch, group_id="g"), at(3))
        assert added.error_code == 0
        _, meta = await c.txn.describe("tx")
        assert meta is not None and GROUP_PARTITION in meta.partitions
        # v3 checks the member and its generation.
        stale = txn_commit(pid, epoch, {("a", 0): 5}, generation=2, member="m")
        assert commit_errors(await c.txn_commit.handle(stale, at(3))) == {
            ("a", 0): E.illegal_generation.value}
        stranger = txn_commit(pid, epoch, {("a", 0): 5}, generation=3, member="x")
        assert commit_errors(await c.txn_commit.handle(stranger, at(3))) == {
            ("a", 0): E.unknown_member_id.value}
        commit = txn_commit(pid, epoch, {("a", 0): 5, ("a", 9): 1, ("zz", 0): 2}, generation=3,
                            member="m")
        assert commit_errors(await c.txn_commit.handle(commit, at(3))) == {
            ("a", 0): 0, ("a", 9): E.unknown_topic_or_partition.value,
            ("zz", 0): E.unknown_topic_or_partition.value}
        # Pending: not committed yet, and unstable for a consumer that wants stable offsets.
        assert await fetched(c, stable=False) == {("a", 0): (-1, 0), ("a", 1): (-1, 0)}
        assert await fetched(c, stable=True) == {
            ("a", 0): (-1, E.unstable_offset_commit.value), ("a", 1): (-1, 0)}
        assert (await c.end.handle(k.EndTxnRequest(
            transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=True),
            at(3))).error_code == 0
        await eventually(lambda: _is(c, "tx", TxnState.COMPLETE_COMMIT), "complete")
        assert await fetched(c, stable=True) == {("a", 0): (5, 0), ("a", 1): (-1, 0)}

    run(test)


def test_transactional_offsets_vanish_when_the_transaction_aborts() -> None:
    async def test(c: Cluster) -> None:
        pid, epoch = await c.begin("tx")
        assert (await c.add_offsets.handle(k.AddOffsetsToTxnRequest(
            transactional_id="tx", producer_id=pid, producer_epoch=epoch, group_id="g"),
            at(3))).error_code == 0
        # Outside group management (no generation), as the admin client and old clients do.
        assert commit_errors(await c.txn_commit.handle(
            txn_commit(pid, epoch, {("a", 1): 8}), at(2))) == {("a", 1): 0}
        assert (await c.end.handle(k.EndTxnRequest(
            transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=False),
            at(3))).error_code == 0
        await eventually(lambda: _is(c, "tx", TxnState.COMPLETE_ABORT), "aborted")
        assert await fetched(c, stable=True) == {("a", 0): (-1, 0), ("a", 1): (-1, 0)}
        assert c.log.markers[-1][4] == GROUP_PARTITION
        # A new instance of the producer bumps the epoch: the old one is a zombie.
        assert (await c.begin("tx"))[1] == epoch + 1
        zombie = await c.txn_commit.handle(txn_commit(pid, epoch, {("a", 1): 9}), at(3))
        assert commit_errors(zombie) == {("a", 1): E.invalid_producer_epoch.value}
        # At the port of a broker that is not the coordinator, a dead one too (unlike the
        # group APIs, which serve there): NOT_COORDINATOR, so clients look it up again.
        for broker in (1, 2):
            elsewhere = await c.txn_commit.handle(
                txn_commit(pid, epoch + 1, {("a", 1): 9}), at(3, broker_id=broker))
            assert commit_errors(elsewhere) == {("a", 1): E.not_coordinator.value}

    run(test)


def test_describe_and_list_transactions() -> None:
    async def test(c: Cluster) -> None:
        pid, epoch = await c.begin("open", ("a", 1), ("a", 0), ("b", 0))
        await c.begin("idle")
        described = await c.describe.handle(k.DescribeTransactionsRequest(
            transactional_ids=["open", "idle", "nobody", ""]), at(0))
        by_id = {s.transactional_id: s for s in described.transaction_states}
        assert (by_id["open"].error_code, by_id["open"].transaction_state,
                by_id["open"].producer_id, by_id["open"].producer_epoch,
                by_id["open"].transaction_timeout_ms) == (0, "Ongoing", pid, epoch, 60_000)
        assert [(t.topic, list(t.partitions)) for t in by_id["open"].topics] == [
            ("a", [0, 1]), ("b", [0])]
        assert by_id["open"].transaction_start_time_ms > 0
        assert (by_id["idle"].transaction_state, by_id["idle"].transaction_start_time_ms) == (
            "Empty", -1)
        assert by_id["nobody"].error_code == E.transactional_id_not_found.value
        assert by_id[""].error_code == E.invalid_request.value
        elsewhere = await c.describe.handle(k.DescribeTransactionsRequest(
            transactional_ids=["open"]), at(0, broker_id=1))
        assert elsewhere.transaction_states[0].error_code == E.not_coordinator.value

        async def listed(**filters: Any) -> tuple[list[tuple[str, str]], list[str]]:
            response = await c.list.handle(k.ListTransactionsRequest(**filters), at(1))
            assert response.error_code == 0
            return sorted((s.transactional_id, s.transaction_state)
                          for s in response.transaction_states), list(
                response.unknown_state_filters)

        assert await listed() == ([("idle", "Empty"), ("open", "Ongoing")], [])
        assert await listed(state_filters=["Ongoing", "Nonsense"]) == (
            [("open", "Ongoing")], ["Nonsense"])
        assert await listed(state_filters=["Nonsense"]) == ([], ["Nonsense"])
        assert await listed(producer_id_filters=[pid]) == ([("open", "Ongoing")], [])
        # v1: only transactions running for longer than the duration (ten seconds on).
        # (Kafka counts an Empty transaction, started at -1, as running since forever.)
        later = c.txn.now() + 10_000
        c.txn.runtime.now = lambda: later
        assert await listed(duration_filter=3_600_000) == ([("idle", "Empty")], [])
        assert (await listed(duration_filter=5_000))[0] == [
            ("idle", "Empty"), ("open", "Ongoing")]
        # Each broker lists what it leads (broker 1 leads no transaction state partition).
        response = await c.list.handle(k.ListTransactionsRequest(), at(1, broker_id=1))
        assert list(response.transaction_states) == []

    run(test)


def test_write_txn_markers_for_an_admin_client() -> None:
    async def test(c: Cluster) -> None:
        c.log.marker_errors[("b", 0)] = E.invalid_producer_epoch.value
        request = k.WriteTxnMarkersRequest(markers=[
            {"producer_id": 7, "producer_epoch": 1, "transaction_result": False,
             "coordinator_epoch": 4, "topics": [{"name": "a", "partition_indexes": [0, 1]},
                                                {"name": "zz", "partition_indexes": [0]}]},
            {"producer_id": 7, "producer_epoch": 1, "transaction_result": False,
             "coordinator_epoch": 4, "topics": [{"name": "b", "partition_indexes": [0]}]},
            {"producer_id": 8, "producer_epoch": 0, "transaction_result": True,
             "coordinator_epoch": 4, "topics": [{"name": "a", "partition_indexes": [0]}]}])
        response = await c.markers.handle(request, at(1))
        got = {(m.producer_id, t.name, p.partition_index): p.error_code
               for m in response.markers for t in m.topics for p in t.partitions}
        assert got == {(7, "a", 0): 0, (7, "a", 1): 0,
                       (7, "zz", 0): E.unknown_topic_or_partition.value,
                       (7, "b", 0): E.invalid_producer_epoch.value, (8, "a", 0): 0}
        assert [m.producer_id for m in response.markers] == [7, 8]
        assert sorted(c.log.markers) == [(7, 1, False, 4, ("a", 0)), (7, 1, False, 4, ("a", 1)),
                                         (8, 0, True, 4, ("a", 0))]
        assert (await c.markers.handle(k.WriteTxnMarkersRequest(), at(1))).markers == []

    run(test)


def test_write_txn_markers_counts_the_leaders_hold_as_remote_time() -> None:
    class Trailers:
        def set_trailing_metadata(self, trailers: object) -> None:
            pass

    async def test(c: Cluster) -> None:
        c.log.markers_commit_in_wait = True
        markers = WriteTxnMarkersApi(cache_of(METADATA), c.log,  # type: ignore[arg-type]
                                     c.purgatory, leader_wait_ms=100)  # type: ignore[arg-type]
        request = k.WriteTxnMarkersRequest(markers=[
            {"producer_id": 7, "producer_epoch": 1, "transaction_result": True,
             "coordinator_epoch": 4, "topics": [{"name": "a", "partition_indexes": [0, 1]}]}])
        waits = len(c.purgatory.produce_waits)
        with remote_time(Trailers()) as account:
            response = await markers.handle(request, at(1))
        assert [p.error_code for m in response.markers for t in m.topics
                for p in t.partitions] == [0, 0]
        assert c.log.marker_waits == [100]
        # Committed in the leader's hold: no purgatory wait, and the hold is the remote time.
        assert len(c.purgatory.produce_waits) == waits
        assert account.seconds == 0.0015

    run(test)


def test_describe_producers_asks_each_leader() -> None:
    async def test(c: Cluster) -> None:
        c.log.producers[("a", 1)] = [log_pb2.ActiveProducer(
            producer_id=7, producer_epoch=2, last_sequence=9, last_timestamp=1234,
            coordinator_epoch=3, current_txn_start_offset=40)]
        response = await c.producers.handle(k.DescribeProducersRequest(topics=[
            {"name": "a", "partition_indexes": [0, 1, 5]}, {"name": "zz", "partition_indexes": [0]},
            {"name": "bad name", "partition_indexes": [0]},
            {"name": "gone", "partition_indexes": [0]}]), at(0))
        got = {(t.name, p.partition_index): (p.error_code, [
            (s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp,
             s.coordinator_epoch, s.current_txn_start_offset) for s in p.active_producers])
            for t in response.topics for p in t.partitions}
        assert got == {("a", 0): (0, []), ("a", 1): (0, [(7, 2, 9, 1234, 3, 40)]),
                       ("a", 5): (E.unknown_topic_or_partition.value, []),
                       ("zz", 0): (E.unknown_topic_or_partition.value, []),
                       ("bad name", 0): (E.invalid_topic_exception.value, []),
                       ("gone", 0): (0, [])}

    run(test)
