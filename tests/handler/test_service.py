"""The handler against the real services: log nodes, purgatory and replicator, each a gRPC
server on port 0, called over gRPC the way a frontend calls it."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.common.records.record_batch import TRANSACTIONAL_BIT

from ..record_batches import build_batch
from .batches import batch_offsets, record_batch
from .harness import ADVERTISED, running_cluster


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def partition_errors(response):
    return [p.error_code for t in response.responses for p in t.partitions]


def test_create_produce_fetch_and_list_offsets(tmp_path):
    async def main():
        async with running_cluster(tmp_path, nodes=2) as cluster:
            created = (await cluster.create_topic("orders", partitions=4)).topics[0]
            assert (created.num_partitions, created.replication_factor) == (4, 1)
            assert created.topic_id
            assert all(c.config_source in (1, 5) for c in created.configs)

            metadata = await cluster.metadata("orders")
            assert {(b.host, b.port) for b in metadata.brokers} == {ADVERTISED}
            assert sorted(b.node_id for b in metadata.brokers) == [0, 1]
            assert metadata.cluster_id == "handler-test-cluster"
            assert metadata.controller_id in (0, 1)
            (topic,) = metadata.topics
            assert (topic.error_code, topic.name, topic.topic_id) == (0, "orders",
                                                                      created.topic_id)
            assert [p.partition_index for p in topic.partitions] == [0, 1, 2, 3]
            assert {p.leader_id for p in topic.partitions} == {0, 1}

            timestamp = int(time.time() * 1000) - 60_000
            for partition in range(4):
                first = await cluster.produce("orders", partition, record_batch(
                    [b"a", b"b", b"c"], timestamp_ms=timestamp))
                second = await cluster.produce("orders", partition, record_batch(
                    [b"d", b"e"], timestamp_ms=timestamp + 10_000), acks=-1)
                assert (first.error_code, first.base_offset) == (0, 0)
                assert (second.error_code, second.base_offset) == (0, 3)
                assert second.log_start_offset == 0

            fetched = await cluster.fetch("orders", 0, 0)
            assert fetched.error_code == 0 and fetched.session_id == 0
            (partition,) = fetched.responses[0].partitions
            assert (partition.error_code, partition.high_watermark,
                    partition.last_stable_offset, partition.log_start_offset) == (0, 5, 5, 0)
            assert batch_offsets(partition.records) == [(0, 3), (3, 2)]
            # An offset inside a batch returns that whole batch.
            fetched = await cluster.fetch("orders", 0, 4)
            assert batch_offsets(fetched.responses[0].partitions[0].records) == [(3, 2)]

            # All partitions in one request, each answered from its leader.
            request = k.FetchRequest(
                replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                session_id=0, session_epoch=-1,
                topics=[k.FetchRequest.FetchTopic(topic="orders", partitions=[
                    k.FetchRequest.FetchPartition(partition=p, fetch_offset=0,
                                                  partition_max_bytes=1 << 20)
                    for p in range(4)])])
            fetched = await cluster.stub.Fetch(request)
            assert [len(batch_offsets(p.records)) for p in fetched.responses[0].partitions] == [
                2, 2, 2, 2]

            # From Fetch v13 topics are named by id.
            request = k.FetchRequest(
                replica_id=-1, max_wait_ms=0, min_bytes=1, session_epoch=-1,
                topics=[k.FetchRequest.FetchTopic(topic_id=created.topic_id, partitions=[
                    k.FetchRequest.FetchPartition(partition=1, fetch_offset=0)])])
            fetched = await cluster.stub.Fetch(request)
            assert fetched.responses[0].topic_id == created.topic_id
            assert batch_offsets(fetched.responses[0].partitions[0].records) == [(0, 3), (3, 2)]

            latest = await cluster.list_offset("orders", 2, -1)
            assert (latest.error_code, latest.offset) == (0, 5)
            assert latest.leader_epoch == topic.partitions[2].leader_epoch
            for special in (-2, -4):
                earliest = await cluster.list_offset("orders", 2, special)
                assert (earliest.error_code, earliest.offset) == (0, 0)
            by_time = await cluster.list_offset("orders", 2, timestamp + 5_000)
            assert (by_time.error_code, by_time.offset) == (0, 3)
            future = await cluster.list_offset("orders", 2, timestamp + 3_600_000)
            assert (future.error_code, future.offset) == (0, -1)

            produced = REGISTRY.get_sample_value(
                "kbroker_handler_requests_total", {"api": "Produce", "error_code": "0"})
            assert produced is not None and produced >= 8

    run(main())


def test_metadata_auto_creates_topics_with_legal_names(tmp_path):
    async def main():
        async with running_cluster(tmp_path) as cluster:
            response = await cluster.metadata("fresh", "bad name!", auto_create=True)
            fresh, bad = response.topics
            assert (fresh.name, fresh.error_code) == ("fresh", 0)
            assert fresh.topic_id
            assert [(p.partition_index, p.leader_id, p.error_code) for p in fresh.partitions] == [
                (0, 0, 0)]
            assert (bad.name, bad.error_code) == ("bad name!", 17)
            # A produce right after creation succeeds: the topic is really there.
            produced = await cluster.produce("fresh", 0, record_batch([b"x"]))
            assert produced.error_code == 0

            response = await cluster.metadata("missing")
            assert [(t.name, t.error_code) for t in response.topics] == [("missing", 3)]

            unknown_id = "11111111-2222-3333-4444-555555555555"
            response = await cluster.stub.Metadata(k.MetadataRequest(
                topics=[k.MetadataRequest.MetadataRequestTopic(topic_id=unknown_id)],
                topics_is_null=False, allow_auto_topic_creation=True))
            assert [(t.topic_id, t.error_code) for t in response.topics] == [(unknown_id, 100)]
            response = await cluster.stub.Metadata(k.MetadataRequest(
                topics=[k.MetadataRequest.MetadataRequestTopic(topic_id=fresh.topic_id)],
                topics_is_null=False))
            assert [(t.name, t.error_code) for t in response.topics] == [("fresh", 0)]

    run(main())


def test_create_topics_error_codes(tmp_path):
    async def main():
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("taken")
            topic = k.CreateTopicsRequest.CreatableTopic
            response = await cluster.stub.CreateTopics(k.CreateTopicsRequest(
                timeout_ms=10_000, validate_only=False, topics=[
                    topic(name="taken", num_partitions=1, replication_factor=1),
                    topic(name="zero", num_partitions=0, replication_factor=1),
                    topic(name="too-many-copies", num_partitions=1, replication_factor=5),
                    topic(name="no/slashes", num_partitions=1, replication_factor=1),
                    topic(name="twice", num_partitions=1, replication_factor=1),
                    topic(name="twice", num_partitions=2, replication_factor=1),
                ]))
            assert [(t.name, t.error_code) for t in response.topics] == [
                ("taken", 36), ("zero", 37), ("too-many-copies", 38), ("no/slashes", 17),
                ("twice", 42)]
            assert all(t.error_message for t in response.topics)

            response = await cluster.stub.CreateTopics(k.CreateTopicsRequest(
                timeout_ms=10_000, validate_only=True,
                topics=[topic(name="dry-run", num_partitions=2, replication_factor=1)]))
            assert [(t.name, t.error_code, t.num_partitions) for t in response.topics] == [
                ("dry-run", 0, 2)]
            metadata = await cluster.metadata("dry-run")
            assert metadata.topics[0].error_code == 3

    run(main())


def test_produce_error_codes(tmp_path):
    async def main():
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t", partitions=2)
            batch = record_batch([b"x"])
            assert (await cluster.produce("t", 0, batch, acks=2)).error_code == 21
            assert (await cluster.produce("t", 9, batch)).error_code == 3
            assert (await cluster.produce("nope", 0, batch)).error_code == 3
            corrupt = bytearray(batch)
            corrupt[-1] ^= 0xFF
            assert (await cluster.produce("t", 0, bytes(corrupt))).error_code == 2
            # Transactional records without a transactional id.
            transactional = build_batch([b"x"], attributes=TRANSACTIONAL_BIT, producer_id=3,
                                        producer_epoch=0, base_sequence=0)
            response = await cluster.stub.Produce(k.ProduceRequest(
                acks=1, timeout_ms=1000, topic_data=[
                    k.ProduceRequest.TopicProduceData(name="t", partition_data=[
                        k.ProduceRequest.PartitionProduceData(index=0,
                                                              records=transactional)])]))
            assert response.responses[0].partition_responses[0].error_code == 53
            # Nothing of the refused requests was stored.
            latest = await cluster.list_offset("t", 0, -1)
            assert latest.offset == 0

    run(main())


def test_fetch_error_codes(tmp_path):
    async def main():
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t")
            await cluster.produce("t", 0, record_batch([b"x", b"y"]))
            assert partition_errors(await cluster.fetch("t", 0, 100)) == [1]
            assert partition_errors(await cluster.fetch("t", 3, 0)) == [3]
            assert partition_errors(await cluster.fetch("nope", 0, 0)) == [3]
            assert partition_errors(await cluster.fetch("t", 0, 0,
                                                        current_leader_epoch=99)) == [75]
            session = await cluster.fetch("t", 0, 0, session_id=12, session_epoch=3)
            assert (session.error_code, session.session_id, len(session.responses)) == (70, 0, 0)
            response = await cluster.stub.Fetch(k.FetchRequest(
                replica_id=-1, session_epoch=-1, topics=[k.FetchRequest.FetchTopic(
                    topic_id="11111111-2222-3333-4444-555555555555",
                    partitions=[k.FetchRequest.FetchPartition(partition=0, fetch_offset=0)])]))
            assert partition_errors(response) == [100]

    run(main())


def test_fetch_on_an_empty_partition_waits_max_wait(tmp_path):
    async def main():
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("quiet")
            started = time.monotonic()
            response = await cluster.fetch("quiet", 0, 0, max_wait_ms=500, min_bytes=1)
            elapsed = time.monotonic() - started
            assert 0.45 <= elapsed < 1.5, elapsed
            (partition,) = response.responses[0].partitions
            assert (partition.error_code, partition.high_watermark, partition.records) == (
                0, 0, b"")

    run(main())


def test_a_parked_fetch_is_woken_by_a_produce(tmp_path):
    async def main():
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("live")
            channel = insecure_channel(f"127.0.0.1:{cluster.purgatory.port}")
            try:
                purgatory = purgatory_pb2_grpc.PurgatoryStub(channel)
                fetching = asyncio.create_task(
                    cluster.fetch("live", 0, 0, max_wait_ms=10_000, min_bytes=1))
                await _until_parked(purgatory)
                produced_at = time.monotonic()
                produced = await cluster.produce("live", 0, record_batch([b"wake up"]))
                assert produced.error_code == 0
                response = await asyncio.wait_for(fetching, 5)
                assert time.monotonic() - produced_at < 1.0
                (partition,) = response.responses[0].partitions
                assert partition.high_watermark == 1
                assert batch_offsets(partition.records) == [(0, 1)]
            finally:
                await channel.close()

    run(main())


async def _until_parked(purgatory: purgatory_pb2_grpc.PurgatoryStub) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        described = await purgatory.Describe(purgatory_pb2.DescribeRequest())
        if sum(described.pending_by_kind.values()) > 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the fetch never parked in the purgatory")


def test_without_a_purgatory_a_fetch_still_waits_out_max_wait(tmp_path):
    async def main():
        async with running_cluster(tmp_path, purgatory=False) as cluster:
            await cluster.create_topic("t")
            started = time.monotonic()
            response = await cluster.fetch("t", 0, 0, max_wait_ms=300, min_bytes=1)
            assert 0.28 <= time.monotonic() - started < 1.5
            assert partition_errors(response) == [0]

    run(main())


def test_delete_topics_and_describe_cluster(tmp_path):
    async def main():
        async with running_cluster(tmp_path, nodes=2) as cluster:
            await cluster.create_topic("by-name")
            by_id = (await cluster.create_topic("by-id")).topics[0].topic_id
            response = await cluster.stub.DeleteTopics(k.DeleteTopicsRequest(
                timeout_ms=10_000, topic_names=["by-name", "never-was"]))
            assert [(t.name, t.error_code) for t in response.responses] == [
                ("by-name", 0), ("never-was", 3)]
            response = await cluster.stub.DeleteTopics(k.DeleteTopicsRequest(
                timeout_ms=10_000, topics=[k.DeleteTopicsRequest.DeleteTopicState(
                    topic_id=by_id)]))
            assert [(t.name, t.topic_id, t.error_code) for t in response.responses] == [
                ("by-id", by_id, 0)]
            metadata = await cluster.metadata()
            assert [t.name for t in metadata.topics] == []

            described = await cluster.stub.DescribeCluster(
                k.DescribeClusterRequest(include_cluster_authorized_operations=False,
                                         endpoint_type=1),
                metadata=(("kafka-advertised", "front.test:19092"),))
            assert described.error_code == 0
            assert described.cluster_id == "handler-test-cluster"
            assert [(b.broker_id, b.host, b.port) for b in described.brokers] == [
                (0, "front.test", 19092), (1, "front.test", 19092)]
            assert described.cluster_authorized_operations == -(2**31)
            described = await cluster.stub.DescribeCluster(
                k.DescribeClusterRequest(endpoint_type=2))
            assert described.error_code == 114

    run(main())


def test_a_dead_leader_is_reported_and_refuses_writes(tmp_path):
    async def main():
        # Three log nodes: the cluster metadata lives in a metadata log on them, and the
        # replicator records a dead node only while a majority of them is up.
        async with running_cluster(tmp_path, nodes=3) as cluster:
            await cluster.create_topic("spread", partitions=2)
            leaders = {p.partition_index: p.leader_id
                       for p in (await cluster.metadata("spread")).topics[0].partitions}
            assert set(leaders.values()) == {0, 1}
            victim = 1
            orphan = next(i for i, leader in leaders.items() if leader == victim)
            healthy = 1 - orphan
            await cluster.stop_log_node(victim)
            # The dead node stays a broker (the frontend serves its port); its partition,
            # whose only replica it was, has no leader.
            metadata = await cluster.wait_for_metadata(
                lambda response: response.topics[0].partitions[orphan].leader_id == -1,
                "spread")
            assert [b.node_id for b in metadata.brokers] == [0, 1, 2]
            partitions = {p.partition_index: p for p in metadata.topics[0].partitions}
            assert (partitions[orphan].error_code, partitions[orphan].leader_id) == (5, -1)
            assert partitions[orphan].offline_replicas == [victim]
            assert partitions[healthy].error_code == 0
            batch = record_batch([b"x"])
            assert (await cluster.produce("spread", orphan, batch)).error_code == 6
            assert (await cluster.produce("spread", healthy, batch)).error_code == 0
            assert partition_errors(await cluster.fetch("spread", orphan, 0)) == [6]

    run(main())
