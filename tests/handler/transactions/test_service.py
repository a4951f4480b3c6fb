"""Transactions through real handlers, with real log nodes, purgatory and replicator on port 0:
a transaction from FindCoordinator to its markers (produce verified with the coordinator,
offsets committed in it, read back once committed), a handler that dies between Prepare and
Complete (another handler finishes the transaction when the takeover timer runs out), the
timeout abort with its fence, and fencing by a new instance of the producer.

Log nodes without the leader side of transactions (WriteTxnMarkers, verification guards,
DescribeProducers) have it played by :class:`TransactionalLogNodes` in the handler's log node
clients, on top of the real nodes (a marker is a control batch appended as the leader would
write it); log nodes that have it are used as they are."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record_batch import (
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    iter_batches,
    read_header,
)
from services.handler import server as handler_server
from services.handler.clients import LogNodeClients
from services.handler.collaborators import CallError
from services.handler.config import HandlerConfig
from services.handler.metadata_cache import LogNode

from ...record_batches import build_batch
from ..fakes import whole_append
from ..groups.client import context
from ..harness import CALL_TIMEOUT, Cluster, running_cluster

E = ErrorCode
TIMEOUT = 120
OPTIONS: dict[str, Any] = {
    "transaction_state_log_num_partitions": 2,
    "offsets_topic_num_partitions": 2,
    "transaction_marker_takeover_ms": 500,
    "group_initial_rebalance_delay_ms": 0,
}
Stub = kafka_handler_pb2_grpc.KafkaHandlerStub


def run(coroutine: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))  # type: ignore[arg-type]


class LeaderSide:
    """The leader side of transactions, shared by a test's handlers: the markers written,
    partitions whose leader cannot be reached for markers (``blocked``), and, for log nodes
    that lack it (``native`` False), KIP-890 verification (a producer's first transactional
    batch on a partition needs its guard) and the writing of markers."""

    def __init__(self) -> None:
        self.native: bool | None = None
        self.markers: list[tuple[int, int, bool, int, tuple[str, int]]] = []
        self.blocked: set[tuple[str, int]] = set()
        self.guards: dict[tuple[tuple[str, int], int], int] = {}
        self.open: set[tuple[tuple[str, int], int]] = set()
        self._guards = itertools.count(1001)


class TransactionalLogNodes(LogNodeClients):
    """The handler's log node clients, with the leader side of transactions played here when
    the log nodes do not have it (they answer DescribeProducers UNIMPLEMENTED): a marker is a
    control batch appended as the leader would write it."""

    def __init__(self, side: LeaderSide) -> None:
        super().__init__()
        self.side = side

    async def _native(self, node: LogNode) -> bool:
        if self.side.native is None:
            try:
                await super().describe_producers(node, log_pb2.DescribeProducersRequest(), 5.0)
                self.side.native = True
            except CallError as exc:
                if "UNIMPLEMENTED" not in str(exc):
                    raise
                self.side.native = False
        return self.side.native

    async def append(self, node: LogNode, request: log_pb2.AppendRequest, time_limit: float,
                     records=None) -> log_pb2.AppendResponse:
        if await self._native(node):
            return await super().append(node, request, time_limit, records)
        request = whole_append(request, records)
        refused, passed = [], []
        for a in request.partitions:
            header = read_header(a.records) if len(a.records) >= HEADER_SIZE else None
            key = ((a.topic, a.partition), header.producer_id if header else -1)
            if header is not None and header.is_transactional and not a.HasField(
                    "expected_log_end_offset") and key not in self.side.open:
                guard = self.side.guards.setdefault(key, next(self.side._guards))
                if a.verification_guard != guard:
                    refused.append(log_pb2.PartitionAppendResult(
                        topic=a.topic, partition=a.partition,
                        error_code=E.invalid_txn_state.value, verification_guard=guard))
                    continue
                self.side.open.add(key)
            passed.append(a)
        response = log_pb2.AppendResponse()
        if passed:
            response = await super().append(node, log_pb2.AppendRequest(partitions=passed),
                                            time_limit)
        response.results.extend(refused)
        return response

    async def write_txn_markers(self, node: LogNode, request: log_pb2.WriteTxnMarkersRequest,
                                time_limit: float) -> log_pb2.WriteTxnMarkersResponse:
        native = await self._native(node)
        out = log_pb2.WriteTxnMarkersResponse()
        for marker in request.markers:
            answer = out.markers.add(producer_id=marker.producer_id)
            for tp in marker.partitions:
                where = (tp.topic, tp.partition)
                if where in self.side.blocked:
                    answer.partitions.add(topic=tp.topic, partition=tp.partition,
                                          error_code=E.not_leader_or_follower.value)
                    continue
                if native:
                    one = log_pb2.TxnMarker()
                    one.CopyFrom(marker)
                    del one.partitions[:]
                    one.partitions.add(topic=tp.topic, partition=tp.partition)
                    written = (await super().write_txn_markers(node, log_pb2.WriteTxnMarkersRequest(
                        markers=[one]), time_limit)).markers[0].partitions
                else:
                    written = (await super().append(node, log_pb2.AppendRequest(partitions=[
                        log_pb2.PartitionAppend(topic=tp.topic, partition=tp.partition,
                                                records=_marker_batch(marker))]),
                        time_limit)).results
                answer.partitions.extend(written)
                if all(not result.error_code for result in written):
                    self.side.open.discard((where, marker.producer_id))
                    self.side.guards.pop((where, marker.producer_id), None)
                    self.side.markers.append((marker.producer_id, marker.producer_epoch,
                                              marker.committed, marker.coordinator_epoch, where))
        return out


def _marker_batch(marker: log_pb2.TxnMarker) -> bytes:
    return build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.COMMIT if marker.committed
                             else ControlRecordType.ABORT,
                             coordinator_epoch=marker.coordinator_epoch),
        producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
        timestamp=int(time.time() * 1000))


@contextlib.asynccontextmanager
async def transactional_cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, LeaderSide]]:
    side = LeaderSide()
    async with running_cluster(tmp_path, log_node_clients=lambda: TransactionalLogNodes(side),
                               **OPTIONS) as cluster:
        await cluster.create_topic("t", partitions=2)
        # As a producer starts: finding its coordinator creates __transaction_state.
        found = await cluster.stub.FindCoordinator(k.FindCoordinatorRequest(
            key_type=1, coordinator_keys=["tx"]), metadata=context(4), timeout=CALL_TIMEOUT)
        assert (found.coordinators[0].error_code, found.coordinators[0].node_id) == (0, 0)
        yield cluster, side


@contextlib.asynccontextmanager
async def second_handler(cluster: Cluster, side: LeaderSide) -> AsyncIterator[Stub]:
    handler = await handler_server.start(HandlerConfig(
        grpc_address="127.0.0.1:0", replicator_address=f"127.0.0.1:{cluster.replicator.port}",
        purgatory_address=f"127.0.0.1:{cluster.purgatory.port}", advertised="default.test:9999",
        instance="handler-1", **OPTIONS), log_nodes=TransactionalLogNodes(side))
    channel = insecure_channel(f"127.0.0.1:{handler.port}")
    try:
        yield Stub(channel)
    finally:
        await channel.close()
        await handler.stop(0)


class Producer:
    """A transactional producer's calls, each at the version it stands for."""

    def __init__(self, stub: Stub, tid: str = "tx") -> None:
        self.stub = stub
        self.tid = tid
        self.producer_id = -1
        self.epoch = -1

    async def init(self, timeout_ms: int = 60_000) -> k.InitProducerIdResponse:
        response = await self.stub.InitProducerId(k.InitProducerIdRequest(
            transactional_id=self.tid, transaction_timeout_ms=timeout_ms),
            metadata=context(4), timeout=CALL_TIMEOUT)
        if response.error_code == 0:
            self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        return response

    async def add(self, *partitions: int, version: int = 3) -> list[int]:
        response = await self.stub.AddPartitionsToTxn(k.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.tid, v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.epoch, v3_and_below_topics=[
                {"name": "t", "partitions": list(partitions)}]),
            metadata=context(version), timeout=CALL_TIMEOUT)
        return [r.partition_error_code for t in response.results_by_topic_v3_and_below
                for r in t.results_by_partition]

    async def produce(self, partition: int, sequence: int) -> k.ProduceResponse:
        batch = build_batch([b"v"], attributes=TRANSACTIONAL_BIT, producer_id=self.producer_id,
                            producer_epoch=self.epoch, base_sequence=sequence)
        return await self.stub.Produce(k.ProduceRequest(
            transactional_id=self.tid, acks=-1, timeout_ms=5000, topic_data=[
                {"name": "t", "partition_data": [{"index": partition, "records": batch}]}]),
            metadata=context(11), timeout=CALL_TIMEOUT)

    async def end(self, commit: bool, version: int = 3) -> int:
        response = await self.stub.EndTxn(k.EndTxnRequest(
            transactional_id=self.tid, producer_id=self.producer_id,
            producer_epoch=self.epoch, committed=commit),
            metadata=context(version), timeout=CALL_TIMEOUT)
        return response.error_code


async def transaction_state(stub: Stub, tid: str = "tx") -> k.DescribeTransactionsResponse:
    response = await stub.DescribeTransactions(k.DescribeTransactionsRequest(
        transactional_ids=[tid]), metadata=context(0), timeout=CALL_TIMEOUT)
    return response.transaction_states[0]


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def in_state(stub: Stub, state: str, tid: str = "tx") -> bool:
    return (await transaction_state(stub, tid)).transaction_state == state


def test_a_transaction_from_find_coordinator_to_its_markers(tmp_path: Path) -> None:
    async def main() -> None:
        async with transactional_cluster(tmp_path) as (cluster, side):
            producer = Producer(cluster.stub)
            assert (await producer.init()).error_code == 0
            assert await producer.add(0) == [0]
            # The leader asks for the transaction to be verified before it stores the first
            # batch: partition 0 is in it, partition 1 is not.
            stored = (await producer.produce(0, 0)).responses[0].partition_responses[0]
            assert (stored.error_code, stored.base_offset) == (0, 0)
            refused = (await producer.produce(1, 0)).responses[0].partition_responses[0]
            assert refused.error_code == E.transaction_abortable.value
            assert (await cluster.stub.FindCoordinator(k.FindCoordinatorRequest(
                key_type=0, coordinator_keys=["g"]), metadata=context(4),
                timeout=CALL_TIMEOUT)).coordinators[0].error_code == 0
            added = await cluster.stub.AddOffsetsToTxn(k.AddOffsetsToTxnRequest(
                transactional_id="tx", producer_id=producer.producer_id,
                producer_epoch=producer.epoch, group_id="g"), metadata=context(3),
                timeout=CALL_TIMEOUT)
            assert added.error_code == 0
            committed = await cluster.stub.TxnOffsetCommit(k.TxnOffsetCommitRequest(
                transactional_id="tx", group_id="g", producer_id=producer.producer_id,
                producer_epoch=producer.epoch, generation_id=-1, topics=[
                    {"name": "t", "partitions": [{"partition_index": 0,
                                                  "committed_offset": 1}]}]),
                metadata=context(3), timeout=CALL_TIMEOUT)
            assert committed.topics[0].partitions[0].error_code == 0
            assert await offsets(cluster.stub) == (-1, E.unstable_offset_commit.value)
            state = await transaction_state(cluster.stub)
            assert state.transaction_state == "Ongoing"
            assert sorted((t.topic, list(t.partitions)) for t in state.topics) == [
                ("__consumer_offsets", [state.topics[0].partitions[0]]), ("t", [0])]
            assert await producer.end(commit=True) == 0
            await until(lambda: in_state(cluster.stub, "CompleteCommit"), "committed")
            assert sorted((m[2], m[4][0]) for m in side.markers) == [
                (True, "__consumer_offsets"), (True, "t")]
            assert await offsets(cluster.stub) == (1, 0)
            # The partition holds the record, then the COMMIT marker.
            assert await batches(cluster, "t", 0) == [(0, True, False), (1, True, True)]
            listed = await cluster.stub.ListTransactions(k.ListTransactionsRequest(),
                                                         metadata=context(1),
                                                         timeout=CALL_TIMEOUT)
            assert [(s.transactional_id, s.transaction_state)
                    for s in listed.transaction_states] == [("tx", "CompleteCommit")]

    run(main())


async def batches(cluster: Cluster, topic: str, partition: int
                  ) -> list[tuple[int, bool, bool]]:
    """(offset, transactional, control) of every batch up to the high watermark, read as a
    consumer reads (a fetch returns one segment's batches: the test's records carry an old
    timestamp, so the marker starts a new segment)."""
    found: list[tuple[int, bool, bool]] = []
    offset = 0
    for _ in range(100):
        fetched = (await cluster.fetch(topic, partition, offset)).responses[0].partitions[0]
        headers = [h for _, h in iter_batches(fetched.records)]
        found += [(h.base_offset, h.is_transactional, h.is_control) for h in headers]
        if not headers or headers[-1].next_offset >= fetched.high_watermark:
            return found
        offset = headers[-1].next_offset
    raise AssertionError("the partition never ended")


async def offsets(stub: Stub) -> tuple[int, int]:
    response = await stub.OffsetFetch(k.OffsetFetchRequest(
        group_id="g", topics=[{"name": "t", "partition_indexes": [0]}], require_stable=True),
        metadata=context(7), timeout=CALL_TIMEOUT)
    partition = response.topics[0].partitions[0]
    return partition.committed_offset, partition.error_code


def test_a_handler_dying_between_prepare_and_complete_leaves_it_to_another(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with transactional_cluster(tmp_path) as (cluster, side), \
                second_handler(cluster, side) as other:
            producer = Producer(cluster.stub)
            assert (await producer.init()).error_code == 0
            assert await producer.add(0, 1) == [0, 0]
            side.blocked.add(("t", 1))  # its leader cannot be reached for the marker
            assert await producer.end(commit=True) == 0
            await until(lambda: _marker_on(side, 0), "the first marker written")
            await cluster.handler.stop(0)  # killed between Prepare and Complete
            assert await in_state(other, "PrepareCommit")
            side.blocked.clear()
            await until(lambda: in_state(other, "CompleteCommit"), "taken over and completed")
            assert {(m[2], m[4]) for m in side.markers} >= {(True, ("t", 0)), (True, ("t", 1))}

    run(main())


async def _marker_on(side: LeaderSide, partition: int) -> bool:
    return any(m[4] == ("t", partition) for m in side.markers)


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with transactional_cluster(tmp_path) as (cluster, side):
            producer = Producer(cluster.stub)
            assert (await producer.init(timeout_ms=1000)).error_code == 0
            epoch = producer.epoch
            assert await producer.add(0) == [0]
            assert (await producer.produce(0, 0)).responses[0].partition_responses[0] \
                .error_code == 0
            await until(lambda: in_state(cluster.stub, "CompleteAbort"), "aborted")
            assert [(m[1], m[2], m[4]) for m in side.markers] == [(epoch + 1, False, ("t", 0))]
            # The zombie is fenced, in each version's words.
            assert await producer.end(commit=True, version=1) == \
                E.invalid_producer_epoch.value
            assert await producer.end(commit=True, version=2) == E.producer_fenced.value
            assert await producer.add(1, version=1) == [E.invalid_producer_epoch.value]
            # A new instance starts over, two epochs on.
            assert (await producer.init()).error_code == 0
            assert producer.epoch == epoch + 2

    run(main())


def test_a_new_instance_fences_an_ongoing_transaction(tmp_path: Path) -> None:
    async def main() -> None:
        async with transactional_cluster(tmp_path) as (cluster, side):
            zombie = Producer(cluster.stub)
            assert (await zombie.init()).error_code == 0
            assert await zombie.add(0, 1) == [0, 0]
            successor = Producer(cluster.stub)
            # Answered once the fenced transaction's abort is done (its markers written).
            first = await successor.init()
            assert first.error_code == 0
            assert (successor.producer_id, successor.epoch) == (zombie.producer_id,
                                                                 zombie.epoch + 2)
            assert sorted((m[1], m[2], m[4][1]) for m in side.markers) == [
                (zombie.epoch + 1, False, 0), (zombie.epoch + 1, False, 1)]
            assert await zombie.add(0) == [E.producer_fenced.value]
            assert await successor.add(0) == [0]

    run(main())
