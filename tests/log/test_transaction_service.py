"""Service tests of transactions on a log node: a real LogService on 127.0.0.1 port 0 with its
data in tmp_path. WriteTxnMarkers answered per partition as appends are, read_committed reads
with their aborted transactions and last stable offsets, ListOffsets of the LSO, the
verification guard round trip of Append, DescribeProducers, the metrics, and the purgatory
hearing the high watermark move that releases a transaction."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record_batch import TRANSACTIONAL_BIT, iter_batches
from services.log.config import LogConfig
from services.log.server import LogService, start

from ..record_batches import build_batch, values
from .test_replica_service import LEADER, become, fetch, state
from .test_service import TIMEOUT, RecordingPurgatory, create, run_node

LAST_STABLE = log_pb2.READ_LIMIT_LAST_STABLE
HIGH_WATERMARK = log_pb2.READ_LIMIT_HIGH_WATERMARK

Stub = log_pb2_grpc.LogServiceStub
# Batches are stamped now: older ones would roll segments (segment.ms) and expire producers.
NOW = int(time.time() * 1000)


def txn_batch(producer_id: int, sequence: int, count: int = 1, epoch: int = 0) -> bytes:
    return build_batch(values(count, tag=f"{producer_id}-{sequence}-"), producer_id=producer_id,
                       producer_epoch=epoch, base_sequence=sequence, base_timestamp=NOW,
                       attributes=TRANSACTIONAL_BIT)


def plain_batch(**producer: int) -> bytes:
    return build_batch(values(1), base_timestamp=NOW, **producer)


async def append(stub: Stub, topic: str, records: bytes, partition: int = 0,
                 guard: int = 0) -> log_pb2.PartitionAppendResult:
    response = await stub.Append(log_pb2.AppendRequest(partitions=[
        log_pb2.PartitionAppend(topic=topic, partition=partition, records=records,
                                verification_guard=guard)]))
    [result] = response.results
    return result


async def append_verified(stub: Stub, topic: str, records: bytes,
                          partition: int = 0) -> log_pb2.PartitionAppendResult:
    """The handler's two steps: an append that needs verifying is sent again with its guard
    (the coordinator is taken to agree)."""
    result = await append(stub, topic, records, partition)
    if result.error_code == ErrorCode.invalid_txn_state.value and result.verification_guard:
        result = await append(stub, topic, records, partition, result.verification_guard)
    assert result.error_code == 0, result
    return result


async def end(stub: Stub, producer_id: int, committed: bool, *partitions: tuple[str, int],
              epoch: int = 0, coordinator_epoch: int = 0) -> list[log_pb2.PartitionAppendResult]:
    response = await stub.WriteTxnMarkers(log_pb2.WriteTxnMarkersRequest(markers=[
        log_pb2.TxnMarker(producer_id=producer_id, producer_epoch=epoch, committed=committed,
                          coordinator_epoch=coordinator_epoch,
                          partitions=[log_pb2.TopicPartition(topic=t, partition=p)
                                      for t, p in partitions])]))
    [marker] = response.markers
    assert marker.producer_id == producer_id
    return list(marker.partitions)


async def read(stub: Stub, topic: str, offset: int,
               limit: int = LAST_STABLE) -> log_pb2.PartitionReadResult:
    response = await stub.Read(log_pb2.ReadRequest(limit=limit, partitions=[
        log_pb2.PartitionRead(topic=topic, partition=0, offset=offset, max_bytes=1 << 20)]))
    [result] = response.results
    return result


def bases(records: bytes) -> list[int]:
    return [batch.header.base_offset for batch in iter_batches(records)]


def aborted(result: log_pb2.PartitionReadResult) -> list[tuple[int, int]]:
    return [(txn.producer_id, txn.first_offset) for txn in result.aborted_transactions]


def test_markers_end_transactions_on_every_named_partition(tmp_path: Path) -> None:
    async def body(stub: Stub, service: LogService) -> None:
        await create(stub, "a")
        await create(stub, "b")
        await append_verified(stub, "a", txn_batch(7, 0, count=2))   # a: 0-1
        await append_verified(stub, "b", txn_batch(7, 0))            # b: 0
        results = await end(stub, 7, False, ("a", 0), ("b", 0), ("missing", 0),
                            coordinator_epoch=4)
        assert [(r.topic, r.error_code, r.base_offset, r.high_watermark) for r in results] == [
            ("a", 0, 2, 3), ("b", 0, 1, 2),
            ("missing", ErrorCode.unknown_topic_or_partition.value, -1, -1)]
        assert results[0].log_end_offset == 3 and results[0].log_start_offset == 0
        # Several markers, answered in the order asked.
        response = await stub.WriteTxnMarkers(log_pb2.WriteTxnMarkersRequest(markers=[
            log_pb2.TxnMarker(producer_id=pid, producer_epoch=0, committed=True,
                              coordinator_epoch=4,
                              partitions=[log_pb2.TopicPartition(topic="a", partition=0)])
            for pid in (9, 8)]))
        assert [(m.producer_id, m.partitions[0].base_offset) for m in response.markers] == [
            (9, 3), (8, 4)]
        # Zombies: an older producer epoch, an older coordinator.
        [stale] = await end(stub, 7, True, ("a", 0), epoch=0, coordinator_epoch=3)
        assert stale.error_code == ErrorCode.transaction_coordinator_fenced.value
        await append_verified(stub, "a", txn_batch(7, 0, epoch=1))
        [old] = await end(stub, 7, True, ("a", 0), epoch=0, coordinator_epoch=4)
        assert old.error_code == ErrorCode.invalid_producer_epoch.value

    run_node(tmp_path, body)


def test_read_committed_reads_stop_at_the_lso_with_the_aborted_transactions(
    tmp_path: Path,
) -> None:
    async def body(stub: Stub, service: LogService) -> None:
        await create(stub, "t")
        await append_verified(stub, "t", txn_batch(7, 0))            # 0
        await append_verified(stub, "t", txn_batch(8, 0))            # 1
        await end(stub, 7, False, ("t", 0))                          # 2
        await append_verified(stub, "t", plain_batch())              # 3
        committed = await read(stub, "t", 0)
        assert (committed.high_watermark, committed.last_stable_offset) == (4, 1)
        assert bases(committed.records) == [0] and aborted(committed) == [(7, 0)]
        # Consumers reading uncommitted data see everything, and the same LSO.
        uncommitted = await read(stub, "t", 0, HIGH_WATERMARK)
        assert bases(uncommitted.records) == [0, 1, 2, 3]
        assert uncommitted.last_stable_offset == 1 and not uncommitted.aborted_transactions
        listed = await stub.ListOffsets(log_pb2.ListOffsetsRequest(limit=LAST_STABLE, partitions=[
            log_pb2.PartitionTimestamp(topic="t", partition=0, timestamp=-1)]))
        assert [r.offset for r in listed.results] == [1]
        await end(stub, 8, True, ("t", 0))                           # 4
        committed = await read(stub, "t", 1)
        assert committed.last_stable_offset == 5
        assert bases(committed.records) == [1, 2, 3, 4] and aborted(committed) == [(7, 0)]
        assert aborted(await read(stub, "t", 3)) == []
        missing = await read(stub, "nope", 0)
        assert (missing.error_code, missing.last_stable_offset) == (
            ErrorCode.unknown_topic_or_partition.value, -1)

    run_node(tmp_path, body)


def test_appends_that_start_a_transaction_need_the_guard_they_were_given(
    tmp_path: Path,
) -> None:
    async def body(stub: Stub, service: LogService) -> None:
        await create(stub, "t")
        first = await append(stub, "t", txn_batch(7, 0))
        assert first.error_code == ErrorCode.invalid_txn_state.value
        assert first.verification_guard != 0 and first.base_offset == -1
        wrong = await append(stub, "t", txn_batch(7, 0), guard=first.verification_guard ^ 1)
        assert (wrong.error_code, wrong.verification_guard) == (
            ErrorCode.invalid_txn_state.value, first.verification_guard)
        stored = await append(stub, "t", txn_batch(7, 0), guard=first.verification_guard)
        assert (stored.error_code, stored.base_offset, stored.verification_guard) == (0, 0, 0)
        # In the transaction, a plain batch of the producer is refused, without a guard.
        plain = await append(stub, "t", plain_batch(producer_id=7, producer_epoch=0,
                                                   base_sequence=1))
        assert (plain.error_code, plain.verification_guard) == (
            ErrorCode.invalid_txn_state.value, 0)
        control = build_end_transaction_batch(
            EndTransactionMarker(type=ControlRecordType.ABORT, coordinator_epoch=0),
            producer_id=7, producer_epoch=0, timestamp=1)
        assert (await append(stub, "t", control)).error_code == ErrorCode.invalid_record.value

    run_node(tmp_path, body)


def test_describe_producers_answers_from_the_leaders_producer_state(tmp_path: Path) -> None:
    async def body(stub: Stub, service: LogService) -> None:
        await create(stub, "t")
        await create(stub, "f")
        await become(stub, state("f", log_pb2.REPLICA_ROLE_FOLLOWER, 1))
        await append_verified(stub, "t", txn_batch(7, 0, count=3, epoch=2))
        await append_verified(stub, "t", plain_batch(producer_id=8, producer_epoch=0,
                                                     base_sequence=0))
        await append_verified(stub, "t", plain_batch(producer_id=8, producer_epoch=0,
                                                     base_sequence=1))
        await end(stub, 8, True, ("t", 0), coordinator_epoch=6)
        response = await stub.DescribeProducers(log_pb2.DescribeProducersRequest(partitions=[
            log_pb2.TopicPartition(topic=t, partition=0) for t in ("t", "f", "none")]))
        described, follower, missing = response.results
        assert described.error_code == 0
        assert [(p.producer_id, p.producer_epoch, p.last_sequence, p.coordinator_epoch,
                 p.current_txn_start_offset) for p in described.active_producers] == [
            (7, 2, 2, -1, 0), (8, 0, 1, 6, -1)]
        assert all(p.last_timestamp > 0 for p in described.active_producers)
        assert follower.error_code == ErrorCode.not_leader_or_follower.value
        assert missing.error_code == ErrorCode.unknown_topic_or_partition.value

    run_node(tmp_path, body)


def test_transaction_metrics(tmp_path: Path) -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    async def body(stub: Stub, service: LogService) -> None:
        await create(stub, "m")
        markers = sample("kbroker_log_txn_markers_total", type="ABORT")
        aborts = sample("kbroker_log_aborted_transactions_total")
        await append_verified(stub, "m", txn_batch(7, 0))
        await append_verified(stub, "m", txn_batch(8, 0))
        assert sample("kbroker_log_ongoing_transactions") == 2
        assert sample("kbroker_log_partition_last_stable_offset_lag", topic="m",
                      partition="0") == 2
        await end(stub, 7, False, ("m", 0))
        await end(stub, 9, False, ("m", 0))  # no transaction of 9 here: not an aborted one
        assert sample("kbroker_log_txn_markers_total", type="ABORT") - markers == 2
        assert sample("kbroker_log_aborted_transactions_total") - aborts == 1
        assert sample("kbroker_log_ongoing_transactions") == 1

    run_node(tmp_path, body)


def test_the_purgatory_hears_the_high_watermark_that_releases_a_transaction(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        purgatory = RecordingPurgatory()
        server = grpc.aio.server()
        purgatory_pb2_grpc.add_PurgatoryServicer_to_server(purgatory, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        config = LogConfig(data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0",
                           purgatory_address=f"127.0.0.1:{port}")
        service = await start(config)
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        try:
            await released(log_pb2_grpc.LogServiceStub(channel), purgatory)
        finally:
            await channel.close()
            await service.stop(0)
            await server.stop(0)

    async def released(stub: Stub, purgatory: RecordingPurgatory) -> None:
        await create(stub, "t")
        assert await become(stub, state("t", LEADER, 1)) == [0]  # with followers
        await append_verified(stub, "t", txn_batch(7, 0))            # 0
        await end(stub, 7, True, ("t", 0))                          # 1
        assert (await read(stub, "t", 0)).last_stable_offset == 0
        # The follower's fetch says it holds both: committed.
        assert (await fetch(stub, "t", 2, epoch=1)).high_watermark == 2
        # The move that makes the transaction stable is reported like any other.
        while purgatory.positions.get("t-0") != 2:
            purgatory.changed.clear()
            await asyncio.wait_for(purgatory.changed.wait(), 10)
        assert (await read(stub, "t", 0)).last_stable_offset == 2

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))
